"""lm-eval parity for the generative cards: arle's prompts against lm-eval 0.4.13's own tasks.

Each card whose description names an lm-eval task is listed in exactly one table below
(the multiple-choice cards are in test_lmeval_parity_mc.py). The fixture rows go through
arle (card transform, prompt, few-shot selection, as `arle eval` loads them) and through
lm-eval's task YAML with its dataset swapped for the same rows (tests/helpers/lmeval_local.py), and:

- PARITY (the card follows the lm-eval task): the prompt is identical, byte for byte. For a
  `completion` card that is the text the model continues, exemplars and separators
  included; for a `chat` card it is the chat messages, which lm-eval builds with
  `--apply_chat_template` and hands to the model's chat template exactly as arle does, so
  one chat template renders both the same. Few-shot exemplars are the same rows in the same
  order (lm-eval's sampler with its seed 1234), and stop sequences and max new tokens
  equal lm-eval's `until` and `max_gen_toks` (256 when the YAML sets none).
- DEVIATIONS (the card differs from the lm-eval task on purpose): its description says
  so, in the words listed, and what still matches (eval rows, gold answers) is asserted.
- NOT_CLAIMED: the description mentions lm-eval only to say the card is not an lm-eval task.
No model is needed: this compares what would be sent to one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest

from arlecli.cards import Card
from arlecli.data.sources import pulled_path, read_rows_file, tasks_from_rows
from arlecli.envs import make_env
from arlecli.eval import EvalOptions, load_tasks
from arlecli.fewshot import exemplars_for
from arlecli.catalog import list_cards, load_card
from arlecli.types import Task

from helpers.lmeval_local import lmeval_docs  # noqa: E402

pytest.importorskip("lm_eval")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
FIXTURES = BENCHMARKS / "fixtures"
DEFAULT_MAX_GEN_TOKS = 256  # lm_eval.defaults.DEFAULT_MAX_GEN_TOKS: a task YAML without max_gen_toks

# card -> (lm-eval task, its folder under lm_eval/tasks, {lm-eval split: fixture file or
# "fixture"}, {card few-shot split: fixture file}, chat?)
PARITY: dict[str, dict[str, Any]] = {
    "gsm8k": dict(
        task="gsm8k",
        folder="gsm8k",
        lm_splits={"train": "gsm8k.train.jsonl", "test": "fixture"},
        arle_fewshot={"train": "gsm8k.train.jsonl"},
        shot_key="question",
    ),
    "gsm8k_cot": dict(task="gsm8k_cot", folder="gsm8k", lm_splits={"test": "fixture"}, embedded_shots=8),
    # lm-eval's exemplars are task ids 2-4, hard-coded in its utils.py; arle picks them by id
    # from the "prompt" split (fixture: that split's real rows 1-4, so first-n would differ).
    "mbpp": dict(
        task="mbpp",
        folder="mbpp",
        lm_splits={"test": "fixture"},
        arle_fewshot={"prompt": "mbpp.prompt.jsonl"},
        shot_key="task_id",
    ),
    "humaneval": dict(task="humaneval", folder="humaneval", lm_splits={"test": "fixture"}, shot_key="task_id"),
    "humaneval_plus": dict(
        task="humaneval_plus", folder="humaneval", lm_splits={"test": "fixture"}, shot_key="task_id"
    ),
    "ifeval": dict(task="ifeval", folder="ifeval", lm_splits={"train": "fixture"}, chat=True, shot_key="key"),
}


def _fixture(card: Card) -> list[dict[str, Any]]:
    return read_rows_file(card.fixture_path)


def _tasks(card: Card) -> list[Task]:
    return tasks_from_rows(card, _fixture(card), "fixture")


def _rows(card: Card, name: str) -> list[dict[str, Any]]:
    return _fixture(card) if name == "fixture" else read_rows_file(FIXTURES / name)


def _pull(card: Card, split: str, rows: list[dict[str, Any]]) -> None:
    """Put `rows` where `arle data pull` keeps the card's split, so load_tasks reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = pulled_path(card, str(card.source.splits.get(split, split)))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _arle(card: Card, spec: dict[str, Any], limit: int | None = None) -> tuple[list[Task], list[Any], Any]:
    """arle's tasks, what each renders to and the exemplars, as `arle eval --data FIXTURE` loads them."""
    for split, name in spec.get("arle_fewshot", {}).items():
        _pull(card, split, read_rows_file(FIXTURES / name))
    tasks, exemplars = load_tasks(card, EvalOptions(data=str(card.fixture_path), limit=limit))
    rendered = [make_env(card, t, exemplars_for(exemplars, t)).reset() for t in tasks]
    return tasks, rendered, exemplars


