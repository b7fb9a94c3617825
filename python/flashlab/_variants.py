"""FlashAttention-2's packed variants, a PyTorch-SDPA-style entry, and the layout hint of
shape errors.

The packed functions take zero-copy views of the packed dimension (kv[:, :, 0] is k) and
pass them to flash_attn_func / flash_attn_varlen_func, so autograd accumulates the
gradients of q, k and v into the packed tensor and NumPy arrays run the forward unchanged.
scaled_dot_product_attention transposes [B, H, S, D] into FlashAttention's [B, S, H, D] as
views and transposes the output back, again without a copy.

Imported at the end of flashlab/__init__.py, after the functions it wraps are defined.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional, Sequence, Tuple, overload

from . import Output, flash_attn_func, flash_attn_varlen_func
from ._options import Array

LAYOUT_HINT = ("q/k/v are [batch, seqlen, heads, head_dim] (FlashAttention's layout); for "
               "[batch, heads, seqlen, head_dim] use flashlab.scaled_dot_product_attention")


def _shape(x: Any, name: str) -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be an array supporting DLPack (torch, numpy, ...), "
                        f"got {type(x).__name__}")
    return tuple(shape)


def _unpack(packed: Any, name: str, axis: int, count: int, layout: str) -> Tuple[Array, ...]:
    """The `count` views packed[..., i, ...] along `axis` of a packed array whose rank is
    that of `layout` (no copy: each is a strided view of `packed`)."""
    shape = _shape(packed, name)
    if len(shape) != layout.count(",") + 1 or shape[axis] != count:
        raise ValueError(f"{name} must have shape {layout}, got {shape}")
    index = (slice(None),) * axis
    return tuple(packed[index + (i,)] for i in range(count))


# ---- the layout hint --------------------------------------------------------------------


def _dense_fits(q: Tuple[int, ...], k: Tuple[int, ...], v: Tuple[int, ...]) -> bool:
    """The shape rules of dense q/k/v [B, S, H, D] in src/api/validate.cpp: one batch,
    k and v with one seqlen and head count, k with q's head_dim, heads_q a multiple of
    heads_kv."""
    return (len(q) == len(k) == len(v) == 4 and k[0] == q[0] and v[0] == q[0]
            and v[1] == k[1] and v[2] == k[2] and k[3] == q[3] and k[2] >= 1
            and q[2] % k[2] == 0)


def _looks_transposed(q: Any, k: Any, v: Any) -> bool:
    """True when q/k/v fail the dense shape rules but pass them with dims 1 and 2 swapped:
    arrays in PyTorch SDPA's [B, H, S, D] layout."""
    shapes = [tuple(getattr(x, "shape", ())) for x in (q, k, v)]
    swapped = [s[:1] + s[2:3] + s[1:2] + s[3:] for s in shapes]
    return not _dense_fits(*shapes) and _dense_fits(*swapped)


def with_layout_hint(attention: Callable[..., Output]) -> Callable[..., Output]:
    """`attention(q, k, v, ...)` whose shape errors on arrays that look like [B, H, S, D]
    end with LAYOUT_HINT. The C++ message stays as it is, first."""

    @functools.wraps(attention)
    def wrapped(q: Array, k: Array, v: Array, *args: Any) -> Output:
        try:
            return attention(q, k, v, *args)
        except ValueError as e:
            if not _looks_transposed(q, k, v):
                raise
            raise ValueError(f"{e}; {LAYOUT_HINT}") from None

    return wrapped


# ---- packed variants --------------------------------------------------------------------


