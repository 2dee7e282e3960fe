"""`arle bench list|show`: browse the benchmark cards."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer

from arlecli.cli.output import Column, console, print_json, print_table
from arlecli.errors import UserError

app = typer.Typer(help="Browse benchmark cards.", no_args_is_help=True)


def _source_text(card, short: bool = False) -> str:
    """Where a card's rows come from; `short`: a long list of configs as its first and a count
    (a table row, not the 57 subjects of MMLU in one unbreakable cell)."""
    src = card.source
    configs = src.config if isinstance(src.config, list) else None
    if short and configs and len(configs) > 3:
        config = f"{configs[0]}, ... {len(configs)} configs"
    else:
        config = ",".join(configs) if configs else src.config
    return f"{src.kind}:{src.path}" + (f" [{config}]" if config else "")


@app.command("list")
def list_command(
    category: Optional[str] = typer.Option(None, "--category", "-c", help="Only cards of this category."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """List the benchmarks: name, category, source and reward."""
    from arlecli.cards import CATEGORIES
    from arlecli.catalog import scan_cards

    if category and category not in CATEGORIES:
        raise UserError(f"unknown category '{category}'; choose one of: {', '.join(CATEGORIES)}")
    found, broken = scan_cards()
    cards = [c for c in found if not category or c.category == category]
    # A broken card is listed whatever the category filter: its category may be what is broken.
    if as_json:
        print_json(
            [
                {
                    "name": c.name,
                    "category": c.category,
                    "source": _source_text(c),
                    "reward": c.reward,
                    "version": c.version,
                    "description": c.description,
                    "path": str(c.path),
                }
                for c in cards
            ]
            + [{"name": b.name, "broken": b.reason, "path": str(b.path)} for b in broken]
        )
        return
    title = f"{len(cards)} benchmarks" + (f", {len(broken)} broken" if broken else "")
    out = console()
    # Card text, shown as is (print_table shows cells plain); at 80 columns one record per card.
    print_table(
        out,
        [Column("name", key=True), Column("category"), Column("source", wrap=True), Column("reward")],
        [[str(c.name), str(c.category), _source_text(c, short=True), str(c.reward)] for c in cards],
        title=title,
    )
    for b in broken:  # one unwrapped line each, so the reason reads whole in a log or a grep
        out.print(f"broken: {b.name}: {b.reason}", style="red", markup=False, highlight=False, soft_wrap=True)


@app.command("show")
def show_command(
    name: str = typer.Argument(..., help="Benchmark name or card path."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Show a card, its splits, where each part comes from, and one rendered prompt from its
    fixture or offline source."""
    from arlecli.data.sources import load_rows, read_rows_file, split_names, tasks_from_rows
    from arlecli.envs import make_env
    from arlecli.catalog import load_card, part_origins

    card = load_card(name)
    example = None
    if card.fixture_path is not None:
        rows = read_rows_file(card.fixture_path)[:1]
    elif card.source.kind in ("package", "generator"):
        rows = load_rows(card, limit=1)[:1]
    else:
        rows = []
    if rows:
        task = tasks_from_rows(card, rows, "fixture")[0]
        example = make_env(card, task).reset()  # what the model sees first (tool guide included)
    info: dict[str, Any] = {
        "name": card.name,
        "version": card.version,
        "category": card.category,
        "description": card.description,
        "source": _source_text(card),
        "splits": split_names(card),
        "default_split": card.source.default_split,
        "reward": card.reward,
        "reward_params": card.reward_params,
        "metrics": card.metrics,
        "format": card.prompt.format,
        "stop": card.prompt.stop,
        "max_tokens": card.prompt.max_tokens,
        "fewshot": card.prompt.fewshot.n,
        "path": str(card.path),
        "origins": part_origins(card),
        "example_prompt": example,
    }
    if as_json:
        print_json(info)
        return
    out = console()
    from rich.markup import escape

    # Card text is data: its brackets are not markup (terminal_text escapes control characters).
    out.print(f"[bold]{escape(card.name)}[/bold] {escape(f'v{card.version}  ({card.category})  {card.path}')}")
    out.print(card.description, markup=False)
    for key in (
        "source",
        "splits",
        "default_split",
        "reward",
        "reward_params",
        "metrics",
        "format",
        "stop",
        "max_tokens",
        "fewshot",
    ):
        out.print(f"  {key}: {json.dumps(info[key]) if not isinstance(info[key], str) else info[key]}", markup=False)
    out.print("--- where each part comes from ---", markup=False)
    for part, origin in info["origins"].items():
        out.print(f"  {part}: {origin}", markup=False, highlight=False, soft_wrap=True)
    if example is not None:
        text = example if isinstance(example, str) else "\n".join(f"[{m['role']}] {m['content']}" for m in example)
        out.print("--- example prompt (zero-shot) ---", markup=False)
        out.print(text, markup=False, highlight=False)