def _lmeval(card: Card, spec: dict[str, Any]) -> list[Any]:
    splits = {split: _rows(card, name) for split, name in spec["lm_splits"].items()}
    return lmeval_docs(spec["task"], splits, folder=spec["folder"], chat=spec.get("chat", False))


@pytest.mark.parametrize("name", sorted(PARITY))
def test_prompts_exemplars_stops_and_max_tokens_match_lmeval(name: str):
    card, spec = load_card(name), PARITY[name]
    tasks, rendered, exemplars = _arle(card, spec)
    docs = _lmeval(card, spec)
    assert len(docs) == len(tasks) >= 3
    for task, mine, doc in zip(tasks, rendered, docs):
        if card.prompt.format == "chat":
            assert mine == doc.messages, f"{name} {task.id}: chat messages differ from lm-eval's"
        else:
            assert mine == doc.context, f"{name} {task.id}: prompt differs from lm-eval's"
        shots = exemplars_for(exemplars, task)
        if "embedded_shots" in spec:  # arle's card writes lm-eval's fixed exemplars into the template
            assert not shots and len(doc.fewshot) == spec["embedded_shots"]
        else:
            key = spec["shot_key"]
            assert [str(s.fields[key]) for s in shots] == [str(d[key]) for d in doc.fewshot], (
                f"{name} {task.id}: few-shot exemplars differ from lm-eval's"
            )
            assert len(shots) == card.prompt.fewshot.n
        assert card.prompt.stop == doc.until, f"{name}: stop sequences differ from lm-eval's `until`"
        assert card.prompt.max_tokens == doc.gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)


def test_gsm8k_draws_exemplars_per_question_as_lmeval_seeds_them():
    """lm-eval's default sampler gives each question its own 5 of the train rows; the
    draws depend on the question's position only, so --limit keeps the first ones."""
    card, spec = load_card("gsm8k"), PARITY["gsm8k"]
    tasks, _, exemplars = _arle(card, spec)
    drawn = [tuple(s.input for s in exemplars_for(exemplars, t)) for t in tasks]
    assert len(set(drawn)) > 1, "every question got the same exemplars: not lm-eval's per-question draw"
    train = [r["question"] for r in read_rows_file(FIXTURES / "gsm8k.train.jsonl")]
    assert any(list(d) != train[:5] for d in drawn), "exemplars are the first train rows (first_n)"
    limited, _, few = _arle(card, spec, limit=2)
    assert [tuple(s.input for s in exemplars_for(few, t)) for t in limited] == drawn[:2]


def test_mbpp_exemplars_are_task_ids_2_to_4_not_the_first_rows():
    card = load_card("mbpp")
    tasks, _, exemplars = _arle(card, PARITY["mbpp"])
    assert [s.id for s in exemplars_for(exemplars, tasks[0])] == ["2", "3", "4"]


# --- cards that deviate on purpose ------------------------------------------------------


def _check_targets(convert: Callable[[Task], Any], lm: Callable[[Any], Any]) -> Callable[[list[Task], list[Any]], None]:
    def check(tasks: list[Task], docs: list[Any]) -> None:
        assert len(tasks) == len(docs) >= 3
        for task, doc in zip(tasks, docs):
            assert convert(task) == lm(doc), f"{task.id}: gold {convert(task)!r} vs lm-eval's {lm(doc)!r}"

    return check


def _math_gold(task: Task) -> str:
    from arlecli.rewards.math import gold_text

    return gold_text(task.target)


def _norm_gpqa(text: str) -> str:
    return " ".join(str(text).strip().replace(" [title]", ". ").split())


