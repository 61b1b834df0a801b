"""model.backend=ggml_q8: int8 activations times ggml blocks (ggml_q8.py, ggml_q8_kernels.c),
and the batch-invariant attention the ggml backends use (attention.py, attention_kernels.c)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import q4_tiny_model
from test_ggml import assert_batch_invariant, gguf_weight

from specbench.kernels import ggml, ggml_q8
from specbench.models.attention import _rows, invariant_attention

pytestmark = pytest.mark.skipif(ggml.compiler() is None, reason="no C compiler (cc/gcc)")


def _check_q8_kernel(kind: str, n: int, lib=None) -> torch.Tensor:
    torch.manual_seed(n)
    k = 96
    bw = ggml.recover(gguf_weight(kind, n, k, seed=n))
    qw = ggml_q8.pack(bw)
    x, bias = torch.randn(17, k), torch.randn(n)
    one = torch.cat([ggml_q8.linear(x[i : i + 1], qw, bias, lib) for i in range(17)])
    # what the kernel computes (int8 activations), up to float32 rounding; near F.linear
    torch.testing.assert_close(one, ggml_q8.reference(x, bw, bias), rtol=1e-5, atol=1e-5)
    assert torch.allclose(one, F.linear(x, ggml.recover(gguf_weight(kind, n, k, seed=n)).dequantize(), bias), atol=0.05)
    assert_batch_invariant(lambda xs: ggml_q8.linear(xs, qw, bias, lib), x, one, (kind, n))
    return one


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [48, 5, 67])  # whole groups of 16 rows; padded ones
def test_q8_kernel_is_batch_invariant_and_computes_int8_activations(kind, n):
    _check_q8_kernel(kind, n)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize(("flags", "path"), [(("-mno-avx512f",), 1), (("-mno-avx512f", "-mno-avx2"), 0)])
def test_q8_avx2_and_portable_builds_give_the_same_bits(kind, flags, path):
    """Integer sums are exact and the float epilogue is the same operations: the AVX2 build (no
    VNNI: sign trick + vpmaddubsw) and the portable build return the native build's bits."""
    if path == 1 and "avx2" not in ggml.cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    lib = ggml.load(ggml.build(flags))
    assert lib.ggml_q8_kernels_vnni() == 0 and lib.ggml_q8_kernels_path() == path
    for n in (48, 67):
        assert torch.equal(_check_q8_kernel(kind, n, lib), _check_q8_kernel(kind, n))


def test_q8_avx2_sign_trick_is_exact_at_the_extremes():
    """Q8_0 weights of -128 and 127 against activations of +-127 (the largest pair sums the
    16-bit step sees): the AVX2 build's integers must not saturate."""
    if "avx2" not in ggml.cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    bw = ggml.recover(gguf_weight("q8_0", 16, 64, seed=3))
    bw.qs[:8] = -128
    bw.qs[8:] = 127
    qw = ggml_q8.pack(bw)
    x = torch.full((2, 64), 1.0)
    x[1, ::2] = -1.0
    lib = ggml.load(ggml.build(("-mno-avx512f",)))
    portable = ggml.load(ggml.build(("-mno-avx512f", "-mno-avx2")))
    got = ggml_q8.linear(x, qw, None, lib)
    assert torch.equal(got, ggml_q8.linear(x, qw, None, portable))
    torch.testing.assert_close(got, ggml_q8.reference(x, bw, None), rtol=1e-5, atol=1e-5)


def test_q8_packing_layout():
    """Record (group g, block b): 16 scales, 16 minima, then chunk c byte 4*row+t holds k=4c+t
    (low nibble) and k=16+4c+t (high nibble) of row 16g+row."""
    bw = ggml.recover(gguf_weight("q4_1", 32, 64, seed=1))
    rec = ggml_q8.pack(bw).packed.reshape(2, 2, 384)
    q = torch.cat([bw.qs & 0x0F, bw.qs >> 4], dim=-1)  # [n, nb, 32] nibble values
    for g, b, row, kk in [(0, 0, 0, 0), (1, 1, 15, 31), (0, 1, 7, 18), (1, 0, 3, 13)]:
        r = rec[g, b]
        assert torch.equal(r[:64].view(torch.float32)[row : row + 1], bw.d[16 * g + row, b : b + 1])
        assert torch.equal(r[64:128].view(torch.float32)[row : row + 1], bw.m[16 * g + row, b : b + 1])
        c, t = (kk % 16) // 4, kk % 4
        byte = int(r[128 + 64 * c + 4 * row + t])
        assert (byte & 0x0F if kk < 16 else byte >> 4) == int(q[16 * g + row, b, kk])


