"""Held-out evaluation during training: the eval runner on the weights being trained.

It runs on the engine the rollouts use (`train.batches.PolicyBackend`: the hf engine over the
trainer's own model object, or the run's vLLM engine synced to it), so no second copy of the
model is loaded, and `<run>/eval/step-N/` is an ordinary eval run directory (meta.json,
samples.jsonl, results.json) that `arle eval` would have written for those weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arlecli.cards import Card
from arlecli.eval import EvalOptions, run_eval
from arlecli.records import RunDir
from arlecli.results import META, read_json
from arlecli.train.batches import PolicyBackend


@dataclass
class HeldOut:
    """How and where held-out evaluations run for one training run."""

    card: Card
    options: EvalOptions
    run_dir: Path
    model_name: str
    engine: PolicyBackend
    on_start: Callable[[str, int, int], None] | None = None  # (label, total, already done)
    on_sample: Callable[[dict[str, Any]], None] | None = None
    on_done: Callable[[str, dict[str, Any]], None] | None = None

    def dir_for(self, label: str) -> Path:
        """The eval run directory for `label` (step-0, step-20 ...)."""
        return RunDir(self.run_dir).eval_dir(label)

    def finished(self) -> dict[str, dict[str, Any]]:
        """Results of the evaluations already finished in this run directory, by label."""
        root = RunDir(self.run_dir).held_out
        done = sorted(root.glob("step-*/results.json")) if root.exists() else []
        return {path.parent.name: read_json(path) for path in done}

    def evaluate(self, model: Any, tokenizer: Any, label: str, version: int) -> dict[str, Any]:
        """Evaluate `model` (weights of optimizer step `version`) into eval/<label>/.

        A directory left by an interrupted run is resumed, so a resumed training run never
        re-scores finished samples."""
        with self.engine.over(model, tokenizer, version) as engine:
            return self._run(engine, label)

    def evaluate_saved(self, label: str, model_path: str) -> dict[str, Any]:
        """Evaluate the weights saved at `model_path` (when no process holds them whole:
        ZeRO-3/FSDP, or a resumed run that had nothing left to train)."""
        from arlecli.engine.hf import HFEngine

        engine = HFEngine(model_path, batch_size=self.engine.batch_size)
        try:
            return self._run(engine, label)
        finally:
            engine.close()

    def _run(self, engine: Any, label: str) -> dict[str, Any]:
        out = self.dir_for(label)
        on_start = self.on_start
        results = run_eval(
            self.card,
            engine,
            self.options,
            model=f"{self.model_name}@{label}",
            run_dir=out,
            resume=(out / META).exists(),
            command=["arle", "train", "(held-out eval)", label],
            on_start=(lambda total, done: on_start(label, total, done)) if on_start else None,
            on_sample=self.on_sample,
        )
        if self.on_done:
            self.on_done(label, results)
        return results


def accuracy(results: dict[str, Any] | None) -> float | None:
    """The `accuracy` value of an eval's results (None when there was no eval)."""
    if not results:
        return None
    return results.get("metrics", {}).get("accuracy", {}).get("value")