def _gpqa_check(tasks: list[Task], docs: list[Any]) -> None:
    """Options shuffle differently (lm-eval: the global RNG), so compare sets and gold text."""
    assert len(tasks) == len(docs) >= 3
    for task, doc in zip(tasks, docs):
        lm_gold = doc.doc["choices"]["ABCD".index(doc.target.strip("()"))]
        assert sorted(map(_norm_gpqa, task.fields["choices"])) == sorted(map(_norm_gpqa, doc.doc["choices"]))
        assert _norm_gpqa(task.fields["answer_text"]) == _norm_gpqa(lm_gold)


def _mmlu_pro_check(tasks: list[Task], docs: list[Any]) -> None:
    """Same question and options, lettered A-J in the same order, and the same gold letter."""
    assert len(tasks) == len(docs) >= 3
    for task, doc in zip(tasks, docs):
        assert task.target == doc.target
        lm_options = re.findall(r"^([A-J])\. (.*)$", doc.context.split("Options:\n")[-1], flags=re.M)
        mine = re.findall(r"^([A-J])\. (.*)$", task.fields["choices_text"], flags=re.M)
        assert [(k, v.strip()) for k, v in mine] == lm_options


def _mmlu_pro_docs(card: Card) -> tuple[list[Task], list[Any]]:
    """lm-eval runs one mmlu_pro task per category; each fixture row goes to its own."""
    docs = []
    for row in _fixture(card):
        docs += lmeval_docs(
            f"mmlu_pro_{row['category'].replace(' ', '_')}",
            {"test": [row], "validation": [row]},
            folder="mmlu_pro",
            num_fewshot=0,
        )
    return _tasks(card), docs


def _mmlu_redux_docs(card: Card) -> tuple[list[Task], list[Any]]:
    """lm-eval's generative mmlu_redux reads the "ok" rows only (one task per subject)."""
    pairs = [(t, r) for t, r in zip(_tasks(card), _fixture(card)) if r["error_type"] == "ok"]
    docs = []
    for _, row in pairs:
        docs += lmeval_docs(f"mmlu_redux_{row['config']}_generative", {"test": [row]}, folder="mmlu-redux/generative")
    return [t for t, _ in pairs], docs


def _letters(tasks: list[Task], docs: list[Any]) -> None:
    assert len(tasks) == len(docs) >= 1
    for task, doc in zip(tasks, docs):
        assert task.target == doc.target, f"{task.id}: gold {task.target!r} vs lm-eval's {doc.target!r}"
        assert task.input.strip() in doc.context


def _drop_check(tasks: list[Task], docs: list[Any]) -> None:
    """lm-eval's golds (answer + validated answers, repeats dropped) are arle's, empty ones aside."""
    assert len(tasks) == len(docs) >= 3
    for task, doc in zip(tasks, docs):
        lm = [list(a) for a in doc.doc["answers"] if a and str(a[0]).strip()]
        assert [list(g) for g in task.target] == lm
        assert doc.doc["passage"] in task.fields["passage"] and task.input == doc.doc["question"]


def _mbpp_plus_check(tasks: list[Task], docs: list[Any]) -> None:
    """lm-eval's mbpp_plus runs the three base asserts; arle's test script runs them too."""
    assert len(tasks) == len(docs) >= 3
    for task, doc in zip(tasks, docs):
        for line in doc.doc["test_list"][:3]:
            assert line in doc.context and line in task.fields["test_source"]


def _truthfulqa_check(tasks: list[Task], docs: list[Any]) -> None:
    """Same questions; lm-eval's gen task has no single target (it scores against references)."""
    assert len(tasks) == len(docs) >= 3
    for task, doc in zip(tasks, docs):
        assert doc.context.endswith("Q: " + task.input)
        assert task.target.rstrip(".") + "." in doc.doc["correct_answers"]  # lm-eval ends each with "."


