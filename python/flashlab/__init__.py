"""FlashLab: exact attention kernels with FlashAttention-2's Python API.

Arrays cross into C++ as DLPack views (zero copy): PyTorch tensors (with autograd) and
NumPy arrays (forward and an explicit backward) both work. CPU arrays run the CPU
backends; CUDA tensors run on the caller's current stream of the tensor's device.
Every bad input raises ValueError or TypeError carrying the C++ Status message.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, Optional, Sequence, Tuple, Union, cast, overload

from . import _flashlab
from ._rotary import apply_rotary_emb
from ._version import __version__
from ._options import Array, int32, kernel_for, options, window
from ._options import is_torch as _is_torch

Output = Union[Array, Tuple[Array, Array, None]]

__all__ = [
    "__version__",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
    "apply_rotary_emb",
    "attention_backward",
    "kernels",
    "cuda_available",
]


def kernels() -> list[dict[str, Any]]:
    """The registry: one dict per kernel (name, arch, summary, forward, backward)."""
    return _flashlab.kernels()


def cuda_available() -> bool:
    """True when this build has CUDA kernels and a CUDA device is visible."""
    return bool(_flashlab.cuda_available())


def _check_arrays(optional: Tuple[str, ...] = (), **arrays: Array) -> bool:
    """All given arrays are torch tensors (True) or all are not (False); anything without
    __dlpack__ is a TypeError naming the argument. The `optional` ones may be None.
    (Written for torch.compile: torch tensors take only the _is_torch branch.)"""
    names = list(arrays)
    torch_ = _is_torch(arrays[names[0]])
    for name in names:
        x = arrays[name]
        if x is None and name in optional:
            continue
        if _is_torch(x) != torch_:
            raise TypeError(f"{name} is a {type(x).__module__}.{type(x).__name__} but {names[0]} "
                            f"is {'' if torch_ else 'not '}a torch tensor: pass one kind of array")
        if not torch_ and not hasattr(x, "__dlpack__"):
            raise TypeError(f"{name} must be an array supporting DLPack (torch, numpy, ...), "
                            f"got {type(x).__name__}")
    return torch_


_VARLEN = ("cu_seqlens_q", "cu_seqlens_k")


def _check_unsupported(dropout_p: float, alibi_slopes: Any) -> None:
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ALiBi is not supported by this build")


# ---- NumPy: forward and explicit backward ------------------------------------------------
# (Another DLPack array takes this path too and gets NumPy outputs, on the host.)


def _lse_shape(q: Array, varlen: bool) -> Tuple[int, ...]:
    """softmax_lse: [Hq, total_q] for varlen, else [B, Hq, Sq]."""
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _numpy_forward(q: Array, k: Array, v: Array, opts: "_flashlab.Options") -> Tuple[Array, Array]:
    import numpy as np

    out = np.empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=q.dtype)
    lse = np.empty(_lse_shape(q, opts.cu_seqlens_q is not None), dtype=np.float32)
    opts.workspace = np.empty(_flashlab.forward(q, k, v, out, lse, opts, True), dtype=np.uint8)
    _flashlab.forward(q, k, v, out, lse, opts)
    return out, lse


def _numpy_seed(dropout_p: float, dropout_seed: Optional[int]) -> int:
    if float(dropout_p) == 0.0:
        return 0
    if dropout_seed is None:
        raise ValueError("dropout_seed: NumPy arrays need an explicit seed with dropout_p > 0, "
                         "so that attention_backward can regenerate the mask")
    return int(dropout_seed)


def attention_backward(
    q: Array,
    k: Array,
    v: Array,
    out: Array,
    dout: Array,
    softmax_lse: Array,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    cu_seqlens_q: Optional[Array] = None,
    cu_seqlens_k: Optional[Array] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: Optional[int] = None,
    kernel: str = "auto",
    check_inputs: bool = False,
) -> Tuple[Array, Array, Array]:
    """Gradients (dq, dk, dv) for NumPy arrays; PyTorch users get them from autograd.

    `out` and `softmax_lse` are the forward's (return_attn_probs=True); the mask options
    must be the forward's. Varlen: pass the forward's cu_seqlens and max_seqlen too.
    Dropout: the forward's dropout_p and dropout_seed regenerate its mask.
    """
    import numpy as np

    if _check_arrays(_VARLEN, q=q, k=k, v=v, out=out, dout=dout, softmax_lse=softmax_lse,
                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k):
        raise TypeError("attention_backward takes NumPy arrays; torch tensors get their "
                        "gradients from autograd")
    opts = options(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                   softcap=softcap, kernel=kernel_for(kernel, True), cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                   dropout_p=dropout_p, dropout_seed=_numpy_seed(dropout_p, dropout_seed),
                   check_inputs=check_inputs)
    dq, dk, dv = (np.empty(x.shape, dtype=x.dtype) for x in (q, k, v))
    args = (q, k, v, out, dout, softmax_lse, dq, dk, dv, bool(deterministic), opts)
    opts.workspace = np.empty(_flashlab.backward(*args, True), dtype=np.uint8)
    _flashlab.backward(*args)
    return dq, dk, dv


# ---- PyTorch: a torch.library custom op with a fake implementation, and autograd ---------

_ops = None


def _torch() -> Any:
    """The torch custom ops. Importing flashlab never imports torch: the ops are registered
    here at import when torch is already loaded (so that torch.compile never has to trace an
    import), else on the first call with a torch tensor."""
    global _ops
    if _ops is None:
        from . import _torch_ops as ops

        _ops = ops
    return _ops


if "torch" in sys.modules:
    _torch()


# ---- the FlashAttention-2 functions ------------------------------------------------------


def _attention(q: Array, k: Array, v: Array, cu_q: Optional[Array], cu_k: Optional[Array],
               max_q: int, max_k: int, dropout_p: float, softmax_scale: Optional[float],
               causal: bool, window_size: Sequence[int], softcap: float, alibi_slopes: Any,
               deterministic: bool, return_attn_probs: bool, dropout_seed: Optional[int],
               kernel: str, check_inputs: bool) -> Output:
    """The three public functions' one body: out, or (out, softmax_lse, None), through the
    torch custom op (autograd) or, for other arrays, directly."""
    _check_unsupported(dropout_p, alibi_slopes)
    win = window(window_size)
    max_q, max_k = int32("max_seqlen_q", max_q), int32("max_seqlen_k", max_k)
    if _check_arrays(_VARLEN, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k):
        out, lse = _torch().attention(q, k, v, cu_q, cu_k, max_q, max_k, float(dropout_p),
                                      softmax_scale, bool(causal), win, float(softcap),
                                      bool(deterministic), dropout_seed, str(kernel),
                                      bool(check_inputs))
    else:
        opts = options(softmax_scale=softmax_scale, causal=causal, window_size=win,
                       softcap=softcap, kernel=kernel_for(kernel, False), cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                       dropout_p=dropout_p, dropout_seed=_numpy_seed(dropout_p, dropout_seed),
                       check_inputs=check_inputs)
        out, lse = _numpy_forward(q, k, v, opts)
    return (out, lse, None) if return_attn_probs else out


# Each function with return_attn_probs has two typed signatures: out alone without it,
# (out, softmax_lse, None) or out when it is given.
@overload
def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Output: ...  # noqa: E501


def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, dropout_seed: Optional[int] = None,
                    kernel: str = "auto") -> Output:
    """FlashAttention-2's flash_attn_func: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (v may
    have its own head dim Dv), any strides with a contiguous last dim.

    Returns out [B, Sq, Hq, Dv]; with return_attn_probs, (out, softmax_lse, None) where
    softmax_lse is fp32 [B, Hq, Sq] (not differentiable). `kernel` names a registry entry
    (see kernels()) for each pass it has; "auto" picks the kernel of a pass it lacks.
    `deterministic` asks the backward for bitwise-reproducible gradients
    (a kernel that cannot give them refuses with its reason).
    `dropout_p` drops attention probabilities with the counter-based Philox mask of
    src/common/dropout.h; torch tensors draw its seed from torch's default generator
    (torch.manual_seed repeats it) unless `dropout_seed` is given, and the backward
    regenerates the same mask. NumPy arrays need `dropout_seed`.
    """
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, deterministic, return_attn_probs, dropout_seed,
                      kernel, False)


@overload
def flash_attn_qkvpacked_func(qkv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_qkvpacked_func(qkv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ...) -> Output: ...  # noqa: E501


def flash_attn_qkvpacked_func(qkv: Array, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *,
                              dropout_seed: Optional[int] = None, kernel: str = "auto") -> Output:
    """qkv [B, S, 3, H, D]: q, k, v are strided views of the packed array (no copy)."""
    shape = getattr(qkv, "shape", None)
    if shape is None:
        raise TypeError(f"qkv must be an array supporting DLPack (torch, numpy, ...), "
                        f"got {type(qkv).__name__}")
    if len(shape) != 5 or shape[2] != 3:
        raise ValueError("qkv must have shape [batch, seqlen, 3, heads, head_dim], "
                         f"got {tuple(shape)}")
    return _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None, None, 0, 0, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, dropout_seed, kernel, False)


@overload
def flash_attn_varlen_func(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: Literal[False] = ..., block_table: Optional[Array] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Array: ...  # noqa: E501
@overload
def flash_attn_varlen_func(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Sequence[int] = ..., softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ..., return_attn_probs: bool = ..., block_table: Optional[Array] = ..., *, dropout_seed: Optional[int] = ..., kernel: str = ..., check_inputs: bool = ...) -> Output: ...  # noqa: E501


def flash_attn_varlen_func(q: Array, k: Array, v: Array, cu_seqlens_q: Array,
                           cu_seqlens_k: Array, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Sequence[int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Array] = None,
                           deterministic: bool = False, return_attn_probs: bool = False,
                           block_table: Optional[Array] = None, *,
                           dropout_seed: Optional[int] = None, kernel: str = "auto",
                           check_inputs: bool = False) -> Output:
    """Packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens int32 [B + 1]
    on the device of q (sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1]).

    softmax_lse (with return_attn_probs) is fp32 [Hq, total_q]. max_seqlen_q/k may
    over-estimate the longest sequence. cu_seqlens on the host are always checked; on a
    CUDA device only with `check_inputs=True` (a copy to the host and a sync on the current
    stream per call), else kernels clamp them to the packed tensors.

    Paged KV (block_table int32 [batch, max_num_blocks_per_seq]): k/v are caches
    [num_blocks, page_size, Hkv, D] (any page_size >= 1) and sequence b's keys are its first
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of pages block_table[b][0], [1], ... The rows
    used are gathered (copied) into packed k/v, then the varlen forward runs on them: the
    kernels do not read pages. block_table and cu_seqlens_k are read and checked on the host
    (CUDA ones are copied there). Forward only, as in FlashAttention-2: torch inputs are
    detached, and when one of them required grad a backward through the output raises
    RuntimeError.
    """
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k are required (int32 [batch + 1])")

    def run(q: Array, k: Array, v: Array) -> Output:
        return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          deterministic, return_attn_probs, dropout_seed, kernel, check_inputs)

    if block_table is not None:
        return cast(Output, _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, run))
    return run(q, k, v)


# The packed variants and the SDPA entry build on the functions above; shape errors of
# every public function gain the layout hint through their one body, _attention.
from ._variants import (  # noqa: E402
    flash_attn_kvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    scaled_dot_product_attention,
    with_layout_hint,
)

_attention = with_layout_hint(_attention)

from ._kvcache import flash_attn_with_kvcache  # noqa: E402
from ._paged import varlen_paged as _varlen_paged  # noqa: E402
