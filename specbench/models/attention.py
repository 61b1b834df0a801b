"""The adapter's attention function: transformers' sdpa without copying grouped K/V heads.

With an explicit attention mask (every multi-token query the adapter runs: verification, token
trees, prefill) transformers' sdpa function materialises K and V at the full head count in every
layer (`repeat_kv`: for SmolLM2's 3 KV heads and 9 query heads, two extra copies of the layer's
whole cache per layer per forward); only a one-token or unmasked query avoids it. Here a masked
grouped query is folded instead: the query heads that share a KV head are stacked along the
query axis ([B, H, q, D] -> [B, H_kv, g*q, D]), the mask is tiled to match, and one ordinary
sdpa call runs per KV head -- transformers' own `pack_gqa` trick for q = 1, generalised to any q.
Measured on the embedded model's shapes (1 thread, 200 cached tokens): 188 us per layer with
`repeat_kv`, 99 with `enable_gqa=True`, 74 folded at q = 8 (results/bench/backends.md).
`use_grouped_sdpa` points a model config at this function, registered through transformers'
AttentionInterface (no forked modeling file); everything else (no mask, no grouping, per-head
masks, extra arguments) is transformers' own sdpa. Same attention, exact up to the kernel's
summation order.
"""

from __future__ import annotations

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "specbench_sdpa"


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [B, H, q, D], key/value [B, H_kv, n, D] -> ([B, q, H, D], None), as transformers' sdpa."""
    groups = getattr(module, "num_key_value_groups", 1)
    q = query.shape[2]
    plain = attention_mask is None or groups == 1 or attention_mask.dim() != 4 or attention_mask.shape[1:3] != (1, q)
    if plain or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    b, h, _, d = query.shape
    # query head i*g + j (the j-th sharing KV head i) lands in rows [j*q, (j+1)*q) of block i,
    # so the mask is tiled g times along the query axis
    folded = query.reshape(b, h // groups, groups * q, d)
    mask = attention_mask.repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(b, h, q, -1).transpose(1, 2).contiguous(), None


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
