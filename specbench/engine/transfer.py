"""Host-to-device copies that do not make the host wait.

`torch.tensor(values, device="cuda")` and `.to("cuda")` of an ordinary host tensor copy from
pageable memory: the host blocks until the copy is done, and `torch.cuda.set_sync_debug_mode`
flags it as a synchronising call. Small per-step inputs (positions, tree masks, the rows of an
accepted path) go through pinned memory with `non_blocking=True` instead: the copy is queued
behind the kernels already launched and the host goes on. PyTorch's caching host allocator keeps
a pinned block until the copy that reads it has finished, so the source may be dropped at once.
On a CPU device this is a plain tensor.
"""

from __future__ import annotations

import torch


def upload(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (a list, a host tensor or a tensor already on `device`) as a tensor on `device`."""
    device = torch.device(device)
    if isinstance(values, torch.Tensor):
        host = values if dtype is None else values.to(dtype)
    else:
        host = torch.tensor(values, dtype=dtype)
    if host.device == device or (device.type == host.device.type == "cuda" and device.index is None):
        return host
    if device.type == "cuda" and host.device.type == "cpu":
        return _pinned(host).to(device, non_blocking=True)
    return host.to(device)


def _pinned(host: torch.Tensor) -> torch.Tensor:
    """A pinned copy of a host tensor (tests on fake CUDA replace this: a CPU-only build cannot pin)."""
    return host.pin_memory()


def take(t: torch.Tensor, rows) -> torch.Tensor:
    """t[rows] along the first axis, the row indices uploaded queued (a list index would be a
    blocking copy)."""
    if isinstance(rows, torch.Tensor) and rows.device == t.device:
        return t.index_select(0, rows)
    return t.index_select(0, upload(rows, t.device, torch.long))
