"""Artifacts in the formats their authors publish them: Medusa heads, Self-SD skip sets.

Medusa (FasterDecoding/Medusa, e.g. hub `FasterDecoding/medusa-vicuna-7b-v1.3`): a directory with
`config.json` (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`) and
`medusa_lm_head.safetensors` or `medusa_lm_head.pt`, the state dict of a ModuleList of heads,
head i = Sequential(medusa_num_layers residual blocks, bias-free vocabulary projection):
`{i}.{j}.linear.weight` [d, d], `{i}.{j}.linear.bias` [d] (j < L) and `{i}.{L}.weight` [V, d],
L = medusa_num_layers. A block is x + SiLU(W x + b), fed the base model's final-norm hidden
state. (Medusa's own module repeats one block object L times, so its L blocks share weights;
its state dict still has one key per j, and loading those keys into L blocks is equivalent.)

The tree Medusa decodes with (`medusa_choices`, `mc_sim_7b_63` by default in its
`medusa_generate`) lives in Medusa's source, not in the checkpoint, and is not copied here:
`medusa_tree(name)` reads it from an installed Medusa (`pip install
git+https://github.com/FasterDecoding/Medusa`; the PyPI wheel medusa-llm 0.1 lacks the file),
and `method.tree=<file.json>` takes the same list of paths from a file.

Self-SD (dilab-zju/self-speculative-decoding, `skip_layers.json`): `{model name: {"attention":
[layer ids], "mlp": [layer ids]}}`, 0-based; a file with one such entry, or the entry alone, loads
too. Every format error is one line naming the file and the expected layout.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from torch import nn

from specbench.models.artifacts import check_state, read_json_object, read_weights_file
from specbench.core.errors import SpecBenchError

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
MEDUSA_LAYOUT = (
    "expected Medusa's layout: config.json with medusa_num_heads, medusa_num_layers (L) and "
    "medusa_lm_head.{safetensors,pt} with keys '{i}.{j}.linear.weight' [d, d], '{i}.{j}.linear.bias' [d] "
    "for j < L and '{i}.{L}.weight' [V, d] for each head i"
)
SKIP_LAYOUT = 'expected Self-SD\'s skip_layers.json layout: {"<model>": {"attention": [layer ids], "mlp": [layer ids]}}'
DEFAULT_MEDUSA_TREE = "mc_sim_7b_63"  # what Medusa's medusa_generate uses unless told otherwise


class ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(linear(x)) (keys linear.weight, linear.bias)."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class PublishedMedusaHeads(nn.Module):
    """Heads with Medusa's exact module layout, so its state dict loads key for key; the same
    interface as methods/medusa.py's MedusaHeads (num_heads, head(k, h), forward(h))."""

    def __init__(self, d: int, vocab: int, num_heads: int, num_layers: int):
        super().__init__()
        self.num_heads, self.num_layers = int(num_heads), int(num_layers)
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(d) for _ in range(self.num_layers)], nn.Linear(d, vocab, bias=False))
            for _ in range(self.num_heads)
        )

    def structure(self) -> dict:
        return {"num_heads": self.num_heads, "num_layers": self.num_layers, "published": True}

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        return [self.head(k, h) for k in range(self.num_heads)]

    def head(self, k: int, h: torch.Tensor) -> torch.Tensor:
        return self.medusa_head[k](h)

    def features(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Head k's input to its vocabulary projection."""
        return self.medusa_head[k][:-1](h)

    def projection(self, k: int) -> nn.Linear:
        return self.medusa_head[k][-1]


def _local_or_hub(where: str) -> Path:
    p = Path(where).expanduser()
    if p.exists():
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(where, allow_patterns=["config.json", "medusa_lm_head.*"]))
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, ...: one line either way
        raise SpecBenchError(f"Medusa heads {where!r}: not a local directory and not loadable from the hub "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})") from None


def is_medusa_checkpoint(where) -> bool:
    """A directory holding Medusa's files, or a hub id (org/name) that is not a local file."""
    if not where or str(where) in ("auto", "none", "null"):
        return False
    p = Path(str(where)).expanduser()
    if p.is_dir():
        return any((p / f).is_file() for f in MEDUSA_FILES) or (p / "config.json").is_file()
    w = str(where)
    return (not p.exists() and w.count("/") == 1 and not w.startswith((".", "/", "~"))
            and not w.endswith((".pt", ".pth", ".bin", ".safetensors", ".json")))


def medusa_config(d: Path) -> dict:
    cfg_path = d / "config.json"
    conf = read_json_object(cfg_path, "", MEDUSA_LAYOUT)
    conf.setdefault("medusa_num_layers", 1)  # MedusaConfig's default
    for key, low in (("medusa_num_heads", 1), ("medusa_num_layers", 0)):
        v = conf.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            kind = "positive" if low else "non-negative"
            raise SpecBenchError(f"{cfg_path}: no {kind} integer {key!r}; {MEDUSA_LAYOUT}")
    return conf


