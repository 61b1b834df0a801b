"""The one place that knows how a decoder-only transformers model is laid out.

Methods never touch model internals: they ask the adapter to embed tokens, run a range of
decoder layers (optionally skipping attention or MLP sub-layers) against a `KVCache`, and apply
the final norm and head. Layers are the model's own modules called directly, with position ids
and an explicit additive 4D attention mask, so tree and group attention need no forked modeling
file. Llama, Qwen2 and Mistral share this structure (`model.model.layers`, `.norm`,
`.rotary_emb`, `lm_head`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from specbench.engine.cache import KVCache, StaticKVCache
from specbench.engine.transfer import upload
from specbench.core.errors import SpecBenchError


@dataclass
class LayerSkip:
    """Sub-layers a layer-skipping draft leaves out (Self-SD)."""

    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()


@functools.lru_cache(maxsize=None)
def cache_kwarg(module_type: type) -> str:
    """The name a layer's forward takes the KV cache by: transformers 5.24 renamed
    `past_key_values` to `cache` and warns on the old name; earlier 5.x has only the old one."""
    return "cache" if "cache" in inspect.signature(module_type.forward).parameters else "past_key_values"


def layer_device(module: nn.Module) -> torch.device | None:
    """Where a module computes: accelerate's execution device when it dispatched the module
    (its weights may sit on `meta`, offloaded), else the device of its first parameter."""
    hook = getattr(module, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}")
    p = next(module.parameters(), None)
    return None if p is None or p.device.type == "meta" else p.device


def to_device(x: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    return x if device is None or x.device == device else x.to(device)


class ModelAdapter:
    def __init__(self, model: nn.Module, tokenizer, name: str = "model"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.draft_quant = "none"  # model.draft_quant: how trained parts beside this model are rounded at load
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
            raise SpecBenchError(
                f"model {type(model).__name__} is not a supported decoder-only layout "
                "(need model.model.{embed_tokens,layers,norm,rotary_emb} and model.lm_head; "
                "Llama, Qwen2 and Mistral have it)"
            )
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.rotary_emb = inner.rotary_emb
        self.lm_head = model.lm_head
        self.config = model.config
        for p in model.parameters():
            p.requires_grad_(False)
        # imported here, not at the top: transformers' attention registry costs seconds of
        # imports that `import specbench` (CLI errors, --help) should not pay; a model exists now
        from specbench.models.attention import GROUPED_SDPA, use_grouped_sdpa

        # boolean masks on CUDA only where the attention is the adapter's sdpa (an `eager` model
        # adds its mask to the scores: it needs the float one)
        self.boolean_masks = use_grouped_sdpa(self.config) or self.config._attn_implementation == GROUPED_SDPA
        # device_map=auto (accelerate) spreads layers over devices: hidden states then follow
        # the layers, and each layer's KV cache entries are made (and stay) on its own device
        devices = {layer_device(m) for m in [self.embed_tokens, *self.layers, self.norm, self.lm_head]} - {None}
        self.multi_device = len(devices) > 1
        self.devices = sorted(devices, key=str)  # what timing synchronises (engine/timer.py)
        self.execution = "eager"  # graphs: static buffers and CUDA graphs (models/graphs.py, set_execution)
        self.graphs = None
        self.static_capacity = 256  # rows of a new static cache; the runner sizes it for its longest sequence
        self._static_caches: dict[tuple, StaticKVCache] = {}

    def set_execution(self, mode: str, max_width: int = 64) -> None:
        """eager: the layers called from Python on growing caches; graphs: on static buffers, each
        width captured once as a CUDA graph where CUDA is (models/graphs.py)."""
        from specbench.models.graphs import EXECUTIONS, StaticRunner

        if mode not in EXECUTIONS:
            raise SpecBenchError(f"model.execution={mode!r}: one of {', '.join(EXECUTIONS)}")
        if mode == "graphs" and self.multi_device:
            raise SpecBenchError("model.execution=graphs needs the model on one device (not model.device_map)")
        self.execution = mode
        self.graphs = StaticRunner(self, max_width) if mode == "graphs" else None

    def follow_execution(self, other: "ModelAdapter") -> None:
        """Run as `other` runs (a draft model beside its target)."""
        self.set_execution(other.execution, other.graphs.max_width if other.graphs else 64)
        self.static_capacity = other.static_capacity

    # -- facts -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def context_length(self) -> int | None:
        """Positions the model was built for (None: not stated by its config)."""
        n = getattr(self.config, "max_position_embeddings", None)
        return int(n) if n else None

    @property
    def vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(self, num_layers: int | None = None, role: str = "target") -> KVCache:
        """An empty cache for a sequence: the target's (every layer) or a draft part's (`role`,
        `num_layers`). Under execution=graphs it is the run's one static cache of that role, emptied:
        its buffers are what the captured graphs read and write, so they live as long as the adapter."""
        n = self.num_layers if num_layers is None else int(num_layers)
        if self.execution != "graphs":
            return KVCache(n)
        key = (role, n)
        if key not in self._static_caches:
            self._static_caches[key] = StaticKVCache(n, self.static_capacity)
        return self._static_caches[key].reset()

    def new_layer(self, input_norm: bool = True) -> nn.Module:
        """A freshly initialised decoder layer of the target's own class and config (a draft
        head's layer). input_norm=False drops the layer's input norm, as EAGLE's draft layer
        has none (its input is a projection of an already normalised feature)."""
        layer = type(self.layers[0])(self.config, 0)
        if not input_norm:
            layer.input_layernorm = nn.Identity()
        return layer.to(device=self.device, dtype=self.dtype)

    # -- pieces ------------------------------------------------------------------------------
    def embed(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """[q] or [B, q] token ids -> [1 or B, q, d]."""
        ids = upload(ids, layer_device(self.embed_tokens) if self.multi_device else self.device, torch.long)
        return self.embed_tokens(ids if ids.dim() == 2 else ids.view(1, -1))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: [1, q, d] -> logits [1, q, V]."""
        if self.multi_device:
            return self.lm_head(to_device(self.norm(to_device(hidden, layer_device(self.norm))), layer_device(self.lm_head)))
        return self.lm_head(self.norm(hidden))

    def run_layers(
        self,
        hidden: torch.Tensor,
        cache: KVCache | None,
        start: int = 0,
        end: int | None = None,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        skip: LayerSkip | None = None,
        layers: list[nn.Module] | None = None,
        cache_offset: int = 0,
    ) -> torch.Tensor:
        """Run decoder layers [start, end) over `hidden` ([B, q, d]) appending to `cache`
        (cache None: no history and nothing stored, as in training).

        positions: [q] absolute positions (default: right after what each layer has cached).
        tree_mask: [q, q] bool, True where new token i may attend to new token j (default
        causal). Cached tokens are always visible, except that a wider mask [q, m] (m > q)
        covers the last m - q cached tokens too (a draft tree grown one level per call).
        layers: run these modules instead of the model's own (an early-exit layer); they write
        to cache layer `cache_offset + k`, their own `layer_idx` is ignored.
        """
        mods = layers if layers is not None else self.layers[start : self.num_layers if end is None else end]
        first = cache_offset if layers is not None else start
        if isinstance(cache, StaticKVCache):  # execution=graphs (models/graphs.py)
            return self.graphs.run(mods, first, hidden, cache, positions, tree_mask, skip)
        # index tensors go to the device once per forward, before the loop (on a GPU a host copy
        # inside it is one transfer per layer), queued (engine/transfer.py); with device_map the
        # loop moves them on as needed
        if positions is not None:
            positions = upload(positions, hidden.device)
        if tree_mask is not None:
            tree_mask = upload(tree_mask, hidden.device)
        return self._layer_loop(mods, first, hidden, cache, positions, tree_mask, skip)

    def run_layers_tapped(self, hidden: torch.Tensor, cache: KVCache | None, taps, positions=None,
                          tree_mask=None, stop: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over `hidden`, as run_layers, plus the hidden states at the *input* of the
        layers `taps` (EAGLE-3's low/mid/high features; the authors' and vLLM's convention: tap i
        is what layer i reads = what layer i-1 wrote) concatenated in `taps`' order: [B, q, len(taps)*d].
        The layers run in segments between taps: the same layers, caches and positions.
        stop: the layers past the deepest tap are not run (the first returned tensor is then
        that tap's state; a caller that only reads taps, as the feature cache for EESD)."""
        got: dict[int, torch.Tensor] = {}
        done = 0
        for i in sorted(set(int(t) for t in taps)):
            if i > done:
                hidden = self.run_layers(hidden, cache, done, i, positions=positions, tree_mask=tree_mask)
                done = i
            got[i] = hidden
        if done < self.num_layers and not stop:
            hidden = self.run_layers(hidden, cache, done, None, positions=positions, tree_mask=tree_mask)
        return hidden, torch.cat([to_device(got[int(t)], hidden.device) for t in taps], -1)

    def _layer_loop(self, mods, first, hidden, cache, positions, tree_mask, skip):
        q = hidden.shape[1]
        pos_embs: dict[int, tuple] = {}
        masks: dict[int, torch.Tensor | None] = {}
        for k, layer in enumerate(mods):
            idx = first + k
            past = cache.length(idx) if cache is not None else 0
            dev = layer_device(layer) if self.multi_device else None
            hidden = to_device(hidden, dev)
            key = (past, dev)
            if key not in pos_embs:  # once per forward (per device, per cache length)
                pos = to_device(positions, hidden.device) if positions is not None else torch.arange(past, past + q, device=hidden.device)
                pos_embs[key] = self.rotary_emb(hidden, pos.view(1, -1))
                boolean = self.boolean_masks and hidden.device.type == "cuda"
                masks[key] = self._mask(past, q, tree_mask, hidden.dtype, hidden.device, boolean)
                if dev is not None:  # a dispatched rotary module may answer on its own device
                    pos_embs[key] = tuple(to_device(t, dev) for t in pos_embs[key])
                    masks[key] = None if masks[key] is None else to_device(masks[key], dev)
            hidden = self._layer(layer, idx, hidden, cache, pos_embs[key], masks[key], skip)
        return hidden

    def _layer(self, layer, idx, hidden, cache, pos_emb, mask, skip: LayerSkip | None):
        attn_on = skip is None or idx not in skip.attn
        mlp_on = skip is None or idx not in skip.mlp
        if attn_on and mlp_on:
            return self._call_layer(layer, idx, hidden, cache, pos_emb, mask)
        # A partly skipped layer: the same sub-modules the layer's forward uses, minus the
        # skipped residual branch.
        if attn_on:
            attn_out, _ = self._call_attn(layer, idx, layer.input_layernorm(hidden), cache, pos_emb, mask)
            hidden = hidden + attn_out
        if mlp_on:
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return hidden

    @staticmethod
    def _redirect(layer, idx):
        # the attention module writes to cache[layer_idx]; point it where this call needs it
        attn = layer.self_attn
        if attn.layer_idx != idx:
            attn.layer_idx = idx

    def _call_layer(self, layer, idx, hidden, cache, pos_emb, mask):
        self._redirect(layer, idx)
        out = layer(hidden, attention_mask=mask, use_cache=True, position_embeddings=pos_emb,
                    **{cache_kwarg(type(layer)): cache})
        return out[0] if isinstance(out, tuple) else out

    def _call_attn(self, layer, idx, normed, cache, pos_emb, mask):
        self._redirect(layer, idx)
        return layer.self_attn(
            hidden_states=normed, position_embeddings=pos_emb, attention_mask=mask,
            **{cache_kwarg(type(layer.self_attn)): cache},
        )

    @staticmethod
    def _mask(past: int, q: int, tree_mask, dtype, device, boolean: bool = False) -> torch.Tensor | None:
        """[1, 1, q, past+q] mask; None for one causal token (it sees everything).

        `boolean` (CUDA with the adapter's sdpa): a boolean mask (True = may attend), which SDPA's
        memory-efficient kernel takes (models/attention.py passes enable_gqa=True with it);
        otherwise the additive float mask the CPU numerics were measured with (0 or the dtype's
        minimum), bit for bit as before."""
        if q == 1 and tree_mask is None:
            return None
        allowed = torch.ones(q, past + q, dtype=torch.bool, device=device)
        new = to_device(tree_mask, device) if tree_mask is not None else torch.ones(q, q, dtype=torch.bool, device=device).tril()
        allowed[:, past + q - new.shape[1] :] = new
        if boolean:
            return allowed.view(1, 1, q, past + q)
        mask = torch.zeros(q, past + q, dtype=dtype, device=device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.view(1, 1, q, past + q)

    # -- the full model ----------------------------------------------------------------------
    def forward(
        self,
        ids: list[int] | torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        skip: LayerSkip | None = None,
        last_only: bool = False,
        head: nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full forward over new tokens. Returns (logits [q, V], final-norm hidden [q, d]);
        `head` replaces the LM head (a draft's vocabulary subset, methods/draft_vocab.py)."""
        h = self.run_layers(self.embed(ids), cache, positions=positions, tree_mask=tree_mask, skip=skip)
        return self._finish(h, last_only, head)

    def forward_tapped(self, ids, cache: KVCache, taps, positions=None, tree_mask=None,
                       last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward() that also returns the tapped features of every fed position ([q, len(taps)*d],
        see run_layers_tapped; `last_only` applies to the logits and hidden state only)."""
        h, tapped = self.run_layers_tapped(self.embed(ids), cache, taps, positions=positions, tree_mask=tree_mask)
        logits, hidden = self._finish(h, last_only, None)
        return logits, hidden, to_device(tapped[0], self.device)

    def _finish(self, h: torch.Tensor, last_only: bool, head: nn.Module | None) -> tuple[torch.Tensor, torch.Tensor]:
        if last_only:
            h = h[:, -1:]
        if self.multi_device:  # hidden states are returned where the logits are (self.device)
            h = to_device(self.norm(to_device(h, layer_device(self.norm))), layer_device(self.lm_head))
            return (self.lm_head if head is None else head)(h)[0], h[0]
        h = self.norm(h)
        return (self.lm_head if head is None else head)(h)[0], h[0]
