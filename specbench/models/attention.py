"""The adapter's attention function: transformers' sdpa without copying grouped K/V heads.

With an explicit attention mask (every multi-token query the adapter runs: verification, token
trees, prefill) transformers' sdpa function materialises K and V at the full head count in every
layer (`repeat_kv`: for SmolLM2's 3 KV heads and 9 query heads, two extra copies of the layer's
whole cache per layer per forward); only an unmasked or one-token query avoids it. PyTorch's CPU
kernel takes a mask together with `enable_gqa=True`, so here a masked grouped query passes the
flag instead of copying. Folding the query heads of a group into the query axis (transformers'
`pack_gqa`, generalised to q > 1, mask tiled) measured the same, so the simpler flag it is
(`python bench/attention.py`, results/bench/backends.md). On CUDA the adapter's masks are
boolean (True = may attend) and go to SDPA with `enable_gqa`; on torch 2.11 (an H200, session 54)
the fused kernels refuse grouped heads for dense input, so that call runs the math kernel. K/V
repeated first would let the memory-efficient kernel take it: per eager call 0.43-0.45x the time
at 256 cached rows, the same at 1024 in float32, 1.6x in bfloat16 (`bench/gpu_attention.py`,
results/bench/gpu_general/gpu_attention.txt): mixed, and unmeasured inside a captured step, so
unchanged (docs/gpu.md). CPU masks stay the additive float ones. `use_grouped_sdpa` points a model config
at this function, registered through transformers' AttentionInterface (no forked modeling file);
everything else (no mask, no grouping, extra arguments) is transformers' own sdpa. Same
attention, exact up to the kernel's summation order.

On the batch-invariant backends (`ggml*`, backends.INVARIANT) float32 queries of batch 1 go to a
C kernel instead (attention_kernels.c) that computes each query the same way whatever the other
queries are, so a k-token verify or a token tree returns the bits of one-token decoding through
attention too, and a prompt gets the same bits with an explicit causal mask (the adapter) or
without one (transformers' generate, hf_assisted).
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from specbench.kernels import ggml
from specbench.kernels.backends import INVARIANT

GROUPED_SDPA = "specbench_sdpa"


@functools.lru_cache(maxsize=4)
def _causal(q: int) -> torch.Tensor:
    """A prompt's causal rows (built once per length, not once per layer)."""
    return torch.ones(q, q, dtype=torch.uint8).tril()


def _allowed(mask: torch.Tensor | None, q: int, n: int) -> torch.Tensor | None | bool:
    """The keys each query may see as a [q, n] uint8 tensor, None for all, False if unsupported."""
    if mask is None:  # one query sees every key; several without a mask are causal (q == n only)
        return None if q == 1 else _causal(q) if q == n else False
    mask = mask.reshape(-1, q, n)
    if mask.shape[0] != 1:
        return False
    if mask.dtype == torch.bool:
        return mask[0].to(torch.uint8)
    blocked = mask[0] <= torch.finfo(mask.dtype).min / 2
    if not bool(((mask[0] == 0) | blocked).all()):  # a bias (ALiBi, soft masks): not ours
        return False
    return (~blocked).to(torch.uint8)


_LAST: list = [None, None, None]  # (weakref to the mask, its version, what _allowed made of it)


def _allowed_cached(mask: torch.Tensor | None, q: int, n: int):
    """_allowed, once per mask: every layer of a forward gets the same mask tensor (~30 us saved
    per layer at k = 8). Keyed on the object itself (a weak reference: a new mask at the same
    address is a different object) and its version (in-place edits)."""
    if mask is None:
        return _allowed(mask, q, n)
    ref, version, hit = _LAST
    if ref is not None and ref() is mask and version == mask._version:
        return hit
    hit = _allowed(mask, q, n)
    _LAST[:] = [weakref.ref(mask), mask._version, hit]
    return hit


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    """t[0] as [heads, n, d] with rows of d contiguous floats (copied only if they are not)."""
    return t[0] if t.stride(3) == 1 and t.stride(2) == d else t[0].contiguous()


def invariant_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """attention_kernels.c for a float32 CPU query of batch 1, else None (the caller uses sdpa)."""
    b, h, q, d = query.shape
    n = key.shape[2]
    if (b != 1 or d % 16 or d > 256 or dropout or kwargs.get("position_bias") is not None
            or query.dtype != torch.float32 or key.dtype != torch.float32 or not query.is_cpu or torch.is_grad_enabled()):
        return None
    allowed = _allowed_cached(attention_mask, q, n)
    if allowed is False:
        return None
    # the kernel takes rows of D floats at any stride between heads (and, for the query, between
    # queries): KVCache's prefix of a larger buffer is read in place (copying it cost ~12 us per
    # layer at 200 cached tokens, growing with the context)
    qc = query[0] if query.stride(3) == 1 else query[0].contiguous()
    kc, vc = _rows(key, d), _rows(value, d)
    out = torch.empty(1, q, h, d)
    # prefills too (a prompt seen with an explicit mask by the adapter and without one by
    # transformers' generate must get the same bits); the kernel takes a long query in chunks
    _kernel()(qc.data_ptr(), qc.stride(0), qc.stride(1), q, h, d, kc.data_ptr(), kc.stride(0), vc.data_ptr(), vc.stride(0),
              n, key.shape[1], None if allowed is None else allowed.data_ptr(), d**-0.5 if scaling is None else scaling,
              out.data_ptr(), torch.get_num_threads())
    return out


@functools.cache
def _kernel():
    return ggml.library().invariant_attention  # looked up once: this runs once per layer and forward


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [B, H, q, D], key/value [B, H_kv, n, D] -> ([B, q, H, D], None), as transformers' sdpa."""
    if getattr(getattr(module, "o_proj", None), "backend", None) in INVARIANT:
        out = invariant_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        if out is not None:
            return out, None
    groups = getattr(module, "num_key_value_groups", 1)
    # a boolean mask (the adapter's on CUDA) always comes here, grouped or not: one call shape
    ours = attention_mask is not None and (groups > 1 or attention_mask.dtype == torch.bool)
    if not ours or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=groups > 1
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
# a direct call of the HF model (hf_assisted's generate) builds the masks sdpa would get
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_sdpa(config) -> bool:
    """Switch a model config from transformers' sdpa to the grouped one; other choices
    (eager, flash) are the user's and stay."""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    config._attn_implementation = GROUPED_SDPA
    return True
