"""Weights in ggml's block formats, multiplied by a batch-invariant C kernel (model.backend=ggml).

The embedded model ships as a Q4_1 GGUF (the tied embedding / LM head as Q8_0); transformers
dequantizes it to float32, so the fp32 eager path reads 4 bytes per weight that carry 0.625
(Q4_1) or 1.0625 (Q8_0) bytes of information. This backend recovers the blocks from the float32
parameter and keeps a layer only if they reproduce it *bit for bit* (`recover`); the C kernel
(ggml_kernels.c) dequantizes in registers exactly as gguf-py does. So the model is the same
float32 model, only the summation order differs from MKL's, and the kernel computes every
output row the same way whatever the number of rows: a k-token verify returns the bits of k
one-token steps (greedy speculative decoding is then exact against AR on this backend).

Layers whose weights are not block-representable (a float32 checkpoint, trained heads) fall
back to the `hybrid` path. Quantized weights are held twice (row-major blocks for the multi-row
tiles, `stripes` for the one-row decode path: ~110 MB more for the embedded model), because the
decode step streams memory and the multi-row tiles do not, and each layout is the fast one for
its case (measured; ggml_kernels.c). The kernel is compiled on first use with the system C compiler
(`cc`, or $CC) for this CPU (-march=native) into the artifact cache; without a compiler the
backend is unavailable and `check_backend` says so.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.core.cachedir import cache_dir
from specbench.core.cpuinfo import cpuinfo_field
from specbench.core.errors import SpecBenchError

BLOCK = 32
# the fp32-activation kernels, the int8-activation ones (model.backend=ggml_q8) and the
# batch-invariant attention these backends use (attention.py): one library
SOURCES = tuple(Path(__file__).with_name(f) for f in ("ggml_kernels.c", "ggml_q8_kernels.c", "attention_kernels.c"))
# and the one-pass block recovery (`recover`): built into the same library, but not among the sources a run
# records (`loaded_build`), since it changes no output, only how fast a model loads
RECOVER_SOURCE = Path(__file__).with_name("ggml_recover.c")
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]


@dataclass(frozen=True)
class BlockWeight:
    """One weight matrix [n, k] in a ggml block format; d (and m) are float32 per block."""

    kind: str  # "q4_1" | "q8_0" | "f32"
    n: int
    k: int
    # q4_1: uint8 [n, k/32, 16] (low nibbles = elements 0..15 of a block); q8_0: int8 [n, k/32, 32];
    # f32: the weight itself [n, k] (shared with the parameter, no copy)
    qs: torch.Tensor
    d: torch.Tensor | None
    m: torch.Tensor | None
    # the one-row path's copy of the same blocks, 8 output rows side by side (see `stripes`)
    stripes: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """The float32 weights, computed as gguf-py does (multiply, then add, each rounded)."""
        if self.kind == "f32":
            return self.qs
        if self.kind == "q4_1":
            q = torch.cat([self.qs & 0x0F, self.qs >> 4], dim=-1).float()
            w = (self.d[..., None] * q) + self.m[..., None]
        else:
            w = self.d[..., None] * self.qs.float()
        return w.reshape(self.n, self.k)

    @functools.cached_property
    def call(self):
        """The kernel and the weight's pointers (looked up once: this runs ~200 times a forward)."""
        ptr = [None if t is None else t.data_ptr() for t in (self.qs, self.d, self.m, self.stripes)]
        return (getattr(library(), f"ggml_linear_{self.kind}"), *ptr)

    @property
    def nbytes(self) -> int:
        """Bytes of the block format (the stripes are a second copy of the same blocks)."""
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def stripes(kind: str, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """The blocks of each full group of 8 output rows as the kernel's one-row path reads them:
    block b of the group's 8 rows side by side, each a record {d, m, qs} (Q4_1, 24 bytes) or
    {d, qs} (Q8_0, 36 bytes). Decoding then streams one sequential run of memory per group
    (ggml_kernels.c gives the measured saving); the rows of a last partial group are not
    striped (the kernel reads them from qs/d/m)."""
    n, nb = d.shape
    fields = [d[..., None].view(torch.uint8)] + ([m[..., None].view(torch.uint8)] if kind == "q4_1" else [])
    rec = torch.cat([*fields, qs.view(torch.uint8)], dim=-1)  # [n, nb, REC]
    full = n - n % 8
    return rec[:full].reshape(full // 8, 8, nb, rec.shape[-1]).transpose(1, 2).contiguous().reshape(-1)


def _fp16_candidates(approx: torch.Tensor) -> list[torch.Tensor]:
    """approx rounded to float16 and its two neighbours, as float32 (the stored scale is one of them)."""
    h = approx.clamp(-65504, 65504).half().view(torch.int16)
    return [(h + i).view(torch.float16).float() for i in (0, -1, 1)]


def _first_exact(blocks: torch.Tensor, candidates, build):
    """Per block, the first candidate scale whose reconstruction equals the block exactly
    (None unless every block has one). Later candidates are tried on the misses only."""
    d, q = candidates[0].clone(), None
    todo = torch.arange(blocks.shape[0])
    for i, cand in enumerate(candidates):
        qi, rec = build(cand[todo], blocks[todo])
        hit = (rec == blocks[todo]).all(dim=1)
        if q is None:
            q = qi.clone()  # the first candidate covers every block
        idx = todo[hit]
        d[idx], q[idx] = cand[idx], qi[hit]
        todo = todo[~hit]
        if todo.numel() == 0:
            return d, q
    return None


def _recover_q4_1(blocks: torch.Tensor):
    m = blocks.min(dim=1).values
    if not torch.equal(m.half().float(), m):
        return None

    def build(d, b):
        mb = b.min(dim=1, keepdim=True).values
        safe = torch.where(d == 0, torch.ones_like(d), d)[:, None]
        q = torch.round((b - mb) / safe).clamp(0, 15)
        q = torch.where(d[:, None] == 0, torch.zeros_like(q), q)
        return q, (d[:, None] * q) + mb

    found = _first_exact(blocks, _fp16_candidates((blocks.max(dim=1).values - m) / 15), build)
    if found is None:
        return None
    d, q = found
    q = q.to(torch.uint8)
    return d, m, q[:, :16] | (q[:, 16:] << 4)


def _recover_q8_0(blocks: torch.Tensor):
    def build(d, b):
        safe = torch.where(d == 0, torch.ones_like(d), d)[:, None]
        q = torch.round(b / safe).clamp(-128, 127)
        q = torch.where(d[:, None] == 0, torch.zeros_like(q), q)
        return q, d[:, None] * q

    found = _first_exact(blocks, _fp16_candidates(blocks.abs().max(dim=1).values / 127), build)
    if found is None:
        return None
    d, q = found
    return d, q.to(torch.int8)


FORMATS = ("q4_1", "q8_0", "f32")  # most compact first


def recover(weight: torch.Tensor, formats=FORMATS) -> BlockWeight | None:
    """The first of `formats` that reproduces `weight` bit for bit ("f32" always does), or None
    if the kernel cannot take this weight (not a float32 CPU matrix with rows of 32k values)."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % BLOCK or not weight.is_cpu:
        return None
    n, k = weight.shape
    blocks = weight.detach().reshape(-1, BLOCK)
    shape = (n, k // BLOCK)
    one_pass = _LIB is not None and blocks.is_contiguous()  # the C loop, where the kernels are loaded anyway
    if one_pass:
        q4_1, q8_0 = functools.partial(_recover_c, "q4_1"), functools.partial(_recover_c, "q8_0")
    else:
        finite = bool(torch.isfinite(blocks).all())
        q4_1, q8_0 = (_recover_q4_1, _recover_q8_0) if finite else (lambda b: None, lambda b: None)
    found = q4_1(blocks) if "q4_1" in formats else None
    if found is not None:
        d, m, qs = found
        qs, d, m = qs.reshape(*shape, 16).contiguous(), d.reshape(shape).contiguous(), m.reshape(shape).contiguous()
        bw = BlockWeight("q4_1", n, k, qs, d, m, stripes("q4_1", qs, d, m))
    else:
        found = q8_0(blocks) if "q8_0" in formats else None
        if found is None:
            return BlockWeight("f32", n, k, weight.detach().contiguous(), None, None) if "f32" in formats else None
        d, qs = found
        qs, d = qs.reshape(*shape, 32).contiguous(), d.reshape(shape).contiguous()
        bw = BlockWeight("q8_0", n, k, qs, d, None, stripes("q8_0", qs, d, None))
    # belt and braces for the torch path: the stored blocks must give back exactly the parameter (the C loop
    # keeps a block only after that very comparison, block by block)
    return bw if one_pass or torch.equal(bw.dequantize(), weight.detach()) else None


def _recover_c(kind: str, blocks: torch.Tensor):
    """_recover_q4_1 / _recover_q8_0 in one pass of C (ggml_recover.c): the same blocks, or None."""
    nb = blocks.shape[0]
    d = torch.empty(nb, dtype=torch.float32)
    if kind == "q4_1":
        m, qs = torch.empty(nb, dtype=torch.float32), torch.empty(nb, 16, dtype=torch.uint8)
        ok = _LIB.ggml_recover_q4_1(blocks.data_ptr(), nb, d.data_ptr(), m.data_ptr(), qs.data_ptr())
        return (d, m, qs) if ok else None
    qs = torch.empty(nb, BLOCK, dtype=torch.int8)
    return (d, qs) if _LIB.ggml_recover_q8_0(blocks.data_ptr(), nb, d.data_ptr(), qs.data_ptr()) else None


def round_to_q8_0(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` rounded to Q8_0 blocks as llama.cpp quantizes (gguf-py's reference quantize, then its
    dequantize), in `weight`'s dtype and device: a float32 weight `recover` then keeps as Q8_0, so the
    kernels run it quantized. None when its rows are not whole blocks."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK:
        return None
    from gguf import GGMLQuantizationType, quants

    q8 = GGMLQuantizationType.Q8_0
    w = weight.detach().to("cpu", torch.float32).numpy()
    return torch.from_numpy(quants.dequantize(quants.quantize(w, q8), q8).copy()).to(weight.device, weight.dtype)


# -- the compiled kernel ------------------------------------------------------------------------

_LIB: ctypes.CDLL | None = None
_LIB_ERROR: str | None = None


def compiler() -> str | None:
    """The C compiler the kernel is built with ($CC, cc or gcc), or None."""
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the kernels (SOURCES) for this machine (once per source, compiler, flags) and return the
    shared library's path. `extra_flags` lets tests build the portable variant (-mno-avx512f)."""
    cc = compiler()
    if cc is None:
        raise SpecBenchError("model.backend=ggml needs a C compiler (cc/gcc, e.g. `apt-get install gcc`); use hybrid")
    flags = [*CFLAGS, *extra_flags]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    # the CPU's instruction sets are part of the key: a cache shared by cluster nodes must never hand
    # a -march=native build to an older CPU (an illegal instruction kills the run)
    key = hashlib.sha256(("".join(p.read_text() for p in (*SOURCES, RECOVER_SOURCE)) + version + " ".join(flags) + os.uname().machine
                          + cpu_flags()).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"ggml_kernels-{key}.so"
    if verified(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        so = Path(tmp) / out.name
        res = subprocess.run([cc, *flags, "-o", str(so), *map(str, (*SOURCES, RECOVER_SOURCE))], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SpecBenchError(f"model.backend=ggml: compiling the kernels failed: {res.stderr.strip()[-400:]}")
        digest = Path(tmp) / "digest"
        digest.write_text(_sha256(so))
        os.replace(digest, _digest_path(out))  # the digest first: a library is never visible without one
        os.replace(so, out)  # atomic: concurrent runs never load a half-written library
    if not verified(out):
        raise SpecBenchError(f"model.backend=ggml: the kernel library {out} does not match its recorded hash right after "
                             "it was built (another process rebuilding it, or a failing disk); run again")
    return out


_PATHS = {2: "AVX-512", 1: "AVX2", 0: "portable"}


def loaded_build() -> dict | None:
    """The kernels this process loaded (None if none was): each one's compiled path and a digest of
    their sources. Runs record it: the same host ran the portable attention kernel before its AVX2
    path existed (docs/cpu-backends.md), and its cells of then and now must be told apart."""
    if _LIB is None:
        return None
    return {"linear": _PATHS[_LIB.ggml_kernels_path()], "int8": _PATHS[_LIB.ggml_q8_kernels_path()],
            "attention": _PATHS[_LIB.attention_kernels_path()],
            "sources": hashlib.sha256("".join(p.read_text() for p in SOURCES).encode()).hexdigest()[:12]}


def cpu_flags() -> str:
    """The CPU's instruction-set flags (x86 `flags`, Arm `Features`), sorted; '' where unknown."""
    return " ".join(sorted((cpuinfo_field("flags", "Features") or "").split()))


def _digest_path(so: Path) -> Path:
    return so.with_name(so.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verified(so: Path) -> bool:
    """The cached library exists and has the hash recorded when it was built (loading a truncated
    one would kill the process with SIGBUS; a missing or different one is rebuilt)."""
    try:
        return so.is_file() and _digest_path(so).read_text().strip() == _sha256(so)
    except OSError:
        return False


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i = ctypes.c_void_p, ctypes.c_int
    for kind in FORMATS:
        fn = getattr(lib, f"ggml_linear_{kind}")
        fn.argtypes = [p, i, i, p, p, p, i, p, p, p, i]
        fn.restype = None
    for kind in ("q4_1", "q8_0"):
        fn = getattr(lib, f"ggml_q8_linear_{kind}")
        fn.argtypes = [p, i, i, p, i, p, p, i]
        fn.restype = None
    L = ctypes.c_long
    lib.invariant_attention.argtypes = [p, L, L, i, i, i, p, L, p, L, i, i, p, ctypes.c_float, p, i]
    lib.invariant_attention.restype = None
    lib.ggml_recover_q4_1.argtypes = [p, L, p, p, p]
    lib.ggml_recover_q8_0.argtypes = [p, L, p, p]
    lib.ggml_recover_q4_1.restype = lib.ggml_recover_q8_0.restype = i
    return lib


def library() -> ctypes.CDLL:
    """The compiled kernels for this machine (built on first use)."""
    global _LIB, _LIB_ERROR
    if _LIB is None:
        if _LIB_ERROR is not None:
            raise SpecBenchError(_LIB_ERROR)
        try:
            _LIB = load(build())
        except (SpecBenchError, OSError) as e:
            _LIB_ERROR = str(e)
            raise SpecBenchError(_LIB_ERROR) from None
    return _LIB


def available() -> str | None:
    """None if the kernel builds and loads here, else why not."""
    try:
        library()
    except SpecBenchError as e:
        return str(e)
    return None


def linear(x: torch.Tensor, w: BlockWeight, bias: torch.Tensor | None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x @ W.T + bias for float32 CPU x of any leading shape (`lib`: another build, for tests)."""
    x2 = x.reshape(-1, w.k).contiguous()
    rows = x2.shape[0]
    y = torch.empty(rows, w.n, dtype=torch.float32)
    fn, qs, d, m, st = w.call
    if lib is not None:
        fn = getattr(lib, f"ggml_linear_{w.kind}")
    b = None if bias is None else bias.contiguous().data_ptr()
    fn(x2.data_ptr(), rows, w.k, qs, d, m, w.n, b, y.data_ptr(), st, torch.get_num_threads())
    return y.reshape(*x.shape[:-1], w.n)
