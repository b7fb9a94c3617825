"""FlashLab: exact attention kernels with FlashAttention-2's Python API.

Arrays cross into C++ as DLPack views (zero copy): PyTorch tensors (with autograd) and
NumPy arrays (forward and an explicit backward) both work. CPU arrays run the CPU
backends; CUDA tensors run on the caller's current stream of the tensor's device.
Every bad input raises ValueError or TypeError carrying the C++ Status message.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

from . import _flashlab

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "kernels",
    "cuda_available",
]


def kernels() -> list[dict]:
    """The registry: one dict per kernel (name, arch, summary, forward, backward)."""
    return _flashlab.kernels()


def cuda_available() -> bool:
    """True when this build has CUDA kernels and a CUDA device is visible."""
    return bool(_flashlab.cuda_available())


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _check_unsupported(dropout_p: float, alibi_slopes: Any) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: only 0.0 is supported by this build, got {dropout_p}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ALiBi is not supported by this build")


def _window(window_size: Sequence[int]) -> Tuple[int, int]:
    if len(window_size) != 2:
        raise ValueError(f"window_size must be (left, right), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _options(
    *,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    kernel: str,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    stream: int = 0,
) -> "_flashlab.Options":
    o = _flashlab.Options()
    o.softmax_scale = None if softmax_scale is None else float(softmax_scale)
    o.causal = bool(causal)
    o.window_left, o.window_right = _window(window_size)
    o.softcap = float(softcap)
    o.kernel = str(kernel)
    o.cu_seqlens_q = cu_seqlens_q
    o.cu_seqlens_k = cu_seqlens_k
    o.max_seqlen_q = int(max_seqlen_q)
    o.max_seqlen_k = int(max_seqlen_k)
    o.stream = int(stream)
    return o


# ---- NumPy (and any non-torch DLPack array): forward and explicit backward -----------------


def _numpy_forward(q, k, v, opts):
    import numpy as np

    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    if opts.cu_seqlens_q is not None:
        lse = np.empty((q.shape[1], q.shape[0]), dtype=np.float32)
    else:
        lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    opts.workspace = np.empty(_flashlab.forward(q, k, v, out, lse, opts, True), dtype=np.uint8)
    _flashlab.forward(q, k, v, out, lse, opts)
    return out, lse


def attention_backward(q, k, v, out, dout, lse, *, softmax_scale=None, causal=False,
                       window_size=(-1, -1), softcap=0.0, deterministic=False, kernel="auto"):
    """Gradients (dq, dk, dv) for NumPy arrays (PyTorch users get them from autograd)."""
    import numpy as np

    opts = _options(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                    softcap=softcap, kernel=kernel)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    args = (q, k, v, out, dout, lse, dq, dk, dv, bool(deterministic), opts)
    opts.workspace = np.empty(_flashlab.backward(*args, True), dtype=np.uint8)
    _flashlab.backward(*args)
    return dq, dk, dv


# ---- PyTorch: a torch.library custom op with a fake implementation, and autograd ---------

_ops = None


def _torch():
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


def _attention(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window_size, softcap,
               deterministic, kernel):
    """(out, lse) through the torch custom op (autograd) or, for other arrays, directly."""
    if _is_torch(q):
        return _torch().attention(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal,
                                  _window(window_size), softcap, deterministic, kernel)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "__dlpack__"):
            raise TypeError(f"{name} must be an array supporting DLPack (torch, numpy, ...), "
                            f"got {type(x).__name__}")
    opts = _options(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                    softcap=softcap, kernel=kernel, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=max_q, max_seqlen_k=max_k)
    return _numpy_forward(q, k, v, opts)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    kernel: str = "auto",
):
    """FlashAttention-2's flash_attn_func: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D].

    Returns out [B, Sq, Hq, Dv]; with return_attn_probs, (out, softmax_lse, None) where
    softmax_lse is fp32 [B, Hq, Sq]. `kernel` names a registry entry (see kernels()) for the
    forward, and for the backward when it has one ("auto" picks the backward otherwise).
    """
    _check_unsupported(dropout_p, alibi_slopes)
    out, lse = _attention(q, k, v, None, None, 0, 0, softmax_scale, causal, window_size,
                          softcap, deterministic, kernel)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    kernel: str = "auto",
):
    """qkv [B, S, 3, H, D]: views q, k, v out of the packed tensor (no copy)."""
    if len(qkv.shape) != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape [batch, seqlen, 3, heads, head_dim], got {tuple(qkv.shape)}")
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, kernel=kernel)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    kernel: str = "auto",
):
    """Packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens int32 [B + 1].

    softmax_lse (with return_attn_probs) is fp32 [Hq, total_q].
    """
    _check_unsupported(dropout_p, alibi_slopes)
    if block_table is not None:
        raise ValueError("block_table: paged KV is not supported by this build")
    out, lse = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, window_size, softcap, deterministic, kernel)
    return (out, lse, None) if return_attn_probs else out
