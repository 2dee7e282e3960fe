"""Benchmark cards: the YAML schema, parsed into dataclasses, and the prompt they render.

A card is data, not code. It composes a source (where rows come from), a field map or
transform (how a row becomes a Task), a prompt, an env kind, a reward and its metrics.
Every validation error names the file, the field and the fix, and exits 2 via UserError.
This module checks a card's structure; what it names (reward params, metrics, env params)
is held to the plugins' declarations by catalog.py, which sits above the plugins. The prompt
a card renders for a task (`render_prompt`) is here, beside the card, for every env to use.

    name: gsm8k
    version: 1
    category: math
    description: Grade-school math word problems ...
    source:
      kind: hub                  # hub | files | package | generator
      path: openai/gsm8k         # hub id | file path | "package:resource" | generator name
      config: main               # or a list of configs, concatenated (rows tagged `config`)
      splits: {test: test, train: train}   # arle split -> source split (or {seed, size})
      default_split: test
      params: {}                 # hub: extra datasets.load_dataset kwargs (data_files, revision);
                                 # generator: the generator's parameters
    fields: {input: question, target: answer}   # Task field <- row column
    transform: null              # optional: a row -> row function (named as below)
    prompt:
      format: completion         # completion (raw text) | chat (messages)
      system: null
      template: "Question: {input}\\nAnswer:"
      fewshot: {split: train, n: 5, target: " {target}", separator: "\\n\\n",
                sampler: default, seed: 1234}   # first_n (default) | default: lm-eval's seeded
                                                # draw per task; or ids: [2, 3, 4] (see fewshot.py)
      stop: ["Question:"]
      max_tokens: 256
    env: single_turn             # or {name: tools, params: {tools: [python], max_turns: 4}}
    reward: {name: gsm8k, params: {}}
    metrics: [strict_match, flexible_extract]   # names the reward declares, accuracy, pass@k
    group_by: null               # a Task field to break metrics down by (e.g. subject)
    fixture: fixtures/gsm8k.jsonl
    loglikelihood: null          # multiple choice scored as an lm-eval task (`--scoring loglikelihood`):
                                 # {task, transform, text, choices, gold, fewshot, metrics}; see
                                 # Loglikelihood below and benchmarks/arc_easy.yaml

The code a card names (reward, env, a tools env's tools, transform, a generator's
`source.path`, a rollout env's function) is a registered name (`gsm8k`), "module:attr" or
"file.py:attr", a file relative to the card's folder (arlecli/plugins.py).
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.types import Task

SOURCE_KINDS = ("hub", "files", "package", "generator")
PROMPT_FORMATS = ("completion", "chat")
CATEGORIES = ("math", "code", "multiple_choice", "qa", "instruction_following", "procedural", "agent")


@dataclass
class Source:
    """Where rows come from. `splits` maps an arle split name to the source's own split."""

    kind: str
    path: str
    config: str | list[str] | None = None
    splits: dict[str, Any] = field(default_factory=dict)
    default_split: str = "test"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class FewShot:
    """How exemplars are drawn and rendered: `n` rows of `split`, chosen by `sampler`
    (`first_n`, or lm-eval's seeded `default` draw per task) or listed by `ids` (see
    arlecli/fewshot.py)."""

    split: str | None = None
    n: int = 0
    target: str = " {target}"
    separator: str = "\n\n"
    sampler: str = "first_n"
    seed: int = 1234
    ids: list[str] | None = None


@dataclass
class Prompt:
    """How a Task becomes what the model sees."""

    format: str = "chat"
    template: str = "{input}"
    system: str | None = None
    fewshot: FewShot = field(default_factory=FewShot)
    stop: list[str] = field(default_factory=list)
    max_tokens: int = 512


FEWSHOT_SAMPLERS = ("first_n", "default")  # arlecli/fewshot.py; lm-eval's sampler names
LOGLIK_METRICS = ("acc", "acc_norm", "acc_bytes")
LOGLIK_SAMPLERS = ("first_n", "default")
SCORINGS = ("generate", "loglikelihood")


