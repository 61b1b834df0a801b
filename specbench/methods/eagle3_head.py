"""EAGLE-3's draft model (Li et al. 2025) and its checkpoints (ours, and the authors' / SpecForge's release).

The draft reads three of the target's hidden states per position (low, middle, high: the *input*
of layers `layers`, by default the authors' 2, N//2, N-3), concatenated [3d] and fused by
`fc` (3d -> d, no bias) into one d-wide feature. Its one decoder layer (`midlayer`) takes two
inputs per position: the embedding e of the next token and a feature h (the fused target feature
for committed positions; the draft's own previous output inside the tree / the training-time
unroll). Attention reads cat(input_layernorm(e), hidden_norm(h)) (2d wide: q/k/v are 2d -> ...);
the residual stream is h itself; then the layer's MLP as usual. Its output (pre-norm) is the
feature fed to the next depth; `norm` + `lm_head` (d -> draft_vocab_size) give the draft logits.

Draft vocabulary (the authors' `d2t` / `t2d` buffers, saved with the weights): draft id i is
target id i + d2t[i] (d2t holds offsets; the ids are sorted), t2d[v] says whether target id v
is in the draft vocabulary. `logits()` returns target-vocabulary logits (-inf outside the draft
vocabulary), so EAGLE-2's tree code (methods/eagle.py) runs on this head unchanged.

Key names are the authors' (eagle/traineagle3/cnets.py `Model`) and SpecForge's
(`LlamaForCausalLMEagle3`): fc.weight, midlayer.{self_attn,mlp,hidden_norm,input_layernorm,
post_attention_layernorm}.*, norm.weight, lm_head.weight, d2t, t2d, and possibly
embed_tokens.weight (the target's embedding: checked for shape, then ignored).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbench.models.artifacts import apply_checkpoint, check_state, expected_state, load_checkpoint, read_json_object, read_weights_file
from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter
from specbench.models.adapter import cache_kwarg

TRAIN_CMD = "python -m specbench.train method=eagle3 model={model}"
LAYOUT = ("expected the EAGLE-3 layout (authors' / SpecForge's): config.json (hidden_size, draft_vocab_size, num_hidden_layers 1) "
          "and model.safetensors or pytorch_model.bin with fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def tap_layers(num_layers: int, layers="auto") -> list[int]:
    """The three target layers whose input the draft reads: the authors' (2, N//2, N-3) where
    those are distinct and increasing (N >= 7), else spread evenly (tiny test models)."""
    n = num_layers
    if layers in (None, "auto"):
        ours = [2, n // 2, n - 3]
        return ours if 0 < ours[0] < ours[1] < ours[2] < n else [n // 4, n // 2, (3 * n) // 4]
    vals = None if isinstance(layers, str) or not hasattr(layers, "__iter__") else list(layers)  # a list or ListConfig
    if vals is None or len(vals) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for v in vals):
        raise SpecBenchError(f"method.layers={layers!r} is not allowed; expected 'auto' or three layer indices in [0, {n})")
    return [int(v) for v in vals]


def vocab_maps(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for the sorted target ids `ids`, as the authors build them: d2t[i] = ids[i] - i
    (an offset), t2d[v] = v is one of `ids`."""
    ids = torch.as_tensor(ids, dtype=torch.long).sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d


def check_maps(d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    """d2t must name distinct increasing target ids, exactly the ones t2d marks; else one line."""
    ids = torch.arange(len(d2t)) + d2t.long().cpu()
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(t2d) or not bool((ids[1:] > ids[:-1]).all())):
        raise SpecBenchError(f"{where}: d2t maps draft ids outside [0, {len(t2d)}) or not in increasing order; {LAYOUT}")
    if not torch.equal(t2d.bool().cpu().nonzero().flatten(), ids):
        raise SpecBenchError(f"{where}: t2d does not mark exactly the {len(ids)} target ids d2t names; {LAYOUT}")


