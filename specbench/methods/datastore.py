"""REST's datastore: a corpus tokenised with the target's tokenizer, and its suffix array.

    python -m specbench.tools.datastore --model smollm2-135m --corpus gsm8k/train.jsonl:question,answer
    python -m specbench.tools.datastore --model tiny-llama --corpus notes.txt more.txt

A corpus entry is a JSONL file with the fields to read (`path:field` or `path:f1,f2`: the
fields of one record joined by a newline make one entry) or a plain text file (one entry). A
relative path is looked up under the data directory (`$SPECBENCH_DATA_DIR`) first, then the
working directory. The entries' token ids are concatenated with no separator, as REST's
`draftretriever.Writer.add_entry` does, so a continuation may run into the next entry.

The datastore is cached in `<cache>/datastore/<model>-<tokenizer hash>-<corpus hash>.npz`
(specbench/core/cachedir.py): built once by this command (specbench/tools/datastore.py), or by
`method=rest` on first use.

Suffix array: prefix doubling, O(n log^2 n) with numpy sorts (`suffix_array`); a suffix that
runs out sorts before its extensions, which is what Python's list/array comparison does, so
`Datastore.find` can binary-search it with slices.
"""

from __future__ import annotations

import array
import bisect
import hashlib
import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbench.models.artifacts import atomic_write, safe_key
from specbench.core.cachedir import cache_dir
from specbench.core.errors import SpecBenchError


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of every suffix of `tokens`, in lexicographic order of the suffixes."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)
    k = 1
    while True:
        second = np.zeros(n, dtype=np.int64)  # 0: the suffix ends before k more tokens (sorts first)
        second[: n - k] = rank[k:] + 1
        key = rank * (n + 1) + second
        sa = np.argsort(key, kind="stable")
        new = np.empty(n, dtype=np.int64)
        new[sa] = np.concatenate([[0], np.cumsum(key[sa][1:] != key[sa][:-1])])
        rank = new
        if rank[sa[-1]] == n - 1 or k >= n:  # every suffix has its own rank: sorted
            return sa
        k *= 2


@dataclass
class Datastore:
    tokens: np.ndarray  # int32 [n]
    sa: np.ndarray  # int64 [n]
    meta: dict

    def __post_init__(self):
        # array.array slices compare lexicographically like lists and stay compact
        self._data = array.array("i", self.tokens.astype(np.int32).tobytes())
        self._sa = array.array("q", self.sa.astype(np.int64).tobytes())

    def __len__(self) -> int:
        return len(self.tokens)

    def find(self, query: list[int]) -> tuple[int, int]:
        """[lo, hi): the suffix-array rows whose suffix starts with `query`."""
        q = array.array("i", query)
        n, d = len(q), self._data

        def key(p):
            return d[p : p + n]

        lo = bisect.bisect_left(self._sa, q, key=key)
        hi = bisect.bisect_right(self._sa, q, lo=lo, key=key)
        return lo, hi

    def longest_suffix(self, context: list[int], max_len: int, min_len: int) -> tuple[int, int, int]:
        """(length, lo, hi) of the longest suffix of `context` (at most max_len, at least min_len
        tokens) that occurs; (0, 0, 0) if none. A suffix that occurs implies every shorter one
        does, so the length is binary-searched: the same answer as REST's descending scan."""
        best = (0, 0, 0)
        lo_len, hi_len = min_len, min(max_len, len(context))
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            lo, hi = self.find(context[-mid:])
            if hi > lo:
                best, lo_len = (mid, lo, hi), mid + 1
            else:
                hi_len = mid - 1
        return best

    def continuations(self, lo: int, hi: int, skip: int, count: int, length: int) -> np.ndarray:
        """[m, length] int64: the `length` tokens after the first `count` matches of the rows
        lo..hi in suffix-array order (draftretriever's order), -1 past the corpus' end."""
        starts = self.sa[lo : min(hi, lo + count)] + skip
        idx = starts[:, None] + np.arange(length)[None, :]
        out = self.tokens[np.minimum(idx, len(self.tokens) - 1)].astype(np.int64)
        out[idx >= len(self.tokens)] = -1
        return out