@dataclass
class Loglikelihood:
    """lm-eval's `multiple_choice` scoring of a card (`arle eval --scoring loglikelihood`).

    The keys mirror the lm-eval task YAML it reproduces: `text` is doc_to_text (a `{column}`
    template), `choices` doc_to_choice (a column holding the options, or a literal list),
    `gold` doc_to_target (a column holding the gold index or the gold option's text, or a
    literal index). Partial scoring (winogrande) sets `contexts` (a column holding one
    context per option) and `continuation` (the template of the text scored after each)
    instead of `text`. `transform` is lm-eval's process_docs: applied to the raw rows in
    place of the card's own transform. Few-shot: `split`, `n`, lm-eval's sampler
    (`first_n`, or `default`: a Random(1234) draw per document in order) and `by`, a column
    exemplars must share with the document (MMLU: per-subject 5-shot from dev).
    `exclude_doc`: the default sampler draws n + 1 and drops the document itself, as lm-eval
    does for a task whose few-shot split "equals" its test split (both unset: hellaswag ...).
    """

    task: str
    text: str = "{input}"
    choices: str | list[str] = "choices"
    gold: str | int = "gold"
    contexts: str | None = None
    continuation: str | None = None
    transform: str | None = None
    description: str = ""
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    fewshot_split: str | None = None
    fewshot_n: int = 0
    fewshot_sampler: str = "default"
    fewshot_by: str | None = None
    fewshot_exclude_doc: bool = False
    metrics: list[str] = field(default_factory=lambda: ["acc", "acc_norm"])
    default: bool = False


@dataclass
class Card:
    """A parsed, validated benchmark card."""

    name: str
    description: str
    category: str
    source: Source
    reward: str
    reward_params: dict[str, Any]
    version: int = 1
    fields: dict[str, str] = field(default_factory=dict)
    transform: str | None = None
    prompt: Prompt = field(default_factory=Prompt)
    env: str = "single_turn"
    env_params: dict[str, Any] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    group_by: str | None = None
    fixture: str | None = None
    loglikelihood: Loglikelihood | None = None
    path: Path | None = None
    hash: str = ""

    @property
    def default_scoring(self) -> str:
        """ "loglikelihood" where the card makes lm-eval's scoring its default, else "generate"."""
        return "loglikelihood" if self.loglikelihood and self.loglikelihood.default else "generate"

    @property
    def fixture_path(self) -> Path | None:
        """The fixture file, resolved next to the card."""
        if not self.fixture or self.path is None:
            return None
        return self.path.parent / self.fixture


def card_error(path: Path | str, fld: str, msg: str) -> UserError:
    return UserError(f"{path}: field '{fld}': {msg}")


def _take(
    d: dict[str, Any],
    key: str,
    typ: type | tuple[type, ...],
    path: Path | str,
    where: str,
    default: Any = ...,
    required: bool = False,
) -> Any:
    fld = f"{where}.{key}" if where else key
    if key not in d or d[key] is None:
        if required:
            raise card_error(path, fld, "is missing; add it to the card")
        return None if default is ... else default
    val = d[key]
    # YAML's `true` is an int to Python; a count or a size given `true` is a mistake.
    wants_bool = typ is bool or (isinstance(typ, tuple) and bool in typ)
    if not isinstance(val, typ) or (isinstance(val, bool) and not wants_bool):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise card_error(path, fld, f"must be {names}, got {type(val).__name__} ({val!r})")
    return val


def _check_unknown(d: dict[str, Any], allowed: set[str], path: Path | str, where: str) -> None:
    import difflib

    for key in d:
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1) if isinstance(key, str) else []
            hint = f"; did you mean '{near[0]}'?" if near else f"; allowed: {', '.join(sorted(allowed))}"
            raise card_error(path, f"{where}.{key}" if where else key, f"is not a card field{hint}")


def _one_of(val: str, choices: tuple[str, ...], path: Path | str, fld: str) -> str:
    if val not in choices:
        raise card_error(path, fld, f"'{val}' is not one of: {', '.join(choices)}")
    return val


