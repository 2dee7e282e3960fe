"""LLM-as-judge: another model grades each completion against a rubric.

    reward:
      name: judge
      params:
        model: judge                # a profile, a local folder, a hub id, or an http(s) endpoint URL
        scale: pass/fail            # or an integer range "LO-HI": "1-5", "1-10", "0-100"
        rubric: "PASS when the answer agrees with the reference ... True answers: {correct_answers}"

The judge sees one user message: the task's question (`input`), the reference answer
(`target`, left out when a row has none), the response (the episode's final completion) and
the rubric, whose `{column}` placeholders are filled from the task like a prompt template. It
is asked to reason, then end with "Verdict: PASS|FAIL" or "Score: N". The last such line is
the verdict; pass/fail gives reward 1 or 0, a range gives (N - LO) / (HI - LO); `correct` is
reward >= `threshold`. A reply with no verdict (or a score outside the range) scores 0 with
`details.judge_error` and `judge_failed: 1` (list `judge_failed` in the card's metrics to
report the failure rate), and never stops the run; a judge that cannot be reached (after
the engine's retries) stops it with one line, and `arle eval --resume` continues.

Grading runs on any engine arle has (an endpoint through the openai engine, with its
concurrency, retries and backoff; local weights through hf or vllm), temperature 0 by
default. Replies are cached on disk, one file per (judge, rubric, scale, judge prompt with
the question, reference and completion, decoding settings), so a rerun grades from the cache
without asking the judge. A URL without `model_name` is keyed by the URL alone.

`score_batch(tasks, episodes)` grades many completions in one engine call; `arle eval`
(chunks of `batch_size`) and training (each batch of completions) use it when a reward has
it. `close()` releases the judge engine and warns how many replies had no verdict.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlecli import safeio, thinking
from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.types import Episode, Score, Task

# Bump when the judge prompt's wording changes: old cache entries answered another prompt.
PROMPT_VERSION = 1
PASS_FAIL = "pass/fail"
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
# The judge's last "Verdict: PASS" / "Score: 7" (also "**Score:** 7/10", "Verdict = fail").
_DECORATION = r"[\s*_`\"'\[(]*"
# The markup before the word ("**Verdict:**", "### Score") belongs to the verdict, not the reasoning.
# A match starts only where such a run starts (the lookbehind), as the leftmost match did anyway:
# else every position inside a long run of spaces began a scan of the rest of it (20,000 spaces: 8 s).
_LEAD = r"(?<![*_`#>\t ])[*_`#>\t ]*"
_VERDICT = re.compile(rf"{_LEAD}\bverdict{_DECORATION}[:=]{_DECORATION}(pass|fail)\b", re.IGNORECASE)
_SCORE = re.compile(rf"{_LEAD}\bscore{_DECORATION}[:=]{_DECORATION}(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_MAX_ERROR_REPLY = 200

JUDGE_PROMPT = """You are grading a response to a task. Apply the rubric strictly and impartially.

## Task
{question}
{reference}
## Response to grade
{completion}

## Rubric
{rubric}