# -- corpus ----------------------------------------------------------------------------------
def resolve(path: str, data_dir: str | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and data_dir and (Path(data_dir).expanduser() / p).is_file():
        return Path(data_dir).expanduser() / p
    if p.is_file():
        return p
    raise SpecBenchError(f"datastore corpus file {path!r} not found (relative paths: under the data directory "
                         f"{data_dir or '(SPECBENCH_DATA_DIR unset)'}, then the working directory)")


def parse_spec(spec: str, data_dir: str | None) -> tuple[Path, list[str] | None]:
    """'path.jsonl:field1,field2' -> (path, fields); a text file: (path, None)."""
    path, sep, fields = str(spec).rpartition(":") if ".jsonl:" in str(spec) else (str(spec), "", "")
    p = resolve(path, data_dir)
    if p.name.endswith(".jsonl") and not sep:
        raise SpecBenchError(f"datastore corpus {spec!r} is a JSONL file: name the field(s), e.g. {spec}:text")
    return p, [f for f in fields.split(",") if f] if sep else None


def entries(path: Path, fields: list[str] | None):
    """The texts of one corpus file: one per JSONL record (its fields joined), or the whole file."""
    if fields is None:
        yield path.read_text(errors="replace")
        return
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw) if raw.strip() else None
            except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
                raise SpecBenchError(f"datastore corpus {path}:{n} is not a JSON record ({getattr(e, 'msg', None) or e}); "
                                     "fix or remove that line") from None
            if rec is None:
                continue
            if not isinstance(rec, dict):
                raise SpecBenchError(f"datastore corpus {path}:{n} is a JSON {type(rec).__name__}; expected an object with {fields}")
            missing = [k for k in fields if k not in rec]
            if missing:
                raise SpecBenchError(f"datastore corpus {path}:{n} has no field {missing[0]!r}; it has {sorted(rec)}")
            yield "\n".join(str(rec[k]) for k in fields)


def corpus_hash(specs: list[tuple[Path, list[str] | None]]) -> str:
    h = hashlib.sha1()
    for p, fields in specs:
        h.update(json.dumps([p.name, fields]).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


def tokenizer_hash(tokenizer) -> str:
    vocab = tokenizer.vocab
    return hashlib.sha1(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()[:8]


def datastore_path(model: str, tokenizer, specs) -> Path:
    return cache_dir() / "datastore" / f"{safe_key(model)}-{tokenizer_hash(tokenizer)}-{corpus_hash(specs)}.npz"


def build(tokenizer, specs) -> Datastore:
    ids: list[int] = []
    n_entries = 0
    for p, fields in specs:
        for text in entries(p, fields):
            ids += tokenizer.encode(text)
            n_entries += 1
    tokens = np.asarray(ids, dtype=np.int32)
    meta = {"corpus": [[str(p), fields] for p, fields in specs], "entries": n_entries, "tokens": len(tokens)}
    return Datastore(tokens, suffix_array(tokens), meta)


def load_or_build(model: str, tokenizer, corpus: list[str], data_dir: str | None = None, build_missing: bool = True) -> tuple[Datastore, Path]:
    """The cached datastore of this model's tokenizer and corpus; built (and cached) if missing."""
    if not corpus:
        raise SpecBenchError("the datastore corpus is empty; name at least one file (path.jsonl:field or a text file)")
    specs = [parse_spec(c, data_dir) for c in corpus]
    path = datastore_path(model, tokenizer, specs)
    if path.is_file():
        try:
            with np.load(path) as z:
                return Datastore(z["tokens"], z["sa"], json.loads(str(z["meta"]))), path
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # truncated: BadZipFile
            raise SpecBenchError(f"datastore {path} is unreadable ({type(e).__name__}); delete it and re-create it with "
                                 f"`python -m specbench.tools.datastore --model {model} --corpus {' '.join(corpus)}`") from None
    if not build_missing:
        raise SpecBenchError(f"no datastore for {model} and this corpus; build it with `python -m specbench.tools.datastore --model {model} --corpus {' '.join(corpus)}`")
    ds = build(tokenizer, specs)

    def write(tmp: Path):
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a path
            np.savez(f, tokens=ds.tokens, sa=ds.sa, meta=json.dumps(ds.meta))

    atomic_write(path, write)
    return ds, path