def parse_card(data: Any, path: Path | str) -> Card:
    """Validate a card's YAML data. Raises UserError naming the file, field and fix."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: a card must be a YAML mapping with name, source, reward, ...")
    _check_unknown(
        data,
        {
            "name",
            "version",
            "description",
            "category",
            "source",
            "fields",
            "transform",
            "prompt",
            "env",
            "reward",
            "metrics",
            "group_by",
            "fixture",
            "loglikelihood",
        },
        path,
        "",
    )
    name = _take(data, "name", str, path, "", required=True)
    category = _one_of(_take(data, "category", str, path, "", required=True), CATEGORIES, path, "category")

    src = _take(data, "source", dict, path, "", required=True)
    _check_unknown(src, {"kind", "path", "config", "splits", "default_split", "params"}, path, "source")
    source = Source(
        kind=_one_of(_take(src, "kind", str, path, "source", required=True), SOURCE_KINDS, path, "source.kind"),
        path=_take(src, "path", str, path, "source", required=True),
        config=_take(src, "config", (str, list), path, "source"),
        splits=_take(src, "splits", dict, path, "source", default={}),
        default_split=_take(src, "default_split", str, path, "source", default="test"),
        params=_take(src, "params", dict, path, "source", default={}),
    )
    if source.splits and source.default_split not in source.splits:
        raise card_error(
            path,
            "source.default_split",
            f"'{source.default_split}' is not in source.splits ({', '.join(source.splits)})",
        )

    pr = _take(data, "prompt", dict, path, "", default={})
    _check_unknown(pr, {"format", "template", "system", "fewshot", "stop", "max_tokens"}, path, "prompt")
    fs = _take(pr, "fewshot", dict, path, "prompt", default={})
    _check_unknown(fs, {"split", "n", "target", "separator", "sampler", "seed", "ids"}, path, "prompt.fewshot")
    fs_ids = _take(fs, "ids", list, path, "prompt.fewshot")
    prompt = Prompt(
        format=_one_of(_take(pr, "format", str, path, "prompt", default="chat"), PROMPT_FORMATS, path, "prompt.format"),
        template=_take(pr, "template", str, path, "prompt", default="{input}"),
        system=_take(pr, "system", str, path, "prompt"),
        fewshot=FewShot(
            split=_take(fs, "split", str, path, "prompt.fewshot"),
            n=_take(fs, "n", int, path, "prompt.fewshot", default=len(fs_ids or [])),
            target=_take(fs, "target", str, path, "prompt.fewshot", default=" {target}"),
            separator=_take(fs, "separator", str, path, "prompt.fewshot", default="\n\n"),
            sampler=_one_of(
                _take(fs, "sampler", str, path, "prompt.fewshot", default="first_n"),
                FEWSHOT_SAMPLERS,
                path,
                "prompt.fewshot.sampler",
            ),
            seed=_take(fs, "seed", int, path, "prompt.fewshot", default=1234),
            ids=None if fs_ids is None else [str(i) for i in fs_ids],
        ),
        stop=list(_take(pr, "stop", list, path, "prompt", default=[])),
        max_tokens=_take(pr, "max_tokens", int, path, "prompt", default=512),
    )
    for i, stop in enumerate(prompt.stop):
        if not isinstance(stop, str) or not stop:
            raise card_error(
                path, f"prompt.stop[{i}]", f"must be a non-empty string, got {stop!r}; quote it in the card"
            )
    if prompt.max_tokens <= 0:
        raise card_error(path, "prompt.max_tokens", f"must be at least 1, got {prompt.max_tokens}")
    if prompt.fewshot.n < 0:
        raise card_error(path, "prompt.fewshot.n", f"must be 0 or more, got {prompt.fewshot.n}")
    if source.kind == "generator":
        _check_generator_splits(source, path)
    if prompt.fewshot.n and not prompt.fewshot.split:
        raise card_error(path, "prompt.fewshot.split", "is missing; few-shot exemplars need a split to come from")
    if prompt.fewshot.ids is not None and prompt.fewshot.n > len(prompt.fewshot.ids):
        raise card_error(
            path,
            "prompt.fewshot.n",
            f"is {prompt.fewshot.n} but `ids` lists {len(prompt.fewshot.ids)}; list more ids or lower n",
        )

    rw = _take(data, "reward", (dict, str), path, "", required=True)
    if isinstance(rw, str):
        rw = {"name": rw}
    _check_unknown(rw, {"name", "params"}, path, "reward")
    env = _take(data, "env", (dict, str), path, "", default="single_turn")
    if isinstance(env, str):
        env = {"name": env}
    _check_unknown(env, {"name", "params"}, path, "env")
    fields = _take(data, "fields", dict, path, "", default={})
    _check_unknown(fields, {"id", "input", "target"}, path, "fields")
    card = Card(
        name=name,
        version=_take(data, "version", int, path, "", default=1),
        description=_take(data, "description", str, path, "", default="").strip(),
        category=category,
        source=source,
        fields={k: str(v) for k, v in fields.items()},
        transform=_take(data, "transform", str, path, ""),
        prompt=prompt,
        env=_take(env, "name", str, path, "env", required=True),
        env_params=_take(env, "params", dict, path, "env", default={}),
        reward=_take(rw, "name", str, path, "reward", required=True),
        reward_params=_take(rw, "params", dict, path, "reward", default={}),
        metrics=[str(m) for m in _take(data, "metrics", list, path, "", default=[])],
        group_by=_take(data, "group_by", str, path, ""),
        fixture=_take(data, "fixture", str, path, ""),
        loglikelihood=_parse_loglikelihood(_take(data, "loglikelihood", dict, path, ""), path),
        path=Path(path) if not isinstance(path, Path) else path,
    )
    _anchor_plugins(card)
    return card


def _anchor_plugins(card: Card) -> None:
    """Make each `file.py:attr` the card names (reward, env, transform, generator) absolute
    against the card's folder, so every later lookup finds the file wherever it runs from."""
    from arlecli.plugins import anchor

    base = card.path.parent if card.path is not None else None
    card.reward, card.env = anchor(card.reward, base), anchor(card.env, base)
    card.transform = anchor(card.transform, base) if card.transform else card.transform
    if card.loglikelihood is not None and card.loglikelihood.transform:
        card.loglikelihood.transform = anchor(card.loglikelihood.transform, base)
    if card.source.kind == "generator":
        card.source.path = anchor(card.source.path, base)


