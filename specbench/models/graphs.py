"""`model.execution=graphs`: decoder layers over static buffers, captured once as CUDA graphs.

In eager mode every layer of every forward is a few dozen kernel launches from Python; a 135M
model on an H100 spends ~30 ms per token launching, ~0.2 ms computing (docs/gpu.md). Serving
engines (vLLM, SGLang) capture a decoding step as a CUDA graph over buffers that never move and
replay it with one launch. This module does the same for the adapter's `run_layers`, whichever
method calls it (the target's verify, EESD's lower layers, Self-SD's skipped forward, a draft
head's layer):

- the KV cache is a `StaticKVCache` (engine/cache.py): fixed buffers written through a device
  index, its lengths moved by this module after each forward;
- a call over q new tokens is padded to a width W, the next power of two (at most
  `model.graph_max_width`; wider calls, a prompt, run the same code uncaptured at their own
  size). Padding rows see only themselves, no real row sees them, they are written past the
  committed length and never counted in it: they change no committed token;
- the attention mask over the whole buffer is built on the device from the length and the
  call's [q, E + q] tree mask (E cached tokens the mask also covers: a draft tree grown one level
  per call), so a step uploads a few integers and a small mask, queued (engine/transfer.py);
- on CUDA each (layers, skip set, cache, W, E) is captured at its second call (a key used once,
  such as one of SWIFT's candidate layer sets, is not worth a capture), after two warm-up runs on
  a side stream, into one memory pool per adapter, and replayed; outputs are cloned out of the pool (a
  later replay of another graph may reuse its memory). On CPU nothing is captured: the same
  function runs on the same buffers (the tests' path: every method must equal eager AR there).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from specbench.engine.cache import StaticKVCache
from specbench.engine.transfer import upload

EXECUTIONS = ("eager", "graphs")
MAX_GRAPHS = 256  # captured graphs kept per adapter (a skip-set search makes new keys as it goes)
CAPTURES = [0]  # graphs captured in this process (Method.generate records how many a generation paid for)


def bucket(n: int) -> int:
    """The padded width of a call over n rows: the next power of two."""
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass
class _Entry:
    """The static buffers of one (layers, cache, W, E) and, on CUDA, its graph."""

    x: torch.Tensor  # [1, W, d] input states
    pos: torch.Tensor  # [W] rotary positions
    length: torch.Tensor  # [1] the length the call writes after
    tmask: torch.Tensor  # [W, E + W] which of the last E cached and the W new rows each row sees
    slots: torch.Tensor  # [W] cache rows written (length + i), computed on the device
    out: torch.Tensor | None = None
    graph: object | None = None
    epoch: int = 0
    refs: tuple = ()  # the layers and cache its key names by id(): kept alive, so no id is reused
    uses: int = 0  # calls so far: captured at the second


class StaticRunner:
    """Runs `ModelAdapter._layer` loops on static buffers; one per adapter."""

    def __init__(self, adapter, max_width: int):
        self.adapter = adapter
        self.max_width = int(max_width)
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.pool = None
        self.capture = adapter.device.type == "cuda" and torch.cuda.is_available()
        self.buffers = 0  # static input buffers allocated (tests: none per step)

    # -- the call ------------------------------------------------------------------------------
    def run(self, mods, first: int, hidden: torch.Tensor, cache: StaticKVCache, positions, tree_mask, skip) -> torch.Tensor:
        if hidden.shape[0] != 1:
            raise ValueError("a static-buffer forward takes one sequence (batch 1)")
        q = hidden.shape[1]
        written = [first + k for k in range(len(mods)) if skip is None or first + k not in skip.attn]
        length = cache.length(written[0] if written else first)
        extra = 0 if tree_mask is None else tree_mask.shape[1] - tree_mask.shape[0]
        width = bucket(q)
        captured = width <= self.max_width
        width, extra_w = (width, bucket(extra) if extra else 0) if captured else (q, extra)
        if length + width > cache.capacity:
            cache.grow(bucket(2 * (length + width)))
        key = (tuple(map(id, mods)), first, skip_key(skip), id(cache), width, extra_w)
        e = self.entries.get(key) if captured else None
        if e is None or e.epoch != cache.epoch:
            e = self._new_entry(key if captured else None, hidden, width, extra_w, cache.epoch)
            e.refs = (mods, cache)
        self._fill(e, hidden, q, length, positions, tree_mask, extra, extra_w)
        cache.slots = e.slots
        body = lambda: self._body(mods, first, cache, skip, e, width, extra_w)  # noqa: E731
        e.uses += 1
        if not self.capture or not captured or not cache.allocated(written) or e.uses < 2:
            # CPU, a wide call, the first write into a fresh cache, or a call not seen before: a key
            # used once (SWIFT's candidate layer sets, scored once each) is never worth a capture
            e.out = body()
        elif e.graph is None:
            self._capture(e, body)
        else:
            e.graph.replay()
        for i in written:
            cache.lengths[i] = length + q
        return e.out[:, :q].clone()

    def _new_entry(self, key, hidden, width: int, extra_w: int, epoch: int) -> _Entry:
        dev, d = hidden.device, hidden.shape[-1]
        e = _Entry(x=hidden.new_zeros(1, width, d), pos=torch.zeros(width, dtype=torch.long, device=dev),
                   length=torch.zeros(1, dtype=torch.long, device=dev),
                   tmask=torch.zeros(width, extra_w + width, dtype=torch.bool, device=dev),
                   slots=torch.zeros(width, dtype=torch.long, device=dev), epoch=epoch)
        self.buffers += 1
        if key is not None:
            self.entries[key] = e
            if len(self.entries) > MAX_GRAPHS:
                self.entries.popitem(last=False)
        return e

    def _fill(self, e: _Entry, hidden, q: int, length: int, positions, tree_mask, extra: int, extra_w: int) -> None:
        """The call's inputs into the entry's buffers: device copies, and one queued upload of
        the integers (positions, length) and one of the mask when they come from the host."""
        width = e.x.shape[1]
        e.x[:, :q] = hidden
        dev = e.pos.device
        if positions is None:
            ints = torch.arange(length, length + width + 1)
            ints[-1] = length
            e_ints = upload(ints, dev)
            e.pos.copy_(e_ints[:-1])
            e.length.copy_(e_ints[-1:])
        else:
            e.length.copy_(upload([length], dev, torch.long))
            e.pos[:q] = upload(positions, dev, torch.long)
            e.pos[q:] = length + q  # padding: any position the rotary table has
        e.tmask.copy_(upload(pad_mask(tree_mask, q, width, extra, extra_w), dev))

    def _body(self, mods, first: int, cache: StaticKVCache, skip, e: _Entry, width: int, extra_w: int) -> torch.Tensor:
        a = self.adapter
        torch.add(e.length, torch.arange(width, device=e.slots.device), out=e.slots)
        allowed = visible(e.length, e.tmask, extra_w, cache.capacity)
        if a.boolean_masks and e.x.device.type == "cuda":
            mask = allowed.view(1, 1, width, cache.capacity)
        else:  # the additive float mask the CPU numerics were measured with (adapter._mask)
            mask = torch.zeros(allowed.shape, dtype=e.x.dtype, device=e.x.device)
            mask.masked_fill_(~allowed, torch.finfo(e.x.dtype).min)
            mask = mask.view(1, 1, width, cache.capacity)
        pos_emb = a.rotary_emb(e.x, e.pos.view(1, -1))
        h = e.x
        for k, layer in enumerate(mods):
            h = a._layer(layer, first + k, h, cache, pos_emb, mask, skip)
        return h

    def _capture(self, e: _Entry, body) -> None:
        """Two warm-up runs on a side stream (allocator and kernel choices settle), then the capture,
        then one replay (capturing runs nothing). The warm-ups write the rows this call writes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            e.out = body()
        e.graph = graph
        CAPTURES[0] += 1
        graph.replay()


