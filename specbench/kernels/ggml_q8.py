"""ggml block weights times int8 activations, as llama.cpp computes them (model.backend=ggml_q8).

`ggml` keeps the activations in float32 and so computes the float32 model; its multi-row cost is
float multiply-adds, which on this CPU makes an 8-token verify cost ~2x a decoding step
(bench/roofline.py: the fp32 FMA floor at 8 rows is ~4x the one-row memory floor). llama.cpp
instead rounds each activation row to int8 per block of 32 and multiplies integers
(ggml_q8_kernels.c): ~3x fewer vector instructions per weight and row with AVX-512 VNNI.

The price is a different model: activations carry ~8 bits, outputs differ from the float32
model by ~1e-3 relative (greedy text can differ from `ggml`'s). The rounding is per row, so the
model is the same for every batch shape: AR and a k-token verify run the same model, and greedy
speculative decoding stays exact against AR on this backend, as it is on `ggml`.

Weights that are not Q4_1 / Q8_0 blocks (float32 checkpoints, trained heads) stay on the
float32 path (`ggml`'s kernel, or F.linear).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from specbench.kernels import ggml

LANES = 16  # output rows per record (one AVX-512 register of int32 sums)


@dataclass(frozen=True)
class Q8Weight:
    """A Q4_1 / Q8_0 weight packed for the int8-activation kernel; n padded to LANES rows."""

    kind: str
    n: int
    k: int
    packed: torch.Tensor  # uint8, groups of LANES rows x blocks, see ggml_q8_kernels.c

    @functools.cached_property
    def call(self):
        """The kernel and the packing's pointer (looked up once: this runs ~200 times a forward)."""
        return getattr(ggml.library(), f"ggml_q8_linear_{self.kind}"), self.packed.data_ptr()


def _quads(q: torch.Tensor) -> torch.Tensor:
    """[groups*16, nb, 4c] -> [groups, nb, c, 16 rows, 4]: chunk c holds k = 4c..4c+3 of 16 rows."""
    n, nb, k = q.shape
    return q.reshape(n // LANES, LANES, nb, k // 4, 4).permute(0, 2, 3, 1, 4)


def pack(bw: ggml.BlockWeight) -> Q8Weight | None:
    """The int8-activation kernel's layout of a recovered Q4_1 / Q8_0 weight (None for f32)."""
    if bw is None or bw.kind not in ("q4_1", "q8_0"):
        return None
    pad = -bw.n % LANES
    groups, nb = (bw.n + pad) // LANES, bw.k // ggml.BLOCK

    def side_by_side(t: torch.Tensor) -> torch.Tensor:  # [n, nb] floats -> per group and block, 16 rows' values
        t = torch.nn.functional.pad(t, (0, 0, 0, pad))
        return t.reshape(groups, LANES, nb).transpose(1, 2).contiguous().view(torch.uint8)

    scales = [side_by_side(bw.d)] + ([side_by_side(bw.m)] if bw.kind == "q4_1" else [])
    qs = torch.nn.functional.pad(bw.qs, (0, 0, 0, 0, 0, pad))
    if bw.kind == "q4_1":
        body = _quads(qs)  # byte j: low nibble k=j, high k=16+j; chunk c (0..3): k = 4c.. and 16+4c..
    else:
        body = _quads((qs.to(torch.int16) + 128).to(torch.uint8))  # unsigned for vpdpbusd
    body = body.reshape(groups, nb, -1)
    packed = torch.cat([*scales, body], dim=-1).contiguous().reshape(-1)
    return Q8Weight(bw.kind, bw.n, bw.k, packed)


def linear(x: torch.Tensor, w: Q8Weight, bias: torch.Tensor | None, lib=None) -> torch.Tensor:
    """x @ W.T + bias with x rounded to int8 per row and block of 32 (`lib`: another build)."""
    x2 = x.reshape(-1, w.k).contiguous()
    rows, n_pad = x2.shape[0], w.n + (-w.n % LANES)
    y = torch.empty(rows, n_pad, dtype=torch.float32)
    if bias is not None and n_pad != w.n:
        bias = torch.nn.functional.pad(bias, (0, n_pad - w.n))
    fn, packed = w.call
    if lib is not None:
        fn = getattr(lib, f"ggml_q8_linear_{w.kind}")
    b = None if bias is None else bias.contiguous().data_ptr()
    fn(x2.data_ptr(), rows, w.k, packed, n_pad, b, y.data_ptr(), torch.get_num_threads())
    if n_pad != w.n:
        y = y[:, : w.n]
    return y.reshape(*x.shape[:-1], w.n)


def reference(x: torch.Tensor, bw: ggml.BlockWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """What the kernel computes, in float64 torch (for tests: equal up to float32 rounding)."""
    x2 = x.reshape(-1, bw.k).double()
    xb = x2.float().reshape(x2.shape[0], -1, ggml.BLOCK)
    dx = xb.abs().amax(-1) / 127
    qx = torch.round(xb * torch.where(dx == 0, 0, 1 / dx)[..., None]).clamp(-127, 127).double()
    if bw.kind == "q4_1":
        qw = torch.cat([bw.qs & 0x0F, bw.qs >> 4], dim=-1).double()
    else:
        qw = bw.qs.double()
    isum = torch.einsum("rbj,nbj->rnb", qx, qw)
    y = (isum * (bw.d.double()[None] * dx.double()[:, None])).sum(-1)
    if bw.kind == "q4_1":
        y = y + (bw.m.double()[None] * (dx.double() * qx.sum(-1))[:, None]).sum(-1)
    if bias is not None:
        y = y + bias.double()
    return y.float().reshape(*x.shape[:-1], bw.n)
