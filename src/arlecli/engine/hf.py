"""The `hf` backend: batched generation with transformers, our own decode loop.

Why not `model.generate`: a static batch there runs until its longest row ends, so one
row that never emits EOS makes every other row pay for its tokens (ENVIRONMENT.md
measured 16,384 token slots computed for 1,480 useful ones). This loop drops each row
from the batch (and from the KV cache) the moment it hits EOS, a stop string or its
token budget, so compute follows the useful tokens, and refills the freed slots with
waiting requests (their prompts prefilled, their KV merged into the running cache), so
a batch never idles while one long row finishes. Requests are admitted longest prompt
first, so padding stays small and out-of-memory shows up at once, not at the end; rows
admitted together are prefilled in groups of similar length.

On CPU (fp32), linears run on oneDNN with prepacked weights and grouped-query attention
skips transformers' K/V copies (engine.onednn, `use_grouped_attention`): together about 2x
on a CPU eval (perf/eval_vs_lmeval.py: the same 64 greedy texts as before). Llama, Qwen2 and
Qwen3 models run engine.fused's forward (stacked projections, fewer calls: the same bits),
and the KV cache grows in a buffer instead of being copied every step (engine.kv_buffer).

Sampling uses one torch.Generator per request, seeded from the request's seed, so a
sample's tokens do not depend on which other requests share its batch: a resumed eval
draws the same samples as an uninterrupted one.

Chaining (`generate(..., then=...)`, what engine.phases uses for a thinking model's phases):
a finished row whose follow-up request continues its own ids stays in the batch with its KV
cache, the ids the follow-up adds (a forced end of thought) fed one decode step each, so a
phase costs neither a second prefill of the whole sequence nor a wait for the batch to drain.

Prompt lookup (engine.lookup): a greedy row decoding alone (batch 1, or the last row of a
batch) feeds a guess copied from its own context with its last token in one forward and keeps
what greedy would have chosen of it: up to 9 tokens for the cost of 1.05-1.6 steps.

Across calls (an agent episode's turns, each its own `generate` call): a finished row's KV is
kept in `prefix_cache` (engine.prefix_cache, keyed by the ids themselves, LRU over a token
budget), and a later prompt that shares a prefix with a kept sequence prefills only the rest,
so turn k+1 runs just the completion's last token and what the env appended. It is dropped
whenever the weights change (`_weights_version`: a live policy trained between calls).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from arlecli.engine.base import (
    Completion,
    GenerationRequest,
    Loglik,
    LoglikRequest,
    SamplingParams,
    cut_at_stop,
    encode_pair,
)
from arlecli.engine import fused, lookup, native, packed_cache
from arlecli.engine.attention import GROUPED_SDPA, ROWWISE_ATTENTION, grouped_sdpa
from arlecli.engine.onednn import pack_linears, rows_are_batch_invariant, unpack_linears
from arlecli.engine.prefix_cache import Entry, PrefixCache, configured_max_tokens
from arlecli.engine.tokens import check_template_kwargs, encode_request
from arlecli.errors import UserError

LONG_PROMPT_FACTOR = 4  # prompts longer than this many contexts are refused before any prefill


# `then(index, completion) -> GenerationRequest | None`: a finished request's follow-up, if any.
Then = Callable[[int, Completion], "GenerationRequest | None"]


@dataclass
class _Row:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: object | None
    out: list[int]
    logprobs: list[float]
    started: float = 0.0  # perf_counter when its prefill began: its latency runs from there
    feed: list[int] = field(default_factory=list)  # ids to feed (not sample) before it samples again
    cached: int = 0  # leading prompt ids whose KV comes from `past` (the prefix cache), not prefill
    past: Entry | None = None
    guess_len: int = lookup.FIRST_GUESS  # the next prompt-lookup guess's length (`HFEngine._verify` adapts it)


class HFEngine:
    """Generation with a transformers causal LM on CPU or GPU. `chat_template_kwargs` go to
    every chat-template render of its prompts (engine.tokens). `prefix_cache_tokens` bounds
    the KV kept across calls for prompts that extend earlier sequences (engine.prefix_cache;
    0 turns it off; None: $ARLE_KV_REUSE_TOKENS or 16384). `draft_tokens` bounds a
    prompt-lookup guess for a lone greedy row (engine.lookup; 0 turns it off; None:
    $ARLE_PROMPT_LOOKUP or 8): the tokens are greedy's either way."""

    name = "hf"
    chains = True  # generate() takes `then` (follow-up requests continue a row in the batch)
    streams = True  # generate() takes `on_tokens` (each row's ids so far, after every step: arle serve streams them)
    admits = True  # generate() takes `more` (requests that join a running call: arle serve's new arrivals)
    share_prompts = True  # rows with the same prompt are prefilled once (`_prefill`); perf and tests turn it off

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 16,
        device: str | None = None,
        dtype: str | None = None,
        model_obj: Any | None = None,
        tokenizer: Any | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        prefix_cache_tokens: int | None = None,
        draft_tokens: int | None = None,
    ) -> None:
        import torch

        self.torch = torch
        self.dtype = dtype  # as asked (--dtype); None: fp32 on CPU, bf16 on CUDA (`_load`)
        self.batch_size = max(1, batch_size)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if model_obj is not None and tokenizer is not None:
            # A live policy: its weights change between calls, so it is packed per call.
            self.model, self.tokenizer = model_obj, tokenizer
            self._packed: list[Any] | None = None
            self._fused: fused.FusedForward | None = None
        else:
            loaded = native.load(model, self.device, dtype)
            if loaded is not None:  # the same modules and numbers without transformers' model classes
                self.model, self.tokenizer, self._fused = loaded.model, loaded.tokenizer, loaded.forward
                store = loaded.store
            else:
                self.model, self.tokenizer = _load(model, self.device, dtype)
                use_grouped_attention(self.model)
                store = _packed_store(model) if self.device == "cpu" else None
                self._fused = fused.build(self.model, store)
            skip = self._fused.modules if self._fused else frozenset()
            self._packed = pack_linears(self.model, skip=skip, store=store)
            if store is not None:  # the packed weights kept for the next load
                store.save()
        # Prompt lookup's guesses are greedy's bit for bit only where every linear gives a row the
        # same bits at any row count and attention runs rowwise when asked (engine.attention).
        calls = [*(self._packed or []), *(self._fused.calls if self._fused else [])]
        self._lookup_exact = rows_are_batch_invariant(calls) and (
            getattr(self.model.config, "_attn_implementation", None) == GROUPED_SDPA
        )
        self.chat_template_kwargs = check_template_kwargs(self.tokenizer, chat_template_kwargs)
        self.model.eval()
        self._cache_kw = fused.cache_keyword(self.model.forward)
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = eos_ids
        self._on_tokens: Callable[[int, list[int]], None] | None = None
        self._more: Callable[[], list[tuple[int, GenerationRequest]]] | None = None
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else (next(iter(eos_ids)) if eos_ids else 0)
        )
        self.prefix_cache = PrefixCache(configured_max_tokens() if prefix_cache_tokens is None else prefix_cache_tokens)
        self.draft_tokens = lookup.configured_draft_tokens() if draft_tokens is None else draft_tokens
        self.lookup = lookup.Tally()
        self._weights_seen: tuple[Any, ...] | None = None

    @property
    def packed_linears(self) -> int:
        """How many linear layers run on oneDNN with weights packed at load, alone or stacked
        (engine.fused): 0 for a live policy (packed per call) and where packing does not pay."""
        return len(self._packed or []) + len(self._fused.modules if self._fused and self._packed is not None else ())

    def encode(self, request: GenerationRequest) -> list[int]:
        """Prompt token ids (shared with the vllm backend so both see the same ids)."""
        return encode_request(self.tokenizer, request, self.chat_template_kwargs)

    def generate(
        self,
        requests: list[GenerationRequest],
        then: Then | None = None,
        on_tokens: Callable[[int, list[int]], None] | None = None,
        more: Callable[[], list[tuple[int, GenerationRequest]]] | None = None,
    ) -> Iterator[tuple[int, Completion]]:
        """Yield (index, completion) as each request finishes.

        Continuous batching: up to `batch_size` rows decode together; a finished row leaves
        the batch (and the KV cache) at once, and waiting requests (longest prompts first)
        are prefilled and merged in as soon as a quarter of the slots are free, so the batch
        does not run on to the end of its longest row half empty.

        `then(index, completion)`, when given, is asked as each request finishes: None yields
        the completion; a GenerationRequest runs next under the same index instead (the
        completion is not yielded), in the same batch slot when its prompt ids extend the
        finished row's prompt and output.

        `on_tokens(index, ids)`, when given, is called after each step with the ids a row has
        generated so far (the row's own list: read it, do not keep or change it).

        `more()`, when given, is asked before every step for requests that arrived since, as
        (index, request) pairs with indices of the caller's choosing: they wait and join the
        batch as the others do, so a server's new request does not wait for this call to end."""
        self._on_tokens = on_tokens
        self._more = more
        seen = self._weights_version()
        if seen != self._weights_seen:  # kept KV was computed by other weights: none of it is valid
            self.prefix_cache.clear()
            self._weights_seen = seen
        encoded = [self.encode(r) for r in requests]
        context = self._max_length()
        longest = max((len(ids) for ids in encoded), default=0)
        if longest > LONG_PROMPT_FACTOR * context:
            # A conversation that outgrows the context a little (an agent's late turns on a small
            # model) still runs, as it always has; a prompt many times the context computes
            # nothing meaningful past the position embeddings and asks the attention for tens of
            # GB (an 80k-token row ran for minutes, a 50 MB one died allocating 28 GB).
            raise UserError(
                f"a prompt of {longest:,} tokens is over {LONG_PROMPT_FACTOR}x the model's context of "
                f"{context:,} tokens: shorten or drop that row (--rows, --limit), or use a model with a longer context"
            )
        order = sorted(range(len(requests)), key=lambda i: -len(encoded[i]))
        waiting = deque(self._row(i, encoded[i], requests[i].params) for i in order)
        with self._kernels():
            yield from self._run(waiting, then)

    @contextlib.contextmanager
    def _kernels(self) -> Iterator[None]:
        """The packed kernels for one call: those packed at load, or for a live policy packed
        now (the same kernels as an engine that loaded these weights itself, so training
        rollouts sample what `arle eval` would) and dropped after, before the weights change."""
        if self._packed is not None:
            yield
            return
        self._fused = fused.build(self.model)
        packed = pack_linears(self.model, skip=self._fused.modules if self._fused else frozenset())
        try:
            yield
        finally:
            unpack_linears(packed)
            self._fused = None

    def forward(self, ids: Any, mask: Any = None, positions: Any = None, cache: Any = None, keep: int = 0) -> Any:
        """The model's logits for `ids` [batch, positions] (left-padded rows: `mask`, `positions`),
        `cache` (a transformers cache) grown in place; the last `keep` positions' only if `keep`.
        Through engine.fused where the model has it (the same bits as the model's own forward)."""
        if self._fused is not None:
            return self._fused(ids, mask, positions, cache, keep)
        kwargs = {self._cache_kw: cache, "use_cache": True} if cache is not None else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep, **kwargs)
        return out.logits

    def _weights_version(self) -> tuple[Any, ...]:
        """What identifies the weights the model computes with now: each parameter's identity
        and in-place version counter (an optimizer step, load_state_dict or a LoRA merge bumps
        it) and each peft layer's active/disabled adapters (switching them changes the
        function without touching a tensor). Cheap: one tuple over the parameters."""
        params = tuple((id(p), p._version) for p in self.model.parameters())
        adapters = tuple(
            (m._disable_adapters, str(getattr(m, "_active_adapter", None)))
            for m in self.model.modules()
            if hasattr(m, "_disable_adapters")
        )
        return params, adapters

    def _reuse(self, rows: list[_Row]) -> list[_Row]:
        """Give each row the longest kept prefix of its prompt; returns `rows` ordered for
        prefill (longest part left to run first, as `length_groups` wants) when any row got one."""
        if not self.prefix_cache.max_tokens:
            return rows
        for r in rows:
            r.cached, r.past = self.prefix_cache.match(r.prompt_ids)
        if not any(r.cached for r in rows):
            return rows
        return sorted(rows, key=lambda r: -(len(r.prompt_ids) - r.cached))

    def _keep(self, cache: Any, leaving: list[tuple[int, list[int]]]) -> None:
        """Copy the KV of each leaving (batch row, ids in the cache) into the prefix cache. A
        row's tokens are the last len(ids) columns of the batch cache: rows are only ever
        left-padded (prefill, `_merge`) and grow at the right."""
        if not leaving or not self.prefix_cache.max_tokens:
            return
        layers = list(cache.layers)
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            self.prefix_cache.max_tokens = 0  # a sliding window drops old columns: no row's ids map to them
            return
        width = layers[0].keys.shape[2]
        for b, ids in leaving:
            start = width - len(ids)
            if start >= 0 and len(ids) <= self.prefix_cache.max_tokens:  # else too long to keep: no copy
                kv = [(x.keys[b : b + 1, :, start:].clone(), x.values[b : b + 1, :, start:].clone()) for x in layers]
                self.prefix_cache.put(ids, kv)

    def _row(self, index: int, prompt_ids: list[int], params: SamplingParams) -> _Row:
        return _Row(index, prompt_ids, params, self._generator(params), [], [])

    def _generator(self, params: SamplingParams) -> object | None:
        if params.temperature <= 0:
            return None
        gen = self.torch.Generator(device=self.device)
        gen.manual_seed(params.seed if params.seed is not None else 0)
        return gen

    def _prefill(self, rows: list[_Row]):
        """Run the prompts of `rows`; returns (last logits, cache, mask, next positions).

        Rows of very different lengths are prefilled in separate groups (`length_groups`)
        whose caches are then merged: one left-padded batch of prompts of 99-181 tokens was
        46% padding, each position costing a full forward pass.

        Rows with the same prompt (a GRPO group's samples, `arle eval -n`) are run once and
        their logits and KV copied: a row's numbers do not depend on its batch, so the copies
        are what each row's own prefill would give, at 1/G of the cost."""
        torch = self.torch
        distinct, copies = rows, None
        if self.share_prompts:
            slot: dict[tuple[Any, ...], int] = {}  # a prompt (and its kept prefix) -> its row in `distinct`
            keys = [(tuple(r.prompt_ids), r.cached, id(r.past)) for r in rows]
            distinct = []
            for r, key in zip(rows, keys):
                if key not in slot:
                    slot[key] = len(distinct)
                    distinct.append(r)
            if len(distinct) < len(rows):
                copies = torch.tensor([slot[key] for key in keys], device=self.device)
        groups = length_groups([len(r.prompt_ids) - r.cached for r in distinct])
        parts = [self._prefill_group(distinct[start:end]) for start, end in groups]
        logits, cache, mask, positions = parts[0]
        for more_logits, more_cache, more_mask, more_positions in parts[1:]:
            mask = _merge(cache, more_cache, mask, more_mask)
            logits = torch.cat([logits, more_logits])
            positions = torch.cat([positions, more_positions])
        if copies is None:
            return logits, cache, mask, positions
        for r in rows:
            r.past = None  # as `_prefill_group` leaves the rows it ran: a copy's kept KV was its first row's
        cache.batch_select_indices(copies)
        return logits[copies], cache, mask[copies], positions[copies]

    def _prefill_group(self, rows: list[_Row]):
        """Run the prompts of `rows` (left-padded) as one batch; returns what `_prefill` does.

        Rows with a kept prefix (`r.past`) run only their last `width` ids, `width` the
        longest part left to run in the group, on top of their kept KV (left-padded to the
        longest). A row with a shorter rest runs a few kept ids again instead of leaving a
        masked gap between its past and its rest, so every row stays padding-then-tokens, the
        shape `_merge` and `_keep` rely on; padding a short rest would cost the same slots."""
        torch = self.torch
        from arlecli.engine.kv_buffer import new_cache  # here: the tests swap it for DynamicCache

        width = max(len(r.prompt_ids) - r.cached for r in rows)
        fed = [r.prompt_ids[-width:] for r in rows]
        pasts = [len(r.prompt_ids) - len(f) for r, f in zip(rows, fed)]  # <= r.cached: kept ids not run again
        past = max(pasts)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), past + width), dtype=torch.long)
        for b, f in enumerate(fed):  # left padding: every row's next token lands in the last column
            ids[b, width - len(f) :] = torch.tensor(f)
            mask[b, past + width - len(f) - pasts[b] :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        cache = new_cache(self.model.config)
        if past:
            self._fill_past(cache, rows, pasts, past)
        for r in rows:
            r.past = None  # the batch cache holds what it needs; the entry may be evicted now
        logits = self.forward(ids, mask, positions, cache, keep=1)
        return logits[:, -1, :].float(), cache, mask, positions[:, -1:] + 1

    def _fill_past(self, cache: Any, rows: list[_Row], pasts: list[int], past: int) -> None:
        """Load each row's first `pasts[b]` kept KV columns into the empty `cache`, right-aligned
        in `past` columns (zeros, masked out, before them)."""
        kept = next(r.past for r in rows if r.past is not None)
        for layer_idx in range(len(kept.layers)):
            first = kept.layers[layer_idx][0]
            shape = (len(rows), first.shape[1], past, first.shape[3])
            keys = first.new_zeros(shape)
            values = first.new_zeros(shape)
            for b, r in enumerate(rows):
                if pasts[b] and r.past is not None:
                    k, v = r.past.layers[layer_idx]
                    keys[b, :, past - pasts[b] :] = k[0, :, : pasts[b]]
                    values[b, :, past - pasts[b] :] = v[0, :, : pasts[b]]
            cache.update(keys.to(self.device), values.to(self.device), layer_idx)

    def _step(
        self,
        rows: list[_Row],
        logits,
        then: Then | None = None,
        waiting: deque[_Row] | None = None,
    ) -> tuple[list[int], list[int], list[tuple[int, Completion]], list[tuple[int, list[int]]]]:
        """Pick each row's next token; returns (tokens, surviving row positions, finished,
        leaving). A row that is fed ids (a chained follow-up's) takes the next of them instead.
        `leaving`: (row position, the ids its KV holds) of each row that leaves the batch done."""
        chosen, lps = self._pick(logits, rows)
        # One device-to-host copy per step, not one per row (a sync each on a GPU).
        return self._emit(rows, chosen.tolist(), lps.tolist() if lps is not None else None, then, waiting)

    def _emit(
        self,
        rows: list[_Row],
        tokens: list[int],
        token_lps: list[float] | None,
        then: Then | None = None,
        waiting: deque[_Row] | None = None,
    ) -> tuple[list[int], list[int], list[tuple[int, Completion]], list[tuple[int, list[int]]]]:
        """`_step` once the tokens are chosen: append them, finish rows, chain follow-ups."""
        keep: list[int] = []
        finished: list[tuple[int, Completion]] = []
        leaving: list[tuple[int, list[int]]] = []
        for b, r in enumerate(rows):
            if r.feed:
                tokens[b] = r.feed.pop(0)
                keep.append(b)
                continue
            r.out.append(tokens[b])
            if token_lps is not None and r.params.logprobs:
                r.logprobs.append(token_lps[b])
            if self._on_tokens is not None:
                self._on_tokens(r.index, r.out)
            done = self._finished(r, tokens[b])
            if not done:
                keep.append(b)
                continue
            completion = self._completion(r, done)
            leaving.append((b, [*r.prompt_ids, *r.out[:-1]]))  # the token just sampled was never fed
            follow = then(r.index, completion) if then is not None else None
            if follow is None:
                finished.append((r.index, completion))
                continue
            prompt_ids = self.encode(follow)
            so_far = [*r.prompt_ids, *r.out]
            if done != "eos" and prompt_ids[: len(so_far)] == so_far:
                # Continue in place: the KV cache holds everything but the token just sampled,
                # which is fed next, then whatever the follow-up adds.
                rows[b] = self._row(r.index, prompt_ids, follow.params)
                rows[b].feed = prompt_ids[len(so_far) :]
                rows[b].started = time.perf_counter()
                keep.append(b)
                leaving.pop()
            elif waiting is not None:
                waiting.appendleft(self._row(r.index, prompt_ids, follow.params))
        return tokens, keep, finished, leaving

    def _run(self, waiting: deque[_Row], then: Then | None = None) -> Iterator[tuple[int, Completion]]:
        from arlecli.engine.kv_buffer import fill_gaps  # imports transformers: not at arle's start-up

        torch = self.torch
        active: list[_Row] = []
        # The running batch: KV cache, mask, positions, fed tokens (tensors and a transformers cache).
        cache: Any = None
        mask: Any = None
        next_pos: Any = None
        last: Any = None
        with torch.inference_mode():
            while True:
                if self._more is not None:
                    waiting.extend(self._row(i, self.encode(r), r.params) for i, r in self._more())
                if not (active or waiting):
                    break
                free = self.batch_size - len(active)
                if waiting and (not active or free >= max(1, self.batch_size // 4)):
                    rows = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                    now = time.perf_counter()
                    for r in rows:
                        r.started = now
                    rows = self._reuse(rows)
                    logits, new_cache, new_mask, new_pos = self._prefill(rows)
                    tokens, keep, finished, leaving = self._step(rows, logits, then, waiting)
                    self._keep(new_cache, leaving)
                    yield from finished
                    if keep:
                        sel = torch.tensor(keep, device=self.device)
                        new_cache.batch_select_indices(sel)
                        new_last = torch.tensor([tokens[b] for b in keep], device=self.device)
                        rows = [rows[b] for b in keep]
                        if active:
                            mask = _merge(cache, new_cache, mask, new_mask[sel])
                            next_pos = torch.cat([next_pos, new_pos[sel]])
                            last = torch.cat([last, new_last])
                        else:
                            cache, mask, next_pos, last = new_cache, new_mask[sel], new_pos[sel], new_last
                        active += rows
                if not active:
                    continue
                width = mask.shape[1]
                guess = self._guess(active, cache)
                if guess:
                    tokens, keep, finished, leaving, mask = self._verify(
                        active, guess, last, cache, mask, next_pos, then, waiting
                    )
                else:
                    mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
                    logits = self.forward(last.view(-1, 1), mask, next_pos, cache)
                    tokens, keep, finished, leaving = self._step(active, logits[:, -1, :].float(), then, waiting)
                next_pos = next_pos + (mask.shape[1] - width)  # the positions fed and kept: 1, or a guess's
                self._keep(cache, leaving)
                yield from finished
                last = torch.tensor(tokens, device=self.device)
                if len(keep) < len(active):
                    keep = fill_gaps(keep, len(active))  # the cache moves only the rows past the gaps
                    active = [active[b] for b in keep]
                    if not active:
                        cache = mask = next_pos = last = None
                        continue
                    sel = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(sel)
                    mask, next_pos, last = mask[sel], next_pos[sel], last[sel]

    def _guess(self, rows: list[_Row], cache: Any) -> list[int]:
        """A prompt-lookup draft (engine.lookup) for a batch of one greedy row, else [].

        One row only: at batch 1 a step reads every weight for one position, so a few more
        positions ride along almost free; a full batch is closer to compute-bound and would pay
        for every row's guess. Not for rows that are fed ids, nor where a sliding window's
        cache cannot be cut back, nor where the kernels cannot give the steps' bits
        (`_lookup_exact`: a live policy, a GPU)."""
        if len(rows) != 1 or not self.draft_tokens or not self._lookup_exact:
            return []
        r = rows[0]
        if r.feed or r.params.temperature > 0:
            return []
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            return []
        room = r.params.max_tokens - len(r.out) - 1  # a guess of g ids ends with g + 1 tokens at most
        return lookup.draft([*r.prompt_ids, *r.out], min(self.draft_tokens, r.guess_len, room))

    def _verify(
        self,
        rows: list[_Row],
        guess: list[int],
        last: Any,
        cache: Any,
        mask: Any,
        next_pos: Any,
        then: Then | None,
        waiting: deque[_Row],
    ) -> tuple[list[int], list[int], list[tuple[int, Completion]], list[tuple[int, list[int]]], Any]:
        """Run the row's last token and `guess` in one forward and emit the model's greedy
        token after each position for as long as the guess agrees with it: the tokens single
        steps would have chosen, and one more. Returns `_step`'s tuple and the attention mask
        grown by the positions fed that stay in the cache (the rest are cut off it)."""
        torch = self.torch
        ids = torch.tensor([[int(last[0]), *guess]], device=self.device)
        n = ids.shape[1]
        grown = torch.cat([mask, mask.new_ones((1, n))], dim=1)
        rowwise = ROWWISE_ATTENTION.set(True)
        try:
            logits = self.forward(ids, grown, next_pos + torch.arange(n, device=self.device), cache)[0].float()
        finally:
            ROWWISE_ATTENTION.reset(rowwise)
        picked = logits.argmax(dim=-1)
        chosen = picked.tolist()
        row = rows[0]
        lps = None
        if row.params.logprobs:  # a log-softmax gives each position the bits it gives it alone, as in `_pick`
            lps = torch.log_softmax(logits, dim=-1).gather(1, picked.view(-1, 1)).squeeze(1).tolist()
        for fed, token in enumerate(chosen, 1):
            tokens, keep, finished, leaving = self._emit(rows, [token], lps[fed - 1 :] if lps else None, then, waiting)
            # Done, chained into a follow-up, the guess used up, or the model disagreed with it.
            if not keep or rows[0] is not row or fed == n or token != guess[fed - 1]:
                break
        if fed < n:  # the positions after the last one kept (a negative crop: the form every transformers 5 takes)
            cache.crop(fed - n)
        row.guess_len = lookup.next_guess_len(fed - 1, len(guess))
        self.lookup.forwards += 1
        self.lookup.guessed += len(guess)
        self.lookup.tokens += fed
        return tokens, keep, finished, leaving, grown[:, : mask.shape[1] + fed]

    def _pick(self, logits, active: list[_Row]):
        """The next token of each row, and its logprob (None when no row asked for them).

        The logprob is that of the distribution the token was drawn from (temperature-scaled,
        nucleus renormalised; the raw one for greedy rows), as vLLM's processed logprobs: a
        trainer compares it with its own temperature-scaled logprobs of the same token."""
        torch = self.torch
        chosen = logits.argmax(dim=-1)
        want = any(r.params.logprobs for r in active)
        # A full-vocabulary log-softmax per step, skipped when no row asks for logprobs.
        lps = torch.log_softmax(logits, dim=-1).gather(1, chosen.view(-1, 1)).squeeze(1) if want else None
        for b, r in enumerate(active):
            p = r.params
            if p.temperature <= 0 or r.feed:  # a fed row samples nothing: its generator stays untouched
                continue
            scaled = logits[b] / p.temperature
            probs = torch.softmax(scaled, dim=-1)
            if p.top_p < 1.0:
                sorted_p, idx = probs.sort(descending=True)
                cum = sorted_p.cumsum(-1)
                cut = cum - sorted_p > p.top_p  # keep the smallest prefix whose mass reaches top_p
                sorted_p[cut] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
            chosen[b] = draw(probs, r.generator)
            if lps is not None:
                lps[b] = torch.log(probs[chosen[b]] / probs.sum())
        return chosen, lps

    def _finished(self, r: _Row, tok: int) -> str | None:
        if tok in self.eos_ids:
            return "eos"
        if tok in r.params.stop_token_ids:
            return "stop"
        if r.params.stop:
            # Decode only a tail window: a stop string can only complete in the newest tokens,
            # and a token is at least one character, so len(stop) + slack tokens cover it.
            window = max(len(s) for s in r.params.stop) + 4
            tail = self.tokenizer.decode(r.out[-window:], skip_special_tokens=True)
            if any(s in tail for s in r.params.stop):
                return "stop"
        if len(r.out) >= r.params.max_tokens:
            return "length"
        return None

    def _completion(self, r: _Row, why: str) -> Completion:
        ids = r.out[:-1] if why == "eos" else r.out
        full = self.tokenizer.decode(ids, skip_special_tokens=True)
        text = cut_at_stop(full, r.params.stop)
        if text != full:
            why = "stop"
        return Completion(
            text=text,
            token_ids=list(r.out),
            prompt_token_ids=list(r.prompt_ids),
            logprobs=list(r.logprobs) if r.params.logprobs else None,
            finish_reason="length" if why == "length" else "stop",
            latency_s=time.perf_counter() - r.started,
        )

    def loglikelihood(self, requests: list[LoglikRequest]) -> Iterator[tuple[int, Loglik]]:
        """Yield (index, Loglik) for each (context, continuation), a batch at a time.

        As lm-eval's HFLM computes it (lm-eval's token split, `encode_pair`; log-softmax over
        the continuation's positions), with one saving: the choices of a question share its
        context, so the context runs once and every choice's continuation is scored against
        its KV cache (lm-eval runs the whole context again for each choice). Requests with a
        context of their own (winogrande's partial scoring) run as lm-eval runs them: the
        longest first, `batch_size` right-padded sequences to a forward pass."""
        encoded = [encode_pair(self.tokenizer, r.context, r.continuation) for r in requests]
        for i, (_, cont) in enumerate(encoded):
            if not cont:
                raise UserError(
                    f"loglikelihood request {i}: the continuation {requests[i].continuation!r} "
                    "is empty after tokenisation"
                )
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(encoded):
            groups.setdefault(tuple(ctx), []).append(i)
        shared = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: -len(encoded[g[0]][0]))
        alone = sorted(
            (i for g in groups.values() if len(g) == 1 for i in g),
            key=lambda i: (-len(encoded[i][0]) - len(encoded[i][1]), tuple(encoded[i][0] + encoded[i][1])),
        )
        with self._kernels():
            for group in shared:
                for start in range(0, len(group), self.batch_size):
                    part = group[start : start + self.batch_size]
                    yield from zip(part, self._score_shared([encoded[i] for i in part]))
            for start in range(0, len(alone), self.batch_size):
                batch = alone[start : start + self.batch_size]
                yield from zip(batch, self._score_batch([encoded[i] for i in batch]))

    def _inputs(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[int]]:
        # The last token is only ever a target; a too-long sequence loses its left end (as lm-eval).
        limit = self._max_length()
        return [(ctx + cont)[-(limit + 1) :][:-1] for ctx, cont in pairs]

    def _score_shared(self, pairs: list[tuple[list[int], list[int]]]) -> list[Loglik]:
        """Score continuations of one shared context: the context's KV once, then every
        continuation (right-padded) as one batch on top of it."""
        torch = self.torch
        from transformers import DynamicCache

        inputs = self._inputs(pairs)
        # The prefix run once: common to all inputs, and short of every first scored position.
        shared = min(len(x) - len(cont) for x, (_, cont) in zip(inputs, pairs))
        for n, column in enumerate(zip(*inputs)):
            if n >= shared or any(t != column[0] for t in column):
                shared = n
                break
        if shared < 1:
            return self._score_batch(pairs)
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            self.forward(torch.tensor([inputs[0][:shared]], device=self.device), cache=cache, keep=1)
            cache.batch_repeat_interleave(len(pairs))
            rests = [x[shared:] for x in inputs]
            width = max(len(r) for r in rests)
            ids = torch.full((len(rests), width), self.pad_id, dtype=torch.long)
            for b, r in enumerate(rests):
                ids[b, : len(r)] = torch.tensor(r)
            logits = self.forward(ids.to(self.device), cache=cache)
            return [self._loglik(logits[b], len(r), cont) for b, (r, (_, cont)) in enumerate(zip(rests, pairs))]

    def _loglik(self, logits: Any, length: int, cont: list[int]) -> Loglik:
        """The Loglik of `cont`, the last tokens predicted by a row's logits[:length]."""
        torch = self.torch
        rows = torch.log_softmax(logits[length - len(cont) : length].float(), dim=-1)
        target = torch.tensor(cont, device=rows.device)
        greedy = bool((rows.argmax(dim=-1) == target).all())
        return Loglik(float(rows.gather(1, target.view(-1, 1)).sum()), greedy, len(cont))

    def _max_length(self) -> int:
        config = self.model.config
        for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
            if isinstance(getattr(config, attr, None), int):
                return getattr(config, attr)
        return 2048  # lm-eval's default

    def _score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[Loglik]:
        """Score (context, continuation) pairs as lm-eval does: right-padded sequences, one
        forward pass (no mask needed: padding only follows the real tokens)."""
        torch = self.torch
        inputs = self._inputs(pairs)
        width = max(len(x) for x in inputs)
        ids = torch.full((len(inputs), width), self.pad_id, dtype=torch.long)
        for b, x in enumerate(inputs):
            ids[b, : len(x)] = torch.tensor(x)
        with torch.inference_mode():
            logits = self.forward(ids.to(self.device))
            return [self._loglik(logits[b], len(x), cont) for b, (x, (_, cont)) in enumerate(zip(inputs, pairs))]

    def close(self) -> None:
        """Drop the model (and the kept KV) so its memory can be freed."""
        self.model = None
        self.prefix_cache.clear()


def draw(probs: Any, generator: Any) -> Any:
    """`torch.multinomial(probs, 1, generator=generator)[0]` for a 1-D `probs`, bit for bit: the
    same token and the same generator state after, at about half the cost on a CPU.

    Why: multinomial takes argmax(probs / q) over one Exp(1) draw q per vocabulary entry, and a
    CPU's `exponential_` makes them in a scalar loop in double (1.2 ms a row of SmolLM2's 49,152
    entries, ~10% of a 16-row sampled decode step). Each q is -log1p(-u) of one float64 uniform
    from the generator, cast to the probabilities' dtype: drawing the uniforms in one call and
    taking the logarithm vectorised gives the same q (tests/test_engine_hf.py checks it against
    multinomial itself, so a torch that draws otherwise fails there). Elsewhere (CUDA draws
    its own way), multinomial itself."""
    import torch

    if probs.device.type != "cpu" or probs.dim() != 1:
        return torch.multinomial(probs, 1, generator=generator)[0]
    uniform = torch.empty(probs.shape[0], dtype=torch.float64).uniform_(generator=generator)
    exponential = torch.log1p(uniform.neg_()).neg_().to(probs.dtype)
    return torch.argmax(probs / exponential)


MAX_PREFILL_PADDING = 0.25  # of a prefill group's width; a new group starts beyond it


def length_groups(lengths: list[int]) -> list[tuple[int, int]]:
    """Split `lengths` (prompt lengths, longest first as `generate` admits them) into runs
    [start, end) in which no prompt is shorter than 1 - MAX_PREFILL_PADDING of the run's
    longest: the share of a group's prefill spent on padding stays under that bound."""
    groups: list[tuple[int, int]] = []
    start, longest, shortest = 0, 0, None
    for i, n in enumerate(lengths):
        longest, shortest = max(longest, n), n if shortest is None else min(shortest, n)
        if i > start and shortest < (1 - MAX_PREFILL_PADDING) * longest:
            groups.append((start, i))
            start, longest, shortest = i, n, n
    groups.append((start, len(lengths)))
    return groups


def _merge(cache: Any, new: Any, mask: Any, new_mask: Any) -> Any:
    """Append the rows of KV cache `new` to `cache` (in place), left-padding whichever is
    shorter with masked-out zeros; returns the merged attention mask."""
    import torch

    width = max(mask.shape[1], new_mask.shape[1])

    def pad(x: Any, dim: int) -> Any:
        missing = width - x.shape[dim]
        if not missing:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x.new_zeros(shape), x], dim=dim)

    for old, add in zip(cache.layers, new.layers, strict=True):
        old.keys = torch.cat([pad(old.keys, 2), pad(add.keys, 2)])
        old.values = torch.cat([pad(old.values, 2), pad(add.values, 2)])
    return torch.cat([pad(mask, 1), pad(new_mask, 1)])