def skip_key(skip) -> tuple:
    return () if skip is None else (tuple(sorted(skip.attn)), tuple(sorted(skip.mlp)))


def pad_mask(tree_mask, q: int, width: int, extra: int, extra_w: int) -> torch.Tensor:
    """[width, extra_w + width] bool, built where the call's mask is (the host when it has none):
    the call's mask (default causal) over the last `extra` cached rows and its q new rows; padding
    columns on the left are ordinary cached rows (visible), padding rows see themselves (and the
    cache before the window), and no real row sees a padding row."""
    dev = tree_mask.device if tree_mask is not None else torch.device("cpu")
    m = torch.zeros(width, extra_w + width, dtype=torch.bool, device=dev)
    m[:q, : extra_w - extra] = True
    if tree_mask is None:
        m[:q, extra_w : extra_w + q] = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
    else:
        m[:q, extra_w - extra : extra_w + q] = tree_mask.to(torch.bool)
    torch.diagonal(m[q:, extra_w + q :]).fill_(True)
    return m


def visible(length: torch.Tensor, tmask: torch.Tensor, extra_w: int, capacity: int) -> torch.Tensor:
    """[W, capacity] bool built on the device: cached rows before the mask's window are visible,
    the window [length - extra_w, length + W) follows `tmask`, everything after is not."""
    width = tmask.shape[0]
    cols = torch.arange(capacity, device=tmask.device)
    rel = cols - (length - extra_w)
    inside = (rel >= 0) & (rel < extra_w + width)
    window = tmask.gather(1, rel.clamp(0, extra_w + width - 1).expand(width, capacity))
    return torch.where(inside, window, (cols < length).expand(width, capacity))


def precapture(adapter) -> int:
    """Capture the target's whole forward at every padded width before anything is timed (the
    method's own layer ranges and heads are captured in the warm-up generation); returns how many."""
    runner = adapter.graphs
    if runner is None or not runner.capture:
        return 0
    before = CAPTURES[0]
    cache = adapter.new_cache()
    adapter.forward([0], cache)  # the buffers' first write, uncaptured
    for width in sorted({bucket(w) for w in range(1, runner.max_width + 1)}, reverse=True):
        for _ in range(2):  # captured at a key's second call
            adapter.forward([0] * width, cache)
            cache.crop(1)
    cache.reset()
    return CAPTURES[0] - before
