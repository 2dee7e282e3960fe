"""Eval runs as training data: `arle data from-eval` (SFT rows, or DPO pairs with `--pairs`).

Each sample of an eval run (samples.jsonl) is one episode. Its conversation is rebuilt from
what eval recorded, exactly as the model saw it:

    prompt (the first turn's messages)
    + for each turn: {"role": "assistant", "content": completion} + the env's observation messages
    tools: the schemas the chat template rendered (native tools), when there were any

which is what the episode driver sent the engine (envs/episodes.py: each turn's prompt is the
previous one + the model's reply + the env's answer). Applying the model's chat template to
the messages before the k-th assistant turn (with the generation prompt, and `tools`) gives
the text of the k-th turn's prompt ids.

SFT rows (one per episode): {"messages", "tools"?, "benchmark", "run", "task_id", "sample",
"reward", "correct", "model"}; every assistant message is the model's and carries loss, the
rest (system, user, tool) is prompt or environment.

Completion-format cards (`prompt.format: completion`: HumanEval, gsm8k, MBPP) prompt with plain
text, not chat messages: their rows are TRL's prompt/completion format instead, `{"prompt": str,
"completion": str, ...provenance}` (pairs: `{"prompt": str, "chosen": str, "rejected": str,
...}`), the prompt exactly the text the engine tokenised, the completion the model's reply as
eval recorded it (cut at the card's stop sequence). A trainer tokenises the prompt as the engine
did, the completion after it, and appends EOS, as TRL does (train.sft.tokenize_text).

DPO rows (`--pairs`): {"prompt", "chosen", "rejected", "tools"?, "benchmark", "run", "task_id",
"model", "chosen_reward", "rejected_reward"}, TRL's conversational preference format. `prompt`
is the episode's first prompt, `chosen`/`rejected` everything after it (for an agent episode,
its assistant turns with the tool results between them). Pairing rule: within a task (same
benchmark, task id, prompt and tools), the i-th correct sample is paired with the i-th wrong
one, in the order the runs were given and their samples' order; each sample is used once, up
to `max_per_task` pairs per task.

An episode with a model turn cut at its token limit (finish_reason "length") makes no SFT row
and is never `chosen`, unless `keep_cut`: the chat template would close that turn with an
end-of-turn token the model never produced, and training would teach it to stop mid-sentence.

Thinking. A turn of a model that thought is written as

    {"role": "assistant", "content": ANSWER, "reasoning_content": THINKING}

(the shape Qwen3-style templates render and vLLM's parsers return), so the rows train the
thinking as well as the answer; `drop_thinking` (`--drop-thinking`) writes the answer alone. An
episode a turn of which thought and gave no answer (`thinking_cut`) is never a row, not even
with `keep_cut` (nor a side of a pair): there is no answer to learn or to prefer against.
How a trainer renders such a message is `for_template`'s: a chat template that renders
reasoning_content renders it; for one that does not, the thinking is written inline, between
the model's think tags, before the answer (`<think>\nTHINKING\n</think>\n\nANSWER`), as the
model generated it. `arle train --algo sft|dpo` tokenises rows through it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.records import RunDir, Sample
from arlecli.rundir import EvalRun, load_eval, refuse_overwriting


@dataclass
class Trajectory:
    """One episode of an eval run as a conversation, with where it came from."""

    run: str
    benchmark: str
    model: str
    task_id: str
    sample: int
    reward: float
    correct: bool
    # What the model saw before its first turn (plain text for a completion-format card) and
    # its turns (assistant) with the env's answers in between (the reply's text for such a card).
    prompt: list[dict[str, Any]] | str
    continuation: list[dict[str, Any]] | str
    tools: list[dict[str, Any]] | None
    cut: bool = False  # a model turn stopped at its token limit (finish_reason "length")
    thinking_cut: bool = False  # a model turn thought and gave no answer

    @property
    def is_text(self) -> bool:
        """A completion-format episode: a plain-text prompt and reply, not chat messages."""
        return isinstance(self.prompt, str)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation, ending with the model's last turn (chat episodes only)."""
        return [*self.prompt, *self.continuation]

    def key(self) -> str:
        """Equal for identical conversations (what --dedupe compares)."""
        return safeio.dumps([self.prompt, self.continuation, self.tools], sort_keys=True)

    def prompt_key(self) -> str:
        """Equal for episodes that started from the same prompt and tools (pairs need one)."""
        return safeio.dumps([self.benchmark, self.task_id, self.prompt, self.tools], sort_keys=True)


