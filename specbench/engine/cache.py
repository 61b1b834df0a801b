"""A minimal KV cache that the unmodified transformers attention modules can write into.

Attention layers only call `past_key_values.update(key, value, layer_idx)` and use what it
returns, so any object with that method works as a cache. Owning it (instead of using
`DynamicCache`, whose `crop` semantics changed between releases) gives us three things the
decoding methods need: per-layer lengths (layer-skipping drafts leave skipped layers behind),
rollback to an accepted length, and keeping an arbitrary subset of positions (the accepted path
of a token tree). Buffers grow by doubling so a step costs no copy of the whole history.
"""

from __future__ import annotations

import torch

from specbench.engine.transfer import upload


class KVCache:
    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self.lengths)

    def length(self, layer: int = 0) -> int:
        return self.lengths[layer]

    # the protocol transformers' attention modules use ------------------------------------
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_, **__):
        n, new = self.lengths[layer_idx], key.shape[-2]
        buf_k, buf_v = self.keys[layer_idx], self.values[layer_idx]
        if buf_k is None or n + new > buf_k.shape[-2]:
            cap = max(64, 2 * (n + new))
            shape = (*key.shape[:-2], cap, key.shape[-1])
            grown_k = key.new_empty(shape)
            grown_v = value.new_empty((*value.shape[:-2], cap, value.shape[-1]))
            if buf_k is not None and n:
                grown_k[..., :n, :] = buf_k[..., :n, :]
                grown_v[..., :n, :] = buf_v[..., :n, :]
            self.keys[layer_idx], self.values[layer_idx] = buf_k, buf_v = grown_k, grown_v
        buf_k[..., n : n + new, :] = key
        buf_v[..., n : n + new, :] = value
        self.lengths[layer_idx] = n + new
        return buf_k[..., : n + new, :], buf_v[..., : n + new, :]

    def copy_prefix(self, src: "KVCache", n: int) -> "KVCache":
        """This (empty) cache holding the first n entries of every layer of `src`, copied."""
        for i in range(src.num_layers):
            if src.keys[i] is not None:
                self.write_rows(i, src.keys[i][..., :n, :], src.values[i][..., :n, :])
        return self

    def write_rows(self, i: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Layer i's entries from position 0 set to these (outside a forward)."""
        self.lengths[i] = 0
        self.update(key, value, i)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    # rollback ------------------------------------------------------------------------------
    def crop(self, length: int, layers: range | None = None) -> None:
        """Forget every position at or after `length` (in the given layers, default all)."""
        for i in layers if layers is not None else range(self.num_layers):
            self.lengths[i] = min(self.lengths[i], length)

    def keep(self, start: int, positions: torch.Tensor | list[int], layers: range | None = None) -> None:
        """Keep positions [0, start) plus `start + positions` (in order), drop the rest.

        Used after tree verification: the accepted path's entries move down to sit right after
        the committed prefix. A chain's accepted prefix is already in place: a crop, no copy.
        The source index goes to each device once per call, not once per layer: on a GPU a
        host-to-device copy per layer is a transfer queued inside every step."""
        rows = positions.tolist() if isinstance(positions, torch.Tensor) else [int(p) for p in positions]
        if rows == list(range(len(rows))):
            self.crop(start + len(rows), layers)
            return
        src: dict[torch.device, torch.Tensor] = {}  # device_map: each layer's cache on its own device
        for i in layers if layers is not None else range(self.num_layers):
            if self.keys[i] is None:
                continue
            dev = self.keys[i].device
            if dev not in src:
                src[dev] = upload([start + r for r in rows], dev, torch.long)  # queued, no wait
            self._move_rows(i, start, src[dev])

    def _move_rows(self, i: int, start: int, src: torch.Tensor) -> None:
        """Layer i: rows `src` to [start, start + len(src)), the rest dropped (device work only)."""
        k, v = self.keys[i], self.values[i]
        k[..., start : start + len(src), :] = k[..., src, :]
        v[..., start : start + len(src), :] = v[..., src, :]
        self.lengths[i] = start + len(src)


class StaticKVCache(KVCache):
    """The KV cache of `model.execution=graphs`: buffers of a fixed capacity, allocated once and
    kept for the whole run, so a captured CUDA graph can read and write them on every replay.

    Writes go through a device index (`slots`, set by models/graphs.py before each forward):
    inside a captured graph no Python runs, so a write position baked in as a Python slice
    would be the capture's forever. `update` therefore touches no host state; the lengths are
    moved by the caller after the forward (StaticRunner), and attention reads the whole buffer
    with a mask that hides every row past the length. Rollback moves a length and copies
    nothing; keeping a tree's accepted path moves its rows on the device.
    """

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(num_layers)
        self.capacity = int(capacity)
        self.slots: torch.Tensor | None = None  # [q] rows the next forward writes (device)
        self.epoch = 0  # bumped when the buffers are replaced: graphs captured on the old ones are stale
        self.allocations = 0  # buffer allocations (tests: none per step)

    def reset(self) -> "StaticKVCache":
        self.lengths = [0] * self.num_layers
        return self

    def allocated(self, layers) -> bool:
        return all(self.keys[i] is not None for i in layers)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_, **__):
        if self.keys[layer_idx] is None:
            self._allocate(layer_idx, key, value)
        buf_k, buf_v = self.keys[layer_idx], self.values[layer_idx]
        buf_k.index_copy_(-2, self.slots, key)
        buf_v.index_copy_(-2, self.slots, value)
        return buf_k, buf_v

    def _allocate(self, i: int, key: torch.Tensor, value: torch.Tensor) -> None:
        # zeros, not empty: masked rows still enter attention's weighted sum with weight 0, and
        # 0 * (a NaN left in uninitialised memory) would be NaN
        self.keys[i] = key.new_zeros((*key.shape[:-2], self.capacity, key.shape[-1]))
        self.values[i] = value.new_zeros((*value.shape[:-2], self.capacity, value.shape[-1]))
        self.allocations += 1

    def write_rows(self, i: int, key: torch.Tensor, value: torch.Tensor) -> None:
        n = key.shape[-2]
        if n > self.capacity:
            self.grow(n)
        if self.keys[i] is None:
            self._allocate(i, key, value)
        self.keys[i][..., :n, :] = key
        self.values[i][..., :n, :] = value
        self.lengths[i] = n

    def grow(self, capacity: int) -> None:
        """Larger buffers with the same contents (a sequence longer than the run was sized for);
        every graph captured on the old buffers must be captured again (`epoch`)."""
        old_k, old_v, self.capacity = self.keys, self.values, int(capacity)
        self.keys, self.values = [None] * self.num_layers, [None] * self.num_layers
        for i, (k, v) in enumerate(zip(old_k, old_v)):
            if k is not None:
                self._allocate(i, k, v)
                self.keys[i][..., : k.shape[-2], :] = k
                self.values[i][..., : v.shape[-2], :] = v
        self.epoch += 1