# card -> what is compared, the lm-eval task that is run on the fixture, and the words in the
# card's description that state the deviation.
DEVIATIONS: dict[str, dict[str, Any]] = {
    "aime24": dict(
        task="aime24",
        folder="aime",
        lm_splits={"train": "fixture"},
        says=["Zero-shot chat prompt", "Prompt differs from lm-eval's aime24"],
        reason='chat prompt asking for \\boxed{} (lm-eval: "Question: ...\\nAnswer:"), math-verify '
        "scoring, 8192 new tokens (lm-eval 32768)",
        check=_check_targets(lambda t: str(t.target), lambda d: d.target),
    ),
    "aime25": dict(
        task="aime25",
        folder="aime",
        lm_splits={"test": "fixture"},
        says=["Zero-shot chat prompt", "Prompt differs from lm-eval's aime25"],
        reason="chat prompt asking for \\boxed{}, math-verify scoring, 8192 new tokens",
        check=_check_targets(lambda t: str(t.target), lambda d: d.target),
    ),
    "asdiv": dict(
        task="asdiv",
        folder="asdiv",
        lm_splits={"validation": "fixture"},
        says=["Generative, not lm-eval's loglikelihood"],
        reason="generative \\boxed{} chat prompt; lm-eval's asdiv scores the answer's loglikelihood",
        check=_check_targets(lambda t: str(t.target), lambda d: d.target),
    ),
    "gpqa_diamond": dict(
        task="gpqa_diamond_cot_zeroshot",
        folder="gpqa/cot_zeroshot",
        lm_splits={"train": "fixture"},
        says=["unlike\n  lm-eval's and lighteval's global-RNG shuffles"],
        reason="options shuffled by an md5 of the question, not lm-eval's unseeded global RNG, "
        "so the lettered prompt cannot match; the option set and gold text do",
        check=_gpqa_check,
    ),
    "hendrycks_math": dict(
        task="hendrycks_math_algebra",
        folder="hendrycks_math",
        lm_splits={"train": "fixture", "test": "fixture"},
        says=["Prompt differs from lm-eval's hendrycks_math", "not lm-eval's string normalisation"],
        reason="chat prompt asking for \\boxed{} and math-verify scoring; the gold (the last "
        "\\boxed{} of the solution) is lm-eval's",
        check=_check_targets(_math_gold, lambda d: d.doc["answer"]),
    ),
    "drop": dict(
        task="drop",
        folder="drop",
        lm_splits={"train": "fixture", "validation": "fixture"},
        says=["Prompt differs from lm-eval's drop"],
        reason='chat prompt asking for a final "Answer:" line (lm-eval: "{passage} {question}" cut at '
        'the first "."); the same gold alternatives (answer + each validated answer)',
        check=_drop_check,
    ),
    "mbpp_plus": dict(
        task="mbpp_plus",
        folder="mbpp",
        lm_splits={"test": "fixture"},
        says=["Prompted as EvalPlus's instruct prompt", "not lm-eval's mbpp_plus"],
        reason="EvalPlus's instruct prompt and plus tests; lm-eval's mbpp_plus is mbpp's 3-shot "
        "prompt and runs the three base asserts only",
        check=_mbpp_plus_check,
    ),
    "mmlu_pro": dict(
        docs=_mmlu_pro_docs,
        says=["but zero-shot"],
        reason="zero-shot chat prompt; lm-eval shows 5 CoT exemplars of the same category",
        check=_mmlu_pro_check,
    ),
    "mmlu_redux": dict(
        docs=_mmlu_redux_docs,
        says=['lm-eval\'s mmlu_redux generative task is similar but runs on the "ok" rows only'],
        reason="all 5,700 rows with evalscope's gold per error type, and arle's own prompt; on the "
        '"ok" rows lm-eval reads, the question and gold letter match',
        check=_letters,
    ),
    "nq_open": dict(
        task="nq_open",
        folder="nq_open",
        lm_splits={"train": "fixture", "validation": "fixture"},
        says=["Prompt differs from lm-eval's nq_open"],
        reason='chat prompt asking for a final "Answer:" line (lm-eval: "Q: ...?\\nA:", stop at a '
        "newline, period or comma); same gold list",
        check=_check_targets(lambda t: list(t.target), lambda d: list(d.target)),
    ),
    "triviaqa": dict(
        task="triviaqa",
        folder="triviaqa",
        lm_splits={"train": "fixture", "validation": "fixture"},
        says=["Prompt differs from lm-eval's triviaqa"],
        reason='chat prompt asking for a final "Answer:" line (lm-eval: "Question: ...?\\nAnswer:", '
        "stop at a newline, period or comma); same gold aliases",
        check=_check_targets(lambda t: list(t.target), lambda d: list(d.target)),
    ),
    "truthfulqa_judged": dict(
        task="truthfulqa_gen",
        folder="truthfulqa",
        lm_splits={"validation": "fixture"},
        says=["lm-eval's truthfulqa_gen scores the same answers with BLEU/ROUGE"],
        reason="graded by a judge model (the paper's headline), zero-shot chat prompt; "
        "lm-eval's truthfulqa_gen uses a 6-QA preamble and BLEU/ROUGE",
        check=_truthfulqa_check,
    ),
}


