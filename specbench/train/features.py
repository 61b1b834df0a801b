"""The target's features for the training text, computed once by a prefill and cached on disk.

Every trainer of a draft that reads the target's hidden states (EAGLE-2: the final-norm feature;
EAGLE-3: the inputs of three layers and the final-norm feature its loss reads the target's
distribution from; Hydra and Medusa: the final-norm feature; EESD: the input of layer n, and the
final-norm feature for its Cali-TS examples) ran the frozen target (EESD: its first n layers) over
each batch at every optimiser step and again for every epoch, resumed run and held-out evaluation.
Here the target runs once over every sequence (a batched, right-padded prefill: causal attention
keeps the real positions unaffected; never generation), and the features are stored in
`<cache>/features/<key>.safetensors`, keyed by the model's identity, the sequences' hash (their
tokens cut at train.max_len), the tap set and the storage dtype; every trainer and resumed run with
the same key reuses the file. A store is checked when read: one that is damaged or holds NaN or
infinite values (a valid header over poisoned numbers) is ignored and computed again; features
that are not finite as computed are never written (one line).

`train.feature_cache`: `float16` (default; tests/test_features.py and tests/test_eesd_features.py
show the loss within 1e-3 relative of the live computation on the tiny model), `float32`, or null
(compute live, as before).

A tap is a layer index i (the hidden state at the input of layer i, as EAGLE-3 reads it) or
"final" (the final norm's output). A batch's rows are found by their tokens: the training loop
hands the loss padded ids and labels; a row's length is its last labelled position + 2
(loop.pad_batch), and its first that many tokens are the sequence. A row not in the store (a
caller's own ids) is None: the caller computes it live. `FeatureStore.sequence` finds one whole
sequence (EESD's Cali-TS examples read every position of it).
"""

from __future__ import annotations

import hashlib
import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from specbench.models.artifacts import all_finite, atomic_write, cache_dir, safe_key
from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter

FORMAT = "specbench-features/1"
DTYPES = {"float16": torch.float16, "float32": torch.float32}


class FeatureStore:
    """Features [sum of lengths, F] of the sequences, found by their tokens."""

    def __init__(self, feats: torch.Tensor, keys: list[tuple], dtype, device, path=None):
        self.feats, self.dtype, self.device, self.path = feats, dtype, device, path
        self.index: dict[tuple, tuple[int, int]] = {}
        at = 0
        for k in keys:
            self.index.setdefault(k, (at, len(k)))
            at += len(k)

    def inputs(self) -> dict:
        """What a training reading this store names when its loss is not finite (train_loop)."""
        return {"the target's features": str(self.path)}

    @property
    def width(self) -> int:
        return self.feats.shape[1]

    def batch(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """[B, T, F] in the target's dtype for a padded batch (loop.pad_batch), or None when a row
        with labels is not stored. Rows without labels and padding are zeros (no loss reads them)."""
        out = torch.zeros(ids.shape[0], ids.shape[1], self.width, dtype=self.dtype)
        for b in range(ids.shape[0]):
            where = (labels[b] != -100).nonzero()
            if not len(where):
                continue
            n = int(where.max()) + 2
            row = self.sequence(ids[b, :n].tolist())
            if row is None:
                return None
            out[b, :n] = row
        return out.to(self.device)

    def sequence(self, seq: list[int]) -> torch.Tensor | None:
        """[len(seq), F] in the target's dtype (on the CPU) if `seq` is stored whole, else None
        (a sequence longer than train.max_len is stored cut, so its tail is not here)."""
        hit = self.index.get(tuple(seq))
        if hit is None or hit[1] != len(seq):
            return None
        return self.feats[hit[0]: hit[0] + hit[1]].to(self.dtype)


def feature_key(target: ModelAdapter, keys: list[tuple], taps, dtype: str) -> str:
    blob = json.dumps([FORMAT, target.key, [list(k) for k in keys], [str(t) for t in taps], dtype])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@torch.no_grad()
def prefill(target: ModelAdapter, seqs: list[list[int]], taps, batch_size: int = 4) -> torch.Tensor:
    """[sum of lengths, F]: the taps of every position of every sequence, in `taps`' order."""
    layers = [int(t) for t in taps if t != "final"]
    rows = []
    for i in tqdm(range(0, len(seqs), batch_size), desc="target features (prefill)", unit="batch"):
        batch = seqs[i: i + batch_size]
        width = max(len(s) for s in batch)
        ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s in batch], device=target.device)
        # without "final" nothing past the deepest tap is read (EESD's layer n): those layers are not run
        h, tapped = target.run_layers_tapped(target.embed(ids), None, layers or [0], stop="final" not in taps)
        d = target.hidden_size
        parts, k = [], 0
        for t in taps:
            if t == "final":
                parts.append(target.norm(h))
            else:
                parts.append(tapped[..., k * d:(k + 1) * d])
                k += 1
        f = torch.cat(parts, -1).cpu()
        rows += [f[b, : len(s)] for b, s in enumerate(batch)]
    return torch.cat(rows, 0)