class Attn:
    num_key_value_groups = 3


@torch.no_grad()
@pytest.mark.parametrize(("n", "d", "heads", "kv"), [
    (40, 32, 9, 3),  # one block of keys (the kernel walks keys in blocks of 64), 3 heads per V row
    (150, 32, 9, 3),  # several blocks
    (70, 256, 8, 2),  # 4 heads per kv head at D = 256: one head per V row
    (70, 48, 6, 2),  # 3 heads per V row at D = 48: the generic P.V path (no specialised case)
    (70, 128, 4, 4),  # no grouping, D = 128
])
def test_invariant_attention_gives_each_query_the_bits_it_gets_alone(n, d, heads, kv):
    """A query's output depends only on its own query and on the keys it sees, in order: the
    same as a one-query call over exactly those keys (a verified chain, or a tree node whose
    mask row lists prefix + ancestors), and close to sdpa."""
    torch.manual_seed(0)
    q = 6
    query = torch.randn(1, heads, q, d)
    key, value = torch.randn(2, 1, kv, n, d)
    allowed = torch.rand(q, n) < 0.6
    allowed[:, 0] = True
    out = invariant_attention(Attn(), query, key, value, allowed.view(1, 1, q, n), scaling=0.2)
    ref = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed.view(1, 1, q, n), scale=0.2, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)
    for i in range(q):
        seen = allowed[i].nonzero().flatten()
        alone = invariant_attention(Attn(), query[:, :, i : i + 1], key[:, :, seen], value[:, :, seen], None, scaling=0.2)
        assert torch.equal(alone[0, 0], out[0, i]), i
    # threads split the work by (kv head, share of the queries): the same bits at any count
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 4):
            torch.set_num_threads(t)
            assert torch.equal(invariant_attention(Attn(), query, key, value, allowed.view(1, 1, q, n), scaling=0.2), out), t
    finally:
        torch.set_num_threads(threads)
    # an additive float mask is the same mask
    additive = torch.zeros(q, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    assert torch.equal(invariant_attention(Attn(), query, key, value, additive.view(1, 1, q, n), scaling=0.2), out)
    # what it does not take: a soft bias, a causal query without a mask, float64
    assert invariant_attention(Attn(), query, key, value, torch.randn(1, 1, q, n), scaling=0.2) is None
    assert invariant_attention(Attn(), query, key, value, None, scaling=0.2) is None
    assert invariant_attention(Attn(), query.double(), key.double(), value.double(), None) is None


@torch.no_grad()
def test_invariant_attention_reads_the_cache_buffers_in_place():
    """KVCache hands attention a prefix of a larger buffer (heads `capacity` rows apart): the
    kernel reads it at that head stride, without a copy, and gets the bits of the same keys
    copied to a contiguous tensor (a kernel that assumed heads n rows apart would read the next
    head's rows, or the unused tail)."""
    from specbench.engine.cache import KVCache

    torch.manual_seed(2)
    cache, n, q = KVCache(1), 90, 5
    cache.update(*torch.randn(2, 1, 3, 60, 32), 0)  # capacity 120: heads 120 rows apart
    cache.keys[0][..., 60:, :] = cache.values[0][..., 60:, :] = float("nan")  # the unused tail
    key, value = cache.update(*torch.randn(2, 1, 3, n - 60, 32), 0)
    assert key.stride(1) == 120 * 32 and not key.is_contiguous()
    assert _rows(key, 32).data_ptr() == key.data_ptr()  # what the kernel gets: the buffer itself
    query = torch.randn(1, 9, q, 32)
    causal = torch.ones(q, n, dtype=torch.bool).tril(n - q).view(1, 1, q, n)
    out = invariant_attention(Attn(), query, key, value, causal, scaling=0.2)
    assert torch.equal(out, invariant_attention(Attn(), query, key.contiguous(), value.contiguous(), causal, scaling=0.2))
    assert not out.isnan().any()


@torch.no_grad()
@pytest.mark.parametrize(("n", "d", "heads", "kv"), [
    (203, 64, 9, 3),  # the embedded model's heads; 203 keys: a partial chunk of 8 and of 16
    (37, 48, 6, 2),  # the generic D path, keys past a chunk's count
    (70, 16, 9, 3),  # D = 16: several heads per V row on AVX2
    (21, 256, 8, 2),
])
def test_invariant_attention_avx2_build_gives_the_portable_bits(monkeypatch, n, d, heads, kv):
    """The AVX2 build (two 8-lane registers per 16 lanes, the score tree done for 8 keys at once)
    does the portable build's operations lane for lane: the same bits, masked or not. Before it
    existed AVX2 hosts silently ran the portable code (~10x slower at 4 queries)."""
    if "avx2" not in ggml.cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    import specbench.models.attention as attention

    avx2 = ggml.load(ggml.build(("-mno-avx512f",)))
    portable = ggml.load(ggml.build(("-mno-avx512f", "-mno-avx2")))
    assert (avx2.attention_kernels_path(), portable.attention_kernels_path()) == (1, 0)
    torch.manual_seed(n)
    q = 6
    query = torch.randn(1, heads, q, d) * 3  # scores of either sign and size: exp's range reduction
    key, value = torch.randn(2, 1, kv, n, d)
    allowed = (torch.rand(q, n) < 0.7).view(1, 1, q, n)
    allowed[..., 0] = True
    got = {}
    for name, lib in (("avx2", avx2), ("portable", portable)):
        monkeypatch.setattr(attention, "_kernel", lambda lib=lib: lib.invariant_attention)
        module = Attn()
        got[name] = (invariant_attention(module, query, key, value, allowed, scaling=0.2),
                     invariant_attention(module, query[:, :, :1], key, value, None, scaling=0.2))
    for a, b in zip(got["avx2"], got["portable"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["ggml", "ggml_f32", "ggml_q8"])
def test_whole_forward_is_batch_invariant(backend):
    """An 8-token forward after a cache returns, row for row, the logits of 8 one-token forwards
    bit for bit: linear layers and attention alike (with sdpa's attention this fails on ggml_q8)."""
    target = q4_tiny_model(backend)
    ids = [(7 * i + 3) % target.vocab_size for i in range(38)]
    with torch.no_grad():
        cache = target.new_cache()
        target.forward(ids[:30], cache, last_only=True)
        whole = target.forward(ids[30:38], cache)[0]
        cache.crop(30)
        rows = torch.cat([target.forward(ids[30 + i : 31 + i], cache)[0] for i in range(8)])
    assert torch.equal(whole.reshape(rows.shape), rows)


@torch.no_grad()
def test_a_prompt_gets_the_same_bits_with_or_without_its_causal_mask():
    """transformers' generate (hf_assisted) prefills without a mask, the adapter with an explicit
    causal one: on the ggml backends both must give the same bits (with sdpa they do not, and
    int8 activations turned that into different greedy text), also past 64 queries (chunked)."""
    torch.manual_seed(1)
    q = 100
    query = torch.randn(1, 9, q, 16)
    key, value = torch.randn(2, 1, 3, q, 16)
    causal = torch.ones(q, q, dtype=torch.bool).tril().view(1, 1, q, q)
    masked = invariant_attention(Attn(), query, key, value, causal, scaling=0.25)
    assert torch.equal(invariant_attention(Attn(), query, key, value, None, scaling=0.25), masked)
    ref = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(masked, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)
    # the last query alone, over all the keys: the bits it got inside the prefill
    alone = invariant_attention(Attn(), query[:, :, -1:], key, value, None, scaling=0.25)
    assert torch.equal(alone[0, 0], masked[0, -1])


def test_ggml_q8_layers_are_batch_invariant_past_the_prefill_size():
    """No F.linear switch for long inputs on ggml_q8: transformers' generate computes the LM head
    on every prompt row, the adapter on the last one only; both must get the same bits."""
    from torch import nn

    from specbench.models import apply_backend
    from specbench.kernels.backends import GGML_MAX_ROWS

    lin = nn.Linear(64, 48, bias=False)
    with torch.no_grad():
        lin.weight.copy_(gguf_weight("q8_0", 48, 64, seed=4))
    apply_backend(lin, "ggml_q8")
    x = torch.randn(GGML_MAX_ROWS + 6, 64)
    with torch.no_grad():
        whole = lin(x)
        assert torch.equal(whole[-1:], lin(x[-1:]))
        assert torch.equal(whole[:3], lin(x[:3]))
