"""Held-out evaluation during training: the eval runner on the weights being trained.

The in-process hf engine generates with the trainer's own model object (no copy, no
reload), so `<run>/eval/step-N/` is an ordinary eval run directory (meta.json,
samples.jsonl, results.json) that `arle eval` would have written for those weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arlecli.cards import Card
from arlecli.eval import EvalOptions, run_eval
from arlecli.results import META


@dataclass
class HeldOut:
    """How and where held-out evaluations run for one training run."""

    card: Card
    options: EvalOptions
    run_dir: Path
    model_name: str
    batch_size: int = 16
    on_start: Callable[[str, int, int], None] | None = None   # (label, total, already done)
    on_sample: Callable[[dict[str, Any]], None] | None = None
    on_done: Callable[[str, dict[str, Any]], None] | None = None

    def dir_for(self, label: str) -> Path:
        """The eval run directory for `label` (step-0, step-20 ...)."""
        return self.run_dir / "eval" / label

    def evaluate(self, model: Any, tokenizer: Any, label: str, *, model_path: str | None = None) -> dict[str, Any]:
        """Evaluate `model` (or, with model=None, the weights at `model_path`) into eval/<label>/.

        A directory left by an interrupted run is resumed, so a resumed training run never
        re-scores finished samples."""
        from arlecli.engine.hf import HFEngine

        was_training = bool(getattr(model, "training", False))
        if model is not None:
            engine = HFEngine("", batch_size=self.batch_size, model_obj=model, tokenizer=tokenizer,
                              device=str(next(model.parameters()).device))
        else:
            engine = HFEngine(model_path or "", batch_size=self.batch_size)
        out = self.dir_for(label)
        try:
            results = run_eval(
                self.card, engine, self.options, model=f"{self.model_name}@{label}", run_dir=out,
                resume=(out / META).exists(), command=["arle", "train", "(held-out eval)", label],
                on_start=(lambda total, done: self.on_start(label, total, done)) if self.on_start else None,
                on_sample=self.on_sample)
        finally:
            if model is not None:
                model.train(was_training)  # HFEngine switched it to eval mode
            else:
                engine.close()
        if self.on_done:
            self.on_done(label, results)
        return results


def accuracy(results: dict[str, Any] | None) -> float | None:
    """The `accuracy` value of an eval's results (None when there was no eval)."""
    if not results:
        return None
    return results.get("metrics", {}).get("accuracy", {}).get("value")