Explain your reasoning briefly, then end your reply with one final line of exactly this form:
{verdict_line}"""


@dataclass(frozen=True)
class Scale:
    """How the judge states its grade: pass/fail, or a whole number from `low` to `high`."""

    text: str
    low: int | None = None
    high: int | None = None

    @classmethod
    def parse(cls, text: str) -> Scale:
        """ "pass/fail" or "LO-HI" (whole numbers, 0 <= LO < HI <= 100); ValueError otherwise."""
        if text.strip().lower() == PASS_FAIL:
            return cls(PASS_FAIL)
        m = _RANGE.match(text)
        if m and int(m[1]) < int(m[2]) <= 100:
            return cls(f"{int(m[1])}-{int(m[2])}", int(m[1]), int(m[2]))
        raise ValueError(
            f'scale {text!r} is not one arle knows; use "pass/fail" or a whole-number '
            'range "LO-HI" such as "1-5", "1-10" or "0-100"'
        )

    def verdict_line(self) -> str:
        """The last line the judge is asked to write."""
        if self.low is None:
            return '"Verdict: PASS" or "Verdict: FAIL"'
        return f'"Score: N", where N is a whole number from {self.low} (worst) to {self.high} (best)'

    def read(self, reply: str) -> tuple[float, str, str]:
        """(reward in [0, 1], the verdict as written, the reasoning before it) from a reply;
        ValueError saying what is wrong when it has no usable verdict."""
        pattern = _VERDICT if self.low is None else _SCORE
        found = list(pattern.finditer(reply))
        if not found:
            what = "Verdict: PASS/FAIL" if self.low is None else "Score: N"
            raise ValueError(f'no "{what}" line in the judge\'s reply')
        last = found[-1]
        reasoning = reply[: last.start()].strip()
        if self.low is None:
            verdict = last[1].upper()
            return (1.0 if verdict == "PASS" else 0.0), verdict, reasoning
        value = float(last[1])
        assert self.high is not None
        if not self.low <= value <= self.high:
            raise ValueError(f"score {last[1]} is outside the scale {self.text}")
        return (value - self.low) / (self.high - self.low), last[1], reasoning


def judge_prompt(task: Task, completion: str, rubric: str, scale: Scale) -> str:
    """The one user message the judge gets for `completion` of `task`."""
    from arlecli.cards import fill

    reference = _reference_text(task.target)
    return JUDGE_PROMPT.format(
        question=task.input.strip(),
        reference=f"\n## Reference answer\n{reference}\n" if reference else "",
        completion=completion.strip() or "(empty response)",
        rubric=fill(rubric, task, "reward.params.rubric").strip(),
        verdict_line=scale.verdict_line(),
    )


def _reference_text(target: Any) -> str:
    if target is None:
        return ""
    if isinstance(target, (list, tuple)):
        return "\n".join(f"- {t}" for t in target if str(t).strip())
    return str(target).strip()


class JudgeCache:
    """Judge replies on disk, one JSON file per key under `folder` (written atomically, so
    concurrent runs sharing the folder never read half a file; the last writer wins)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._warned = False

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        """The cached reply for `key`, or None (missing or unreadable: ask the judge again)."""
        try:
            entry = safeio.loads(self._path(key).read_bytes())
        except (OSError, ValueError):
            return None
        reply = entry.get("reply") if isinstance(entry, dict) else None
        return reply if isinstance(reply, str) else None

    def put(self, key: str, reply: str, judge: str) -> None:
        """Store `reply`; a cache that cannot be written (read-only, full) only costs reruns."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            safeio.write_atomic(path, safeio.dumps({"judge": judge, "reply": reply}))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(
                    safeio.terminal_text(
                        f"warning: judge cache {self.folder} not written ({exc.strerror or exc}); "
                        "reruns will ask the judge again"
                    ),
                    file=sys.stderr,
                )


class JudgeReward:
    """The judge scoring function: `score(task, episode)` and `score_batch(tasks, episodes)`.

    The judge model is resolved when the reward is built (so a bad `model` stops `arle eval`
    before any generation) and its engine is started on first use."""

    def __init__(
        self,
        spec: Any,
        rubric: str,
        scale: Scale,
        threshold: float,
        concurrency: int,
        max_tokens: int,
        temperature: float,
        cache: JudgeCache | None,
    ) -> None:
        self.spec = spec
        self.rubric, self.scale, self.threshold = rubric, scale, threshold
        self.concurrency, self.max_tokens, self.temperature = concurrency, max_tokens, temperature
        self.batch_size = concurrency  # what arle eval hands score_batch at a time
        self.cache = cache
        # Where the judge is, not how it is reached: an API key never enters the key or a file.
        self.identity = json.dumps(
            {"kind": spec.kind, "base_url": spec.base_url, "model": spec.model, "path_or_id": spec.path_or_id},
            sort_keys=True,
        )
        self.failed = 0
        self.graded = 0
        self._engine: Any = None
        self._lock = threading.Lock()  # engine start-up; in-process engines also run one call at a time

    def __call__(self, task: Task, episode: Episode) -> Score:
        return self.score_batch([task], [episode])[0]

    @property
    def engine_started(self) -> bool:
        """True while the judge's engine runs: it starts at the first grading, stops at close()."""
        return self._engine is not None

    def check_tasks(self, tasks: list[Task]) -> None:
        """Fill the rubric from the first task, so a placeholder that is no column stops the run
        before anything is generated (every row of a split has the same columns)."""
        if tasks:
            judge_prompt(tasks[0], "", self.rubric, self.scale)

    def score_batch(self, tasks: list[Task], episodes: list[Episode]) -> list[Score]:
        """Grade each episode against the task at the same position; one engine call for the
        replies not in the cache (identical prompts are asked once)."""
        prompts = [judge_prompt(t, e.completion, self.rubric, self.scale) for t, e in zip(tasks, episodes, strict=True)]
        keys = [self._key(p) for p in prompts]
        replies: dict[str, str] = {}
        for key in keys:
            cached = self.cache.get(key) if self.cache is not None else None
            if cached is not None:
                replies[key] = cached
        ask = {key: prompt for key, prompt in zip(keys, prompts) if key not in replies}
        if ask:
            replies.update(self._ask(ask))
        return [self._score(replies[key]) for key in keys]

    def _key(self, prompt: str) -> str:
        # safeio.dumps: the same text as json.dumps (so cached keys stay valid) unless a lone
        # surrogate would make .encode() fail.
        material = safeio.dumps(
            {
                "v": PROMPT_VERSION,
                "judge": self.identity,
                "rubric": self.rubric,
                "scale": self.scale.text,
                "prompt": prompt,
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            },
            sort_keys=True,
        )
        return hashlib.sha256(material.encode("utf-8")).hexdigest()

    def _ask(self, prompts: dict[str, str]) -> dict[str, str]:
        from arlecli.engine.base import GenerationRequest, SamplingParams

        keys = list(prompts)
        params = SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, seed=0)
        requests = [GenerationRequest(messages=[{"role": "user", "content": prompts[k]}], params=params) for k in keys]
        engine = self._start()
        replies: dict[str, str] = {}
        if engine.name == "openai":  # thread-safe; its own semaphore bounds the requests in flight
            results = list(engine.generate(requests))
        else:
            with self._lock:
                results = list(engine.generate(requests))
        tags = thinking.tags_for(engine)
        for i, completion in results:
            # A thinking judge's verdict is in its answer: a score it weighed in its thought is
            # not the one it gave (and a thought cut at the budget gave none).
            reply = thinking.split(completion.text, tags, reasoning=completion.reasoning).answer
            replies[keys[i]] = reply
            if self.cache is not None:
                self.cache.put(keys[i], reply, self.spec.name)
        return replies

    def _start(self) -> Any:
        with self._lock:
            if self._engine is None:
                from arlecli.engine import make_engine

                self._engine = make_engine(self.spec, batch_size=self.concurrency, concurrency=self.concurrency)
            return self._engine

    def _score(self, reply: str) -> Score:
        details: dict[str, Any] = {"judge_model": self.spec.name}
        try:
            reward, verdict, reasoning = self.scale.read(reply)
        except ValueError as exc:
            with self._lock:
                self.failed += 1
                self.graded += 1
            clipped = reply.strip()[:_MAX_ERROR_REPLY] + ("..." if len(reply.strip()) > _MAX_ERROR_REPLY else "")
            details.update(
                judge_reasoning=reply.strip(),
                judge_verdict=None,
                judge_score=0.0,
                judge_failed=1.0,
                judge_error=f"{exc}: {clipped!r}",
            )
            return Score(0.0, False, None, details)
        with self._lock:
            self.graded += 1
        details.update(judge_reasoning=reasoning, judge_verdict=verdict, judge_score=reward, judge_failed=0.0)
        return Score(reward, reward >= self.threshold, verdict, details)

    def close(self) -> None:
        """Stop the judge engine; say how many replies had no verdict (they scored 0)."""
        if self.failed:
            print(
                safeio.terminal_text(
                    f"warning: judge {self.spec.name}: {self.failed} of {self.graded} replies "
                    "had no usable verdict and scored 0 (see details.judge_error in the samples); "
                    "check the rubric, the scale and the judge's max_tokens"
                ),
                file=sys.stderr,
            )
            self.failed = self.graded = 0
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()