def _says(card: Card, words: str) -> bool:
    """`words` are in the card's description (line breaks and indents count as one space)."""
    return " ".join(words.split()) in " ".join(card.description.split())


@pytest.mark.parametrize("name", sorted(DEVIATIONS))
def test_deviating_cards_say_so_and_match_lmeval_where_they_can(name: str):
    card, spec = load_card(name), DEVIATIONS[name]
    for words in spec["says"]:
        assert _says(card, words), f"{name}: the description no longer states its deviation ({words!r})"
    tasks, docs = spec["docs"](card) if "docs" in spec else (_tasks(card), _lmeval(card, spec))
    spec["check"](tasks, docs)


def test_squad_v2_unanswerable_is_lmevals_unanswerable_and_golds_are_its_spans():
    """lm-eval's squadv2 is a Python task bound to its hub copy, so its own doc_to_target
    is called directly on the fixture rows."""
    from lm_eval.tasks.squadv2.task import SQuAD2

    card = load_card("squad_v2")
    assert _says(card, "Prompt differs from lm-eval's squadv2") and "unanswerable" in card.prompt.template
    for task, row in zip(_tasks(card), _fixture(card)):
        lm = SQuAD2.doc_to_target(None, row).strip()
        assert list(task.target) == list(row["answers"]["text"])
        assert lm == (task.target[0] if task.target else "unanswerable")


# Deviating cards whose lm-eval task cannot take local rows (checked in their own test above).
DEVIATIONS_WITHOUT_LMEVAL_RUN = {
    "squad_v2": 'chat prompt with a final "Answer:" line; lm-eval\'s squadv2 is a Python task on its hub copy '
    "(lighteval/squad_v2), checked through its doc_to_target above",
}

# Cards whose description names lm-eval only to say they are not an lm-eval task.
NOT_CLAIMED = {
    "amc23": "No lm-eval task exists",
    "supergpqa": "There is no lm-eval task",
    "minerva_math": "Not lm-eval's minerva_math",
    "math_tool": "lm-eval's\n  flexible-extract",  # scoring only (the gsm8k reward, checked through gsm8k)
}

# Multiple choice (loglikelihood) cards: tests/test_lmeval_parity_mc.py.
MC_CARDS = {
    "mmlu",
    "arc_easy",
    "arc_challenge",
    "hellaswag",
    "winogrande",
    "piqa",
    "boolq",
    "openbookqa",
    "sciq",
    "commonsense_qa",
    "truthfulqa_mc1",
}


@pytest.mark.parametrize("name", sorted(NOT_CLAIMED))
def test_cards_that_are_not_lmeval_tasks_say_so(name: str):
    assert _says(load_card(name), NOT_CLAIMED[name])


def test_every_card_naming_lmeval_is_listed():
    """A card whose description names lm-eval is in exactly one of the tables above."""
    tables = [set(PARITY), set(DEVIATIONS), set(DEVIATIONS_WITHOUT_LMEVAL_RUN), set(NOT_CLAIMED), MC_CARDS]
    naming = {
        c.name for c in list_cards() if c.path and c.path.parent == BENCHMARKS and re.search(r"lm-eval", c.description)
    }
    listed = set().union(*tables)
    assert naming <= listed, f"cards naming lm-eval without a parity entry: {sorted(naming - listed)}"
    assert sum(len(t) for t in tables) == len(listed), "a card is listed twice"


# --- the few-shot samplers themselves ---------------------------------------------------


