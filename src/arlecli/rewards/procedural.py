"""Rewards for procedural tasks: countdown (our safe checker) and reasoning-gym's checkers."""

from __future__ import annotations

import ast
import difflib
import functools
import json
import operator
import re
import secrets
from collections import Counter
from fractions import Fraction
from importlib.resources import files
from typing import Any, Callable, Sequence

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.types import Episode, Score, Task

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` in `text`, stripped, else None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def last_line(text: str) -> str | None:
    """The last non-empty line of `text`, stripped, else None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


# Countdown ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 300  # a dozen numbers fit many times over; stops parser/bignum abuse
MAX_LITERAL = 10**9
_EXPRESSION_RUN = re.compile(r"[\d\s+\-*/().^%!]+")  # ^ % ! kept so ast rejects them
_OPERATOR = re.compile(r"\d\s*[+\-*/]\s*[\d(]|\)\s*[+\-*/]")
_BIN_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class UnsafeExpression(ValueError):
    """The text is not plain arithmetic on integer literals."""


def countdown_expression(text: str) -> str | None:
    """The expression a model proposed: the last `<answer>` content if any, else the last
    line that holds arithmetic. Markdown, `×`/`÷` and a trailing `= <result>` are tolerated."""
    tagged = answer_tag(text)
    candidates = [tagged] if tagged is not None else reversed(text.splitlines())
    for line in candidates:
        expr = _expression_in(line)
        if expr is not None:
            return expr
    return tagged  # a tag with no arithmetic in it is still the model's (wrong) answer


def _expression_in(line: str) -> str | None:
    line = line.replace("×", "*").replace("÷", "/").replace("−", "-")
    line = re.sub(r"\\times|\\cdot", "*", line).replace("\\div", "/")
    # "83 + 7 = 90": keep the side with the most numbers (the expression, not the result).
    sides = [s for s in line.split("=") if s.strip()]
    best: str | None = None
    for side in sides:
        for run in _EXPRESSION_RUN.findall(side):
            # Bold markers and a full stop hug the expression in prose ("**8 / 2 + 3**.").
            run = " ".join(run.split()).rstrip(".").strip(" *")
            if _OPERATOR.search(run) and (best is None or _count(run) > _count(best)):
                best = run
    return best


def _count(expr: str) -> int:
    return len(re.findall(r"\d+", expr))


def safe_arithmetic(expr: str) -> tuple[Fraction, list[int]]:
    """Evaluate `expr` exactly, allowing only integer literals, + - * /, unary minus and
    brackets. Returns (value, the integer literals used). Raises UnsafeExpression otherwise
    (names, calls, powers, floats, huge literals, division by zero)."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression("expression too long")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UnsafeExpression(f"not an expression: {exc}") from None
    literals: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if node.value > MAX_LITERAL:
                raise UnsafeExpression("number too large")
            literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise UnsafeExpression("division by zero")
            return _BIN_OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        raise UnsafeExpression(f"not allowed: {type(node).__name__}")

    try:
        return walk(tree), literals
    except RecursionError:
        raise UnsafeExpression("expression nested too deeply") from None


def _countdown_problem(task: Task) -> tuple[list[int], Any]:
    fields = task.fields
    meta = fields.get("metadata") or {}
    if isinstance(meta, str):
        meta = safeio.loads(meta)
    # Our rows carry numbers/target at the top; reasoning_gym:countdown rows in metadata.
    numbers = fields.get("numbers", meta.get("numbers"))
    target = fields.get("target", meta.get("target", task.target))
    if numbers is None or target is None:
        raise ValueError(f"task {task.id}: countdown needs fields 'numbers' and 'target'")
    return [int(n) for n in numbers], target


@register("countdown", metrics=["accuracy", "valid_expression"], fields=["numbers|metadata"])
def countdown() -> RewardFn:
    """Countdown: an arithmetic expression that uses each given number exactly once and
    equals the target.

    The answer is the last `<answer>...</answer>` content, else the last line holding
    arithmetic (a trailing `= result` is ignored). It is evaluated exactly with `ast`
    (integer literals, + - * /, unary minus and brackets; no names, calls or powers); the
    multiset of literals must equal `task.fields["numbers"]` and the value must equal
    `task.fields["target"]` within 1e-6 (both also read from `fields["metadata"]`, so
    reasoning_gym:countdown rows work too).

    Takes no params. Details: accuracy (0/1), valid_expression (0/1: safe arithmetic that
    evaluates). `extracted` is the expression string or None.
    """

    def score(task: Task, episode: Episode) -> Score:
        numbers, target = _countdown_problem(task)
        expr = countdown_expression(episode.completion)
        valid = correct = False
        if expr is not None:
            try:
                value, used = safe_arithmetic(expr)
                valid = True
                correct = Counter(used) == Counter(numbers) and abs(float(value - Fraction(str(target)))) <= 1e-6
            except UnsafeExpression:
                pass
        details = {"accuracy": int(correct), "valid_expression": int(valid)}
        return Score(float(correct), correct, expr, details)

    return score


# reasoning-gym --------------------------------------------------------------------------

MAX_ANSWER_CHARS = 10_000
MAX_INERT_CHARS = 2_000  # longer plain literals go to the sandbox: parse/compile cost grows
# These reasoning-gym checkers pass the model's answer to eval() or sympy.parse_expr (itself
# an eval), so model text could run code or hang sympy on a power tower or a factorial.
# Three layers: a regex screen rejects obvious code for free; an answer that is a plain
# literal (numbers under + - * /, lists/tuples of literals) cannot run anything and is
# checked in-process; anything else is checked in the sandbox (arlecli.sandbox), with a
# timeout, so a loop or a file write never happens here. Other checkers only compare
# strings/numbers, and a screen there would reject honest answers (a word-sorting answer
# may well contain "open").
_EVAL_CHECKERS = frozenset(
    {
        "binary_matrix",
        "composite",
        "countdown",
        "intermediate_integration",
        "n_queens",
        "polynomial_multiplication",
        "puzzle24",
        "simple_integration",
        "spiral_matrix",
        "string_insertion",
    }
)
_UNSAFE = re.compile(
    r"__|\b(?:import|exec|eval|compile|open|globals|locals|vars|getattr|setattr|delattr|"
    r"input|breakpoint|lambda|os|sys|subprocess|builtins|self|class)\b"
    r"|\*\*\s*[\w.()]+\s*\*\*|\*\*\s*\([^)]*\*\*|\*\*\s*\(?\s*[\d.]{4,}|\d\s*!"
)
# Runs in the sandbox (a package file: sandbox/_resources/rg_checker.py): scores one answer with
# a reasoning_gym checker, printing the score after a nonce.
_CHECKER_PROGRAM = files("arlecli.sandbox._resources").joinpath("rg_checker.py").read_text(encoding="utf-8")


def looks_unsafe(answer: str) -> bool:
    """True when `answer` could run code or blow up an eval-based checker (a cheap screen)."""
    return bool(_UNSAFE.search(answer))


def _numeric(node: ast.AST) -> bool:
    return isinstance(node, (ast.BinOp, ast.UnaryOp)) or (
        isinstance(node, ast.Constant) and type(node.value) in (int, float)
    )


def is_inert(answer: str) -> bool:
    """True when eval() of `answer` can only build a value: number literals under + - * /
    and unary minus, strings, and lists/tuples of those (no names, calls, powers,
    subscripts or comprehensions). Such answers are safe to check in-process."""
    if len(answer) > MAX_INERT_CHARS:
        return False
    try:
        tree = ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    # ast.walk is iterative, so a long operator chain cannot exhaust the stack here.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.List, ast.Tuple, ast.expr_context, ast.operator, ast.unaryop)):
            continue  # operator nodes are vetted through their BinOp/UnaryOp below
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, str, bool):
            continue
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and _numeric(node.operand):
            continue
        # Numbers only on both sides: "a" * 10**9 or [0] * 10**9 would allocate gigabytes.
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS and _numeric(node.left) and _numeric(node.right):
            continue
        return False
    return True


def rg_answer(text: str) -> str | None:
    """The answer reasoning-gym scores: the last `<answer>` content, else the last
    non-empty line, stripped."""
    tagged = answer_tag(text)
    return tagged if tagged is not None else last_line(text)


@functools.lru_cache(maxsize=None)
def _rg_checker(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    from reasoning_gym import get_score_answer_fn

    return get_score_answer_fn(name)


def _grids_as_tuples(metadata: dict[str, Any]) -> dict[str, Any]:
    # The ARC checkers compare their parsed board (tuples) with metadata["output"] by ==,
    # and our JSON-safe rows hold lists, which never equal tuples.
    def grid(value: Any) -> Any:
        return tuple(tuple(r) for r in value) if isinstance(value, list) else value

    return {**metadata, **{k: grid(metadata[k]) for k in ("input", "output") if k in metadata}}


# Undo what JSON did to a row's metadata, where a checker cares (found by scoring every
# dataset's own answers after a JSON round trip; only these two needed it).
_RESTORE: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "arc_agi": _grids_as_tuples,
    "rearc": _grids_as_tuples,
}


def rg_entry(task: Task, name: str | None) -> dict[str, Any]:
    """The reasoning_gym entry (question, answer, metadata) a checker scores against, rebuilt
    from the task's fields (metadata restored for dataset `name`, else its `source_dataset`)."""
    fields = task.fields
    metadata = fields.get("metadata") or {}
    if isinstance(metadata, str):  # a row that went through a flat file
        metadata = safeio.loads(metadata)
    name = name or metadata.get("source_dataset")
    if name in _RESTORE:
        metadata = _RESTORE[name](metadata)
    return {
        "question": fields.get("question", task.input),
        "answer": fields.get("answer", task.target),
        "metadata": metadata,
    }


def _in_process(name: str, answer: str, entry: dict[str, Any]) -> float:
    try:
        return float(_rg_checker(name)(answer, entry))
    except Exception:  # a checker crash on odd model text is a wrong answer
        return 0.0


def sandbox_checks(
    jobs: Sequence[tuple[str, str, dict[str, Any]]],
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    workers: int | None = None,
) -> list[float]:
    """Run reasoning-gym checkers on (dataset, answer, entry) jobs in the sandbox, in parallel.

    Each job's score, or 0.0 when the checker failed, timed out or printed no result."""
    from arlecli.sandbox import run_programs

    if not jobs:
        return []
    nonces = [secrets.token_hex(16) for _ in jobs]
    stdins = [
        json.dumps({"name": name, "answer": answer, "entry": entry, "nonce": nonce}, default=str)
        for (name, answer, entry), nonce in zip(jobs, nonces)
    ]
    results = run_programs(
        [_CHECKER_PROGRAM] * len(jobs),
        stdins=stdins,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        workers=workers,
        packages=[("reasoning_gym",)] * len(jobs),
    )
    return [_sandbox_value(r.stdout, nonce) if r.passed else 0.0 for r, nonce in zip(results, nonces)]


def _sandbox_value(stdout: str, nonce: str) -> float:
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce + " "):
            try:
                return float(json.loads(line[len(nonce) + 1 :]))
            except (ValueError, TypeError):
                return 0.0
    return 0.0


# Without the `task` param the row's metadata names its dataset (and every checker reads it).
# runs_code: reasoning_gym's checkers run in the sandbox (they are third-party code on model output).
@register("reasoning_gym", metrics=["accuracy"], runs_code=True, fields=lambda p: [] if p.get("task") else ["metadata"])
def reasoning_gym(
    task: str | None = None, timeout_s: float = 10.0, memory_mb: int = 2048, workers: int | None = None
) -> RewardFn:
    """Score with reasoning-gym's own checker (`score_answer`) for the row's dataset.

    The answer is the last `<answer>...</answer>` content, else the last non-empty line.
    The entry the checker sees is {question, answer, metadata} from the task's fields
    (`answer` falls back to `task.target`, `question` to `task.input`). For the datasets
    whose checker eval()s the answer (countdown, puzzle24, n_queens, the integration tasks,
    ...), answers that look like code or a power tower score 0 without reaching it; plain
    literals (numbers and + - * /, lists) are checked here; any other answer is checked in
    the sandbox, so model text never runs in this process.

    Args:
        task: reasoning-gym dataset name (e.g. "gsm_symbolic"; "reasoning_gym:" prefix
            allowed). Default: the row's `metadata["source_dataset"]`.
        timeout_s: wall-clock limit of one sandboxed check (interpreter start and the
            reasoning-gym import, about 1.5 s, included).
        memory_mb: memory limit of one sandboxed check.
        workers: sandboxed checks run at once by the batch path (default: CPU count).

    Details: accuracy (0/1, checker score == 1). `reward` is the checker's score in [0, 1]
    (some checkers give partial credit, e.g. countdown 0.05 for a wrong value). The
    returned `score` also carries `score.batch(tasks, episodes)`, which runs the sandboxed
    checks of a batch in parallel.
    """
    fixed = task.removeprefix("reasoning_gym:") if task else None
    if fixed is not None:
        from reasoning_gym.factory import DATASETS

        if fixed not in DATASETS:
            near = difflib.get_close_matches(fixed, DATASETS, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UserError(f"reward reasoning_gym: unknown dataset '{fixed}'{hint}")

    def batch(tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
        if len(tasks) != len(episodes):
            raise ValueError(f"got {len(tasks)} tasks but {len(episodes)} episodes")
        answers: list[str | None] = []
        values: list[float | None] = []  # None: left for the sandbox
        jobs: list[tuple[str, str, dict[str, Any]]] = []
        for row, episode in zip(tasks, episodes):
            answer, value, job = _triage(row, episode.completion, fixed)
            answers.append(answer)
            values.append(value)
            if job is not None:
                jobs.append(job)
        checked = sandbox_checks(jobs, timeout_s=timeout_s, memory_mb=memory_mb, workers=workers) if jobs else []
        sandboxed = iter(checked)
        return [_rg_score(next(sandboxed) if v is None else v, a) for v, a in zip(values, answers)]

    def score(row: Task, episode: Episode) -> Score:
        return batch([row], [episode])[0]

    score.batch = batch  # type: ignore[attr-defined]
    return score


def _triage(
    row: Task, completion: str, fixed: str | None
) -> tuple[str | None, float | None, tuple[str, str, dict[str, Any]] | None]:
    """(answer, score, None) when scored here, or (answer, None, sandbox job)."""
    entry = rg_entry(row, fixed)
    name = fixed or entry["metadata"].get("source_dataset")
    if not name:
        raise ValueError(f"task {row.id}: set the reward param `task` (no source_dataset)")
    answer = rg_answer(completion)
    if answer is not None and len(answer) > MAX_ANSWER_CHARS:
        answer = None  # no honest answer is that long; some checkers are quadratic
    if answer is None:
        return None, 0.0, None
    if name not in _EVAL_CHECKERS:
        return answer, _in_process(name, answer, entry), None
    if looks_unsafe(answer):  # the cheap first filter
        return answer, 0.0, None
    if is_inert(answer):
        return answer, _in_process(name, answer, entry), None
    return answer, None, (name, answer, entry)


def _rg_score(value: float, answer: str | None) -> Score:
    value = min(max(value, 0.0), 1.0)
    correct = value == 1.0
    return Score(value, correct, answer, {"accuracy": int(correct)})


# ARC grids ------------------------------------------------------------------------------

Grid = list[list[int]]
MAX_GRID_CHARS = 20_000  # a 30x30 grid is under 2,000 characters
_GRID_LINE = re.compile(r"[\s\[\],]*\d(?:[\s,]*\d)*[\s\[\],]*")


def parse_grid(text: str) -> Grid | None:
    """The grid in `text` (the last `<answer>` content if any, else the whole text): a JSON
    list of lists of digits, else the last block of consecutive lines made only of digits
    (separated by spaces or commas, brackets allowed). Each digit is one cell. None if none."""
    tagged = answer_tag(text)
    body = (tagged if tagged is not None else text)[:MAX_GRID_CHARS]
    try:
        data = safeio.loads(body)  # model text: "[[[[..." is no grid, not a RecursionError
    except ValueError:
        data = None
    if (
        isinstance(data, list)
        and data
        and all(isinstance(r, list) and all(type(c) is int and 0 <= c <= 9 for c in r) for r in data)
    ):
        return data
    blocks: list[list[str]] = []
    inside = False
    for line in body.splitlines():
        if _GRID_LINE.fullmatch(line):
            if not inside:
                blocks.append([])
            blocks[-1].append(line)
            inside = True
        else:
            inside = False
    if not blocks:
        return None
    return [[int(c) for c in re.findall(r"\d", line)] for line in blocks[-1]]


def _target_grid(task: Task) -> Grid:
    target = task.target
    grid = target if isinstance(target, list) else parse_grid(str(target))
    if not grid:
        raise ValueError(f"task {task.id}: the target is not a grid of digits")
    return grid


@register("arc_grid", metrics=["accuracy", "valid_grid", "shape_match"])
def arc_grid() -> RewardFn:
    """ARC-AGI: the output grid must equal the target grid exactly (every cell, same shape).

    The grid is read by `parse_grid`: the last `<answer>` content, else the whole text; a
    JSON list of lists, or the last block of lines of digits ("0 1 2", "012" or "[0, 1, 2]").
    The target is `task.target` as grid text (the `arc_agi` transform's `answer`) or a list
    of lists. Takes no params.

    Details: accuracy (0/1), valid_grid (0/1: a rectangular grid was found), shape_match
    (0/1: same height and width as the target). `extracted` is the parsed grid or None.
    """

    def score(task: Task, episode: Episode) -> Score:
        target = _target_grid(task)
        grid = parse_grid(episode.completion)
        valid = bool(grid and len({len(r) for r in grid}) == 1)
        shape = valid and grid is not None and len(grid) == len(target) and len(grid[0]) == len(target[0])
        correct = shape and grid == target
        details = {"accuracy": int(correct), "valid_grid": int(valid), "shape_match": int(shape)}
        return Score(float(correct), correct, grid, details)

    return score