@dataclass
class Count:
    """What one filter did: `kept` of `of` (samples, tasks or pairs)."""

    filter: str
    kept: int
    of: int
    unit: str = "samples"


@dataclass
class Export:
    """The rows to write and how each filter got there (printed, and `--json`)."""

    kind: str  # sft | dpo
    rows: list[dict[str, Any]]
    runs: list[dict[str, Any]]  # run, benchmark, model, samples
    counts: list[Count] = field(default_factory=list)

    def report(self, output: Path) -> dict[str, Any]:
        """The `--json` report."""
        return {
            "output": str(output),
            "kind": self.kind,
            "rows": len(self.rows),
            "runs": self.runs,
            "filters": [asdict(c) for c in self.counts],
        }


# Reading runs ------------------------------------------------------------------------------


def load_runs(paths: Iterable[Path], *, force: bool = False) -> list[EvalRun]:
    """Each finished eval run of `paths` read whole (rundir.load_eval refuses, in one line, a
    folder that is no run, a training run, an unfinished run or a torn samples.jsonl). Runs of
    different benchmarks are refused unless `force`: their rows would mix tasks."""
    runs: list[EvalRun] = []
    seen: dict[Path, Path] = {}
    for path in paths:
        real = Path(path).resolve()
        if real in seen:
            raise UserError(f"{path} is given twice (as {seen[real]}); its samples would be written twice")
        seen[real] = Path(path)
        runs.append(load_eval(Path(path)))
    benches = {str(r.meta.benchmark) for r in runs}
    if len(benches) > 1 and not force:
        which = ", ".join(f"{r.path} ({r.meta.benchmark})" for r in runs)
        raise UserError(f"the runs are of different benchmarks: {which}; pass --force to mix them in one file")
    return runs


def trajectories(run: EvalRun, *, drop_thinking: bool = False) -> list[Trajectory]:
    """Every sample of `run` as a Trajectory, in samples.jsonl's order (assistant turns with their
    thinking as `reasoning_content` unless `drop_thinking`). A sample without turns (a game's
    seat the other ended the game before it moved) holds nothing the model said."""
    where = RunDir(run.path).samples
    out = []
    for n, s in enumerate(run.samples, 1):
        if s.num_turns == 0:
            continue
        recorded = _chat(s.prompt) and (s.turns is not None or "turns" in s.extra)  # a multi-turn episode
        if recorded and "rollout" in (s.env_info if isinstance(s.env_info, dict) else {}):
            # An agent's own requests (its tools, a rewritten history) are not in samples.jsonl.
            raise UserError(
                f"{run.path} is a @rollout agent's run, whose conversations samples.jsonl does not "
                f"hold whole; from-eval reads runs of single-turn and env cards"
            )
        if recorded and not s.has_tools:
            raise UserError(
                f"{where} line {n}: recorded by an older arle that did not record the tool schemas its "
                f"prompts carried; rerun the eval (arle eval ... --output NEW) to export it"
            )
        out.append(
            trajectory(
                s,
                run=str(run.path),
                benchmark=str(run.meta.benchmark),
                model=str(run.meta.model),
                where=f"{where} line {n}",
                drop_thinking=drop_thinking,
            )
        )
    return out


def trajectory(
    sample: Sample, *, run: str, benchmark: str, model: str, where: str = "a sample", drop_thinking: bool = False
) -> Trajectory:
    """A sample as the conversation the model had (see the module docstring): an eval run's
    line, or an episode's `Sample.from_episode` (train.rft). UserError naming `where` for
    what arle does not write."""
    prompt = sample.prompt
    if isinstance(prompt, str):
        return _text_trajectory(sample, where, prompt, drop_thinking, run=run, benchmark=benchmark, model=model)
    if not _chat(prompt):
        raise UserError(f"{where}: `prompt` is not a list of chat messages; the file was edited or damaged")
    turns = sample.turns
    tools = None
    if turns is None and "turns" not in sample.extra:  # single-turn: one reply
        continuation = [_assistant(sample.completion, where, None if drop_thinking else sample.thinking)]
        cut = sample.finish_reason == "length"
        thinking_cut = bool(sample.thinking_cut)
    else:
        tools = sample.tools
        if not turns or (tools is not None and not isinstance(tools, list)):
            raise UserError(f"{where}: `turns` or `tools` is not what arle writes; the file was edited or damaged")
        continuation = []
        for turn in turns:
            observation = turn.observation
            if not _chat(observation):
                raise UserError(f"{where}: a turn has no list of observation messages; the file was edited or damaged")
            thought = None if drop_thinking else turn.thinking
            continuation += [_assistant(turn.completion, where, thought), *observation]
        cut = any(turn.finish_reason == "length" for turn in turns)
        thinking_cut = any(bool(turn.thinking_cut) for turn in turns) or bool(sample.thinking_cut)
    return Trajectory(
        run=run,
        benchmark=benchmark,
        model=model,
        task_id=str(sample.task_id),
        sample=int(sample.sample or 0),
        reward=float(sample.reward or 0.0),
        correct=bool(sample.correct),
        prompt=prompt,
        continuation=continuation,
        tools=tools,
        cut=cut,
        thinking_cut=thinking_cut,
    )