@register("judge", metrics=["judge_score", "judge_failed"], needs_target=False)
def judge(
    model: str = "",
    rubric: str = "",
    scale: str = PASS_FAIL,
    threshold: float = 0.5,
    model_name: str | None = None,
    api_key_env: str | None = None,
    backend: str | None = None,
    concurrency: int = 8,
    max_tokens: int = 512,
    temperature: float = 0.0,
    timeout_s: float | None = None,
    max_retries: int | None = None,
    cache: bool = True,
) -> RewardFn:
    """A judge model grades each completion against `rubric` on `scale`.

    Args:
        model: the judge: a profile name (`arle model setup`), a local folder, a hub id, or the
            http(s) URL of an OpenAI-compatible endpoint.
        rubric: what a good response is; `{column}` placeholders are filled from the task.
        scale: "pass/fail" (reward 1 or 0) or a whole-number range "LO-HI" (reward (N-LO)/(HI-LO)).
        threshold: `correct` is reward >= threshold (0 to 1).
        model_name: the served model name when `model` is a URL (default: ask the endpoint).
        api_key_env: NAME of the env var holding the key, when `model` is a URL (a profile has its own).
        backend: hf or vllm for local weights (default: arle's usual choice).
        concurrency: judge requests in flight (endpoint) or batch size (local weights).
        max_tokens, temperature: the judge's decoding (temperature 0: deterministic).
        timeout_s, max_retries: per-request deadline and retries for an endpoint judge.
        cache: keep replies under the cache dir so reruns do not ask the judge again.
    """
    from arlecli import config
    from arlecli.models import resolve_model

    try:
        parsed = Scale.parse(scale)
    except ValueError as exc:
        raise ValueError(f"param 'scale': {exc}") from None
    if not model.strip():
        raise ValueError(
            "param 'model' is missing: name the judge (a profile, a local folder, a hub id or an "
            "http(s) endpoint URL), e.g. model: judge after "
            "`arle model setup --name judge --base-url URL`"
        )
    if not rubric.strip():
        raise ValueError("param 'rubric' is missing: say what a good response is (it may use {column} placeholders)")
    if threshold > 1:
        raise ValueError(f"param 'threshold' is a reward between 0 and 1, got {threshold}")
    if concurrency < 1 or max_tokens < 1:
        raise ValueError("params 'concurrency' and 'max_tokens' must be at least 1")
    is_url = model.startswith(("http://", "https://"))
    if not is_url and (model_name or api_key_env):
        raise ValueError(
            "params 'model_name' and 'api_key_env' only apply when 'model' is an http(s) URL "
            "(a profile carries its own)"
        )
    try:
        spec = resolve_model(
            model_name if is_url else model,
            base_url=model if is_url else None,
            backend=backend,
            api_key_env=api_key_env,
            request_timeout=timeout_s,
            max_retries=max_retries,
        )
    except UserError as exc:
        if str(exc).startswith("unknown model"):
            raise ValueError(
                f"param 'model': {model!r} is not a profile, a local folder, a hub id or an http(s) URL; "
                f"create the profile with `arle model setup --name {model} --base-url URL --model NAME "
                "--api-key-env VAR`, or set model to the endpoint's URL"
            ) from None
        raise ValueError(f"param 'model' {model!r}: {exc}") from None
    store = JudgeCache(config.cache_dir() / "judge") if cache else None
    return JudgeReward(spec, rubric, parsed, threshold, concurrency, max_tokens, temperature, store)
