"""`arle data pull`: fetch hub datasets ahead of time, for machines without the hub."""

from __future__ import annotations

from typing import List, Optional

import typer

from arlecli.cli.output import console, print_json

app = typer.Typer(help="Manage benchmark data.", no_args_is_help=True)


@app.command("pull")
def pull_command(
    benches: List[str] = typer.Argument(..., help="Benchmark names or card paths."),
    split: Optional[List[str]] = typer.Option(None, "--split", "-s", help="Only these splits (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Download the benchmarks' hub splits into arle's cache; later runs read them from there
    without the hub (copy $ARLE_HOME/cache/datasets to an offline machine, or share ARLE_HOME)."""
    from arlecli.data.sources import pull
    from arlecli.registry import load_card

    cards = [load_card(b) for b in benches]  # every name checked before any download starts
    pulled = []
    for card in cards:
        if card.source.kind != "hub":
            console().print(f"{card.name}: {card.source.kind} data, nothing to pull", markup=False)
            continue
        for name, n_rows, path in pull(card, split or None):
            pulled.append({"benchmark": card.name, "split": name, "rows": n_rows, "path": str(path)})
            if not as_json:
                console().print(f"{card.name} {name}: {n_rows} rows -> {path}", markup=False)
    if as_json:
        print_json(pulled)