@overload
def flash_attn_kvpacked_func(q: Array, kv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_kvpacked_func(q: Array, kv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Output: ...  # noqa: E501


def flash_attn_kvpacked_func(q: Array, kv: Array, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *,
                             dropout_seed: Optional[int] = None, kernel: str = "auto") -> Output:
    """q [B, Sq, Hq, D], kv [B, Sk, 2, Hkv, D]: k and v are strided views of kv (no copy);
    otherwise flash_attn_func (GQA when Hkv divides Hq)."""
    k, v = _unpack(kv, "kv", 2, 2, "[batch, seqlen_k, 2, heads_kv, head_dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs,
                           dropout_seed=dropout_seed, kernel=kernel)


@overload
def flash_attn_varlen_qkvpacked_func(qkv: Array, cu_seqlens: Array, max_seqlen: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_varlen_qkvpacked_func(qkv: Array, cu_seqlens: Array, max_seqlen: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Output: ...  # noqa: E501


def flash_attn_varlen_qkvpacked_func(qkv: Array, cu_seqlens: Array, max_seqlen: int,
                                     dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Array] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False,
                                     *, dropout_seed: Optional[int] = None, kernel: str = "auto",
                                     check_inputs: bool = False) -> Output:
    """qkv [total, 3, H, D] with one cu_seqlens int32 [B + 1] and max_seqlen for queries and
    keys alike: q, k, v are strided views of qkv (no copy); otherwise flash_attn_varlen_func."""
    q, k, v = _unpack(qkv, "qkv", 1, 3, "[total, 3, heads, head_dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs,
                                  dropout_seed=dropout_seed, kernel=kernel,
                                  check_inputs=check_inputs)


@overload
def flash_attn_varlen_kvpacked_func(q: Array, kv: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_varlen_kvpacked_func(q: Array, kv: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Output: ...  # noqa: E501


def flash_attn_varlen_kvpacked_func(q: Array, kv: Array, cu_seqlens_q: Array,
                                    cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, window_size: Sequence[int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes: Optional[Array] = None,
                                    deterministic: bool = False, return_attn_probs: bool = False,
                                    *, dropout_seed: Optional[int] = None, kernel: str = "auto",
                                    check_inputs: bool = False) -> Output:
    """q [total_q, Hq, D], kv [total_k, 2, Hkv, D]: k and v are strided views of kv (no
    copy); otherwise flash_attn_varlen_func."""
    k, v = _unpack(kv, "kv", 1, 2, "[total_k, 2, heads_kv, head_dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  dropout_seed=dropout_seed, kernel=kernel,
                                  check_inputs=check_inputs)


# ---- PyTorch SDPA's layout --------------------------------------------------------------


def _causal_top_left(sq: int, sk: int) -> Tuple[int, bool, Tuple[int, int]]:
    """PyTorch's is_causal (row i sees keys j <= i: torch.ones(Sq, Sk).tril(), aligned
    top-left) in FlashLab's bottom-right terms (docs/DESIGN.md: row i sees
    j <= i + Sk - Sq + window_right) as (keys to keep, causal, window_size).
    Sq >= Sk: window_right = Sq - Sk gives j <= i on all Sk keys. Sq < Sk: no row sees a
    key past Sq - 1 and a right bound below 0 does not exist, so only the first Sq keys
    are kept, where top-left and bottom-right causal coincide."""
    if sq >= sk:
        return sk, False, (-1, sq - sk)
    return sq, True, (-1, -1)


def scaled_dot_product_attention(q: Array, k: Array, v: Array, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 kernel: str = "auto") -> Array:
    """PyTorch's torch.nn.functional.scaled_dot_product_attention layout and semantics:
    q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] → out [B, Hq, Sq, Dv].

    Computed by flash_attn_func on transposed views, and the output returned as a
    transposed view (no copy; torch tensors get autograd). `is_causal` is PyTorch's
    top-left causal mask (query i sees keys j <= i, also when Sq != Sk), not
    FlashAttention's bottom-right one. `scale` defaults to 1/sqrt(D). Hq != Hkv needs
    enable_gqa=True (Hkv must divide Hq), as in PyTorch. There is no attn_mask and no
    dropout_p: for windows, softcap or dropout use flash_attn_func. Pass is_causal, scale
    and enable_gqa by keyword to stay call-compatible with PyTorch, whose fourth and fifth
    positional parameters are attn_mask and dropout_p. `kernel` as in flash_attn_func.
    """
    shapes = [_shape(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    for shape, name in zip(shapes, "qkv"):
        if len(shape) != 4:
            raise ValueError(f"{name} must have shape [batch, heads, seqlen, head_dim] "
                             f"(PyTorch SDPA's layout), got {shape}")
    hq, hkv = shapes[0][1], shapes[1][1]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"q has {hq} heads and k {hkv}: grouped-query attention needs "
                         "enable_gqa=True")
    views = [x.swapaxes(1, 2) for x in (q, k, v)]
    if not _dense_fits(*(tuple(x.shape) for x in views)):
        raise ValueError("q [batch, heads_q, seqlen_q, head_dim], k [batch, heads_kv, seqlen_k, "
                         "head_dim] and v [batch, heads_kv, seqlen_k, head_dim_v] must agree "
                         f"and heads_kv must divide heads_q; got q {shapes[0]}, k {shapes[1]}, "
                         f"v {shapes[2]}")
    qv, kv, vv = views
    causal, window = False, (-1, -1)
    if is_causal:
        keys, causal, window = _causal_top_left(shapes[0][2], shapes[1][2])
        kv, vv = kv[:, :keys], vv[:, :keys]
    out = flash_attn_func(qv, kv, vv, softmax_scale=scale, causal=causal, window_size=window,
                          kernel=kernel)
    return out.swapaxes(1, 2)
