"""Reading and writing text that arle does not control: model output, data rows, cards,
profiles, run files.

Three promises, kept in one place so every reader and writer keeps them the same way:

- What arle writes is valid UTF-8 JSON whatever it holds. Python strings may carry lone
  surrogates (a model's output decoded with errors="surrogateescape", a class name
  `"\\ud800"`, a JSON row with `"\\ud800"` in it); `json.dumps(..., ensure_ascii=False)`
  keeps them raw, and writing that to a UTF-8 file raises. `dumps` escapes them instead
  (`\\ud800`, valid JSON that reads back as the same string), so no sample is lost.
- JSON is read with a depth limit: a 100k-deep `[[[...` line is one ValueError, not a
  RecursionError traceback.
- YAML is read with a safe loader that refuses aliases (a "billion laughs" card or
  profile expands to gigabytes) and nesting deeper than `MAX_DEPTH`.

`read_text` turns a file that is not UTF-8 into one UserError line naming it.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from arlecli.errors import UserError

MAX_DEPTH = 200  # nesting of a card, a profile, a data row or a run file: far beyond any real one
_SURROGATE = re.compile("[\ud800-\udfff]")


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


def loads(text: str | bytes) -> Any:
    """`json.loads`, with nesting deeper than `MAX_DEPTH` (or than Python's recursion limit)
    refused as ValueError (json.JSONDecodeError is one too)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} deep") from None
    if _too_deep(value):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} deep")
    return value


def _too_deep(value: Any) -> bool:
    # Iterative: a recursive walk would hit the recursion limit on the values it checks.
    stack = [(value, 0)]
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


def read_text(path: Path | str, what: str = "file") -> str:
    """The file's text as UTF-8; UserError (one line naming the file) when it cannot be read
    or is not UTF-8."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 and rerun") from None


def load_yaml(text: str | bytes) -> Any:
    """YAML through a safe loader that refuses aliases and nesting deeper than MAX_DEPTH.

    Raises yaml.YAMLError (with a problem_mark where the parser knows one) for both, like
    any other YAML mistake, so callers keep one error path."""
    loader = _strict_loader()(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.cache
def _strict_loader() -> type:
    import yaml
    from yaml.composer import ComposerError

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader without aliases, and with a depth limit."""

        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D401 (PyYAML's hook)
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ComposerError(None, None, "YAML aliases (*name) are not accepted here: write the value out",
                                    event.start_mark)
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    event = self.peek_event()
                    raise ComposerError(None, None, f"nested more than {MAX_DEPTH} deep", event.start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return StrictLoader
