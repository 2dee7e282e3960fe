"""The model card (README.md) of a training run: in the run directory and in final/.

TRL writes one on every save, but names the base model from the weights' `_name_or_path`
only when that is no local folder, so every run of a local model (the embedded SmolLM2, a
folder, a profile's path) read "fine-tuned version of [None](https://huggingface.co/None)"
with a `pipeline(model="None")` snippet; peft's adapter card is a blank template. arle knows
what was trained, from what, how and with what result: it writes the card once the run ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.models import EMBEDDED_NAME, ModelSpec
from arlecli.records import RunDir
from arlecli.results import read_json
from arlecli.train.algorithm import recorded

README = "README.md"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the embedded default is a quantised copy of


def base_model(spec: ModelSpec) -> str:
    """The base model's name for a card: the hub id, the embedded default's hub id, else the
    local folder."""
    path = spec.path_or_id or spec.name
    if spec.name == EMBEDDED_NAME and Path(path).name == EMBEDDED_NAME:
        return EMBEDDED_HUB_ID
    return path


def _yaml_text(value: str) -> str:
    return safeio.dumps(value)  # a JSON string is a YAML scalar: paths and ids with ':' stay one value


def model_card(spec: ModelSpec, summary: dict[str, Any], meta: dict[str, Any], final: Path) -> str:
    """The card's text: front matter (base_model, library, tags) and what a user needs."""
    base = base_model(spec)
    found = meta.get("options")
    options: dict[str, Any] = found if isinstance(found, dict) else {}
    lora = options.get("lora_rank") or 0
    algo, bench = str(summary.get("algo")), str(summary.get("benchmark"))
    declared = recorded(summary.get("algo"))
    unit = declared.unit if declared else "steps"
    on_hub = not os.path.isdir(base)
    source = f"[{base}](https://huggingface.co/{base})" if on_hub else f"`{base}`"
    kind = f"A LoRA adapter (rank {lora}) for" if lora else "A fine-tune of"
    lines = [
        "---",
        f"base_model: {_yaml_text(base)}",
        f"library_name: {'peft' if lora else 'transformers'}",
        "tags:",
        "- arle",
        "- trl",
        f"- {algo}",
        f"- {_yaml_text(bench)}",
        "---",
        "",
        f"# {final.parent.name}",
        "",
        f"{kind} {source}, trained by [arle](https://pypi.org/project/arle/) with {algo.upper()} on the "
        f"`{bench}` benchmark for {summary.get('global_step')} {unit}.",
        "",
    ]
    before, after = summary.get("before"), summary.get("after")
    if before and after and before.get("accuracy") is not None and after.get("accuracy") is not None:
        lines += [
            f"Held-out accuracy ({meta.get('eval_split')}): {before['accuracy']:.4f} at {before['label']} -> "
            f"{after['accuracy']:.4f} at {after['label']}.",
            "",
        ]
    lines += ["## Use", "", "```bash", f"arle eval {bench} --model {final}", f"arle serve --model {final}", "```", ""]
    if lora:
        lines += [
            "```python",
            "from peft import AutoPeftModelForCausalLM",
            "",
            f"model = AutoPeftModelForCausalLM.from_pretrained({str(final)!r})",
            "```",
            "",
        ]
    else:
        lines += [
            "```python",
            "from transformers import pipeline",
            "",
            f'generator = pipeline("text-generation", model={str(final)!r})',
            "```",
            "",
        ]
    command = meta.get("command")
    lines += ["## Training", ""]
    if isinstance(command, list):
        lines += ["```bash", " ".join(map(str, command)), "```", ""]
    lines += [
        f"Every setting is in `{final.parent / RunDir.META}`, each step's metrics in `metrics.jsonl`, the "
        f"held-out evaluations under `eval/`.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(run_dir: Path, spec: ModelSpec, summary: dict[str, Any]) -> None:
    """README.md in the run directory and in final/ (over TRL's and peft's), when final/ exists."""
    files = RunDir(Path(run_dir))
    final = files.final
    if not final.is_dir():
        return
    try:
        meta = read_json(files.meta)
    except UserError:  # a card is a courtesy: a run without a readable meta.json still ends
        meta = {}
    text = model_card(spec, summary, meta if isinstance(meta, dict) else {}, final)
    for folder in (Path(run_dir), final):
        (folder / README).write_text(text, encoding="utf-8")