def _text_trajectory(
    sample: Sample, where: str, prompt: str, drop_thinking: bool, *, run: str, benchmark: str, model: str
) -> Trajectory:
    """A completion-format card's sample: its plain-text prompt and the reply's text."""
    completion = sample.completion
    if sample.turns is not None or "turns" in sample.extra or not isinstance(completion, str):
        raise UserError(
            f"{where}: a plain-text prompt with turns or without a text completion is not what arle "
            f"writes; the file was edited or damaged"
        )
    if isinstance(sample.thinking, str) and not drop_thinking:
        # A text row has no message to carry the thought in, and where the think tags go is the
        # model's; the answer alone is a row only when asked for.
        raise UserError(
            f"{run}: a completion-format card's samples hold the model's thinking apart from its "
            f"answer, which a prompt/completion row cannot carry; pass --drop-thinking to write the "
            f"answers alone"
        )
    return Trajectory(
        run=run,
        benchmark=benchmark,
        model=model,
        task_id=str(sample.task_id),
        sample=int(sample.sample or 0),
        reward=float(sample.reward or 0.0),
        correct=bool(sample.correct),
        prompt=prompt,
        continuation=completion,
        tools=None,
        cut=sample.finish_reason == "length",
        thinking_cut=bool(sample.thinking_cut),
    )


def _chat(messages: Any) -> bool:
    return isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)


def _assistant(completion: Any, where: str, thinking: Any = None) -> dict[str, Any]:
    if not isinstance(completion, str) or (thinking is not None and not isinstance(thinking, str)):
        raise UserError(f"{where}: a completion or its thinking is not text; the file was edited or damaged")
    message = {"role": "assistant", "content": completion}
    if thinking is not None:
        message["reasoning_content"] = thinking
    return message


# SFT rows ----------------------------------------------------------------------------------


def sft_rows(
    runs: list[EvalRun],
    *,
    correct_only: bool = True,
    min_reward: float | None = None,
    max_per_task: int | None = None,
    dedupe: bool = False,
    keep_cut: bool = False,
    drop_thinking: bool = False,
) -> Export:
    """SFT rows from `runs`' episodes: those with an answer to every turn's thought, no turn of
    which was cut at its token limit (unless `keep_cut`), that are correct (`correct_only`) and
    reach `min_reward`, identical conversations once (`dedupe`), at most `max_per_task` per
    task (the highest rewards; ties: the runs' order, then sample number); their thinking kept
    unless `drop_thinking`. Rows keep the runs' order. UserError naming the filter when none
    is left."""
    found = [t for run in runs for t in trajectories(run, drop_thinking=drop_thinking)]
    for t in found:
        if not isinstance(t.prompt, str) and any(m.get("role") == "assistant" for m in t.prompt):
            raise UserError(
                f"{t.run}: its prompts hold few-shot exemplars as assistant turns, which an SFT row "
                f"would train on as the model's own; rerun the eval with --num-fewshot 0 "
                f"(--pairs keeps them in the prompt)"
            )
    export = Export("sft", [], _run_list(runs))
    kept = _count(export, "read", found, found, "the runs hold no samples")
    kept = _answered(export, kept)
    if not keep_cut:
        kept = _count(export, "complete", kept, [t for t in kept if not t.cut], _ALL_CUT)
    if correct_only:
        kept = _count(
            export,
            "correct-only",
            kept,
            [t for t in kept if t.correct],
            "none of them is correct; pass --all or --min-reward X to keep others",
        )
    if min_reward is not None:
        best = max(t.reward for t in kept)
        kept = _count(
            export,
            f"min-reward {min_reward:g}",
            kept,
            [t for t in kept if t.reward >= min_reward],
            f"the highest reward is {best:g}; lower --min-reward",
        )
    if dedupe:
        kept = _count(export, "dedupe", kept, _dedupe(kept), "")
    if max_per_task is not None:
        kept = _count(export, f"max-per-task {max_per_task}", kept, _top_per_task(kept, max_per_task), "")
    export.rows = [sft_row(t) for t in kept]
    return export


