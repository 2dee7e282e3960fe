"""Reading and writing text that arle does not control: model output, data rows, cards,
profiles, run files.

Four promises, kept in one place so every reader and writer keeps them the same way:

- What arle writes is valid UTF-8 JSON whatever it holds. Python strings may carry lone
  surrogates (a model's output decoded with errors="surrogateescape", a class name
  `"\\ud800"`, a JSON row with `"\\ud800"` in it); `json.dumps(..., ensure_ascii=False)`
  keeps them raw, and writing that to a UTF-8 file raises. `dumps` escapes them instead
  (`\\ud800`, valid JSON that reads back as the same string), so no sample is lost.
- JSON is read with a depth limit: a 100k-deep `[[[...` line is one ValueError, not a
  RecursionError traceback.
- YAML is read with a safe loader that refuses aliases (a "billion laughs" card or
  profile expands to gigabytes) and nesting deeper than `MAX_DEPTH`.

- Text shown on a terminal is shown, not obeyed: `terminal_text` writes ESC, CSI and the
  other characters a terminal acts on (clipboard writes, window titles, cursor moves, bidi
  reordering) as escapes. The consoles of cli/output.py apply it to everything they print.

`read_text` turns a file that is not UTF-8 into one UserError line naming it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

from arlecli.errors import UserError

MAX_DEPTH = 200  # nesting of a card, a profile, a data row or a run file: far beyond any real one
_SURROGATE = re.compile("[\ud800-\udfff]")
# In JSON text a surrogate can only come from an escape (UTF-8 cannot encode one).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **kwargs)`, with any lone surrogate escaped, so
    the text always encodes as UTF-8 (and reads back as the same value)."""
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    if _SURROGATE.search(text) is None:
        return text
    # Raw surrogates only occur inside JSON strings, where `\\uXXXX` means the same thing.
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD: for text shown to a person or put in a
    message, where an escape would be noise."""
    return _SURROGATE.sub("\ufffd", text)


# Shown escaped: C0 controls but \n and \t; DEL and the C1 controls (U+0080-U+009F; U+009B is
# CSI by itself); the line and paragraph separators; the bidi embeddings, overrides, isolates and
# marks, which reorder what is shown ("Trojan Source"); lone surrogates, which stdout cannot encode.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def terminal_text(text: str) -> str:
    """`text` safe to print: every character a terminal would act on instead of showing is
    written as an escape (ESC as the four characters `\\x1b`, U+2028 as `\\u2028`); newlines
    and tabs are kept."""
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def loads(text: str | bytes, *, clean: bool = False) -> Any:
    """`json.loads`, with nesting deeper than `MAX_DEPTH` (or than Python's recursion limit)
    refused as ValueError (json.JSONDecodeError is one too, and so is UnicodeDecodeError
    for bytes that are not UTF-8): callers catch ValueError for every kind of bad line.

    `clean`: lone surrogates (`"\\ud800"` escapes) in strings and keys become U+FFFD, for
    data that goes on to a model: no tokenizer or HTTP client encodes a lone surrogate."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} deep") from None
    if _openers(text) > MAX_DEPTH and _too_deep(value):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} deep")
    escape = _SURROGATE_ESCAPE if isinstance(text, str) else _SURROGATE_ESCAPE_BYTES
    if clean and escape.search(text):  # type: ignore[arg-type]
        value = _cleaned(value)
    return value


def _cleaned(value: Any) -> Any:
    # Recursion is safe: `loads` refused anything nested deeper than MAX_DEPTH.
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _cleaned(v) for k, v in value.items()}
    return value


def _openers(text: str | bytes) -> int:
    # An upper bound on the nesting (brackets inside strings count too): most values need no walk.
    if isinstance(text, (bytes, bytearray)):
        return text.count(b"[") + text.count(b"{")
    return text.count("[") + text.count("{")


def _too_deep(value: Any) -> bool:
    # Iterative: a recursive walk would hit the recursion limit on the values it checks.
    stack = [(value, 0)]
    children: Iterable[Any]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a unique temp file beside it, then a rename,
    so a reader or a concurrent writer of the same path sees the old file or a whole new one.
    On failure the temp file is removed and the OSError raised."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(path: Path | str, what: str = "file", max_bytes: int | None = None) -> bytes:
    """The file's bytes; UserError (one line naming the file) when it cannot be read (missing,
    a folder, no permission). With `max_bytes`, also when it is not a regular file (a FIFO
    would block the read for ever, /dev/zero never end) or holds more than that."""
    try:
        if max_bytes is not None:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise UserError(f"cannot read {what} {path}: not a regular file; remove it or replace it with one")
            if info.st_size > max_bytes:
                raise UserError(
                    f"cannot read {what} {path}: {info.st_size:,} bytes, over the {max_bytes:,} a {what} may hold"
                )
        return Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def decode(data: bytes, path: Path | str, what: str = "file") -> str:
    """`data` (the bytes of file `path`) as UTF-8 text; UserError naming the file and the
    first bad byte when it is not UTF-8 (for a caller that needs the bytes too: a card's hash)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 and rerun") from None


def read_text(path: Path | str, what: str = "file") -> str:
    """The file's text as UTF-8; UserError (one line naming the file) when it cannot be read
    or is not UTF-8."""
    return decode(read_bytes(path, what), path, what)


def load_yaml(text: str | bytes) -> Any:
    """YAML through a safe loader that refuses aliases and nesting deeper than MAX_DEPTH.

    Raises yaml.YAMLError (with a problem_mark where the parser knows one) for both, like
    any other YAML mistake, so callers keep one error path; so is a scalar PyYAML cannot
    build (`2001-13-14` read as a date, an integer of 5,000 digits), which plain
    `yaml.safe_load` lets out as a ValueError.

    Merge keys: `<<: {a: 1}` (an inline mapping) merges as in any YAML 1.1 loader; `<<: *base`
    is refused like every alias (the merge itself is harmless, but an alias is how a small
    file expands to gigabytes, and no card or recipe arle ships needs one)."""
    loader = _strict_loader()(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.cache
def _strict_loader() -> type:
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader without aliases, and with a depth limit."""

        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D401 (PyYAML's hook)
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ComposerError(
                    None, None, "YAML aliases (*name) are not accepted here: write the value out", event.start_mark
                )
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    event = self.peek_event()
                    raise ComposerError(None, None, f"nested more than {MAX_DEPTH} deep", event.start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # noqa: D401 (PyYAML's hook)
            # PyYAML keeps the last of two equal keys without a word: in a card or a recipe the
            # first one's setting would be lost unseen. Keys a merge (`<<`) brings may be
            # overridden, as YAML allows, so only the mapping's own keys are compared.
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else []:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"the key {key_node.value!r} appears twice: keep one",
                        key_node.start_mark,
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

        def construct_object(self, node: Any, deep: bool = False) -> Any:  # noqa: D401 (PyYAML's hook)
            try:
                return super().construct_object(node, deep)
            except (ValueError, OverflowError) as exc:  # a timestamp out of range, too many digits
                raise ConstructorError(None, None, f"cannot read this value ({exc})", node.start_mark) from None

    return StrictLoader
