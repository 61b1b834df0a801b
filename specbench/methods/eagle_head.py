"""EAGLE's draft head (Li et al. 2024) and its checkpoints (ours, and the authors' release).

The head works at the feature level: the target's final-norm feature f_t at position t (the
vector its LM head turns into the distribution of x_(t+1)) and the embedding of x_(t+1) are
concatenated, projected (Linear 2d -> d, with bias as in the authors' code) and run through one
decoder layer of the target's own class and config (built by the adapter; no forked modeling
code). The output is the predicted feature f^_(t+1); the target's frozen LM head turns it into
the draft distribution of x_(t+2). Pair t sits at position t of the head's own KV cache.

Choices, and where the sources differ:
- concatenation order is (embedding, feature), as in the authors' code, so their released `fc`
  weights load unchanged;
- the decoder layer has no input norm (the authors' layer 0 skips it: its input is a projection
  of normalised features), so a released head's keys are exactly ours;
- features are *after* the final norm (what the authors' code reads from the base model), so
  the head's output goes to the LM head directly, without the final norm again: the brief's
  "final norm / LM head" reading would normalise a normalised regression target twice;
- the embedding is the target's, frozen and not saved (a release's `embed_tokens.weight`, if
  present, must match the target's shape and is ignored).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter
from specbench.models.artifacts import apply_checkpoint, load_checkpoint, read_json_object, read_weights_file

TRAIN_CMD = "python -m specbench.train method=eagle model={model}"
EAGLE_LAYOUT = ("expected the EAGLE authors' layout: config.json (hidden_size, num_hidden_layers 1) and model.safetensors "
                "or pytorch_model.bin with fc.weight (fc.bias) and layers.0.*")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class EagleHead(nn.Module):
    def __init__(self, target: ModelAdapter, bias: bool = True):
        super().__init__()
        d = target.hidden_size
        self.bias = bool(bias)
        self.fc = nn.Linear(2 * d, d, bias=self.bias)
        self.layers = nn.ModuleList([target.new_layer(input_norm=False)])
        self.__dict__["_target"] = target  # not a submodule: its embedding and head stay frozen, unsaved
        self.to(device=target.device, dtype=target.dtype)

    def structure(self) -> dict:
        return {"layers": 1, "bias": self.bias}

    def forward(self, features: torch.Tensor, tokens, cache, positions=None, tree_mask=None) -> torch.Tensor:
        """features [B, q, d] (f_t), tokens [B, q] or [q] (x_(t+1)) -> predicted f_(t+1) [B, q, d]."""
        t = self._target
        x = self.fc(torch.cat((t.embed(tokens).to(features.dtype), features), -1))
        return t.run_layers(x, cache, positions=positions, tree_mask=tree_mask, layers=list(self.layers), cache_offset=0)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self._target.lm_head(features)


def training_pairs(target: ModelAdapter, ids: torch.Tensor, f: torch.Tensor | None = None):
    """What the head learns from a token sequence ids [B, T]: inputs (f_0..f_(T-2), x_1..x_(T-1))
    and regression targets f_1..f_(T-1). Decoding feeds the head exactly these pairs for the
    committed tokens (tests/test_eagle.py checks it). `f`: the final-norm features if cached."""
    if f is None:
        f = target.norm(target.run_layers(target.embed(ids), None))
    return f[:, :-1], ids[:, 1:], f[:, 1:]


def _read_weights(path: Path) -> dict:
    for name in WEIGHT_FILES:
        f = path / name
        if f.is_file():
            return read_weights_file(f, EAGLE_LAYOUT)
    raise SpecBenchError(f"EAGLE checkpoint {path} has no weights file (need one of: {', '.join(WEIGHT_FILES)})")


def load_released(target: ModelAdapter, path: Path) -> tuple[EagleHead, dict]:
    """A head in the authors' format: `config.json` + `model.safetensors` or `pytorch_model.bin`
    with `fc.weight` (`fc.bias`) and `layers.0.*`. Any mismatch is one line naming it."""
    conf_path = path / "config.json"
    if not conf_path.is_file():
        raise SpecBenchError(f"EAGLE checkpoint {path} has no config.json")
    conf = read_json_object(conf_path, "EAGLE checkpoint ", EAGLE_LAYOUT)
    for key, want in (("hidden_size", target.hidden_size), ("num_hidden_layers", 1)):
        if conf.get(key) != want:
            raise SpecBenchError(f"EAGLE checkpoint {path}: config {key}={conf.get(key)}, need {want} for model {target.name}")
    state = _read_weights(path)
    emb = state.pop("embed_tokens.weight", None)
    if emb is not None and tuple(emb.shape) != tuple(target.embed_tokens.weight.shape):
        raise SpecBenchError(f"EAGLE checkpoint {path}: embed_tokens.weight has shape {tuple(emb.shape)}, "
                             f"the target's is {tuple(target.embed_tokens.weight.shape)}")
    head = EagleHead(target, bias="fc.bias" in state)  # its sizes are the target's, never the file's
    info = {"head_trained": True, "format": "released"}
    ckpt = {"state": state, "path": str(path), "settings": {"config": conf}, "fix": EAGLE_LAYOUT}
    return apply_checkpoint(head, ckpt, target, info), info


def load_eagle(target: ModelAdapter, cfg) -> tuple[EagleHead, dict]:
    """checkpoint: auto (our cache), a .pt of ours, or a directory in the authors' format."""
    where = cfg.checkpoint
    if where not in (None, "none", "auto") and Path(str(where)).expanduser().is_dir():
        return load_released(target, Path(str(where)).expanduser())
    head = EagleHead(target, bool(cfg.bias))
    allow = bool(cfg.allow_untrained)
    ckpt = load_checkpoint("eagle", target.key, head.structure(), where, required=where != "auto" and not allow,
                           model_name=target.name)
    if ckpt is None and not allow:
        raise SpecBenchError(f"no trained EAGLE head for model {target.name}; train it with `"
                             + TRAIN_CMD.format(model=target.name) + "` or set method.allow_untrained=true")
    info = {"head_trained": ckpt is not None, "format": "specbench"}
    return apply_checkpoint(head, ckpt, target, info), info
