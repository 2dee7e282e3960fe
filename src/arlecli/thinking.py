"""Thinking: what a reasoning model writes before its answer, kept apart from the answer.

Models that think (Qwen3, QwQ, DeepSeek-R1 and its distills, Phi-4-reasoning, Magistral)
write `<think> ... </think>` and then the answer, or an endpoint's reasoning parser hands the
thinking back in its own field (`reasoning_content` / `reasoning` beside `content`, as vLLM's
and SGLang's do). Either way a turn records the two apart (`split`):

- the thinking is part of what the model generated: it stays in the turn's token ids, so
  training learns it, and it is recorded (samples.jsonl, the report, SFT rows);
- the answer is what every reward scores and every environment reads (a tool call or a move
  written inside a thought is not one);
- a turn that ends inside its thinking (its token budget ran out, or it stopped, before the
  end tag) has no answer: it is scored wrong with nothing extracted, and counted. Without this
  an extractor finds "the answer is (B)" in an unfinished thought and scores it.

The delimiters come from the model: a tokenizer that has the tags as tokens of their own
(`detect`), else `<think>`/`</think>` (`DEFAULT`), or what the profile or `--think-tags
START,END` says; `--think-tags none` turns splitting off for a model whose text may contain
the literal tag. Where a chat template opens the thought itself (DeepSeek-R1's generation
prompt ends with `<think>\\n`), the text starts inside it: the prompt says so (`opened`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlecli.errors import UserError


@dataclass(frozen=True)
class ThinkTags:
    """The strings that open and close a thought."""

    start: str
    end: str

    def option(self) -> str:
        """As `--think-tags` takes it."""
        return f"{self.start},{self.end}"


DEFAULT = ThinkTags("<think>", "</think>")
# Tags of their own in some tokenizers (Magistral's), checked before DEFAULT.
KNOWN = (DEFAULT, ThinkTags("[THINK]", "[/THINK]"), ThinkTags("<|begin_of_thought|>", "<|end_of_thought|>"))
NONE = "none"


def parse_option(value: str | None, where: str = "--think-tags") -> ThinkTags | str | None:
    """`--think-tags` (or a profile's `think_tags`): None (not given: detect), "none" (never
    split), or START,END (two non-empty strings that differ). UserError for anything else."""
    if value is None or value == "":
        return None
    if value.strip().lower() == NONE:
        return NONE
    parts = value.split(",")
    if len(parts) != 2 or not all(p.strip() for p in parts) or parts[0].strip() == parts[1].strip():
        raise UserError(
            f"{where} must be START,END (two different tags, e.g. '<think>,</think>') or 'none'; got {value!r}"
        )
    return ThinkTags(parts[0].strip(), parts[1].strip())


def detect(tokenizer: Any) -> ThinkTags | None:
    """The tags a tokenizer declares as tokens of their own (Qwen3, R1 distills, QwQ: `<think>`),
    or None when it has none (the model may still write DEFAULT's as plain text)."""
    vocab = _vocab(tokenizer)
    for tags in KNOWN:
        if tags.start in vocab and tags.end in vocab:
            return tags
    return None


def _vocab(tokenizer: Any) -> set[str]:
    try:
        added = set(tokenizer.get_added_vocab())
    except Exception:
        added = set()
    template = getattr(tokenizer, "chat_template", None)
    text = template if isinstance(template, str) else ""
    # A tag the template writes counts as declared too (some ship `<think>` as plain text).
    return added | {t for tags in KNOWN for t in (tags.start, tags.end) if t in text}


def resolve(option: ThinkTags | str | None, tokenizer: Any = None) -> ThinkTags | None:
    """The tags to split with: the option's, else the tokenizer's own, else DEFAULT; None for
    "none"."""
    if option == NONE:
        return None
    if isinstance(option, ThinkTags):
        return option
    return (detect(tokenizer) if tokenizer is not None else None) or DEFAULT


def declared(option: ThinkTags | str | None, tokenizer: Any) -> bool:
    """Whether the model is known to think: tags given, or declared by its tokenizer."""
    return isinstance(option, ThinkTags) or (option != NONE and tokenizer is not None and detect(tokenizer) is not None)


@dataclass(frozen=True)
class Split:
    """One turn's text taken apart: `thinking` (None: the model did not think), `answer` (""
    when there is none), `cut` (the model thought and gave no answer: the turn ended inside
    its thinking, or right after it)."""

    thinking: str | None
    answer: str
    cut: bool = False


def split(text: str, tags: ThinkTags | None, *, reasoning: str | None = None, opened: bool = False) -> Split:
    """Take a turn's `text` apart into thinking and answer.

    `reasoning` is an endpoint's separate reasoning field: then `text` is the answer already
    (and an empty answer after reasoning is a cut thought). `opened` says the prompt ended
    with the start tag, so the text begins inside the thought. Otherwise a thought is a text
    that starts (after whitespace) with the start tag, or one that holds the end tag with no
    start tag before it (a template opened it and the prompt was not seen: an endpoint).
    The answer is what follows the first end tag, the line breaks after the tag dropped."""
    if reasoning is not None:
        return Split(reasoning, text, cut=not text.strip())
    if tags is None:
        return Split(None, text)
    body = text.lstrip()
    if body.startswith(tags.start):
        rest = body[len(tags.start) :]
    elif opened or (tags.end in text and tags.start not in text.split(tags.end, 1)[0]):
        rest = text
    else:
        return Split(None, text)
    if tags.end not in rest:
        return Split(_thought(rest), "", cut=True)
    thought, answer = rest.split(tags.end, 1)
    # Only the line breaks after the tag go: an answer's own indentation (a function body in
    # completion format) is part of it.
    answer = answer.lstrip("\r\n")
    return Split(_thought(thought), answer, cut=not answer.strip())


def _thought(text: str) -> str:
    return text.strip("\n")


def answer_start(text: str, tags: ThinkTags | None, *, opened: bool = False) -> int | None:
    """Where the answer begins in `text` as generated so far, by `split`'s rules: 0 when the
    text is no thought (yet), just past the end tag when its thought is closed, None while it is
    inside an open thought. What cuts at stop strings uses it to cut the answer only
    (engine.base.cut_answer_at_stop, engine.phases)."""
    if tags is None:
        return 0
    body = text.lstrip()
    if body.startswith(tags.start):
        at = text.find(tags.end, len(text) - len(body) + len(tags.start))
    elif opened or (tags.end in text and tags.start not in text.split(tags.end, 1)[0]):
        at = text.find(tags.end)
    else:
        return 0
    return None if at < 0 else at + len(tags.end)


def prompt_opens(tokenizer: Any, prompt_ids: list[int] | None, tags: ThinkTags | None) -> bool:
    """Whether the rendered prompt ends with the start tag (a template that opens the thought
    for the model, as DeepSeek-R1's does)."""
    if tags is None or not prompt_ids or tokenizer is None:
        return False
    tail = tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
    return tail.rstrip().endswith(tags.start)


def thinking_token_count(
    tokenizer: Any, token_ids: list[int], tags: ThinkTags | None, thinking: str | None, cut: bool
) -> int | None:
    """How many of a turn's generated ids are thinking (through the end tag): all of them for a
    cut thought, None when the turn did not think or the ids are unknown (an endpoint)."""
    if thinking is None or not token_ids or tokenizer is None or tags is None:
        return None
    if cut:
        return len(token_ids)
    end_id = _single_token(tokenizer, tags.end)
    if end_id is not None and end_id in token_ids:
        return token_ids.index(end_id) + 1
    # The shortest prefix whose text holds the end tag (decode grows with the prefix, so bisect).
    lo, hi = 1, len(token_ids)
    if tags.end not in tokenizer.decode(token_ids, skip_special_tokens=False):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if tags.end in tokenizer.decode(token_ids[:mid], skip_special_tokens=False):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _single_token(tokenizer: Any, tag: str) -> int | None:
    # The tag's id where the tokenizer has it as one token of its own (Qwen3's `</think>`).
    try:
        ids = tokenizer.encode(tag, add_special_tokens=False)
    except Exception:
        return None
    return ids[0] if len(ids) == 1 else None


_UNSET: Any = object()


def configure(engine: Any, option: ThinkTags | str | None) -> Any:
    """Give `engine` its `think_tags` (the option's, else its tokenizer's, else DEFAULT) and
    `thinks` (whether the model is known to think: `declared`), and return it; `make_engine`
    and the training engines (train.batches.PolicyBackend) call this for every engine they build."""
    tokenizer = getattr(engine, "tokenizer", None)
    engine.think_tags = resolve(option, tokenizer)
    engine.thinks = declared(option, tokenizer)
    return engine


def thinks(engine: Any) -> bool:
    """Whether `engine`'s model is known to think (see `configure`): what budget forcing and
    answer-only stops need (engine.phases); an engine built without `configure` asks its
    tokenizer."""
    known = getattr(engine, "thinks", _UNSET)
    return declared(None, getattr(engine, "tokenizer", None)) if known is _UNSET else bool(known)


def check_budget(max_thinking_tokens: int | None, model_thinks: bool, model: str) -> None:
    """Refuse `--max-thinking-tokens` for a model not known to think: there is no thought to
    bound (a plain model's answer would be cut instead), so it is a mistake, not a no-op."""
    if max_thinking_tokens is not None and not model_thinks:
        raise UserError(
            f"--max-thinking-tokens: {model} is not known to think (its tokenizer declares no "
            "think tags); pass --think-tags START,END if it writes its thinking between them, "
            "or drop --max-thinking-tokens"
        )


def check_budget_before_load(spec: Any, max_thinking_tokens: int | None) -> None:
    """`check_budget` for a model spec (models.ModelSpec) before any weights load: a local or
    hub model's tokenizer says whether it thinks (an endpoint has none here, as its engine has
    none), so a misplaced --max-thinking-tokens is one line before the run loads anything."""
    if max_thinking_tokens is None:
        return
    tokenizer = None
    if spec.kind == "hf" and spec.path_or_id:
        from transformers import AutoTokenizer  # seconds: only when a thinking budget is asked for

        try:
            tokenizer = AutoTokenizer.from_pretrained(spec.path_or_id)
        except (OSError, ValueError):
            return  # no tokenizer to ask: loading the model will say what is wrong with it
    check_budget(max_thinking_tokens, declared(parse_option(spec.think_tags, "--think-tags"), tokenizer), spec.name)


def tags_for(engine: Any) -> ThinkTags | None:
    """The tags `engine`'s model thinks in (see `configure`); an engine built without
    `make_engine` gets its tokenizer's own, else DEFAULT."""
    tags = getattr(engine, "think_tags", _UNSET)
    return resolve(None, getattr(engine, "tokenizer", None)) if tags is _UNSET else tags