def _parse_loglikelihood(ll: dict[str, Any] | None, path: Path | str) -> Loglikelihood | None:
    """The card's `loglikelihood:` block (see `Loglikelihood`), validated; None when absent."""
    if ll is None:
        return None
    where = "loglikelihood"
    _check_unknown(
        ll,
        {
            "task",
            "text",
            "choices",
            "gold",
            "contexts",
            "continuation",
            "transform",
            "description",
            "target_delimiter",
            "fewshot_delimiter",
            "fewshot",
            "metrics",
            "default",
        },
        path,
        where,
    )
    fs = _take(ll, "fewshot", dict, path, where, default={})
    _check_unknown(fs, {"split", "n", "sampler", "by", "exclude_doc"}, path, f"{where}.fewshot")
    spec = Loglikelihood(
        task=_take(ll, "task", str, path, where, required=True),
        text=_take(ll, "text", str, path, where, default="{input}"),
        choices=_take(ll, "choices", (str, list), path, where, default="choices"),
        gold=_take(ll, "gold", (str, int), path, where, default="gold"),
        contexts=_take(ll, "contexts", str, path, where),
        continuation=_take(ll, "continuation", str, path, where),
        transform=_take(ll, "transform", str, path, where),
        description=_take(ll, "description", str, path, where, default=""),
        target_delimiter=_take(ll, "target_delimiter", str, path, where, default=" "),
        fewshot_delimiter=_take(ll, "fewshot_delimiter", str, path, where, default="\n\n"),
        fewshot_split=_take(fs, "split", str, path, f"{where}.fewshot"),
        fewshot_n=_take(fs, "n", int, path, f"{where}.fewshot", default=0),
        fewshot_sampler=_one_of(
            _take(fs, "sampler", str, path, f"{where}.fewshot", default="default"),
            LOGLIK_SAMPLERS,
            path,
            f"{where}.fewshot.sampler",
        ),
        fewshot_by=_take(fs, "by", str, path, f"{where}.fewshot"),
        fewshot_exclude_doc=_take(fs, "exclude_doc", bool, path, f"{where}.fewshot", default=False),
        metrics=[str(m) for m in _take(ll, "metrics", list, path, where, default=["acc", "acc_norm"])],
        default=_take(ll, "default", bool, path, where, default=False),
    )
    for m in spec.metrics:
        _one_of(m, LOGLIK_METRICS, path, f"{where}.metrics")
    if isinstance(spec.choices, list) and not all(isinstance(c, str) for c in spec.choices):
        raise card_error(path, f"{where}.choices", "a literal list of options must hold strings; quote them")
    if (spec.contexts is None) != (spec.continuation is None):
        raise card_error(path, f"{where}.contexts", "partial scoring needs both `contexts` and `continuation`")
    if spec.fewshot_n < 0:
        raise card_error(path, f"{where}.fewshot.n", f"must be 0 or more, got {spec.fewshot_n}")
    if spec.fewshot_n and not spec.fewshot_split:
        raise card_error(path, f"{where}.fewshot.split", "is missing; few-shot exemplars need a split to come from")
    return spec


def _check_generator_splits(source: Source, path: Path | str) -> None:
    """Each split of a generator source is {seed, size}: whole numbers, size at least 1."""
    for split, spec in source.splits.items():
        fld = f"source.splits.{split}"
        if not isinstance(spec, dict) or "seed" not in spec or "size" not in spec:
            raise card_error(path, fld, f"a generator split needs {{seed, size}}, got {spec!r}")
        for key in ("seed", "size"):
            val = spec[key]
            if not isinstance(val, int) or isinstance(val, bool):
                raise card_error(path, f"{fld}.{key}", f"must be a whole number, got {type(val).__name__} ({val!r})")
        if spec["size"] < 1:
            raise card_error(path, f"{fld}.size", f"must be at least 1, got {spec['size']}")
        if spec["seed"] < 0:
            raise card_error(path, f"{fld}.seed", f"must be 0 or more, got {spec['seed']}")