def target_features(target: ModelAdapter, sequences, taps, tcfg) -> FeatureStore | None:
    """The store of `sequences`' features at `taps` (cached), or None with train.feature_cache null."""
    kind = tcfg.feature_cache
    if kind is None:
        return None
    if kind not in DTYPES:
        raise SpecBenchError(f"train.feature_cache={kind!r} is not allowed; allowed: float16, float32, null")
    keys = [tuple(s[0][: int(tcfg.max_len)]) for s in sequences]
    key = feature_key(target, keys, taps, kind)
    path = cache_dir() / "features" / f"{safe_key(target.key)}-{key}.safetensors"
    width = len(taps) * target.hidden_size
    feats = _read(path, key, sum(len(k) for k in keys), width)
    if feats is None and (found := _from_superset(target, keys, taps, kind)) is not None:
        feats, path = found
        print(f"target features: the {[str(t) for t in taps]} columns of {path}", flush=True)
    elif feats is None:
        feats = prefill(target, [list(k) for k in keys], taps, int(tcfg.prefill_batch_size)).to(DTYPES[kind])
        if not all_finite(feats):  # never cached: every later training would read it
            raise SpecBenchError(f"the target's features at taps {[str(t) for t in taps]} hold NaN or infinite values as "
                                 f"computed ({kind}): check the model's weights, or store them wider "
                                 "(train.feature_cache=float32); nothing written")
        meta = {"format": FORMAT, "key": key, "model": target.key, "taps": [str(t) for t in taps], "dtype": kind}
        atomic_write(path, lambda p: save_file({"features": feats.contiguous()}, str(p),
                                               metadata={"specbench": json.dumps(meta)}))
        print(f"target features: {len(keys)} sequences, {feats.shape[0]} positions x {width} ({kind}) -> {path}", flush=True)
    else:
        print(f"target features: reusing {path}", flush=True)
    return FeatureStore(feats, keys, target.dtype, target.device, path)


def _load(path, accept, say_damaged: bool = False):
    """(metadata, features) of a store of ours whose metadata `accept` passes, else None. The
    metadata is read first: a store of other taps or text is never loaded."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["specbench"])
            if meta.get("format") != FORMAT or not accept(meta):
                return None
            feats = f.get_tensor("features")
    except Exception as e:  # noqa: BLE001 - a damaged cache file is recomputed, never trusted
        if say_damaged:
            print(f"target features: ignoring {path} ({type(e).__name__}); recomputing", flush=True)
        return None
    if not all_finite(feats):  # a valid header over NaN: trained on, it poisons every artifact made from it
        print(f"target features: ignoring {path} (NaN or infinite values); recomputing", flush=True)
        return None
    return meta, feats


def _read(path, key: str, rows: int, width: int) -> torch.Tensor | None:
    """The cached features if the file is ours, of this key and shape; else None (recompute)."""
    if not path.is_file():
        return None
    got = _load(path, lambda meta: meta.get("key") == key, say_damaged=True)
    return got[1] if got is not None and tuple(got[1].shape) == (rows, width) else None


def _from_superset(target: ModelAdapter, keys: list[tuple], taps, kind: str):
    """(features, path) from a cached store of the same sequences and dtype whose taps include
    `taps`, cut to their columns; else None. The recipe trains EAGLE-3 (three layers + final)
    and then EAGLE-2, Hydra and Medusa ("final") on the same text: one prefill serves them all."""
    want, d = [str(t) for t in taps], target.hidden_size

    def covers(meta) -> bool:
        have = meta.get("taps") or []
        return (meta.get("dtype") == kind and set(want) <= set(have)
                and meta.get("key") == feature_key(target, keys, have, kind))

    for path in sorted((cache_dir() / "features").glob(f"{safe_key(target.key)}-*.safetensors")):
        got = _load(path, covers)
        if got is None:
            continue
        have, feats = got[0]["taps"], got[1]
        if tuple(feats.shape) == (sum(len(k) for k in keys), len(have) * d):
            cols = torch.cat([torch.arange(have.index(t) * d, (have.index(t) + 1) * d) for t in want])
            return feats[:, cols].contiguous(), path
    return None
