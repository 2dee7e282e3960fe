"""A transformers KV cache whose layers keep room to grow: a decode step writes its new column
into a buffer instead of copying the whole cache (transformers' `DynamicLayer` runs `torch.cat`
on every layer every step).

Why: the copy grows with the batch and the context. At 16 rows of ~250 tokens a layer's two
`cat`s took as long as its attention (0.48 ms against 0.50 ms on one core), 14 ms of a ~90 ms
step; writing one column takes 8 us. Attention reads the cache as a view of the buffer: SDPA on
it gives the same bits as on a contiguous copy (tested) at ~4% more of its own time.

The layer is a `DynamicLayer` in every other way: `keys` and `values` are always the tensors
to attend over (views here), and whatever replaces them (a batch's row selection, the engine's
merge of two caches, a crop) is taken over at the next update: a tensor that is not a view of
the buffer is copied into a new buffer, as `cat` would have copied it.
"""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import DynamicCache, DynamicLayer

# Columns of room at least, and a quarter of the length: a regrowth copies the cache once, and the
# cache takes up to a quarter more memory than its tokens need.
HEADROOM = 64


def new_cache(config: Any) -> DynamicCache:
    """A `DynamicCache` for a model of `config` whose full-attention layers are `GrowingLayer`s
    (sliding-window and other layer kinds stay transformers' own)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def fill_gaps(keep: list[int], total: int) -> list[int]:
    """The order to keep rows `keep` (ascending positions among `total`) in: a kept row in the
    first len(keep) positions stays where it is and the later ones move into the gaps left, so
    a `GrowingLayer` copies the moved rows alone, not every row (rows are independent of their
    position in a batch: the parity contract's batch invariance)."""
    n = len(keep)
    tail = [b for b in keep if b >= n]
    kept = set(keep)
    return [j if j in kept else tail.pop() for j in range(n)]


class GrowingLayer(DynamicLayer):
    """`DynamicLayer` with its keys and values kept in buffers with room at the end."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._buffers: tuple[Any, Any] | None = None

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Append the new columns and return the keys and values to attend over (as DynamicLayer)."""
        import torch

        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        length = keys.shape[-2] if keys.numel() else 0
        end = length + key_states.shape[-2]
        if not self._holds(keys, values, end):
            room = end + max(HEADROOM, end // 4)
            new: list[Any] = []
            for old, states in ((keys, key_states), (values, value_states)):
                shape = (*states.shape[:-2], room, states.shape[-1])
                buffer = torch.empty(shape, dtype=states.dtype, device=states.device)
                if length:
                    buffer[..., :length, :].copy_(old)
                new.append(buffer)
            self._buffers = (new[0], new[1])
        assert self._buffers is not None
        key_buffer, value_buffer = self._buffers
        key_buffer[..., length:end, :].copy_(key_states)
        value_buffer[..., length:end, :].copy_(value_states)
        self.keys, self.values = key_buffer[..., :end, :], value_buffer[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: Any) -> None:
        """Keep only the rows `indices` (rows leaving a batch). Where each kept row either stays
        where it is or comes from past the new batch's end (`fill_gaps`' order), only the moved
        rows are copied, in place; otherwise the buffers are selected whole, room and all."""
        length = self.get_seq_length()
        if not length or not self._holds(self.keys, self.values, length):
            return super().batch_select_indices(indices)
        assert self._buffers is not None
        order = indices.tolist() if hasattr(indices, "tolist") else list(indices)  # one copy off a GPU, not one a row
        n = len(order)
        if len(set(order)) == n and all(source == j or source >= n for j, source in enumerate(order)):
            for buffer in self._buffers:
                for j, source in enumerate(order):
                    if source != j:  # a slot of a row that left, filled from the tail (never written here)
                        buffer[j, ..., :length, :].copy_(buffer[source, ..., :length, :])
            key_buffer, value_buffer = (buffer[:n] for buffer in self._buffers)
        else:
            key_buffer, value_buffer = (buffer[indices, ...] for buffer in self._buffers)
        self._buffers = (key_buffer, value_buffer)
        self.keys, self.values = key_buffer[..., :length, :], value_buffer[..., :length, :]

    def _holds(self, keys: Any, values: Any, end: int) -> bool:
        """Whether `keys` and `values` are the leading columns of this layer's buffers, with room up to `end`."""
        if self._buffers is None:
            return False
        for tensor, buffer in zip((keys, values), self._buffers):
            if (
                tensor.data_ptr() != buffer.data_ptr()
                or tensor.stride() != buffer.stride()
                or tensor.shape[:-2] != buffer.shape[:-2]
                or end > buffer.shape[-2]
            ):
                return False
        return True
