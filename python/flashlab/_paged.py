"""flash_attn_varlen_func(block_table=...): FlashAttention-2's paged varlen call, as a gather.

k and v are paged caches [num_blocks, page_size, heads_kv, head_dim] and block_table is
int32 [batch, max_num_blocks_per_seq]: sequence b's keys are its first
cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of the pages block_table[b][0], [1], ... in order
(row t is row t mod page_size of page block_table[b][t // page_size]). Any page_size >= 1.

This module copies the rows each sequence uses out of the pages into packed
[total_k, heads_kv, head_dim] arrays with the array library's own indexing (on the GPU for
CUDA tensors) and runs the varlen forward on them with the same cu_seqlens_k, so the result
is bitwise what flash_attn_varlen_func gives on the same keys laid out contiguously. The
kernels never read the pages; the cost is one copy of the used rows per call.

block_table and cu_seqlens_k are read on the host (a CUDA tensor is copied there: a sync on
the current stream), which validates them: the table's shape and dtype, its batch against
cu_seqlens_q, enough pages per sequence for its length, and every used entry in
[0, num_blocks). Entries past a sequence's last used page are not read.

Forward only, as in FlashAttention-2 (its varlen backward takes no block_table). Torch inputs
that require grad are detached for the call; when grad mode is on the output carries a node
whose backward raises RuntimeError, so a backward through it fails loudly instead of
silently leaving q, k and v without gradients.

Imported at the end of flashlab/__init__.py, after the helpers it uses are defined.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Tuple

from . import _check_arrays
from ._options import Array

NO_BACKWARD = ("flash_attn_varlen_func(block_table=...) is forward only (FlashAttention-2 has "
               "no backward for paged KV either): run it under torch.no_grad() or on detached "
               "tensors")


def _host(x: Array, torch_: bool) -> Any:
    """x as a NumPy array on the host (torch: a copy from the device, if any)."""
    import numpy as np

    if torch_:
        return x.detach().cpu().numpy()
    return x if isinstance(x, np.ndarray) else np.from_dlpack(x)


def _int32_host(x: Array, name: str, rank: int, layout: str, torch_: bool) -> Any:
    import numpy as np

    h = _host(x, torch_)
    if h.ndim != rank:
        raise ValueError(f"{name} must be int32 {layout}, got shape {tuple(h.shape)}")
    if h.dtype != np.int32:
        raise ValueError(f"{name}.dtype must be int32, got {h.dtype}")
    return h.astype(np.int64)


def _check_pages(k: Array, v: Array) -> Tuple[int, int]:
    """(num_blocks, page_size) of the paged caches k and v."""
    ks, vs = tuple(getattr(k, "shape", ())), tuple(getattr(v, "shape", ()))
    for name, s in (("k", ks), ("v", vs)):
        if len(s) != 4:
            raise ValueError(f"{name} must be a paged cache [num_blocks, page_size, heads_kv, "
                             f"head_dim] when block_table is given, got shape {s}")
    if ks[:3] != vs[:3]:
        raise ValueError(f"v.shape[:3] must equal k.shape[:3] (num_blocks, page_size, heads_kv) "
                         f"with block_table, got {vs[:3]} and {ks[:3]}")
    if ks[1] < 1:
        raise ValueError(f"k.shape[1] (page_size) must be >= 1, got {ks[1]}")
    return ks[0], ks[1]


def gather_rows(k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array,
                block_table: Array, torch_: bool) -> Tuple[Array, Array]:
    """Validate the paged call and copy each sequence's key/value rows out of the pages:
    packed k/v [cu_seqlens_k[-1], heads_kv, head_dim], sequence b at rows
    cu_seqlens_k[b] .. cu_seqlens_k[b + 1]."""
    import numpy as np

    num_blocks, page_size = _check_pages(k, v)
    if torch_ and block_table.device != k.device:
        raise ValueError(f"block_table is on {block_table.device} but k is on {k.device}: "
                         "pass it on the device of the paged cache")
    table = _int32_host(block_table, "block_table", 2, "[batch, max_num_blocks_per_seq]", torch_)
    batch, max_pages = table.shape
    cu_q_shape = tuple(getattr(cu_seqlens_q, "shape", ()))
    if len(cu_q_shape) != 1:
        raise ValueError(f"cu_seqlens_q must be int32 [batch + 1], got shape {cu_q_shape}")
    batch_q = cu_q_shape[0] - 1
    if batch != batch_q:
        raise ValueError(f"block_table.shape[0] (batch) must be len(cu_seqlens_q) - 1 = "
                         f"{batch_q}, got {batch}")
    cu = _int32_host(cu_seqlens_k, "cu_seqlens_k", 1, "[batch + 1]", torch_)
    if cu.shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_k must have batch + 1 = {batch + 1} entries (the rows "
                         f"of block_table plus one), got {cu.shape[0]}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens_k[0] must be 0, got {cu[0]}")
    lens = np.diff(cu)
    if (lens < 0).any():
        i = int(np.argmax(lens < 0)) + 1
        raise ValueError(f"cu_seqlens_k must be non-decreasing: [{i}] = {cu[i]} < "
                         f"[{i - 1}] = {cu[i - 1]}")
    need = (lens + page_size - 1) // page_size
    if (need > max_pages).any():
        b = int(np.argmax(need > max_pages))
        raise ValueError(f"block_table: sequence {b} has {lens[b]} keys, which need {need[b]} "
                         f"pages of page_size {page_size}, but block_table.shape[1] is "
                         f"{max_pages}")
    seq = np.repeat(np.arange(batch), lens)              # the sequence of each packed row
    t = np.arange(int(cu[-1])) - np.repeat(cu[:-1], lens)  # its row within the sequence
    pages = table[seq, t // page_size]
    bad = (pages < 0) | (pages >= num_blocks)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"block_table[{seq[i]}][{t[i] // page_size}] = {pages[i]} is out of "
                         f"range: page indices must be in [0, num_blocks = {num_blocks})")
    rows = t % page_size
    if torch_:
        import torch

        pages, rows = (torch.from_numpy(x).to(k.device) for x in (pages, rows))
    else:
        k, v = _host(k, False), _host(v, False)
    return k[pages, rows], v[pages, rows]


def _pass_through(ctx: Any, out: Any, *inputs: Any) -> Any:
    return out.view_as(out)


def _refuse_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError(NO_BACKWARD)


@functools.lru_cache(maxsize=None)
def _no_backward() -> Any:
    """An autograd Function that passes the output through and raises on backward (built with
    type() so that importing flashlab never imports torch)."""
    import torch

    return type("PagedNoBackward", (torch.autograd.Function,),
                {"forward": staticmethod(_pass_through),
                 "backward": staticmethod(_refuse_backward)})


def varlen_paged(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array,
                 block_table: Array, run: Callable[[Array, Array, Array], Any]) -> Any:
    """`run(q, k_packed, v_packed)` (the varlen forward with the caller's options) on the rows
    gathered from the pages; see the module docstring."""
    torch_ = _check_arrays(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                           block_table=block_table)
    needs_grad = []
    if torch_:
        import torch

        if torch.is_grad_enabled():
            needs_grad = [x for x in (q, k, v) if x.requires_grad]
        q, k, v = q.detach(), k.detach(), v.detach()
    k_rows, v_rows = gather_rows(k, v, cu_seqlens_q, cu_seqlens_k, block_table, torch_)
    result = run(q, k_rows, v_rows)
    if not needs_grad:
        return result
    if isinstance(result, tuple):
        return (_no_backward().apply(result[0], *needs_grad),) + result[1:]
    return _no_backward().apply(result, *needs_grad)
