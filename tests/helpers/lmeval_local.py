"""Build an lm-evaluation-harness 0.4.13 task from its own installed YAML, on local rows.

The parity tests render fixture rows through arle and through lm-eval and compare. Here
lm-eval's task config is loaded exactly as `lm_eval --tasks NAME` loads it (its YAML,
`include:`s and `!function`s), only the dataset is swapped: `custom_dataset` (lm-eval's
own hook, called by `ConfigurableTask.download`) returns the given rows per split, so
nothing touches the hub. Few-shot exemplars come from lm-eval's sampler seeded as
`simple_evaluate` seeds it (`task.set_fewshot_seed(fewshot_random_seed=1234)`) and are
drawn doc by doc in order, as `build_all_requests` draws them.

    docs = lmeval_docs("gsm8k", {"train": train_rows, "test": test_rows})
    docs[0].context, docs[0].fewshot, docs[0].until, docs[0].gen_kwargs

Indexing all ~14k lm-eval tasks takes 15 s or more, so only the task's own folder
(`folder`, default the task name) under lm_eval/tasks is indexed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

# lm-eval imports datasets/huggingface_hub, which read these at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

LMEVAL_FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED, simple_evaluate's fewshot_random_seed


@dataclass
class LmEvalDoc:
    """What lm-eval builds for one document."""

    doc: dict[str, Any]  # the doc after the task's process_docs
    context: str  # the prompt text (chat: the chat template's output)
    fewshot: list[dict[str, Any]]  # the exemplar docs the sampler drew, in order
    requests: list[tuple[Any, ...]]  # each Instance's arguments, in order
    request_type: str  # generate_until, loglikelihood, ...
    messages: list[dict[str, str]] | None = None  # chat=True: the messages given to the template
    target: Any = None  # doc_to_target(doc)

    @property
    def gen_kwargs(self) -> dict[str, Any]:
        """generate_until's generation kwargs (until, max_gen_toks, do_sample, ...)."""
        return dict(self.requests[0][1])

    @property
    def until(self) -> list[str]:
        until = self.gen_kwargs.get("until", [])
        return [until] if isinstance(until, str) else list(until)


def tasks_dir() -> Path:
    """lm-eval's installed task folder (lm_eval/tasks)."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


@contextlib.contextmanager
def _offline_code_eval() -> Iterator[None]:
    """Let a task's utils.py that loads HF `evaluate`'s code_eval at import (mbpp,
    humaneval) import offline: that metric script lives on the hub. Prompts never use it;
    a stub that answers the import-time self-check stands in while the YAML loads."""
    try:
        import evaluate
    except ImportError:  # nothing to stub: the utils import fails as it would anyway
        yield
        return

    class _CodeEval:
        checked = False

        def compute(self, **kwargs: Any) -> Any:
            if self.checked:  # only the import-time self-check may call it
                raise RuntimeError("code_eval is stubbed by the lm-eval parity helper; it scores nothing")
            self.checked = True
            return {f"pass@{k}": 0.0 for k in kwargs.get("k", [1])}, {}

    real_load = evaluate.load

    def load(path: str, *args: Any, **kwargs: Any) -> Any:
        return _CodeEval() if path == "code_eval" else real_load(path, *args, **kwargs)

    evaluate.load = load
    try:
        yield
    finally:
        evaluate.load = real_load


def lmeval_config(task: str, folder: str | None = None) -> dict[str, Any]:
    """lm-eval's full config for `task` (includes merged, `!function`s resolved)."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    where = tasks_dir() / (folder or task)
    manager = TaskManager(include_defaults=False, include_path=str(where))
    entry = manager.task_index.get(task)
    if entry is None or entry.yaml_path is None:
        raise KeyError(f"lm-eval has no YAML task '{task}' under {where} (pass folder=)")
    with _offline_code_eval():
        return load_yaml(entry.yaml_path, resolve_func=True)


def _dataset(splits: dict[str, list[dict[str, Any]]]) -> Any:
    import datasets

    return datasets.DatasetDict({name: datasets.Dataset.from_list(list(rows)) for name, rows in splits.items()})


