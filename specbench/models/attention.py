"""The adapter's attention function: transformers' sdpa without copying grouped K/V heads.

With an explicit attention mask (every multi-token query the adapter runs: verification, token
trees, prefill) transformers' sdpa function materialises K and V at the full head count in every
layer (`repeat_kv`: for SmolLM2's 3 KV heads and 9 query heads, two extra copies of the layer's
whole cache per layer per forward); only an unmasked or one-token query avoids it. PyTorch's CPU
kernel takes a mask together with `enable_gqa=True`, so here a masked grouped query passes the
flag instead of copying. Folding the query heads of a group into the query axis (transformers'
`pack_gqa`, generalised to q > 1, mask tiled) measured the same, so the simpler flag it is
(`python bench/attention.py`, results/bench/backends.md). `use_grouped_sdpa` points a model config
at this function, registered through transformers' AttentionInterface (no forked modeling file);
everything else (no mask, no grouping, extra arguments) is transformers' own sdpa. Same
attention, exact up to the kernel's summation order.
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
    if attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
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
