"""Chat logprobs' `bytes` are the bytes each token stands for, so a client can join a reply's
tokens back into its text, also where a character (an emoji, CJK) is split over byte tokens
that each decode to U+FFFD alone."""

from __future__ import annotations

import openai
import pytest

from arlecli.serve.app import create_app
from arlecli.serve.server import BackgroundServer
from arlecli.serve.token_bytes import token_bytes_for

TEXT = "🐉 dragon, 日本語 and é\n\tdone"


def _byte_fallback_tokenizer():
    """A Llama-2-style tokenizer (SentencePiece pieces with ▁, <0xNN> byte-fallback tokens in the
    vocabulary), built offline: single characters, anything else falls back to bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁abcdefghijklmnopqrstuvwxyz,")
    tk = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>")


def _wordpiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(["the dragon flew over the sea"] * 5, trainers.WordPieceTrainer(special_tokens=["[UNK]"]))
    tk.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")


def test_byte_level_tokens_give_back_the_text(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert "\ufffd" in [tok.decode([i]) for i in ids]  # the case this is for: split characters
    pieces = token_bytes_for(tok)(ids + [tok.eos_token_id])
    assert b"".join(pieces) == (TEXT + tok.eos_token).encode()
    # Every token of the vocabulary, joined with others, decodes as the tokenizer decodes them.
    every = list(range(len(tok)))
    assert b"".join(token_bytes_for(tok)(every)).decode("utf-8", "replace") == tok.decode(every)


def test_byte_fallback_tokens_give_back_the_text():
    tok = _byte_fallback_tokenizer()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    # The leading space is the first piece's own (▁); Strip removes it only from a whole text.
    assert b"".join(token_bytes_for(tok)(ids)) == (" " + TEXT).encode()


def test_other_decoders_keep_the_decoded_text():
    tok = _wordpiece_tokenizer()
    ids = tok("the dragon", add_special_tokens=False)["input_ids"]
    assert token_bytes_for(tok)(ids) == [tok.decode([i]).encode() for i in ids]


def test_a_reply_of_split_characters_joins_back_from_its_logprob_bytes(tiny_model):
    """The protocol's logprobs for a reply whose tokens are known: their bytes are the text's."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from arlecli.engine.base import Completion
    from arlecli.serve import protocol

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    req = protocol.parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1})
    comp = Completion(TEXT, ids, [1, 2], [-0.5] * len(ids), "stop")
    scored = SimpleNamespace(logprobs=[-0.5] * (len(ids) + 1), top=[[(i, -0.5)] for i in [0] + ids])
    content = protocol.logprobs(req, comp, protocol.token_text_for(SimpleNamespace(tokenizer=tok)), scored)["content"]
    assert "\ufffd" in [e["token"] for e in content]
    assert b"".join(bytes(e["bytes"]) for e in content) == TEXT.encode()
    assert b"".join(bytes(e["top_logprobs"][0]["bytes"]) for e in content) == TEXT.encode()


@pytest.fixture(scope="module")
def served(tiny_model):
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model), batch_size=4)
    with BackgroundServer(create_app(engine, model_name="tiny")) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0)
    engine.close()


def test_chat_logprob_bytes_join_into_the_reply(served):
    client = served
    split = 0
    for seed in range(6):
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": TEXT}],
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            logprobs=True,
            top_logprobs=2,
        )
        choice = reply.choices[0]
        entries = choice.logprobs.content
        joined = b"".join(bytes(e.bytes) for e in entries)
        assert joined.decode("utf-8", "replace").startswith(choice.message.content)
        split += sum(e.token == "\ufffd" for e in entries)
        for e in entries:
            for shown in [e, *e.top_logprobs]:  # each token's bytes are what its text shows
                assert bytes(shown.bytes).decode("utf-8", "replace") == shown.token
    assert split  # random weights over a byte-level vocabulary sample split characters