def medusa_names(K: int, L: int):
    """The names in Medusa's state dict, in order (a generator: config.json's K and L may be absurd)."""
    for i in range(K):
        for j in range(L):
            yield from (f"{i}.{j}.linear.weight", f"{i}.{j}.linear.bias")
        yield f"{i}.{L}.weight"


def medusa_shapes(K: int, L: int, d: int, V: int, dtype: torch.dtype) -> dict:
    """name -> (shape, dtype) of Medusa's state dict (artifacts.check_state), without building the heads."""
    return {n: ((V, d) if n.endswith(f".{L}.weight") and ".linear." not in n else
                (d, d) if n.endswith("weight") else (d,), dtype) for n in medusa_names(K, L)}


def load_medusa_heads(where: str, hidden: int, vocab: int, dtype: torch.dtype = torch.float32) -> tuple[PublishedMedusaHeads, dict]:
    d = _local_or_hub(str(where))
    if d.is_file():
        raise SpecBenchError(f"{d}: give the directory holding config.json and medusa_lm_head.*; {MEDUSA_LAYOUT}")
    conf = medusa_config(d)
    path = next((d / f for f in MEDUSA_FILES if (d / f).is_file()), None)
    if path is None:
        raise SpecBenchError(f"{d}: no {' or '.join(MEDUSA_FILES)}; {MEDUSA_LAYOUT}")
    state = read_weights_file(path, MEDUSA_LAYOUT)
    K, L = int(conf["medusa_num_heads"]), int(conf["medusa_num_layers"])
    if K * (2 * L + 1) > len(state):  # config.json's numbers size nothing before they fit the file
        first = next(n for n in medusa_names(K, L) if n not in state)
        raise SpecBenchError(f"{path}: missing key {first!r} (config.json says {K} heads x {L} blocks); {MEDUSA_LAYOUT}")
    check_state(state, medusa_shapes(K, L, hidden, vocab, dtype), path, f"(d={hidden}, V={vocab}) {MEDUSA_LAYOUT}")
    heads = PublishedMedusaHeads(hidden, vocab, K, L).to(dtype)  # load straight into the model's dtype
    heads.medusa_head.load_state_dict(state)
    info = {"num_heads": K, "medusa_num_layers": L, "heads_trained": True, "checkpoint": str(path),
            "published": True, "base_model": conf.get("base_model_name_or_path")}
    return heads, info


def medusa_tree(name: str) -> list[list[int]]:
    """A named tree (`medusa_choices`) from an installed Medusa, or the paths in a JSON file."""
    p = Path(name).expanduser()
    if p.suffix == ".json" or p.is_file():
        try:
            paths = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecBenchError(f"method.tree={name!r}: cannot read ({type(e).__name__}); expected a JSON list of paths "
                                 "like [[0], [1], [0, 0]]") from None
    else:
        try:
            paths = getattr(importlib.import_module("medusa.model.medusa_choices"), name)
        except (ImportError, AttributeError):
            raise SpecBenchError(
                f"method.tree={name!r}: no such tree in an installed Medusa (medusa.model.medusa_choices); install "
                "it from github.com/FasterDecoding/Medusa or pass a JSON file of paths"
            ) from None
    if not (isinstance(paths, list) and paths and all(isinstance(q, list) and q and all(isinstance(i, int) for i in q) for q in paths)):
        raise SpecBenchError(f"method.tree={name!r}: expected a non-empty list of paths like [[0], [1], [0, 0]]")
    return paths


def default_medusa_tree() -> tuple[list[list[int]] | None, str]:
    """Medusa's default tree when Medusa is installed; (None, why not) otherwise."""
    try:
        return medusa_tree(DEFAULT_MEDUSA_TREE), DEFAULT_MEDUSA_TREE
    except SpecBenchError:
        return None, f"{DEFAULT_MEDUSA_TREE} unavailable (Medusa not installed)"


def load_skip_set(path: Path, model: str | None) -> tuple[list, list, str]:
    """(attention ids, mlp ids, entry name) from a Self-SD skip_layers.json-style file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecBenchError(f"{path}: cannot read ({type(e).__name__}); {SKIP_LAYOUT}") from None
    if not isinstance(data, dict):
        raise SpecBenchError(f"{path}: a JSON {type(data).__name__}; {SKIP_LAYOUT}")
    if "attention" in data or "mlp" in data:
        entry, name = data, path.stem
    elif model and model in data:
        entry, name = data[model], model
    elif len(data) == 1:
        name, entry = next(iter(data.items()))
    else:
        raise SpecBenchError(f"{path} holds skip sets for {', '.join(map(str, data))}; choose one with method.skip.model=<name>")
    if not isinstance(entry, dict) or not isinstance(entry.get("attention"), list) or not isinstance(entry.get("mlp"), list):
        raise SpecBenchError(f"{path}: entry {name!r} needs lists 'attention' and 'mlp'; {SKIP_LAYOUT}")
    return entry["attention"], entry["mlp"], name
