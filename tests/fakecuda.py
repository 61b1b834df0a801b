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

`fake_tiny_llama(dtype)` builds a tiny Llama inside the mode and moves it to fake `cuda`.
Nothing here computes a number: value-level correctness is the other tests' job.
Autograd cannot run: recording history on (or back-propagating to) a fake cuda tensor takes a
CUDA device guard and aborts the process (not an exception), so everything runs under
`no_grad`: training steps are checked up to the loss, and the optimizer step with fake
gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from transformers import LlamaForCausalLM

from specbench.models import ModelAdapter, tiny_llama_config
from specbench.models.tokenizer import ByteTokenizer

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


class DeviceMismatch(RuntimeError):
    """An op mixed cuda and cpu tensors, found where a binding fails before fake mode's own
    device check (which raises torch's FakeTensorDeviceMismatchError)."""


_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__}


def _dummy(dtype: torch.dtype, bool_value: bool):
    if dtype == torch.bool:
        return bool_value
    return 0.0 if dtype.is_floating_point else 0


def _nested(shape, value):
    return value if not shape else [_nested(shape[1:], value) for _ in range(shape[0])]


class _CudaOnCpuBuild(TorchFunctionMode):
    def __init__(self, bool_value: bool):
        super().__init__()
        self.bool_value = bool_value
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS:
            self.reads += 1
            t = args[0]
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
        if func is torch.Tensor.to:
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
            if other is not None:
                device, dtype = other.device, other.dtype
            return self._move(args[0], device, dtype, bool(kwargs.get("copy", False)))
        if func is torch.Tensor.cuda:
            return self._move(args[0], CUDA, None, False)
        if func is torch.as_tensor and isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            return self._move(args[0], torch.device(device) if device is not None else None, kwargs.get("dtype"), False)
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

    @staticmethod
    def _index(func, args, kwargs):
        # C++ indexing takes a device guard for the tensor's device, which a CPU-only build has
        # none of for cuda: index with the fake tensors labelled cpu, then label them back.
        # (Real CUDA indexing also accepts cpu index tensors and copies cpu values in.)
        t = args[0]
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
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
    def _move(t: torch.Tensor, device, dtype, copy: bool) -> torch.Tensor:
        device = t.device if device is None else torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = CUDA
        dtype = t.dtype if dtype is None else dtype
        if device == t.device and dtype == t.dtype and not copy:
            return t
        if device.type != "cuda" and t.device.type != "cuda":
            return t.to(dtype=dtype, copy=copy) if device == t.device else t.to(device=device, dtype=dtype)
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

    `torch.cuda.synchronize` (the phase timer) becomes a no-op: there is no device to wait for."""
    sync, apply, deepcopy = torch.cuda.synchronize, torch.nn.Module._apply, FakeTensor.__deepcopy__
    torch.cuda.synchronize = lambda *a, **k: None
    torch.nn.Module._apply = _apply_without_swap
    FakeTensor.__deepcopy__ = _deepcopy_in_mode
    mode = _CudaOnCpuBuild(bool_value)
    try:
        # no_grad: recording autograd history on a cuda tensor aborts the process (see above)
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=False), mode:
            yield mode
    finally:
        torch.cuda.synchronize, torch.nn.Module._apply, FakeTensor.__deepcopy__ = sync, apply, deepcopy


TINY = {"num_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "num_kv_heads": 2}


def fake_tiny_llama(dtype: torch.dtype = torch.bfloat16, **overrides) -> ModelAdapter:
    """A tiny Llama with fake weights on fake `cuda` (call inside `fake_cuda()`)."""
    model = LlamaForCausalLM(tiny_llama_config(OmegaConf.create(TINY | overrides)))
    model.to(device=CUDA, dtype=dtype)
    adapter = ModelAdapter(model, ByteTokenizer(), "fake-tiny-llama")
    adapter.key = f"fake-tiny-{dtype}".replace("torch.", "")
    return adapter


def on_cuda(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cuda" for t in tensors)
