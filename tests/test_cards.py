"""Cards and the registry: bad cards fail with file + field (every packaged card: test_catalog)."""

from __future__ import annotations

import pytest

from arlecli.cards import parse_card, render_prompt
from arlecli.data.sources import read_rows_file, tasks_from_rows
from arlecli.errors import UserError
from arlecli.catalog import card_paths, load_card, load_card_file, resolve_references

MINIMAL = {
    "name": "mini",
    "category": "math",
    "source": {"kind": "files", "path": "rows.jsonl"},
    "reward": {"name": "gsm8k"},
}


def test_foundation_cards_are_registered():
    assert {"gsm8k", "humaneval", "countdown", "mmlu", "gsm_symbolic"} <= set(card_paths())


def test_missing_required_field_names_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ncategory: math\nsource: {kind: hub, path: x/y}\n")
    with pytest.raises(UserError, match=r"bad\.yaml: field 'reward': is missing"):
        load_card_file(path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"category": "maths"}, "'category': 'maths' is not one of"),
        ({"source": {"kind": "ftp", "path": "x"}}, "'source.kind': 'ftp' is not one of"),
        ({"promt": {}}, "'promt': is not a card field; did you mean 'prompt'"),
        ({"prompt": {"max_tokens": "many"}}, "'prompt.max_tokens': must be int"),
        ({"prompt": {"fewshot": {"n": 3}}}, "'prompt.fewshot.split': is missing"),
    ],
)
def test_invalid_values_name_the_field(change, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_card({**MINIMAL, **change}, "card.yaml")


def test_unknown_reward_is_a_card_error():
    card = parse_card({**MINIMAL, "reward": {"name": "gsm9k"}}, "card.yaml")
    with pytest.raises(UserError, match="field 'reward'.*did you mean gsm8k"):
        resolve_references(card)


def test_user_dir_card_shadows_packaged_and_paths_load(isolated_home, tmp_path):
    user_dir = isolated_home / "benchmarks"
    user_dir.mkdir()
    (user_dir / "gsm8k.yaml").write_text(
        "name: gsm8k\ncategory: math\ndescription: mine\nsource: {kind: files, path: rows.jsonl}\nreward: gsm8k\n"
    )
    assert load_card("gsm8k").description == "mine"
    other = tmp_path / "elsewhere.yaml"
    other.write_text("name: elsewhere\ncategory: math\nsource: {kind: files, path: r.jsonl}\nreward: gsm8k\n")
    assert load_card(str(other)).name == "elsewhere"


def test_entry_point_cards_are_found(tmp_path, monkeypatch):
    pkg = tmp_path / "thirdparty_cards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mybench.yaml").write_text(
        "name: mybench\ncategory: qa\nsource: {kind: files, path: r.jsonl}\nreward: gsm8k\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    class EP:
        name, value = "thirdparty", "thirdparty_cards"

    import arlecli.catalog as catalog

    monkeypatch.setattr(catalog.metadata, "entry_points", lambda group: [EP()] if group == "arle.benchmarks" else [])
    assert load_card("mybench").category == "qa"


def test_unknown_name_suggests():
    with pytest.raises(UserError, match="did you mean gsm8k"):
        load_card("gsm8kk")
    # Case alone is a near miss too: the one card of that name, not a list of look-alikes.
    for typed in ("GSM8K", "Gsm8k"):
        with pytest.raises(UserError, match=r"did you mean gsm8k\?"):
            load_card(typed)
    with pytest.raises(UserError, match="did you mean gsm8k"):
        load_card("GSM8KK")


def test_missing_column_names_the_field_and_columns():
    card = load_card("gsm8k")
    with pytest.raises(UserError, match=r"fields\.input.*'question'.*columns: answer, problem"):
        tasks_from_rows(card, [{"problem": "1+1", "answer": "#### 2"}], "rows.jsonl")


def test_mmlu_fixture_maps_answers_to_letters():
    card = load_card("mmlu")
    tasks = tasks_from_rows(card, read_rows_file(card.fixture_path), "fixture")
    assert [t.target for t in tasks] == ["B", "C", "A", "D"]
    assert "B. Mercury" in render_prompt(card.prompt, tasks[0])[-1]["content"]


def test_a_transform_may_split_one_record_into_several_tasks(tmp_path):
    card = parse_card(
        {**MINIMAL, "transform": "test_cards:explode_questions", "fields": {"input": "q", "target": "a"}},
        tmp_path / "card.yaml",
    )
    rows = [
        {"table": "t1", "questions": [{"q": "x?", "a": "1"}, {"q": "y?", "a": "2"}]},
        {"table": "t2", "questions": [{"q": "z?", "a": "3", "id": "uid-z"}]},
    ]
    tasks = tasks_from_rows(card, rows)
    assert [(t.id, t.input, t.fields["table"]) for t in tasks] == [
        ("0-0", "x?", "t1"),
        ("0-1", "y?", "t1"),
        ("uid-z", "z?", "t2"),
    ]


def explode_questions(row):
    """A transform for the test above: one task per question, the table kept on each."""
    return [{"table": row["table"], **q} for q in row["questions"]]


@pytest.mark.parametrize(
    "template, shown",
    [
        ("{input.__class__.__mro__}", "{input.__class__.__mro__}"),
        ("{id:>999999999999}", "{id:>999999999999}"),
        ("{input!r}", "{input!r}"),
        ("{choices[0].__class__}", "{choices[0].__class__}"),
        ("{0}", "{0}"),
        ("{}", "{}"),
    ],
)
def test_a_template_fills_plain_columns_only(template: str, shown: str) -> None:
    """A card is data: its template must not reach into Python objects (attribute and index
    access) nor size its own output (a format spec of a gigabyte of padding: a MemoryError)."""
    from arlecli.cards import fill
    from arlecli.types import Task

    task = Task(
        id="t1", input="What is {target}? {id.__class__}", target="4", fields={"topic": "sums", "choices": ["3", "4"]}
    )
    with pytest.raises(UserError) as info:
        fill(template, task)
    assert f"uses {shown}: only {{column}} and {{column[item]}} placeholders" in str(info.value)
    # Columns fill, and items of a row's list (lm-eval's `{choices[0]}`); a row's own braces are
    # text, never read as a template.
    assert fill("{{lit}} {topic}: {input} {choices[1]}", task) == "{lit} sums: What is {target}? {id.__class__} 4"
    with pytest.raises(UserError, match=r"uses \{choices\[7\]\}, which a row does not hold"):
        fill("{choices[7]}", task)


def test_rows_files_with_a_byte_order_mark_read_as_without(tmp_path) -> None:
    """Excel's "CSV UTF-8" and some editors start a file with a BOM: it was part of the first
    column's name (a "missing" column that showed as present) or the first line's JSON."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "rows.csv").write_bytes(bom + b"question,answer\nWhat is 1+1?,#### 2\n")
    (tmp_path / "rows.jsonl").write_bytes(bom + b'{"question": "What is 1+1?", "answer": "#### 2"}\n')
    (tmp_path / "rows.json").write_bytes(bom + b'{"rows": [{"question": "What is 1+1?", "answer": "#### 2"}]}')
    want = [{"question": "What is 1+1?", "answer": "#### 2"}]
    for name in ("rows.csv", "rows.jsonl", "rows.json"):
        assert read_rows_file(tmp_path / name) == want, name
    (tmp_path / "empty.json").write_text('{"rows": []}')
    assert read_rows_file(tmp_path / "empty.json") == []


def test_a_card_key_that_is_not_text_is_one_line(tmp_path) -> None:
    card = tmp_path / "c.yaml"
    card.write_text(card_paths()["gsm8k"].read_text() + "\n1: 2\n")  # a YAML key that is a number
    with pytest.raises(UserError, match="is not a card field"):
        load_card_file(card)


def test_a_files_cards_exemplars_never_include_the_task_itself(tmp_path) -> None:
    """A `files` card with no `splits` reads its one file whatever a split is named: a few-shot
    split of another name drew from the evaluated rows, and each prompt held its own question
    with its gold answer as an exemplar."""
    import json

    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.fewshot import exemplars_for

    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(6)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c.yaml").write_text(
        "name: c\nversion: 1\ncategory: math\nsource: {kind: files, path: rows.jsonl}\n"
        "fields: {input: question, target: answer}\n"
        'prompt: {format: completion, template: "Question: {input}\\nAnswer:", fewshot: {split: other, n: 3}}\n'
        "reward: {name: gsm8k}\nmetrics: [accuracy]\n"
    )
    card = load_card_file(tmp_path / "c.yaml")
    tasks, exemplars = load_tasks(card, EvalOptions(limit=3))
    assert len(tasks) == 3
    for task in tasks:
        shots = exemplars_for(exemplars, task)
        assert len(shots) == 3 and not {t.id for t in tasks} & {s.id for s in shots}, [s.id for s in shots]
    with pytest.raises(UserError, match="3 exemplars asked of 0 rows"):  # every row evaluated: none left to show
        load_tasks(card, EvalOptions())


@pytest.mark.timeout(60)
def test_a_fifo_a_device_or_a_huge_file_among_the_users_cards_is_listed_broken(tmp_path) -> None:
    """`arle bench list` reads every *.yaml in $ARLE_HOME/benchmarks: a FIFO there blocked it for
    ever and a link to /dev/zero ate the memory. Each is now a broken card with one line."""
    import os

    from arlecli.cards import MAX_CARD_BYTES
    from arlecli.catalog import scan_cards
    from arlecli.config import arle_home

    folder = arle_home() / "benchmarks"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "fifo.yaml")
    (folder / "zero.yaml").symlink_to("/dev/zero")
    (folder / "huge.yaml").write_bytes(b"#" * (MAX_CARD_BYTES + 1))
    cards, broken = scan_cards()
    said = {b.name: b.reason for b in broken}
    assert "not a regular file" in said["fifo"] and "not a regular file" in said["zero"]
    assert "over the" in said["huge"]
    assert "gsm8k" in {c.name for c in cards}  # the rest still listed


def test_a_group_by_that_names_no_column_is_one_line(tmp_path) -> None:
    import json

    from arlecli.eval import EvalOptions, load_tasks

    (tmp_path / "rows.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2", "topic": "sums"}) + "\n")
    card = (
        "name: c\nversion: 1\ncategory: math\nsource: {kind: files, path: rows.jsonl}\n"
        "fields: {input: question, target: answer}\n"
        'prompt: {format: completion, template: "Q: {input}"}\nreward: {name: gsm8k}\nmetrics: [accuracy]\n'
    )
    (tmp_path / "ok.yaml").write_text(card.replace("name: c", "name: ok") + "group_by: topic\n")
    (tmp_path / "typo.yaml").write_text(card.replace("name: c", "name: typo") + "group_by: topik\n")
    assert len(load_tasks(load_card_file(tmp_path / "ok.yaml"), EvalOptions())[0]) == 1
    with pytest.raises(UserError, match=r"field 'group_by': 'topik' is not a column of the rows \(columns: .*topic"):
        load_tasks(load_card_file(tmp_path / "typo.yaml"), EvalOptions())


def test_a_rows_file_line_past_the_cap_is_one_line_without_reading_it_whole(tmp_path) -> None:
    """A 400 KB .jsonl.gz held one 400 MB line: it was read whole (2.2 GB of memory) and sent as
    a prompt. A line past MAX_ROW_CHARS is refused, read no further than the cap."""
    import gzip

    from arlecli.data.sources import MAX_ROW_CHARS

    big = tmp_path / "rows.jsonl.gz"
    with gzip.open(big, "wt") as f:
        f.write('{"answer": "#### 2"}\n{"question": "' + "a" * (MAX_ROW_CHARS + 1) + '", "answer": "#### 4"}\n')
    with pytest.raises(UserError, match="rows.jsonl.gz: line 2 is over 64 M characters"):
        read_rows_file(big)
