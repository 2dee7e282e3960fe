"""`arle data pull`: fetch hub datasets ahead of time, for machines without the hub.
`arle data from-eval`: eval runs' episodes as SFT rows or DPO pairs (arlecli/trajectories.py)."""

from __future__ import annotations

from pathlib import Path
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
    from arlecli.catalog import load_card

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


@app.command("from-eval")
def from_eval_command(
    runs: List[Path] = typer.Argument(
        ..., help="Finished eval runs (a training run's held-out evals too: RUN/eval/step-N)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The JSONL file to write (replaced whole)."),
    correct_only: Optional[bool] = typer.Option(
        None,
        "--correct-only/--all",
        help="Keep only correct episodes (the default unless --min-reward is given), or all of them.",
    ),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Keep episodes whose reward is at least X."),
    max_per_task: Optional[int] = typer.Option(
        None, "--max-per-task", help="At most K rows per task (the highest rewards; with --pairs: K pairs)."
    ),
    dedupe: bool = typer.Option(False, "--dedupe", help="Write identical conversations once."),
    pairs: bool = typer.Option(
        False,
        "--pairs",
        help="Write DPO pairs (prompt, chosen: a correct episode, rejected: a wrong one of the same task) instead.",
    ),
    keep_cut: bool = typer.Option(
        False,
        "--keep-cut",
        help="Keep episodes with a turn cut at its token limit "
        "(left out by default: the row would end that "
        "turn where the model did not).",
    ),
    drop_thinking: bool = typer.Option(
        False,
        "--drop-thinking",
        help="Write each turn's answer alone, without the model's thinking "
        "(kept by default as the assistant message's reasoning_content).",
    ),
    force: bool = typer.Option(False, "--force", help="Mix runs of different benchmarks in one file."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON for scripts."),
) -> None:
    """Turn eval runs' episodes into training data: SFT rows (`messages`, with agent episodes'
    tool calls and results, and provenance; a completion-format card's runs, e.g. humaneval or
    gsm8k, give TRL's `prompt`/`completion` text rows) for `arle train --algo sft`, or with
    --pairs DPO rows (`prompt`, `chosen`, `rejected`) for `arle train --algo dpo`. A thinking model's turns keep their
    thinking (`reasoning_content`) unless --drop-thinking; an episode that thought and gave no
    answer is never a row. Prints how many rows each filter kept."""
    from arlecli import trajectories as tj
    from arlecli.errors import UserError

    if max_per_task is not None and max_per_task < 1:
        raise UserError(f"--max-per-task must be at least 1, not {max_per_task}")
    if pairs and (correct_only is not None or min_reward is not None):
        raise UserError(
            "--pairs pairs each task's correct episodes with its wrong ones; "
            "--correct-only, --all and --min-reward do not apply to it"
        )
    tj.check_output(output, runs)
    loaded = tj.load_runs(runs, force=force)
    if pairs:
        export = tj.dpo_pairs(
            loaded, max_per_task=max_per_task, dedupe=dedupe, keep_cut=keep_cut, drop_thinking=drop_thinking
        )
    else:
        export = tj.sft_rows(
            loaded,
            correct_only=correct_only if correct_only is not None else min_reward is None,
            min_reward=min_reward,
            max_per_task=max_per_task,
            dedupe=dedupe,
            keep_cut=keep_cut,
            drop_thinking=drop_thinking,
        )
    tj.write_jsonl(output, export.rows)
    for c in export.counts:  # plain lines: they go to logs as often as to a terminal
        typer.echo(
            f"read {c.of} samples from {len(loaded)} run(s)"
            if c.filter == "read"
            else f"{c.filter}: kept {c.kept} of {c.of} {c.unit}",
            err=True,
        )
    typer.echo(f"wrote {len(export.rows)} {'DPO pairs' if pairs else 'SFT rows'} to {output}", err=True)
    if as_json:
        print_json(export.report(output))
