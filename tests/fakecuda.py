"""Fake CUDA tensors on a CPU-only torch build: device and dtype bugs without a GPU.

`fake_cuda()` enters `torch._subclasses.fake_tensor.FakeTensorMode` plus a small
`TorchFunctionMode` that handles what fake mode alone cannot on this build:

- host -> device transfers: a CPU-only build refuses `tensor.to("cuda")` (and `.cuda()`,
  `torch.as_tensor(tensor, device="cuda")`, even `copy_` across devices) before any dispatch,
  so they are replayed as `empty_like(..., device="cuda")`, which fake mode supports;
- indexing (`t[i]`, `t[..., j] = v`): C++ indexing takes a device guard, which this build
  has none of for cuda, so the fake tensors are relabelled cpu for the one call;
- other bindings that take a device guard before dispatch (`~t`): on that failure the
  operands' devices are checked (cuda and non-scalar cpu tensors together raise) and the op
  runs relabelled the same way;
- value reads (`.item()`, `.tolist()`, `int()`, `float()`, `bool()`): fake tensors have no
  values, so these return fixed dummies (0, 0.0, and `bool_value`) and decoding goes on along
  one deterministic path. Only shapes, dtypes and devices are checked; any op mixing `cuda:0`
  and `cpu` tensors raises `FakeTensorDeviceMismatchError` (`DeviceMismatch` below).

Host synchronisations are counted (`SyncCounter`, `fake_cuda().counter`): every device-to-host
read of a cuda tensor (`.item()`/`int()`/`float()`/`bool()`/`.tolist()`, copies to cpu,
`nonzero`, boolean-mask indexing: on a GPU each waits for the queue to drain) and every
host-to-device copy (`torch.tensor(list, device="cuda")`, `.to("cuda")`, a cpu index or value
used with a cuda tensor), each with the line of specbench that caused it and whether it
happened inside the layer loop (tests/test_sync_budget.py holds every method to a budget).

`fake_tiny_llama(dtype)` builds a tiny Llama inside the mode and moves it to fake `cuda`.
Nothing here computes a number: value-level correctness is the other tests' job.
Autograd cannot run: recording history on (or back-propagating to) a fake cuda tensor takes a
CUDA device guard and aborts the process (not an exception), so everything runs under
`no_grad`: training steps are checked up to the loss, and the optimizer step with fake
gradients.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaForCausalLM

from specbench.engine import transfer
from specbench.models import ModelAdapter, tiny_llama_config
from specbench.models.tokenizer import ByteTokenizer
from specbench.config.settings import shipped

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


class DeviceMismatch(RuntimeError):
    """An op mixed cuda and cpu tensors, found where a binding fails before fake mode's own
    device check (which raises torch's FakeTensorDeviceMismatchError)."""


SPECBENCH = str(Path(__file__).resolve().parents[1] / "specbench")
# frames that put an event inside the layer loop: the adapter's per-layer loop (a decoder layer's
# call included) and the cache's per-layer work (KVCache.keep compacts every layer in _move_rows)
# (and models/graphs.py's `_body`: the function a CUDA graph captures, where any sync or host copy
# would make the capture fail on a GPU)
_LAYER_FRAMES = {("adapter.py", "_layer_loop"), ("cache.py", "_move_rows"), ("cache.py", "update"), ("graphs.py", "_body")}


@dataclass
class SyncEvent:
    kind: str  # "d2h": a read that waits for the device; "h2d": a host-to-device copy the host waits for
    # (pageable memory or non_blocking=False); "h2d_async": pinned and non_blocking, queued (no wait)
    what: str  # the op (item, tolist, to_cpu, nonzero, bool_index, copy, index, setitem, ...)
    step: object  # "prefill" or the decoding step's index
    in_layer: bool
    where: str  # the first specbench frame: file:function:line


@dataclass
class SyncCounter:
    """Host syncs seen while `step` names the decoding step the method is in."""

    events: list[SyncEvent] = field(default_factory=list)
    step: object = None

    def record(self, kind: str, what: str) -> None:
        where, in_layer = "", False
        f = sys._getframe(1)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith(SPECBENCH):
                short = name[len(SPECBENCH) + 1 :]
                where = where or f"{short}:{f.f_code.co_name}:{f.f_lineno}"
                in_layer = in_layer or (Path(short).name, f.f_code.co_name) in _LAYER_FRAMES
            f = f.f_back
        self.events.append(SyncEvent(kind, what, self.step, in_layer, where))

    def count(self, kind: str, step=None, in_layer: bool | None = None) -> int:
        return sum(1 for e in self.events if e.kind == kind and (step is None or e.step == step)
                   and (in_layer is None or e.in_layer == in_layer))

    def syncs(self, step=None) -> int:
        """What `torch.cuda.set_sync_debug_mode` reports on a GPU: every read, every blocking copy in."""
        return self.count("d2h", step) + self.count("h2d", step)

    def clear(self) -> None:
        self.events.clear()


def _is_cuda(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cuda"


def _is_host(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


# ops whose result's size or value the host must read (each waits for the device on a GPU)
_SYNCING = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default, torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default, torch.ops.aten._unique2.default,
            torch.ops.aten.unique_consecutive.default, torch.ops.aten.unique_dim.default}


class _CountCopies(TorchDispatchMode):
    """What reaches dispatch: `torch.tensor(list, device="cuda")` (a host copy, then `_to_copy`),
    `.cpu()`, cross-device `copy_`, `nonzero` / `masked_select` on the device."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor):
            dst = torch.device(kwargs["device"]) if kwargs.get("device") is not None else args[0].device
            if dst.type != args[0].device.type:
                self.counter.record("h2d" if dst.type == "cuda" else "d2h", "to_" + dst.type)
        elif func is torch.ops.aten.copy_.default and _is_cuda(args[0]) != _is_cuda(args[1]):
            self.counter.record("h2d" if _is_cuda(args[0]) else "d2h", "copy_")
        elif func in _SYNCING and _is_cuda(args[0]):
            self.counter.record("d2h", func.__name__.split(".")[0])
        elif func is torch.ops.aten.repeat_interleave.Tensor and _is_cuda(args[0]) and kwargs.get("output_size") is None:
            self.counter.record("d2h", "repeat_interleave")  # its output size is read from the device
        return func(*args, **kwargs)


_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__}


def _dummy(dtype: torch.dtype, bool_value: bool):
    if dtype == torch.bool:
        return bool_value
    return 0.0 if dtype.is_floating_point else 0


def _nested(shape, value):
    return value if not shape else [_nested(shape[1:], value) for _ in range(shape[0])]


def _same_device_and_dtype(name: str, tensors, dtypes) -> None:
    devices = {x.device for x in tensors if x is not None}
    if len(devices) > 1:
        raise DeviceMismatch(f"{name}: tensors on {' and '.join(sorted(map(str, devices)))}")
    if len({d for d in dtypes if d is not None}) > 1:
        raise RuntimeError(f"{name}: expected one dtype, got {dtypes}")


def _linear(x, weight, bias=None):
    _same_device_and_dtype("linear", (x, weight, bias), (x.dtype, weight.dtype, bias.dtype if bias is not None else None))
    return torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    mask_dtype = None if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.dtype
    _same_device_and_dtype("scaled_dot_product_attention", (q, k, v, attn_mask), (q.dtype, k.dtype, v.dtype, mask_dtype))
    heads_ok = q.shape[-3] % k.shape[-3] == 0 if enable_gqa else q.shape[-3] == k.shape[-3]
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or k.shape[-3] != v.shape[-3] or not heads_ok:
        raise RuntimeError(f"scaled_dot_product_attention: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
                           f" (enable_gqa={enable_gqa})")
    return torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)


# ops that can neither sync nor copy: only their output's shape, dtype and device are made (with the
# checks fake mode would make). Fake mode runs them op by op in Python (SDPA's math path: ~30 ops), which
# was ~40% of tests/test_sync_budget.py's time; the layer's other ops still run through fake mode.
_SHAPE_ONLY = {torch.nn.functional.linear: _linear, torch.nn.functional.scaled_dot_product_attention: _sdpa}


class _CudaOnCpuBuild(TorchFunctionMode):
    def __init__(self, bool_value: bool, counter: SyncCounter):
        super().__init__()
        self.bool_value = bool_value
        self.reads = 0
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS:
            self.reads += 1
            t = args[0]
            if _is_cuda(t):
                self.counter.record("d2h", func.__name__)
            if func is torch.Tensor.__bool__:
                return self.bool_value
            if func is torch.Tensor.__float__:
                return 0.0
            if func in (torch.Tensor.__int__, torch.Tensor.__index__):
                return 0
            v = _dummy(t.dtype, self.bool_value)
            return _nested(tuple(t.shape), v) if func is torch.Tensor.tolist else v
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            return self._index(func, args, kwargs)
        if func in _SHAPE_ONLY:
            return _SHAPE_ONLY[func](*args, **kwargs)
        if func is torch.Tensor.to:
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
            if other is not None:
                device, dtype = other.device, other.dtype
            queued = bool(non_blocking) and getattr(args[0], "_fake_pinned", False)
            return self._move(args[0], device, dtype, bool(kwargs.get("copy", False)), self.counter, queued)
        if func is torch.Tensor.cuda:
            return self._move(args[0], CUDA, None, False, self.counter)
        if func is torch.as_tensor and isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            return self._move(args[0], torch.device(device) if device is not None else None, kwargs.get("dtype"), False,
                              self.counter)
        try:
            return func(*args, **kwargs)
        except RuntimeError as e:
            if "not linked with support for cuda" not in str(e):
                raise
        return self._relabelled(func, args, kwargs)

    @staticmethod
    def _relabelled(func, args, kwargs):
        # Some Python bindings (`~t`, ...) take a device guard before dispatch. Check the devices
        # as fake mode would, then run the op with the cuda operands labelled cpu.
        leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        cuda = [x for x in leaves if isinstance(x, FakeTensor) and x.device.type == "cuda"]
        cpu = [x for x in leaves if x.device.type == "cpu" and x.dim() > 0]
        if cuda and cpu:
            raise DeviceMismatch(f"{func.__name__}: tensors on cuda:0 and cpu")
        for x in cuda:
            x.fake_device = CPU
        try:
            out = func(*args, **kwargs)
        finally:
            for x in cuda:
                x.fake_device = CUDA
        if cuda:
            for x in pytree.tree_leaves(out):
                if isinstance(x, FakeTensor):
                    x.fake_device = CUDA
        return out

    def _count_index(self, func, t, index, values) -> None:
        """On a GPU, indexing a cuda tensor with a host list or cpu tensor copies it in first, a
        boolean mask waits for its nonzero count, and a cpu value assigned is copied in."""
        if not _is_cuda(t):
            return
        for i in index:
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0:
                self.counter.record("d2h", "bool_index")
            elif _is_host(i) and i.dim() > 0 or isinstance(i, list):
                self.counter.record("h2d", "index")
        if func is torch.Tensor.__setitem__ and any(_is_host(v) for v in values):
            self.counter.record("h2d", "setitem")

    def _index(self, func, args, kwargs):
        # C++ indexing takes a device guard for the tensor's device, which a CPU-only build has
        # none of for cuda: index with the fake tensors labelled cpu, then label them back.
        # (Real CUDA indexing also accepts cpu index tensors and copies cpu values in.)
        t = args[0]
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        self._count_index(func, t, index, args[2:])
        operands = [t, *index, *args[2:]]
        relabel = [x for x in operands if isinstance(x, FakeTensor) and x.device.type == "cuda"]
        for x in relabel:
            x.fake_device = CPU
        try:
            out = func(*args, **kwargs)
        finally:
            for x in relabel:
                x.fake_device = CUDA
        if isinstance(out, FakeTensor) and t.device.type == "cuda":
            out.fake_device = CUDA
        return out

    @staticmethod
    def _move(t: torch.Tensor, device, dtype, copy: bool, counter: SyncCounter, queued: bool = False) -> torch.Tensor:
        device = t.device if device is None else torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = CUDA
        dtype = t.dtype if dtype is None else dtype
        if device == t.device and dtype == t.dtype and not copy:
            return t
        if device.type != "cuda" and t.device.type != "cuda":
            return t.to(dtype=dtype, copy=copy) if device == t.device else t.to(device=device, dtype=dtype)
        if device.type != t.device.type:
            kind = ("h2d_async" if queued else "h2d") if device.type == "cuda" else "d2h"
            counter.record(kind, "to_" + device.type)
        # copy_ across devices also needs the CUDA runtime: values are fake anyway, keep the metadata
        out = torch.empty(t.shape, device=device, dtype=dtype)  # fake even if t is a real constant
        return out.requires_grad_(True) if t.requires_grad and dtype.is_floating_point else out


def _apply_without_swap(self, fn, recurse=True):
    """Module._apply for fake parameters: torch swaps a fake parameter in place, which fails
    while fake mode's memo holds a weak reference to it; assign the converted one instead
    (tied parameters stay tied)."""
    memo: dict[int, torch.nn.Parameter] = {}
    for mod in self.modules() if recurse else [self]:
        for key, p in mod._parameters.items():
            if p is not None:
                if id(p) not in memo:
                    with torch.no_grad():
                        memo[id(p)] = torch.nn.Parameter(fn(p), requires_grad=p.requires_grad)
                mod._parameters[key] = memo[id(p)]
        for key, b in mod._buffers.items():
            if b is not None:
                mod._buffers[key] = fn(b)
    return self


def _deepcopy_in_mode(self, memo):
    """FakeTensor.__deepcopy__ makes its copy in a new fake mode, which the next op refuses
    to mix with ours: copy within the active mode (values are fake anyway)."""
    out = torch.empty_like(self)
    if self.requires_grad:
        out.requires_grad_(True)
    memo[id(self)] = out
    return out


@contextlib.contextmanager
def fake_cuda(bool_value: bool = True) -> Iterator[_CudaOnCpuBuild]:
    """Fake tensor mode with CUDA transfers and value reads handled (see module doc).

    `torch.cuda.synchronize` (the phase timer) becomes a no-op: there is no device to wait for.
    The mode's `counter` (a `SyncCounter`) records the host syncs and copies made inside."""
    sync, apply, deepcopy = torch.cuda.synchronize, torch.nn.Module._apply, FakeTensor.__deepcopy__
    tolist = FakeTensor.tolist
    counter = SyncCounter()
    mode = _CudaOnCpuBuild(bool_value, counter)
    mode.counter = counter

    def one_read_tolist(t):
        # FakeTensor.tolist reads element by element; on a GPU it is one copy, one wait
        if _is_cuda(t):
            counter.record("d2h", "tolist")
        return _nested(tuple(t.shape), _dummy(t.dtype, bool_value))

    def fake_pin(host):
        # a CPU-only build cannot pin memory: mark the tensor, so that its non_blocking copy to the
        # device is counted as the queued copy it is on a GPU (engine/transfer.py)
        host = host.clone()
        host._fake_pinned = True
        return host

    torch.cuda.synchronize = lambda *a, **k: None
    pinned, transfer._pinned = transfer._pinned, fake_pin
    torch.nn.Module._apply = _apply_without_swap
    FakeTensor.__deepcopy__ = _deepcopy_in_mode
    FakeTensor.tolist = one_read_tolist
    try:
        # no_grad: recording autograd history on a cuda tensor aborts the process (see above)
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False), mode, _CountCopies(counter):
            yield mode
    finally:
        torch.cuda.synchronize, torch.nn.Module._apply, FakeTensor.__deepcopy__ = sync, apply, deepcopy
        FakeTensor.tolist = tolist
        transfer._pinned = pinned


TINY = {"num_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "num_kv_heads": 2}


def fake_tiny_llama(dtype: torch.dtype = torch.bfloat16, **overrides) -> ModelAdapter:
    """A tiny Llama with fake weights on fake `cuda` (call inside `fake_cuda()`)."""
    model = LlamaForCausalLM(tiny_llama_config(shipped("model", "tiny-llama", TINY | overrides)))
    model.to(device=CUDA, dtype=dtype)
    adapter = ModelAdapter(model, ByteTokenizer(), "fake-tiny-llama")
    adapter.key = f"fake-tiny-{dtype}".replace("torch.", "")
    return adapter


def on_cuda(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cuda" for t in tensors)