class Eagle3Layer(nn.Module):
    """The draft's decoder layer: the target's own layer class (attention, MLP, norms), its q/k/v
    widened to 2d inputs, plus `hidden_norm`. Called through the adapter like any layer, with
    hidden_states = cat(e, h) [.., 2d]; returns the new feature [.., d]."""

    def __init__(self, target: ModelAdapter):
        super().__init__()
        base, d = target.new_layer(), target.hidden_size
        attn = base.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * d, old.out_features, bias=old.bias is not None))
        self.self_attn, self.mlp = attn, base.mlp
        self.input_layernorm, self.post_attention_layernorm = base.input_layernorm, base.post_attention_layernorm
        self.hidden_norm = type(base.input_layernorm)(d, eps=target.config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, cache=None, **_):
        d = hidden_states.shape[-1] // 2
        emb, h = hidden_states[..., :d], hidden_states[..., d:]
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(h)), -1)
        out, _ = self.self_attn(hidden_states=x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                **{cache_kwarg(type(self.self_attn)): cache})
        h = h + out
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    def __init__(self, target: ModelAdapter, layers: list[int], draft_ids: torch.Tensor):
        super().__init__()
        d, V = target.hidden_size, target.vocab_size
        self.layers = list(layers)
        self.fc = nn.Linear(len(self.layers) * d, d, bias=False)
        self.midlayer = Eagle3Layer(target)
        self.norm = type(target.norm)(d, eps=target.config.rms_norm_eps)
        self.lm_head = nn.Linear(d, len(draft_ids), bias=False)
        d2t, t2d = vocab_maps(draft_ids, V)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.__dict__["_target"] = target  # not a submodule: its embedding stays frozen, unsaved
        self.to(device=target.device, dtype=target.dtype)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    def init_from_target(self) -> None:
        """Training's start: lm_head = the target's head rows of the draft vocabulary, norm = its final norm
        (a short budget starts from the target's own readout; the authors start lm_head at random)."""
        t = self._target
        with torch.no_grad():
            self.lm_head.weight.copy_(t.lm_head.weight[self.target_ids()])
            self.norm.weight.copy_(t.norm.weight)

    def target_ids(self) -> torch.Tensor:
        """Target id of each draft id (device work only)."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def project(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's tapped features [.., 3d] -> the draft's input feature [.., d]."""
        return self.fc(taps.to(self.fc.weight.dtype))

    def forward(self, features: torch.Tensor, tokens, cache, positions=None, tree_mask=None) -> torch.Tensor:
        """features [B, q, d] (h), tokens [B, q] or [q] (the next tokens) -> the draft's output features [B, q, d]."""
        t = self._target
        x = torch.cat((t.embed(tokens).to(features.dtype), features), -1)
        return t.run_layers(x, cache, positions=positions, tree_mask=tree_mask, layers=[self.midlayer], cache_offset=0)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[.., draft_vocab_size]: what training's loss reads."""
        return self.lm_head(self.norm(features))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[.., V] target-vocabulary logits, -inf outside the draft vocabulary (what the tree code reads)."""
        small = self.draft_logits(features)
        if small.shape[-1] == len(self.t2d):
            return small  # full vocabulary: d2t is all zeros
        out = small.new_full((*small.shape[:-1], len(self.t2d)), float("-inf"))
        return out.index_copy_(-1, self.target_ids(), small)

    def structure(self) -> dict:
        return {"layers": self.layers, "draft_vocab_size": self.draft_vocab_size}


def draft_size(target: ModelAdapter, cfg) -> int:
    size = cfg.draft_vocab_size
    if size is None:
        return target.vocab_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SpecBenchError(f"method.draft_vocab_size={size!r} is not allowed; expected an integer >= 1 or null")
    return min(size, target.vocab_size)  # a vocabulary smaller than the draft's: all of it


LM_HEADS = ("trained", "target")


def lm_head_mode(cfg) -> str:
    """method.lm_head: `trained` (the authors': the draft's own head, saved) or `target` (the
    target's head rows of the draft vocabulary, frozen in training and not saved: derived from the
    target and d2t at load, so a checkpoint is ~half the size)."""
    mode = str(cfg.lm_head)
    if mode not in LM_HEADS:
        raise SpecBenchError(f"method.lm_head={mode!r} is not allowed; allowed: {', '.join(LM_HEADS)}")
    return mode


def structure_of(cfg) -> dict:
    """The cache key of a trained head (first use and loading agree): the settings as written."""
    layers = cfg.layers
    out = {"layers": layers if isinstance(layers, str) else [int(v) for v in layers],
           "draft_vocab_size": cfg.draft_vocab_size}
    return out | ({"lm_head": "target"} if lm_head_mode(cfg) == "target" else {})


def with_target_head(state: dict, target: ModelAdapter, where: str) -> dict:
    """A checkpoint saved with lm_head=target: its lm_head rows are the target's at d2t's ids."""
    if "lm_head.weight" in state:
        raise SpecBenchError(f"checkpoint {where}: holds lm_head.weight, but method.lm_head=target derives it from the "
                             "target (train with method.lm_head=target, or load it with method.lm_head=trained)")
    if "d2t" not in state or "t2d" not in state:
        return state  # check_state names the missing key
    check_maps(state["d2t"], state["t2d"], f"checkpoint {where}")
    ids = torch.arange(len(state["d2t"])) + state["d2t"].long()
    w = target.lm_head.weight
    return state | {"lm_head.weight": w.detach()[ids.to(w.device)].to("cpu", torch.float32)}


def _read_weights(path: Path) -> dict:
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return read_weights_file(path / name, LAYOUT)
    raise SpecBenchError(f"EAGLE-3 checkpoint {path} has no weights file (need one of: {', '.join(WEIGHT_FILES)}); {LAYOUT}")


def _released_config(target: ModelAdapter, path: Path) -> tuple[dict, int]:
    if not (path / "config.json").is_file():
        raise SpecBenchError(f"EAGLE-3 checkpoint {path} has no config.json; {LAYOUT}")
    conf = read_json_object(path / "config.json", "EAGLE-3 checkpoint ", LAYOUT)
    d, V = target.hidden_size, target.vocab_size
    want = {"hidden_size": d, "num_hidden_layers": 1, "vocab_size": V, "target_hidden_size": d}
    for key, need in want.items():
        if key in conf or key in ("hidden_size", "num_hidden_layers"):
            if conf.get(key) != need:
                raise SpecBenchError(f"EAGLE-3 checkpoint {path}: config {key}={conf.get(key)!r}, need {need} for model {target.name}")
    dv = conf.get("draft_vocab_size", V)
    if isinstance(dv, bool) or not isinstance(dv, int) or not 1 <= dv <= V:
        raise SpecBenchError(f"EAGLE-3 checkpoint {path}: config draft_vocab_size={dv!r}, need an integer in [1, {V}]")
    return conf, dv


def released_layers(conf: dict, target: ModelAdapter, cfg):
    """Tap layers of a release: method.layers if set, else the config's eagle_config
    eagle_aux_hidden_state_layer_ids (vLLM's key, layer inputs), else the authors' default."""
    if cfg.layers not in (None, "auto"):
        return tap_layers(target.num_layers, cfg.layers)
    aux = (conf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") if isinstance(conf.get("eagle_config"), dict) else None
    return tap_layers(target.num_layers, aux if aux is not None else "auto")


def load_released(target: ModelAdapter, path: Path, cfg) -> tuple[Eagle3Head, dict]:
    """A draft in the authors' / SpecForge's format; any mismatch is one line naming it."""
    conf, dv = _released_config(target, path)
    state = _read_weights(path)
    emb = state.pop("embed_tokens.weight", None)
    if emb is not None and tuple(emb.shape) != tuple(target.embed_tokens.weight.shape):
        raise SpecBenchError(f"EAGLE-3 checkpoint {path}: embed_tokens.weight has shape {tuple(emb.shape)}, "
                             f"the target's is {tuple(target.embed_tokens.weight.shape)}")
    head = Eagle3Head(target, released_layers(conf, target, cfg), torch.arange(dv))  # sizes: the target's and the checked config's
    check_state(state, expected_state(head), path, LAYOUT)
    check_maps(state["d2t"], state["t2d"], f"EAGLE-3 checkpoint {path}")
    info = {"head_trained": True, "format": "released", "layers": head.layers, "draft_vocab_size": dv}
    ckpt = {"state": state, "path": str(path), "settings": {"config": conf}, "fix": LAYOUT}
    return apply_checkpoint(head, ckpt, target, info), info


def load_eagle3(target: ModelAdapter, cfg) -> tuple[Eagle3Head, dict]:
    """checkpoint: auto (our cache), a .safetensors of ours, or a directory in the authors' format."""
    where = cfg.checkpoint
    if where not in (None, "none", "auto") and Path(str(where)).expanduser().is_dir():
        return load_released(target, Path(str(where)).expanduser(), cfg)
    layers, size = tap_layers(target.num_layers, cfg.layers), draft_size(target, cfg)
    head = Eagle3Head(target, layers, torch.arange(size))  # untrained: the first ids (a checkpoint brings its own maps)
    allow = bool(cfg.allow_untrained)
    ckpt = load_checkpoint("eagle3", target.key, structure_of(cfg), where, required=where != "auto" and not allow,
                           model_name=target.name)
    if ckpt is None and not allow:
        raise SpecBenchError(f"no trained EAGLE-3 draft for model {target.name}; train it with `"
                             + TRAIN_CMD.format(model=target.name) + "` or set method.allow_untrained=true")
    if ckpt is not None and lm_head_mode(cfg) == "target":
        ckpt["state"] = with_target_head(ckpt["state"], target, ckpt["path"])
    if ckpt is not None:
        check_state(ckpt["state"], expected_state(head), ckpt["path"], ckpt["fix"])
        check_maps(ckpt["state"]["d2t"], ckpt["state"]["t2d"], f"checkpoint {ckpt['path']}")
    info = {"head_trained": ckpt is not None, "format": "specbench", "layers": layers, "draft_vocab_size": size}
    return apply_checkpoint(head, ckpt, target, info), info
