"""Hydra's sequentially dependent heads (Ankner et al. 2024) and their checkpoints.

Head k (0-based) reads the base feature of the last verified position t (the final-norm hidden
state whose LM-head output is the pending token x_(t+1); Hydra++: that feature after the
prefix-attention layer) concatenated with the input embeddings of the tokens on the candidate
path, x_(t+1) .. x_(t+k+1), and predicts x_(t+k+2). The module layout is the authors'
(zankner/Hydra, hydra_heads/{mlp_head,prefix_mlp_head}.py), so their `hydra_lm_head.pt` loads
key for key:

- `hydra_mlp.{k}`: a first residual block over the concatenation (Linear d(k+2)->d as the
  residual path, x -> res(x) + SiLU(W x + b)), then `num_layers - 1` blocks x + SiLU(W x + b);
  Hydra++ (`prefix-mlp`) puts a Dropout before each block (Sequential indices 0, 2, ...), so its
  blocks sit at the odd indices;
- `hydra_lm_head.{k}`: a vocabulary projection with a bias, initialised from the target's head
  (Hydra++: behind a Dropout, index 1); with `share_head` (our default, not the authors') there is
  none: every head projects through the target's own head, frozen and not saved (as EAGLE-2/3
  read out), behind the same Dropout for Hydra++;
- `prefix_embeding_layer` (Hydra++ only, the authors' spelling): one decoder layer of the
  target's class plus a final RMSNorm over the target's final-norm hidden states of the whole
  context, causal, with its own KV cache.

Where this differs from the authors' code (docs/hydra.md): their Sequential repeats ONE block
object for layers 2..L (Python list multiplication), so those blocks share weights; here they
are distinct (the paper's 4-layer MLP). Their file still holds one key per index, with equal
tensors, and loads here unchanged. The projection's bias starts at zero (theirs: nn.Linear's
random init), so an untrained head is the base head on its features.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbench.models.artifacts import apply_checkpoint, load_checkpoint, read_json_object, read_weights_file
from specbench.engine.cache import KVCache
from specbench.core.errors import SpecBenchError, choice_error
from specbench.models import ModelAdapter

VARIANTS = ("hydra_pp", "hydra")  # hydra_pp: prefix layer, 4-layer MLPs, teacher distillation | hydra: 1-layer, CE
DEFAULT_LAYERS = {"hydra_pp": 4, "hydra": 1}
ARCH = {"hydra_pp": "prefix-mlp", "hydra": "mlp"}  # the authors' hydra_head_arch
TRAIN_CMD = "python -m specbench.train method=hydra model={model} method.variant={variant} method.share_head={share}"
RELEASE_FILES = ("hydra_lm_head.safetensors", "hydra_lm_head.pt")
LAYOUT = ("expected the Hydra authors' layout: config.json (hydra_num_heads, hydra_num_layers, hydra_head_arch "
          "mlp|prefix-mlp, grounded_heads true, hidden_state_offset 0) and hydra_lm_head.{safetensors,pt} with "
          "hydra_mlp.*, hydra_lm_head.* (and prefix_embeding_layer.* for prefix-mlp)")


class ResBlock(nn.Module):
    """The authors' block: res(x) + SiLU(W x + b); res = identity, or a Linear when the input is a
    concatenation of `cond + 1` vectors (the first block of a head). W starts at zero."""

    def __init__(self, d: int, cond: int = 0):
        super().__init__()
        self.linear = nn.Linear(d * (cond + 1), d)
        self.res_connection = nn.Linear(d * (cond + 1), d) if cond else nn.Identity()
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.res_connection(x) + self.act(self.linear(x))


class PrefixLayer(nn.Module):
    """Hydra++'s prefix-attention layer: one decoder layer + RMSNorm over the context's base features."""

    def __init__(self, target: ModelAdapter):
        super().__init__()
        self.layers = nn.ModuleList([target.new_layer()])
        self.norm = type(target.norm)(target.hidden_size, eps=target.config.rms_norm_eps)
        self.__dict__["_target"] = target

    def forward(self, feats: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """feats [B, q, d] (the target's final-norm hidden states, in order after what `cache`
        holds; cache None: no history, as in training) -> [B, q, d]."""
        h = self._target.run_layers(feats, cache, layers=list(self.layers), cache_offset=0)
        return self.norm(h)


class HydraHeads(nn.Module):
    def __init__(self, target: ModelAdapter, variant: str = "hydra_pp", num_heads: int = 4,
                 num_layers: int | None = None, dropout: float = 0.0, share_head: bool = False):
        super().__init__()
        if variant not in VARIANTS:
            raise choice_error("hydra variant", variant, VARIANTS)
        if num_heads < 1 or (num_layers is not None and num_layers < 1):
            raise SpecBenchError(f"hydra needs num_heads >= 1 and num_layers >= 1, got {num_heads} and {num_layers}")
        d, V = target.hidden_size, target.vocab_size
        self.variant, self.num_heads = variant, int(num_heads)
        self.num_layers = int(num_layers or DEFAULT_LAYERS[variant])
        self.prefix, self.share_head = variant == "hydra_pp", bool(share_head)
        if self.prefix:
            self.prefix_embeding_layer = PrefixLayer(target)
        self.hydra_mlp = nn.ModuleList(self._mlp(d, k, dropout) for k in range(self.num_heads))
        if self.share_head:  # a 49k-row projection per head is ~28 M parameters each on a 576-wide model
            self.hydra_lm_head = None
            self.shared_dropout = nn.Dropout(dropout if self.prefix else 0.0)
        else:
            self.hydra_lm_head = nn.ModuleList(self._projection(d, V, dropout) for _ in range(self.num_heads))
            with torch.no_grad():
                for k in range(self.num_heads):
                    self.projection(k).weight.copy_(target.lm_head.weight.float())
                    self.projection(k).bias.zero_()
        self.__dict__["_target"] = target  # not a submodule: its embedding and head stay frozen and unsaved
        self.to(device=target.device, dtype=target.dtype)

    def _mlp(self, d: int, k: int, dropout: float) -> nn.Sequential:
        blocks = [ResBlock(d, k + 1)] + [ResBlock(d) for _ in range(self.num_layers - 1)]
        if not self.prefix:
            return nn.Sequential(*blocks)
        return nn.Sequential(*[m for b in blocks for m in (nn.Dropout(dropout), b)])

    def _projection(self, d: int, V: int, dropout: float) -> nn.Module:
        lin = nn.Linear(d, V)
        return nn.Sequential(nn.Dropout(dropout), lin) if self.prefix else lin

    def structure(self) -> dict:
        return {"variant": self.variant, "num_heads": self.num_heads, "num_layers": self.num_layers,
                "share_head": self.share_head}

    def projection(self, k: int) -> nn.Linear:
        if self.share_head:
            return self._target.lm_head
        p = self.hydra_lm_head[k]
        return p[1] if isinstance(p, nn.Sequential) else p

    # -- what the heads read ------------------------------------------------------------------
    def base(self, feats: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """The heads' base input from the target's final-norm hidden states [B, q, d]: the prefix
        layer's output (Hydra++), else the hidden states themselves."""
        return self.prefix_embeding_layer(feats, cache) if self.prefix else feats

    def embed(self, ids) -> torch.Tensor:
        return self._target.embed(ids)

    def head(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Head k's logits from its input [..., d (k + 2)]: base feature, then k + 1 path embeddings."""
        if self.share_head:
            return self._target.lm_head(self.shared_dropout(self.hydra_mlp[k](x)))
        return self.hydra_lm_head[k](self.hydra_mlp[k](x))


def teacher_forced_inputs(heads: HydraHeads, target: ModelAdapter, ids: torch.Tensor,
                          h: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """What head k reads at position t of a token sequence ids [B, T] in training: cat(base_t,
    emb(ids[t+1]), .., emb(ids[t+k+1])) for t = 0 .. T-k-3 (it predicts ids[t+k+2]), i.e. the
    text's tokens stand where decoding puts the path's tokens (tests/test_hydra.py checks the
    two agree). Returns (the target's final-norm hidden states [B, T, d], inputs per head).
    `h`: those states if cached (train/features.py)."""
    with torch.no_grad():  # frozen target
        if h is None:
            h = target.norm(target.run_layers(target.embed(ids), None))
        emb = target.embed(ids)
    base = heads.base(h, None)
    T, out, cat = ids.shape[1], [], base
    for k in range(heads.num_heads):
        n = T - k - 2
        if n <= 0:
            break
        cat = torch.cat([cat[:, :n], emb[:, k + 1 : k + 1 + n]], -1)
        out.append(cat)
    return h, out


# -- loading ------------------------------------------------------------------------------------
def structure_of(cfg) -> dict:
    variant = str(cfg.variant)
    if variant not in VARIANTS:
        raise choice_error("hydra variant", variant, VARIANTS)
    layers = cfg.num_layers
    return {"variant": variant, "num_heads": int(cfg.num_heads),
            "num_layers": int(layers) if layers is not None else DEFAULT_LAYERS[variant],
            "share_head": bool(cfg.share_head)}


def load_heads(target: ModelAdapter, cfg) -> tuple[HydraHeads, dict]:
    """checkpoint: auto (our cache), a file of ours, or a directory in the authors' format."""
    where = cfg.checkpoint
    if where not in (None, "none", "auto") and Path(str(where)).expanduser().is_dir():
        return load_released(target, Path(str(where)).expanduser())
    s = structure_of(cfg)
    heads = HydraHeads(target, s["variant"], s["num_heads"], s["num_layers"], share_head=s["share_head"])
    allow = bool(cfg.allow_untrained)
    ckpt = load_checkpoint("hydra", target.key, heads.structure(), where, required=where != "auto" and not allow,
                           model_name=target.name)
    if ckpt is None and not allow:
        raise SpecBenchError(f"no trained Hydra heads for model {target.name} ({s}); train them with `"
                             + TRAIN_CMD.format(model=target.name, variant=s["variant"], share=str(s["share_head"]).lower()) + "` or set method.allow_untrained=true")
    info = s | {"heads_trained": ckpt is not None, "format": "specbench"}
    return apply_checkpoint(heads, ckpt, target, info), info


def released_config(path: Path) -> dict:
    conf = read_json_object(path / "config.json", "Hydra checkpoint ", LAYOUT)
    arch = conf.get("hydra_head_arch", "mlp")
    if arch not in ARCH.values():
        raise SpecBenchError(f"Hydra checkpoint {path}: hydra_head_arch={arch!r} is not supported (allowed: mlp, prefix-mlp)")
    for key in ("hydra_num_heads", "hydra_num_layers"):
        v = conf.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecBenchError(f"Hydra checkpoint {path}: config {key}={v!r}, need a positive integer; {LAYOUT}")
    if conf.get("grounded_heads") is not True:
        raise SpecBenchError(f"Hydra checkpoint {path}: grounded_heads={conf.get('grounded_heads')!r}; only grounded "
                             "(sequentially dependent) heads are Hydra (ungrounded ones are Medusa heads)")
    if conf.get("hidden_state_offset", 0) != 0:
        raise SpecBenchError(f"Hydra checkpoint {path}: hidden_state_offset={conf.get('hidden_state_offset')!r}; only 0 "
                             "(the last layer's features) is supported")
    return conf


def load_released(target: ModelAdapter, path: Path) -> tuple[HydraHeads, dict]:
    """Heads saved by the authors' trainer (`hydra_head.state_dict()` in hydra_lm_head.pt, next to
    the HydraConfig's config.json); read without unpickling objects, every key and shape checked."""
    conf = released_config(path)
    f = next((path / n for n in RELEASE_FILES if (path / n).is_file()), None)
    if f is None:
        raise SpecBenchError(f"Hydra checkpoint {path} has no weights file (need one of: {', '.join(RELEASE_FILES)}); {LAYOUT}")
    state = read_weights_file(f, LAYOUT)
    variant = {v: k for k, v in ARCH.items()}[conf.get("hydra_head_arch", "mlp")]
    n_heads, n_layers = int(conf["hydra_num_heads"]), int(conf["hydra_num_layers"])
    if n_heads * (2 + 2 * n_layers) > len(state):  # config's numbers size nothing before they fit the file
        raise SpecBenchError(f"{f}: {len(state)} tensors, fewer than config.json's {n_heads} heads x {n_layers} layers need; {LAYOUT}")
    # the prefix LlamaModel's own (unused) embedding and the old rotary buffer: checked, not loaded
    for key, shape in (("prefix_embeding_layer.embed_tokens.weight", tuple(target.embed_tokens.weight.shape)),
                       ("prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq", None)):
        t = state.pop(key, None)
        if t is not None and shape is not None and tuple(t.shape) != shape:
            raise SpecBenchError(f"{f}: {key!r} has shape {list(t.shape)}, the model needs {list(shape)}; {LAYOUT}")
    heads = HydraHeads(target, variant, n_heads, n_layers)  # sizes from the target, never from the file
    info = {"variant": variant, "num_heads": n_heads, "num_layers": n_layers, "share_head": False, "heads_trained": True,
            "format": "released", "base_model": conf.get("base_model_name_or_path")}
    ckpt = {"state": state, "path": str(f), "settings": {"config": conf}, "fix": LAYOUT}
    return apply_checkpoint(heads, ckpt, target, info), info
