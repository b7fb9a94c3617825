"""FlashAttention-2's flash_attn_with_kvcache on the C++ forward_kvcache.

Inference only: no autograd (FlashAttention-2's function has none either). The new rows
k/v are appended into k_cache/v_cache in place, then q attends to each sequence's cache
rows [0, cache_seqlens[b] + seqlen_new); docs/DESIGN.md "KV cache" has the semantics.
Rotary embeddings are applied by the C++ call (the new keys as they are written, q into its
workspace); _rotary.py's apply_rotary_emb is the reference they match. CUDA tensors run
cute_fa2's split-KV kernel on the current stream of q's device.

Imported at the end of flashlab/__init__.py, after the helpers it uses are defined.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _check_arrays, _flashlab
from ._options import Array, int32, kernel_for, options, window

_OPTIONAL = ("k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
             "block_table", "cache_leftpad")


def _refuse_unsupported(alibi_slopes: Any) -> None:
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ALiBi is not supported yet")


def _seqlens_array(cache_seqlens: Union[int, Array, None], q: Array, torch_: bool) -> Any:
    """An int cache_seqlens as int32 [batch] in q's array library and on q's device; arrays
    pass unchanged."""
    if cache_seqlens is None or hasattr(cache_seqlens, "__dlpack__"):
        return cache_seqlens
    n = int32("cache_seqlens", cache_seqlens)
    batch = q.shape[0]
    if torch_:
        import torch

        return torch.full((batch,), n, dtype=torch.int32, device=q.device)
    import numpy as np

    return np.full((batch,), n, dtype=np.int32)


def _empty(shape: Tuple[int, ...], like: Array, dtype: Any, torch_: bool) -> Array:
    if torch_:
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype) if isinstance(dtype, str) else dtype,
                           device=like.device)
    import numpy as np

    return np.empty(shape, dtype=dtype)


def _crossing(tensors: Sequence[Optional[Array]], torch_: bool) -> List[Any]:
    """What one native call takes: NumPy arrays as they are; torch tensors as DLPack capsules
    made fresh per call (a capsule is consumed once). tensor.__dlpack__() would make the
    legacy default stream wait on the current one, an event per tensor per call; with
    capsules, a call on tiny CPU tensors measured 64 -> 34 us (median of 12 alternating
    rounds, one thread, 2-core AMD EPYC). _torch_ops.py does the same."""
    if not torch_:
        return list(tensors)
    from torch.utils.dlpack import to_dlpack

    return [None if t is None else to_dlpack(t) for t in tensors]


def flash_attn_with_kvcache(q: Array, k_cache: Array, v_cache: Array, k: Optional[Array] = None,
                            v: Optional[Array] = None, rotary_cos: Optional[Array] = None,
                            rotary_sin: Optional[Array] = None,
                            cache_seqlens: Union[int, Array, None] = None,
                            cache_batch_idx: Optional[Array] = None,
                            cache_leftpad: Optional[Array] = None,
                            block_table: Optional[Array] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Array] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *,
                            kernel: str = "auto") -> Any:
    """FlashAttention-2's flash_attn_with_kvcache for NumPy arrays and torch tensors (CPU, CUDA).

    q [B, Sq, Hq, D]; k_cache/v_cache [B_cache, S_cache, Hkv, D / Dv], or paged
    [num_pages, page_size, Hkv, D / Dv] with block_table int32 [B, max_pages]; k/v
    [B, S_new, Hkv, D / Dv] (both or neither) are written into the caches in place at rows
    cache_seqlens[b] .. cache_seqlens[b] + S_new. cache_seqlens is int32 [B] or an int
    (absent: every cache is full); cache_batch_idx int32 [B] picks each sequence's cache row.
    Sequence b attends to its cache rows [0, cache_seqlens[b] + S_new) with causal aligned
    to the cache's end (bottom-right); windows, softcap and GQA as in flash_attn_func.

    Rotary (rotary_cos/rotary_sin [seqlen_rotary, rotary_dim / 2] in q's dtype, needs k and
    v; seqlen_rotary at least the cache's rows): k is rotated at positions
    cache_seqlens[b] + t before it is written into the cache; q at cache_seqlens[b] + i when
    causal or local (a window bound below the cache's rows), else every query of sequence b
    at position cache_seqlens[b]. rotary_interleaved picks the (2i, 2i + 1) pairs, else the
    halves. fp32 arithmetic rounded once, as apply_rotary_emb. The caller's q and k are not
    modified.

    num_splits (CUDA): how many CTAs share each sequence's keys (split-KV, at most 128);
    0 picks it from the SM count, batch, heads and cache length. CUDA tables are not read
    by the host: the kernel clamps out-of-range values (docs/DESIGN.md "KV cache").

    Returns out [B, Sq, Hq, Dv]; with return_softmax_lse, (out, softmax_lse fp32
    [B, Hq, Sq]). Inference only: torch tensors are detached, nothing is differentiable.
    cache_leftpad int32 [B] (contiguous caches): sequence b's rows are cache rows
    [cache_leftpad[b], cache_seqlens[b] + S_new); masks count keys from the first of them.
    alibi_slopes raises ValueError (not supported yet).
    """
    _refuse_unsupported(alibi_slopes)
    splits = int32("num_splits", num_splits)
    if splits < 0:
        raise ValueError(f"num_splits must be >= 0 (0 = chosen per call), got {num_splits}")
    win = window(window_size)
    torch_ = _check_arrays(_OPTIONAL, q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v,
                           rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                           cache_seqlens=cache_seqlens if hasattr(cache_seqlens, "__dlpack__")
                           else None, cache_batch_idx=cache_batch_idx, block_table=block_table,
                           cache_leftpad=cache_leftpad)
    if torch_:  # inference only: plain views of the same memory, so the cache writes land
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin = (
            None if x is None else x.detach()
            for x in (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin))
    if len(q.shape) != 4:
        raise ValueError(f"q must be [batch, seqlen_q, heads_q, head_dim], got shape "
                         f"{tuple(q.shape)}")
    if len(v_cache.shape) != 4:
        raise ValueError(f"v_cache must be [batch_cache, seqlen_cache, heads_kv, head_dim_v] "
                         f"(paged: [num_pages, page_size, ...]), got shape {tuple(v_cache.shape)}")
    batch, seqlen_q, heads_q = q.shape[:3]
    cache_seqlens = _seqlens_array(cache_seqlens, q, torch_)
    if rotary_cos is not None and cache_seqlens is None:
        raise ValueError("rotary_cos/rotary_sin need cache_seqlens (the first position of "
                         "each sequence's new rows)")

    opts = options(softmax_scale=softmax_scale, causal=causal, window_size=win, softcap=softcap,
                   kernel=kernel_for(kernel, False))
    opts.num_splits = splits
    if torch_ and q.is_cuda:
        import torch

        opts.stream = torch.cuda.current_stream(q.device).cuda_stream
    out = _empty((batch, seqlen_q, heads_q, v_cache.shape[3]), q, q.dtype, torch_)
    lse = _empty((batch, heads_q, seqlen_q), q, "float32", torch_) if return_softmax_lse else None
    tensors = (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
               cache_leftpad, rotary_cos, rotary_sin)
    interleaved = bool(rotary_interleaved)

    def call(size_only: bool) -> int:
        t = _crossing(tensors + (out, lse), torch_)
        return _flashlab.forward_kvcache(*t[:11], interleaved, *t[11:], opts, size_only)

    size = call(True)
    opts.workspace = _crossing((_empty((size,), q, "uint8", torch_),), torch_)[0]
    call(False)
    return (out, lse) if return_softmax_lse else out