def sft_row(t: Trajectory) -> dict[str, Any]:
    """The shared SFT row format (see the module docstring): chat messages, or TRL's
    prompt/completion for a completion-format episode."""
    row: dict[str, Any] = {"prompt": t.prompt, "completion": t.continuation} if t.is_text else {"messages": t.messages}
    if t.tools:
        row["tools"] = t.tools
    row.update(
        benchmark=t.benchmark,
        run=t.run,
        task_id=t.task_id,
        sample=t.sample,
        reward=t.reward,
        correct=t.correct,
        model=t.model,
    )
    return row


def _dedupe(items: list[Trajectory]) -> list[Trajectory]:
    seen: set[str] = set()
    out = []
    for t in items:
        key = t.key()
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _top_per_task(items: list[Trajectory], k: int) -> list[Trajectory]:
    by_task: dict[tuple[str, str], list[int]] = {}
    for i, t in enumerate(items):
        by_task.setdefault((t.benchmark, t.task_id), []).append(i)
    # Stable sort: among equal rewards the earlier (run order, then sample order) wins.
    chosen = {i for idx in by_task.values() for i in sorted(idx, key=lambda i: -items[i].reward)[:k]}
    return [t for i, t in enumerate(items) if i in chosen]


_ALL_CUT = (
    "each was cut at its token limit, and a row would end the turn where the model did not; "
    "evaluate with a larger --max-tokens, or pass --keep-cut"
)
_ALL_THOUGHT = (
    "each ended inside its thinking with no answer; evaluate with a larger --max-tokens "
    "(or a smaller --max-thinking-tokens, which leaves room for the answer)"
)


def _answered(export: Export, kept: list[Trajectory]) -> list[Trajectory]:
    """Leave out the episodes that thought and gave no answer (counted only when a run has some,
    so runs of models that do not think report what they always did)."""
    if not any(t.thinking_cut for t in kept):
        return kept
    return _count(export, "answered", kept, [t for t in kept if not t.thinking_cut], _ALL_THOUGHT)


def _count(
    export: Export, name: str, before: list[Trajectory], after: list[Trajectory], why_none: str
) -> list[Trajectory]:
    export.counts.append(Count(name, len(after), len(before)))
    if not after:
        raise UserError(
            f"no rows to write: {name} kept 0 of {len(before)} samples" + (f" ({why_none})" if why_none else "")
        )
    return after


def _run_list(runs: list[EvalRun]) -> list[dict[str, Any]]:
    return [
        {"run": str(r.path), "benchmark": r.meta.benchmark, "model": r.meta.model, "samples": len(r.samples)}
        for r in runs
    ]


# DPO pairs ---------------------------------------------------------------------------------