MAX_CARD_BYTES = 4 << 20  # a card is settings and templates; its data lives in files it names


def read_card_file(path: Path) -> Card:
    """Read and parse one card file (its structure; catalog.load_card_file also holds what it
    names to the plugins' declarations); its hash covers the file's exact bytes.

    The YAML goes through `safeio.load_yaml`: an alias (a "billion laughs" description) or
    nesting past safeio.MAX_DEPTH is a one-line error like any other YAML mistake."""
    raw = safeio.read_bytes(path, "card", max_bytes=MAX_CARD_BYTES)
    text = safeio.decode(raw, path, "card")
    try:
        data = safeio.load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    card = parse_card(data, path)
    card.hash = hashlib.sha256(raw).hexdigest()[:16]
    return card


# ---------------------------------------------------------------- the prompt a card renders

# What the model sees: a raw prompt string (`format: completion`) or chat messages (`format: chat`).
Rendered = str | list[dict[str, Any]]


def _context(task: Task) -> dict[str, Any]:
    return {**task.fields, "input": task.input, "target": task.target, "id": task.id}


def fill(template: str, task: Task, where: str = "prompt.template") -> str:
    """Fill `{column}` placeholders from the task; an unknown column names the card field.

    Only plain names: str.format's attribute and index access (`{input.__class__}`),
    conversions and format specs (`{id:>999999999}`: a gigabyte of padding) are refused. A card
    is data; its template must not reach into Python objects or size its own output."""
    ctx = _context(task)
    parts = []
    try:
        for literal, name, spec, conversion in string.Formatter().parse(template):
            parts.append(literal)
            if name is None:
                continue
            column, items = _placeholder(name)
            if column is None or spec or conversion:
                shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise UserError(
                    f"card field '{where}' uses {{{shown}}}: only {{column}} and {{column[item]}} placeholders "
                    "are filled (no attributes, conversions or format specs); use {{ }} for literal braces"
                )
            if column not in ctx:
                raise UserError(
                    f"card field '{where}' uses {{{name}}}, which is not a column of the rows "
                    f"(columns: {', '.join(sorted(ctx))}); use {{{{ }}}} for literal braces"
                )
            value = ctx[column]
            for item in items:  # a row's list or mapping, as lm-eval's `{choices[0]}`
                try:
                    value = value[int(item)] if item.isdigit() else value[item]
                except (IndexError, KeyError, TypeError):
                    raise UserError(f"card field '{where}' uses {{{name}}}, which a row does not hold") from None
            parts.append(str(value))
    except ValueError as exc:  # an unmatched brace
        raise UserError(f"card field '{where}' is not a valid template: {exc}") from None
    return "".join(parts)


_PLACEHOLDER = re.compile(r"([^.\[\]!:]+)((?:\[[^.\[\]]+\])*)")


def _placeholder(name: str) -> tuple[str | None, list[str]]:
    """A placeholder's column and item keys (`choices[0]`: choices, ["0"]); (None, []) for
    anything else str.format would take: attributes (`input.__class__`), positions (`0`, ``)."""
    found = _PLACEHOLDER.fullmatch(name)
    if found is None or found.group(1).isdigit():
        return None, []
    return found.group(1), re.findall(r"\[([^\]]+)\]", found.group(2))


def render_prompt(prompt: Prompt, task: Task, exemplars: list[Task] | None = None) -> Rendered:
    """What the model sees for `task` under the card's `prompt`, with `exemplars` rendered as
    solved examples first (chat: alternating turns, lm-eval's fewshot_as_multiturn)."""
    exemplars = exemplars or []
    if prompt.format == "completion":
        shots = [
            fill(prompt.template, ex) + fill(prompt.fewshot.target, ex, "prompt.fewshot.target") for ex in exemplars
        ]
        body = prompt.fewshot.separator.join([*shots, fill(prompt.template, task)])
        return f"{prompt.system}\n\n{body}" if prompt.system else body
    messages: list[dict[str, Any]] = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system})
    for ex in exemplars:
        messages.append({"role": "user", "content": fill(prompt.template, ex)})
        messages.append(
            {"role": "assistant", "content": fill(prompt.fewshot.target, ex, "prompt.fewshot.target").strip()}
        )
    messages.append({"role": "user", "content": fill(prompt.template, task)})
    return messages
