"""IFEval: lm-evaluation-harness's own instruction checks, loaded without its task machinery.

We depend on lm-eval (the maintained copy of Google's IFEval checks) rather than rewrite
the 25 checks. Two things stand in the way of a plain `import lm_eval.tasks.ifeval...`:

* `lm_eval/tasks/__init__.py` builds lm-eval's task manager, which imports datasets,
  evaluate, sacrebleu, scikit-learn and more: seconds of import for three small files.
* `instructions_util` calls `nltk.download("punkt_tab")` at import when the data is
  missing: a network call inside a reward (and inside the tests).

So `lm_eval_ifeval()` executes lm-eval's `instructions_util.py`, `instructions.py`,
`instructions_registry.py` and `utils.py` from the installed package as private module
objects (only for the duration of the load do they sit in sys.modules under their own
names, so their `from lm_eval.tasks.ifeval import ...` lines resolve), with
`nltk.download` disabled while it runs. Only two checks need NLTK's punkt_tab data:
`length_constraints:number_sentences` (nltk sentence tokenizer) and
`change_case:capital_word_frequency` (nltk.word_tokenize). When a row uses one of them
and the data is missing, it is fetched then, as lm-eval itself would, and a failed fetch
is a UserError that says how to install it.

Determinism: lm-eval's checks draw from `random` when a kwarg is missing (its
`{k: v ... if v}` filter also drops 0), and langdetect is random unless seeded. Our copies
get their own `random.Random` reseeded before each row (under a lock, since scoring runs
in threads) and langdetect's factory seed is fixed, so a completion always scores the same.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import random
import sys
import threading
import types
from pathlib import Path
from typing import Any

from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.types import Episode, Score, Task

PUNKT_INSTRUCTIONS = ("length_constraints:number_sentences", "change_case:capital_word_frequency")
_MODULES = ("instructions_util", "instructions", "instructions_registry", "utils")
_PACKAGE = "lm_eval.tasks.ifeval"

_LOCK = threading.RLock()
_RNG = random.Random(0)
_loaded: dict[str, types.ModuleType] = {}


def _ifeval_dir() -> Path:
    spec = importlib.util.find_spec("lm_eval")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the ifeval reward uses lm-eval's IFEval checks; `pip install 'lm-eval[ifeval]==0.4.13'`")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks" / "ifeval"


def _exec_modules(folder: Path) -> dict[str, types.ModuleType]:
    import nltk

    names = [_PACKAGE, *(f"{_PACKAGE}.{m}" for m in _MODULES)]
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [str(folder)]
    download = nltk.download
    nltk.download = lambda *a, **k: False  # lm-eval's import-time fetch: never from here
    try:
        sys.modules[_PACKAGE] = package
        modules = {}
        for name in _MODULES:
            spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.{name}", folder / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            with contextlib.redirect_stdout(io.StringIO()):  # it prints "Downloaded punkt_tab" regardless
                spec.loader.exec_module(module)
            setattr(package, name, module)
            modules[name] = module
    finally:
        nltk.download = download
        for n in names:  # leave sys.modules as we found it
            sys.modules.pop(n, None)
        sys.modules.update(saved)
    return modules


def lm_eval_ifeval(*, fresh: bool = False) -> dict[str, types.ModuleType]:
    """lm-eval's IFEval modules (private copies), loaded once; see the module docstring.
    `fresh`: load new copies and leave the cached ones alone (a test that loading leaves no trace)."""
    with _LOCK:
        if fresh or not _loaded:
            try:
                modules = _exec_modules(_ifeval_dir())
            except ImportError as exc:
                raise UserError(
                    f"the ifeval reward needs lm-eval's IFEval extras ({exc}); `pip install 'lm-eval[ifeval]==0.4.13'`"
                ) from None
            import langdetect

            langdetect.DetectorFactory.seed = 0
            for module in modules.values():
                if hasattr(module, "random"):
                    module.random = _RNG  # type: ignore[attr-defined]
            if fresh:
                return modules
            _loaded.update(modules)
    return _loaded


def _ensure_punkt() -> None:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        return
    except LookupError:
        pass
    if not nltk.download("punkt_tab", quiet=True):
        raise UserError(
            "IFEval's number_sentences and capital_word_frequency checks need NLTK's "
            "punkt_tab data and it could not be downloaded; run "
            "`python -m nltk.downloader punkt_tab` (or point NLTK_DATA at a copy)"
        )


def _kwargs_list(value: Any, n: int) -> list[dict[str, Any]]:
    # Hub rows give one dict per instruction (unused keys null); be lenient with odd rows.
    items = list(value) if isinstance(value, (list, tuple)) else []
    items = [dict(k) if isinstance(k, dict) else {} for k in items]
    return (items + [{}] * n)[:n]


def check(instruction_ids: list[str], kwargs: list[dict[str, Any]], prompt: str, response: str) -> dict[str, Any]:
    """lm-eval's `process_results` for one response: prompt/instruction-level strict and
    loose results (loose retries without the first/last line and without '*')."""
    modules = lm_eval_ifeval()
    unknown = [i for i in instruction_ids if i not in modules["instructions_registry"].INSTRUCTION_DICT]
    if unknown:
        raise UserError(f"unknown IFEval instruction(s) {', '.join(unknown)}: lm-eval's registry does not check them")
    if any(i in PUNKT_INSTRUCTIONS for i in instruction_ids):
        _ensure_punkt()
    doc = {
        "key": 0,
        "instruction_id_list": instruction_ids,
        "prompt": prompt,
        "kwargs": _kwargs_list(kwargs, len(instruction_ids)),
    }
    with _LOCK:
        _RNG.seed(0)
        return modules["utils"].process_results(doc, [response])


@register(
    "ifeval",
    metrics=[
        "prompt_level_strict_acc",
        "prompt_level_loose_acc",
        "inst_level_strict_acc",
        "inst_level_loose_acc",
        "n_instructions",
    ],
    needs_target=False,
    fields=["instruction_id_list"],
)
def ifeval() -> RewardFn:
    """IFEval scored by lm-eval's own checks (lm-eval 0.4.13 `ifeval` task).

    The task's fields carry the hub row: `instruction_id_list`, `kwargs` (null keys are
    dropped, as lm-eval does) and `prompt`. An instruction id lm-eval does not know is a
    UserError (the card and the checks disagree), not a wrong answer.

    Details: prompt_level_strict_acc, prompt_level_loose_acc (0/1: every instruction
    followed), inst_level_strict_acc, inst_level_loose_acc (the fraction of this prompt's
    instructions followed; lm-eval's headline inst-level number pools instructions over
    all prompts, so weight these by `n_instructions` to reproduce it), n_instructions.
    correct = prompt-level strict; reward = prompt-level strict.
    `extracted` is the list of per-instruction strict results.
    """

    def score(task: Task, episode: Episode) -> Score:
        ids = [str(i) for i in task.fields.get("instruction_id_list") or []]
        prompt = str(task.fields.get("prompt", task.input))
        result = check(ids, task.fields.get("kwargs") or [], prompt, episode.completion or "")
        strict, loose = result["inst_level_strict_acc"], result["inst_level_loose_acc"]
        n = len(strict)
        details = {
            "prompt_level_strict_acc": int(result["prompt_level_strict_acc"]),
            "prompt_level_loose_acc": int(result["prompt_level_loose_acc"]),
            "inst_level_strict_acc": sum(strict) / n if n else 0.0,
            "inst_level_loose_acc": sum(loose) / n if n else 0.0,
            "n_instructions": n,
        }
        correct = bool(details["prompt_level_strict_acc"]) and n > 0
        return Score(float(correct), correct, [bool(s) for s in strict], details)

    return score