def dpo_pairs(
    runs: list[EvalRun],
    *,
    max_per_task: int | None = None,
    dedupe: bool = False,
    keep_cut: bool = False,
    drop_thinking: bool = False,
) -> Export:
    """DPO rows: within each task, the i-th correct episode paired with the i-th wrong one
    (each used once, at most `max_per_task` pairs a task); see the module docstring. A correct
    episode cut at its token limit is chosen only with `keep_cut` (a wrong one may be rejected);
    one that thought and gave no answer is neither chosen nor rejected."""
    found = [t for run in runs for t in trajectories(run, drop_thinking=drop_thinking)]
    export = Export("dpo", [], _run_list(runs))
    kept = _count(export, "read", found, found, "the runs hold no samples")
    kept = _answered(export, kept)
    if dedupe:
        kept = _count(export, "dedupe", kept, _dedupe(kept), "")
    if not keep_cut:
        kept = _count(export, "complete when correct", kept, [t for t in kept if not (t.correct and t.cut)], _ALL_CUT)
    groups: dict[str, list[Trajectory]] = {}
    for t in kept:
        groups.setdefault(t.prompt_key(), []).append(t)
    both = [g for g in groups.values() if any(t.correct for t in g) and not all(t.correct for t in g)]
    export.counts.append(Count("tasks with a correct and a wrong sample", len(both), len(groups), "tasks"))
    if not both:
        n_right = sum(t.correct for t in kept)
        raise UserError(
            f"no pairs to write: none of the {len(groups)} tasks has both a correct and a wrong sample "
            f"({n_right} correct, {len(kept) - n_right} wrong in all); sample each task more often "
            f"(arle eval --num-samples N --temperature 1.0)"
        )
    for group in both:
        right = [t for t in group if t.correct]
        wrong = [t for t in group if not t.correct]
        n = min(len(right), len(wrong), max_per_task or len(right))
        export.rows += [dpo_row(c, r) for c, r in zip(right[:n], wrong[:n])]
    possible = sum(min(sum(t.correct for t in g), sum(not t.correct for t in g)) for g in both)
    if max_per_task is not None:
        export.counts.append(Count(f"max-per-task {max_per_task}", len(export.rows), possible, "pairs"))
    return export


def dpo_row(chosen: Trajectory, rejected: Trajectory) -> dict[str, Any]:
    """The shared DPO row format (see the module docstring)."""
    row: dict[str, Any] = {"prompt": chosen.prompt, "chosen": chosen.continuation, "rejected": rejected.continuation}
    if chosen.tools:
        row["tools"] = chosen.tools
    run = chosen.run if chosen.run == rejected.run else f"{chosen.run} | {rejected.run}"
    row.update(
        benchmark=chosen.benchmark,
        run=run,
        task_id=chosen.task_id,
        model=chosen.model,
        chosen_reward=chosen.reward,
        rejected_reward=rejected.reward,
    )
    return row


# Writing -----------------------------------------------------------------------------------


def check_output(path: Path, runs: Iterable[Path | str] = ()) -> None:
    """Refuse, before any run is read, an output that cannot be written or that would
    overwrite part of one of `runs`."""
    path = Path(path)
    refuse_overwriting(path, runs)
    if path.is_dir():
        raise UserError(f"--output {path} is a folder; give a file name, e.g. {path / 'sft.jsonl'}")
    parent = path.parent
    if parent.is_file():
        raise UserError(f"--output {path}: {parent} is a file, not a folder; choose another path")
    if not parent.is_dir():
        raise UserError(f"--output {path}: the folder {parent} does not exist; create it or choose another path")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write `rows` as JSON lines atomically (a temp file beside `path`, then a rename), so a
    kill leaves the old file or the whole new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(safeio.dumps(row) + "\n")  # valid UTF-8 whatever the model wrote
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; choose another --output") from None


# Rendering rows for a trainer --------------------------------------------------------------

_PROBE = "arle-reasoning-probe"


def template_renders_reasoning(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes an assistant message's `reasoning_content`
    (Qwen3's does, for the turns after the last user message); False for a template that
    ignores it or refuses the probe."""
    from arlecli.engine.tokens import render_chat

    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}]
    try:
        return _PROBE in render_chat(tokenizer, probe, generation_prompt=False)
    except Exception:  # no template, or one that raises on an unknown key: nothing rendered
        return False


def for_template(
    tokenizer: Any, messages: list[dict[str, Any]], *, renders: bool | None = None
) -> list[dict[str, Any]]:
    """`messages` as a trainer renders them with `tokenizer`'s chat template, so that every
    assistant turn's thinking is trained: unchanged where the template renders
    reasoning_content (`renders`, default: `template_renders_reasoning`); else each such
    turn's thinking is written inline before its answer, between the tokenizer's own think
    tags (else `<think>`/`</think>`), as a thinking model writes it."""
    if not any(isinstance(m.get("reasoning_content"), str) for m in messages if m.get("role") == "assistant"):
        return messages
    if renders if renders is not None else template_renders_reasoning(tokenizer):
        return messages
    from arlecli import thinking

    tags = thinking.resolve(None, tokenizer) or thinking.DEFAULT
    out = []
    for m in messages:
        thought = m.get("reasoning_content")
        if m.get("role") == "assistant" and isinstance(thought, str):
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
            m["content"] = f"{tags.start}\n{thought}\n{tags.end}\n\n{m.get('content') or ''}"
        out.append(m)
    return out