def test_default_sampler_draws_what_lmevals_context_sampler_draws_also_from_the_eval_split():
    """arle's `default` sampler against lm-eval's own ContextSampler, seeded as simple_evaluate
    seeds it, doc after doc; from the eval split itself, a question is never its own exemplar."""
    from lm_eval.api.samplers import ContextSampler

    from arlecli.fewshot import draw

    card = load_card("gsm8k")
    rows = read_rows_file(FIXTURES / "gsm8k.train.jsonl")
    pool = tasks_from_rows(card, rows, "train")
    for same_split, eval_rows in ((False, _fixture(card)), (True, rows)):
        tasks = pool if same_split else _tasks(card)
        mine = draw(pool, tasks, 3, sampler="default", seed=1234, exclude_doc=same_split)
        sampler = ContextSampler(rows).set_rnd(1234)
        theirs = [sampler.sample(3, eval_doc=row if same_split else None) for row in eval_rows]
        assert [[s.input for s in exemplars_for(mine, t)] for t in tasks] == [
            [d["question"] for d in shots] for shots in theirs
        ]
        if same_split:
            assert all(t.id not in {s.id for s in exemplars_for(mine, t)} for t in tasks)


def _card_with_fewshot(**fewshot: Any) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((BENCHMARKS / "gsm8k.yaml").read_text())
    data["prompt"]["fewshot"] = {"split": "train", **fewshot}
    return data


@pytest.mark.parametrize(
    "fewshot, field",
    [
        ({"n": 5, "sampler": "random"}, "prompt.fewshot.sampler"),
        ({"n": 4, "ids": [2, 3, 4]}, "prompt.fewshot.n"),
        ({"ids": "2,3,4"}, "prompt.fewshot.ids"),
    ],
)
def test_a_bad_fewshot_block_is_one_line_naming_the_field(fewshot: dict[str, Any], field: str):
    from arlecli.cards import parse_card
    from arlecli.errors import UserError

    with pytest.raises(UserError) as err:
        parse_card(_card_with_fewshot(**fewshot), "my_card.yaml")
    assert f"my_card.yaml: field '{field}'" in str(err.value) and "\n" not in str(err.value)


def test_fewshot_ids_missing_from_the_split_and_a_too_small_pool_are_user_errors():
    from arlecli.errors import UserError
    from arlecli.fewshot import draw

    card = load_card("gsm8k")
    pool, tasks = tasks_from_rows(card, read_rows_file(FIXTURES / "gsm8k.train.jsonl"), "train"), _tasks(card)
    with pytest.raises(UserError, match=r"'prompt.fewshot.ids' names ids not in the few-shot split: 99"):
        draw(pool, tasks, 2, ids=[pool[0].id, 99])
    with pytest.raises(UserError, match=r"3 exemplars asked, but card field 'prompt.fewshot.ids' lists 2"):
        draw(pool, tasks, 3, ids=[pool[0].id, pool[1].id])
    for sampler in ("default", "first_n"):
        with pytest.raises(UserError, match=r"prompt.fewshot: 7 exemplars asked of 6 rows; lower --num-fewshot"):
            draw(pool, tasks, 7, sampler=sampler)
    # From the eval split itself a task is never its own exemplar, so 6 rows give at most 5.
    with pytest.raises(UserError, match=r"6 exemplars asked of 6 rows \(a task is never its own exemplar\)"):
        draw(pool, pool, 6, sampler="default", exclude_doc=True)


def test_fewshot_by_keeps_exemplars_to_the_tasks_group_one_sampler_per_group():
    """`by` is lm-eval's one-task-per-subject few-shot: exemplars share the task's value, and
    each group's draws run from its own Random(1234), as separate lm-eval tasks would."""
    import random

    from arlecli.fewshot import draw

    pool = [Task(id=f"p{i}", input=f"q{i}", target="", fields={"subject": "ab"[i % 2]}) for i in range(8)]
    tasks = [Task(id=f"t{i}", input="", target="", fields={"subject": s}) for i, s in enumerate("aabab")]
    firsts = draw(pool, tasks, 2, sampler="first_n", by="subject")
    assert [[s.id for s in firsts[t.id]] for t in tasks] == [
        ["p0", "p2"],
        ["p0", "p2"],
        ["p1", "p3"],
        ["p0", "p2"],
        ["p1", "p3"],
    ]
    drawn = draw(pool, tasks, 2, sampler="default", by="subject")
    for subject in "ab":
        group = [p for p in pool if p.fields["subject"] == subject]
        rng = random.Random(1234)
        want = [rng.sample(group, 2) for t in tasks if t.fields["subject"] == subject]
        assert [drawn[t.id] for t in tasks if t.fields["subject"] == subject] == want
