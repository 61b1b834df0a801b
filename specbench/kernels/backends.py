"""How a model's linear layers run on CPU (`model.backend`).

Decoding a small model on a CPU is bandwidth-bound: a forward over k <= 8 new tokens should cost
about what a one-token forward costs. PyTorch's default fp32 `F.linear` does not get there (its
small-M GEMM path is far slower than its GEMV path), which makes verifying k drafts cost ~1.7x a
decoding step. A backend swaps the kernel, not the model:

- `eager`: `F.linear` on the fp32 weights (PyTorch's default).
- `mkldnn`: fp32, the weight reordered once into oneDNN's blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`) and multiplied by `_linear_pointwise`. Same
  arithmetic as eager up to summation order (~1e-6 relative).
- `hybrid`: fp32, inputs of fewer than HYBRID_MIN_ROWS rows (AR decoding, drafting, a 1-2 token
  verify) through `F.linear` (MKL: GEMV for one row, and still ahead of oneDNN for 2-3 rows),
  larger ones (verification, prefill) through the prepacked oneDNN kernel. Measured here (1 and 2
  threads): oneDNN is ~1.3x slower than MKL for 1-3 rows and clearly faster from 4 rows on, where
  MKL's small-M GEMM jumps to ~1.6x its one-row time (results/bench/backends.md).
- `ggml`: the weights in ggml's block formats where those reproduce the float32 parameter bit
  for bit (Q4_1, Q8_0: the embedded GGUF's own blocks, 0.625 / 1.06 bytes per weight instead of
  4), else float32, multiplied by a C kernel (specbench/kernels/ggml.py) that computes every output
  row the same way whatever the number of rows: a k-token verify gives each row the bits k
  one-token steps give. Attention follows (attention.py's batch-invariant kernel on the `ggml*`
  backends), so the whole forward is batch-invariant. Same model as eager up to summation order.
  Prefills (more than GGML_MAX_ROWS rows) go to F.linear.
- `ggml_f32`: the same kernel on the float32 weights (batch-invariant, no compression).
- `ggml_q8`: `ggml`'s Q4_1 / Q8_0 blocks times activations rounded to int8 per row and block of
  32, integer dot products (AVX-512 VNNI), as llama.cpp computes them (specbench/models/
  ggml_q8.py). A different model from the float32 one (activation rounding, ~1e-3 relative),
  but the rounding is per row, so it is batch-invariant like `ggml`; its 8-row linear layers
  cost ~2x its one-row ones instead of ~3.5x. Prefills run the same kernel (no F.linear switch:
  the same numerics at every row count). Other weights (float32) run as on `ggml`.
- `bf16`: bfloat16 copies of weight and bias, input rounded to bfloat16, output back to the
  model's dtype. Half the bytes; rounding differs from fp32 (a different model, slightly).
- `qint8`: int8 weights (symmetric, per output channel) with fbgemm's dynamic quantization of
  the activations. The activation scale is one per input *tensor*, so a k-token verify rounds
  differently from k one-token steps: batch-dependent rounding, greedy output can differ from
  AR's even though both run the same quantized model. Labelled lossy-in-practice; not a default.

The swap is in place (`module.__class__ = BackendLinear`): parameters, their names, tying (the
LM head shares the embedding) and every reference held elsewhere (adapter.lm_head, EESD's and
Medusa's shared head) stay as they are, so checkpoints load unchanged and no modeling file is
forked. The packed copy is derived from the fp32 parameter and rebuilt whenever the parameter
changes (load_state_dict, an optimizer step, .to()); whenever autograd is on, the layer runs
eagerly on the parameter itself, so training never sees a packed weight.

A backend only applies to float32 CPU weights; on other dtypes (the float64 test models) or
devices it is a no-op, so those stay exact.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from specbench.core.errors import SpecBenchError, choice_error
from specbench.kernels import ggml, ggml_q8

# oneDNN picks its blocked layout for a batch-size hint; verification batches are 1..16 rows
MKLDNN_BATCH_HINT = 8
# hybrid: below this many rows F.linear (MKL) beats prepacked oneDNN on this CPU
HYBRID_MIN_ROWS = 4
# ggml: above this many rows (a prefill) MKL's GEMM on the float32 parameter is faster (crossover
# ~40 rows here); up to it (every verify width: Medusa's tree is 64) the batch-invariant kernel
GGML_MAX_ROWS = 64


def _pack_mkldnn(w: torch.Tensor, b: torch.Tensor | None):
    return torch.ops.mkldnn._reorder_linear_weight(w, MKLDNN_BATCH_HINT), b


def _run_mkldnn(x: torch.Tensor, packed) -> torch.Tensor:
    w, b = packed
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")


def _pack_bf16(w: torch.Tensor, b: torch.Tensor | None):
    return w.to(torch.bfloat16), None if b is None else b.to(torch.bfloat16)


def _run_bf16(x: torch.Tensor, packed) -> torch.Tensor:
    w, b = packed
    return F.linear(x.to(torch.bfloat16), w, b).to(x.dtype)


def _pack_qint8(w: torch.Tensor, b: torch.Tensor | None):
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensor creation is deprecated, fbgemm's kernels are not
        warnings.simplefilter("ignore", UserWarning)
        qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qw, b)


def _run_qint8(x: torch.Tensor, packed) -> torch.Tensor:
    # reduce_range: fbgemm's AVX2 int8 kernels saturate on full-range activations
    return torch.ops.quantized.linear_dynamic(x.contiguous(), packed, True)


def _pack_ggml(w: torch.Tensor, b: torch.Tensor | None, formats=ggml.FORMATS):
    return ggml.recover(w, formats), w, b


def _pack_ggml_f32(w: torch.Tensor, b: torch.Tensor | None):
    return _pack_ggml(w, b, ("f32",))


def _run_ggml(x: torch.Tensor, packed) -> torch.Tensor:
    bw, w, b = packed
    if bw is None or x.numel() > GGML_MAX_ROWS * x.shape[-1]:
        return F.linear(x, w, b)
    return ggml.linear(x, bw, b)


def _pack_ggml_q8(w: torch.Tensor, b: torch.Tensor | None):
    bw = ggml.recover(w)
    q8 = ggml_q8.pack(bw)
    return q8, bw if q8 is None else None, w, b  # the fp32-activation blocks only where no q8 packing


def _run_ggml_q8(x: torch.Tensor, packed) -> torch.Tensor:
    q8, bw, w, b = packed
    if q8 is None:
        return _run_ggml(x, (bw, w, b))
    # every row count, prefills too: int8 activations are the model here, and a prompt's LM-head
    # rows (transformers' generate computes them all; the adapter only the last) must get the
    # bits one row gets (the int8 kernel also beats MKL's float32 GEMM at prefill sizes)
    return ggml_q8.linear(x, q8, b)


KERNELS = {
    "ggml": (_pack_ggml, _run_ggml),
    "ggml_q8": (_pack_ggml_q8, _run_ggml_q8),
    "ggml_f32": (_pack_ggml_f32, _run_ggml),
    "mkldnn": (_pack_mkldnn, _run_mkldnn),
    "hybrid": (_pack_mkldnn, _run_mkldnn),
    "bf16": (_pack_bf16, _run_bf16),
    "qint8": (_pack_qint8, _run_qint8),
}
BACKENDS = ("eager", *KERNELS)
# backends whose k-token forward can round differently from k one-token forwards by more than
# fp32 summation order does (greedy output may then differ from AR's)
BATCH_DEPENDENT = frozenset({"qint8"})
# backends whose linear layers are batch-invariant; attention follows them (attention.py)
INVARIANT = frozenset({"ggml", "ggml_f32", "ggml_q8"})


class BackendLinear(nn.Linear):
    """nn.Linear whose no-grad float32 CPU forward runs a packed copy of its weight."""

    backend = "eager"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # hybrid's few-row case first: it is every AR/drafting step (~211 calls per forward),
        # and F.linear is right there whatever the dtype, device or grad mode
        if (self.backend == "hybrid" and x.numel() < HYBRID_MIN_ROWS * x.shape[-1]) or torch.is_grad_enabled():
            return F.linear(x, w, self.bias)
        if w.dtype != torch.float32 or x.dtype != torch.float32 or w.device.type != "cpu":
            return F.linear(x, w, self.bias)
        return KERNELS[self.backend][1](x, self.packed())

    def packed(self):
        """The backend's copy of weight and bias, (re)built when either changed."""
        w = self.weight
        key = (self.backend, w.data_ptr(), w._version, None if self.bias is None else (self.bias.data_ptr(), self.bias._version))
        cached = self.__dict__.get("_packed")
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, KERNELS[self.backend][0](w.detach(), None if self.bias is None else self.bias.detach()))
            self.__dict__["_packed"] = cached
        return cached[1]

    def __getstate__(self):
        # deepcopy/pickle: the packed copy is derived data (and opaque); rebuild it on use
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state.pop("_packed", None)
        return state