def use_grouped_attention(model: Any) -> bool:
    """Switch a CPU model on transformers' "sdpa" attention to `attention.grouped_sdpa` (the same
    results, bit for bit); returns whether it switched.

    Why: with a padding mask, transformers copies each key/value head once per query head
    it serves before calling SDPA (on CUDA the fused kernels refuse grouped heads with a
    mask). The continuous batch always has a padding mask (rows merged at different
    lengths), so every decode step copied the whole KV cache 3 times over for a model with
    3 query heads per KV head (SmolLM2): 10% of the run. On CPU, SDPA takes the grouped
    heads and the mask as they are."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or model.device.type != "cpu":
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
        AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
        model.set_attn_implementation(GROUPED_SDPA)
    except (ImportError, ValueError, AttributeError):  # another transformers: keep its own sdpa
        return False
    return True


def _skip_sklearn() -> None:
    """Keep transformers from importing scikit-learn and SciPy for a model load.

    Why: where scikit-learn is installed (lm-eval pulls it in, and SciPy with it),
    transformers' generation package imports `sklearn.metrics` up front, 1.5-2.5 s of an
    eval's start-up on a slow core, for one use: tuning the confidence threshold of assisted
    (draft-model) generation, which arle never runs; and its loss package imports
    `scipy.optimize` (0.24 s on a fast core) for the Hungarian matching of object-detection
    losses. transformers asks `transformers.utils.is_sklearn_available()` and
    `is_scipy_available()` when those modules are first imported; answering no before then
    skips the imports and changes nothing arle uses (causal LMs). In a process that imported
    them already it is a no-op."""
    import transformers.utils

    if "transformers.generation.candidate_generator" not in sys.modules:
        transformers.utils.is_sklearn_available = lambda: False
    if "transformers.loss.loss_for_object_detection" not in sys.modules:
        transformers.utils.is_scipy_available = lambda: False


def _packed_store(model: str) -> packed_cache.PackedStore | None:
    """The packed-weights cache (engine.packed_cache) for a model folder loaded from its own
    weight files; None for a hub id or an adapter (its weights are merged into the base's)."""
    from arlecli.models import is_adapter_folder

    folder = Path(model)
    if not folder.is_dir() or is_adapter_folder(folder):
        return None
    files = native.weight_files(folder)
    return None if files is None else packed_cache.open_store(files)


def _load(model: str, device: str, dtype: str | None):
    import torch

    _skip_sklearn()
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor "Loading weights" bar is noise in eval output
    # fp32 on CPU unless asked (--dtype): exact and batch-invariant (`pack_linears`); bf16 is
    # faster only on CPUs with bf16 units (AMX, AVX512-BF16) and changes the numbers.
    torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    try:
        from arlecli.models import is_adapter_folder

        if is_adapter_folder(model):
            from peft import AutoPeftModelForCausalLM

            m = AutoPeftModelForCausalLM.from_pretrained(model, dtype=torch_dtype).merge_and_unload()
        else:
            m = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype)
        tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    except OSError as exc:
        raise UserError(
            f"cannot load model '{model}': {str(exc).splitlines()[0]} "
            f"(give a local folder, a cached hub id, or --base-url for an endpoint)"
        ) from None
    except (ValueError, SafetensorError) as exc:  # a damaged or foreign file in a folder that exists
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"cannot load model '{model}': {first} (a file in it is damaged or not a causal LM's: "
            "download or save the model again)"
        ) from None
    return m.to(device), tok
