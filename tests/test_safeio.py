"""safeio: text arle does not control, read and written the same way everywhere (issue 23)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from arlecli import safeio
from arlecli.errors import UserError

# A "billion laughs": each level repeats the one before nine times (9**9 strings expanded).
ALIAS_BOMB = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)


# ---------------------------------------------------------------------------------------------
# dumps: always valid UTF-8


@pytest.mark.parametrize(
    "value",
    ["\ud800", "a\udfffb", {"k\udc80": ["\ud83d", 1]}, "\\\ud800", "plain é"],
    ids=["lone-high", "lone-low", "key-and-list", "after-a-backslash", "no-surrogate"],
)
def test_dumps_encodes_as_utf8_and_reads_back_the_same(value):
    text = safeio.dumps(value)
    text.encode("utf-8")  # json.dumps(..., ensure_ascii=False) would leave the surrogate raw here
    assert json.loads(text) == value
    assert safeio.loads(text.encode("utf-8")) == value


def test_dumps_is_json_dumps_when_there_is_nothing_to_escape():
    # Judge cache keys hash this text: it must not change for ordinary strings.
    value = {"b": ["é", "\u2028", 1.5], "a": None}
    assert safeio.dumps(value, sort_keys=True) == json.dumps(value, ensure_ascii=False, sort_keys=True)


def test_clean_text_replaces_lone_surrogates():
    assert safeio.clean_text("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert safeio.clean_text("plain") == "plain"


# ---------------------------------------------------------------------------------------------
# loads: a depth limit, and every bad input a ValueError


def test_loads_refuses_json_nested_past_the_limit():
    depth = safeio.MAX_DEPTH
    assert safeio.loads("[" * depth + "]" * depth) is not None
    for text in ("[" * (depth + 1) + "]" * (depth + 1), '{"a": ' * (depth + 1) + "1" + "}" * (depth + 1)):
        with pytest.raises(ValueError, match=f"nested more than {depth} deep"):
            safeio.loads(text)


def test_loads_turns_a_recursion_error_into_a_value_error_fast():
    started = time.monotonic()
    for text in ("[" * 100_000 + "]" * 100_000, ("[" * 100_000).encode()):
        with pytest.raises(ValueError, match="nested more than"):
            safeio.loads(text)
    assert time.monotonic() - started < 2


def test_loads_brackets_inside_strings_do_not_count_as_nesting():
    value = ["[" * 1000, {"k": "{" * 1000}]
    assert safeio.loads(json.dumps(value)) == value


@pytest.mark.parametrize("text", ["{not json", b'"\xff"', "1" * 5000], ids=["broken", "not-utf8", "huge-int"])
def test_loads_raises_value_error_for_every_bad_input(text):
    with pytest.raises(ValueError):
        safeio.loads(text)


def test_loads_clean_replaces_lone_surrogates_in_strings_and_keys():
    text = json.dumps({"q\ud800": ["x\udfff", "\U0001f600"]})  # ASCII escapes; the emoji is a valid pair
    assert safeio.loads(text) == {"q\ud800": ["x\udfff", "\U0001f600"]}
    assert safeio.loads(text, clean=True) == {"q\ufffd": ["x\ufffd", "\U0001f600"]}
    assert safeio.loads(text.encode(), clean=True) == {"q\ufffd": ["x\ufffd", "\U0001f600"]}


# ---------------------------------------------------------------------------------------------
# load_yaml: safe, no aliases, a depth limit


def _problem(text: str) -> tuple[str, int]:
    with pytest.raises(yaml.YAMLError) as excinfo:
        safeio.load_yaml(text)
    return excinfo.value.problem, excinfo.value.problem_mark.line + 1  # type: ignore[attr-defined]


def test_load_yaml_refuses_an_alias_bomb_at_once():
    started = time.monotonic()
    problem, line = _problem(ALIAS_BOMB)
    assert "aliases (*name) are not accepted" in problem and line == 2  # the first alias
    assert time.monotonic() - started < 1


def test_load_yaml_refuses_every_alias_even_a_harmless_one():
    problem, line = _problem("base: &b {x: 1}\nother: *b\n")
    assert "aliases" in problem and line == 2
    assert safeio.load_yaml("anchored: &b {x: 1}\n") == {"anchored": {"x": 1}}  # an anchor alone is fine


def test_load_yaml_merge_keys_inline_mappings_merge_aliases_are_refused():
    # An inline `<<:` mapping merges as in any YAML 1.1 loader; `<<: *base` is an alias, refused.
    assert safeio.load_yaml("<<: {a: 1, b: 2}\nb: 3\n") == {"a": 1, "b": 3}
    assert safeio.load_yaml("<<: [{a: 1}, {c: 2}]\n") == {"a": 1, "c": 2}
    problem, line = _problem("base: &base {a: 1}\nmine:\n  <<: *base\n  b: 2\n")
    assert "aliases" in problem and line == 3


@pytest.mark.parametrize(
    "text",
    ["x: " + "[" * 20_000 + "]" * 20_000, "x: " + "{a: " * 20_000 + "}" * 20_000, "- " * 300 + "1"],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_load_yaml_refuses_nesting_past_the_limit(text):
    started = time.monotonic()
    problem, line = _problem(text)
    assert f"nested more than {safeio.MAX_DEPTH} deep" in problem and line == 1
    assert time.monotonic() - started < 5


def test_load_yaml_reads_what_safe_load_reads_up_to_the_limit():
    text = "a: [1, {b: c}]\nd: 2024-01-02\ne: !!str 3\n" + "f: " + "[" * 150 + "]" * 150 + "\n"
    assert safeio.load_yaml(text) == yaml.safe_load(text)
    assert safeio.load_yaml(text.encode()) == yaml.safe_load(text)
    assert safeio.load_yaml("") is None


@pytest.mark.parametrize(
    "text, shown",
    [("when: 2001-13-14\n", "month must be in 1..12"), ("n: " + "9" * 5000 + "\n", "integer string conversion")],
    ids=["bad-date", "huge-int"],
)
def test_load_yaml_a_value_pyyaml_cannot_build_is_a_yaml_error(text, shown):
    # yaml.safe_load lets these out as ValueError: a traceback for every caller that catches YAMLError.
    with pytest.raises(ValueError):
        yaml.safe_load(text)
    problem, line = _problem(text)
    assert problem.startswith("cannot read this value") and shown in problem and line == 1


@pytest.mark.parametrize(
    "text, line",
    [("a: 1\nb: 2\na: 3\n", 3), ("x:\n  k: 1\n  k: 1\n", 3), ("- {a: 1, a: 2}\n", 1), ('"a": 1\na: 2\n', 2)],
    ids=["top", "nested", "flow", "quoted"],
)
def test_load_yaml_refuses_a_key_given_twice(text, line):
    # yaml.safe_load keeps the last: a card's or recipe's first setting lost without a word.
    assert isinstance(yaml.safe_load(text), (dict, list))
    problem, at = _problem(text)
    assert "appears twice: keep one" in problem and at == line


def test_load_yaml_keys_a_merge_brings_may_be_overridden():
    assert safeio.load_yaml("<<: {a: 1, b: 2}\na: 3\n") == {"a": 3, "b": 2}
    assert safeio.load_yaml("a: 1\n'1': 2\n1: 3\n") == {"a": 1, "1": 2, 1: 3}  # a string and an int: two keys


def test_load_yaml_still_refuses_python_tags():
    problem, _ = _problem("x: !!python/object/apply:os.system ['true']\n")
    assert "could not determine a constructor" in problem


# ---------------------------------------------------------------------------------------------
# read_text / decode: a file that is not UTF-8 is one line naming it


def test_read_text_names_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_bytes("default: café\n".encode("latin-1"))
    with pytest.raises(UserError) as excinfo:
        safeio.read_text(path, "model profiles file")
    assert str(excinfo.value) == (f"model profiles file {path} is not UTF-8 text (byte 12): save it as UTF-8 and rerun")


def test_read_text_names_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(UserError, match=f"cannot read card {tmp_path / 'missing.yaml'}: No such file"):
        safeio.read_text(tmp_path / "missing.yaml", "card")
    with pytest.raises(UserError, match=f"cannot read card {tmp_path}: Is a directory"):
        safeio.read_text(tmp_path, "card")


def test_read_text_and_decode_read_utf8(tmp_path):
    path = tmp_path / "card.yaml"
    path.write_text("name: café ✓\n", encoding="utf-8")
    assert safeio.read_text(path) == "name: café ✓\n"
    assert safeio.decode(safeio.read_bytes(path), path) == "name: café ✓\n"