def check_backend(name) -> str:
    """Validate a `model.backend` value (None means eager)."""
    name = "eager" if name is None else str(name)
    if name not in BACKENDS:
        raise choice_error("model.backend", name, BACKENDS)
    if name in ("mkldnn", "hybrid") and not torch.backends.mkldnn.is_available():
        raise SpecBenchError(f"model.backend={name} needs a torch build with oneDNN (torch.backends.mkldnn); use eager or bf16")
    if name in ("ggml", "ggml_f32", "ggml_q8") and (why := ggml.available()) is not None:
        raise SpecBenchError(why)
    if name == "qint8" and "fbgemm" not in torch.backends.quantized.supported_engines:
        raise SpecBenchError("model.backend=qint8 needs torch's fbgemm quantized engine (x86); use eager or mkldnn")
    return name


def apply_backend(module: nn.Module, name) -> int:
    """Make every plain nn.Linear inside `module` run with backend `name`; returns how many.

    Subclasses of nn.Linear other than ours (LoRA wrappers, quantized layers) are left alone."""
    name = check_backend(name)
    n = 0
    for m in module.modules():
        if type(m) not in (nn.Linear, BackendLinear):
            continue
        m.__dict__.pop("_packed", None)
        if name == "eager":
            m.__class__ = nn.Linear
            m.__dict__.pop("backend", None)
        else:
            m.__class__ = BackendLinear
            m.backend = name
            if m.weight.dtype == torch.float32 and m.weight.is_cpu:
                m.packed()  # now, not inside the first timed forward (ggml's recovery takes seconds)
        n += 1
    return n


def round_weights(module: nn.Module, how: str) -> int:
    """`model.draft_quant`: every plain linear layer of a trained part whose weight is not already ggml
    blocks (the target's own rows and layers are) rounded in place to `how` (q8_0); how many. On the
    ggml* backends a float32 part runs the fp32 kernel: EESD's exit layer then cost as much as two of
    the target's Q4_1 layers per draft token (session 56)."""
    if how != "q8_0":
        raise SpecBenchError(f"model.draft_quant={how!r} is not allowed; allowed: none, q8_0")
    n = 0
    with torch.no_grad():
        for m in module.modules():
            if type(m) not in (nn.Linear, BackendLinear):  # as apply_backend: not LoRA wrappers
                continue
            w = m.weight
            if w.dtype == torch.float32 and w.is_cpu and ggml.recover(w, ("q4_1", "q8_0")) is not None:
                continue
            rounded = ggml.round_to_q8_0(w)
            if rounded is not None:
                w.copy_(rounded)
                n += 1
    return n


def backend_of(module: nn.Module) -> str:
    """The backend `module`'s linear layers run with (that of its first one)."""
    for m in module.modules():
        if isinstance(m, BackendLinear):
            return m.backend
        if type(m) is nn.Linear:
            return "eager"
    return "eager"