def lmeval_task(
    task: str,
    splits: dict[str, list[dict[str, Any]]],
    *,
    folder: str | None = None,
    num_fewshot: int | None = None,
    seed: int | None = LMEVAL_FEWSHOT_SEED,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """lm-eval's ConfigurableTask for `task`, reading `splits` ({lm-eval split name: rows}).

    `num_fewshot` None keeps the YAML's (0 if it has none, as simple_evaluate does); the
    sampler is seeded with `seed` as simple_evaluate seeds it."""
    from lm_eval.api.task import ConfigurableTask

    cfg = lmeval_config(task, folder)
    for key in ("tag", "group", "task_list"):
        cfg.pop(key, None)
    cfg.update(overrides or {})
    needed = {cfg.get(k) for k in ("test_split", "validation_split", "training_split", "fewshot_split")} - {None}
    missing = needed - set(splits)
    if missing:
        raise KeyError(f"lm-eval's {task} reads split(s) {sorted(missing)}; pass rows for them")
    data = _dataset(splits)
    cfg["custom_dataset"] = lambda **_: data
    with _offline_code_eval():
        obj = ConfigurableTask(config=cfg)
    if num_fewshot is not None:
        obj.set_config(key="num_fewshot", value=num_fewshot)
    elif obj.get_config("num_fewshot") is None:
        obj.set_config(key="num_fewshot", value=0)
    obj.set_fewshot_seed(seed=seed)
    return obj


def lmeval_docs(
    task: str,
    splits: dict[str, list[dict[str, Any]]],
    *,
    folder: str | None = None,
    num_fewshot: int | None = None,
    seed: int | None = LMEVAL_FEWSHOT_SEED,
    chat: bool = False,
    fewshot_as_multiturn: bool = False,
    system_instruction: str | None = None,
    chat_template: Any = None,
    overrides: dict[str, Any] | None = None,
    limit: int | None = None,
) -> list[LmEvalDoc]:
    """Build lm-eval's requests for every eval doc of `task` over local `splits`.

    `chat=True` builds them as `--apply_chat_template` does: `messages` holds what lm-eval
    hands the chat template, and `context` is `chat_template(messages,
    add_generation_prompt=...)`'s output (default: the messages as JSON)."""
    obj = lmeval_task(task, splits, folder=folder, num_fewshot=num_fewshot, seed=seed, overrides=overrides)
    # One record per fewshot_context call (build_all_requests makes one per doc, in order):
    # the exemplars the sampler drew and the messages given to the chat template.
    records: list[dict[str, Any]] = []
    if getattr(obj, "sampler", None) is not None:
        sample = obj.sampler.sample

        def recording_sample(*args: Any, **kwargs: Any) -> Any:
            docs = sample(*args, **kwargs)
            records[-1]["fewshot"] = [dict(d) for d in docs]
            return docs

        obj.sampler.sample = recording_sample
    fewshot_context = obj.fewshot_context

    def recording_context(*args: Any, **kwargs: Any) -> Any:
        records.append({"fewshot": [], "messages": None})
        return fewshot_context(*args, **kwargs)

    obj.fewshot_context = recording_context

    def render(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        records[-1]["messages"] = [dict(m) for m in messages]
        if chat_template is not None:
            return chat_template(messages, add_generation_prompt=add_generation_prompt)
        return json.dumps(messages)

    obj.build_all_requests(
        limit=limit,
        rank=0,
        world_size=1,
        apply_chat_template=chat,
        fewshot_as_multiturn=fewshot_as_multiturn,
        system_instruction=system_instruction,
        chat_template=render if chat else None,
    )
    by_doc: dict[int, list[Any]] = {}
    for inst in obj.instances:
        by_doc.setdefault(inst.doc_id, []).append(inst)
    docs = list(obj.eval_docs)
    out = []
    for record, doc_id in zip(records, sorted(by_doc)):
        insts = sorted(by_doc[doc_id], key=lambda x: x.idx)
        doc = docs[doc_id]
        first = insts[0].arguments[0]
        out.append(
            LmEvalDoc(
                doc=dict(doc),
                context=first if isinstance(first, str) else str(first),
                fewshot=record["fewshot"],
                requests=[tuple(inst.arguments) for inst in insts],
                request_type=insts[0].request_type,
                messages=record["messages"],
                target=obj.doc_to_target(doc),
            )
        )
    return out


__all__ = ["LMEVAL_FEWSHOT_SEED", "LmEvalDoc", "lmeval_config", "lmeval_docs", "lmeval_task", "tasks_dir"]

if __name__ == "__main__":  # quick look: python tests/helpers/lmeval_local.py TASK ROWS.jsonl [FOLDER]
    rows = [json.loads(line) for line in Path(sys.argv[2]).read_text().splitlines() if line.strip()]
    for d in lmeval_docs(sys.argv[1], {"test": rows}, folder=sys.argv[3] if len(sys.argv) > 3 else None):
        print(repr(d.context), d.requests[0][1:])
