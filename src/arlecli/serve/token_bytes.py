"""The bytes each token stands for: the `bytes` field of chat logprobs.

Why: a byte-level tokenizer splits a character it has no single token for (an emoji, most CJK)
into tokens of one or two of its UTF-8 bytes. Decoded alone such a token is "\ufffd", whose
own bytes are not the token's; OpenAI's `bytes` exists so that a client can join a reply's
tokens back into its text, which only the real bytes allow.

How: the token's vocabulary string run through the tokenizer's own decoder steps, one token at
a time (the `tokenizers` decoders arle's models use: ByteFallback's <0xNN> tokens, Replace,
Metaspace, ByteLevel's byte-to-character table; Fuse and Strip join or trim a whole sequence
and leave a token's bytes alone). A tokenizer with any other decoder, or none that `tokenizers`
describes, gets the UTF-8 of the token's decoded text, as before.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_PASS_THROUGH = {"Fuse", "Strip"}


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves,
    the other 68 for characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _steps(tokenizer: Any) -> list[dict[str, Any]] | None:
    """The decoder's steps as `tokenizers` describes them, or None where they are unknown."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    try:
        state = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return None
    steps = state.get("decoders", []) if state.get("type") == "Sequence" else [state]
    known = {"ByteFallback", "Replace", "Metaspace", "ByteLevel"} | _PASS_THROUGH
    if not steps or any(step.get("type") not in known for step in steps):
        return None
    return steps


def token_bytes_for(tokenizer: Any) -> Callable[[list[int]], list[bytes]]:
    """ids -> each id's bytes, memoised per id; `tokenizer` a transformers tokenizer."""
    steps = _steps(tokenizer)
    added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    table = _byte_level_table()
    memo: dict[int, bytes] = {}

    def one(token_id: int) -> bytes:
        if steps is None:
            return tokenizer.decode([token_id]).encode("utf-8", "surrogatepass")
        if token_id in added:
            return added[token_id].encode("utf-8")
        piece: str | bytes = tokenizer.convert_ids_to_tokens(token_id)
        for step in steps:
            if isinstance(piece, bytes):
                break  # a byte token: nothing after ByteFallback rewrites it
            kind = step["type"]
            if kind == "ByteFallback" and (m := _BYTE_TOKEN.fullmatch(piece)):
                piece = bytes([int(m.group(1), 16)])
            elif kind == "Replace" and "String" in step.get("pattern", {}):
                piece = piece.replace(step["pattern"]["String"], step["content"])
            elif kind == "Metaspace":
                piece = piece.replace(step.get("replacement", "\u2581"), " ")
            elif kind == "ByteLevel":
                piece = b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in piece)
        return piece if isinstance(piece, bytes) else piece.encode("utf-8", "surrogatepass")

    def token_bytes(ids: list[int]) -> list[bytes]:
        out = []
        for i in ids:
            if i not in memo:
                memo[i] = one(i)
            out.append(memo[i])
        return out

    return token_bytes
