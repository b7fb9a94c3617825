"""Rotary position embeddings (RoPE), FlashAttention-2's apply_rotary_emb.

Position p of a sequence turns each pair of a vector's first rotary_dim channels by the angle
whose cosine and sine are row p of `cos` and `sin`:

    (x_a, x_b) -> (x_a·cos − x_b·sin, x_a·sin + x_b·cos)

Pairs are (i, i + rotary_dim/2) by default (GPT-NeoX's halves) and (2i, 2i + 1) with
interleaved=True (GPT-J's neighbours); channels past rotary_dim pass through. A sequence's
positions start at its `seqlen_offsets` entry: the tokens already in a KV cache.

Written with the array library's own operations (torch, with autograd, or NumPy), in fp32
for fp16/bf16 inputs and rounded once to the input dtype: a reference for the kernels that
fuse the rotation into attention, not a kernel itself.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

from ._options import Array
from ._options import is_torch as _is_torch


def _positions(x: Array, seqlen_offsets: Union[int, Array], cu_seqlens: Optional[Array],
               rows: int, torch_like: bool) -> Array:
    """Each token's position: [batch, seqlen] padded, [total] varlen (int64, on x's device)."""
    if torch_like:
        import torch

        lib, dev = torch, {"device": x.device}
        as_int = lambda a: torch.as_tensor(a, dtype=torch.int64, device=x.device)  # noqa: E731
    else:
        import numpy as np

        lib, dev = np, {}
        as_int = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        offsets = as_int(seqlen_offsets)
        if offsets.ndim not in (0, 1) or (offsets.ndim == 1 and offsets.shape[0] != batch):
            raise ValueError(f"seqlen_offsets must be an int or [batch] = [{batch}], got shape "
                             f"{tuple(offsets.shape)}")
        steps = lib.arange(seqlen, **dev).reshape(1, seqlen)
        return offsets.reshape(-1, 1) + steps if offsets.ndim else steps + offsets
    cu = as_int(cu_seqlens)
    if cu.ndim != 1 or cu.shape[0] < 2 or int(cu[0]) != 0 or int(cu[-1]) != rows:
        raise ValueError(f"cu_seqlens must be [batch + 1], start at 0 and end at x.shape[0] = "
                         f"{rows}")
    lengths = cu[1:] - cu[:-1]
    if bool((lengths < 0).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    batch = lengths.shape[0]
    offsets = as_int(seqlen_offsets)
    if offsets.ndim == 1 and offsets.shape[0] != batch:
        raise ValueError(f"seqlen_offsets must be an int or [batch] = [{batch}], got shape "
                         f"{tuple(offsets.shape)}")
    seq = lib.repeat_interleave(lib.arange(batch, **dev), lengths) if torch_like else \
        lib.repeat(lib.arange(batch), lengths)
    start = offsets[seq] if offsets.ndim else offsets
    return lib.arange(rows, **dev) - cu[seq] + start


def _torch_ops(x: Array) -> Tuple[Any, Callable[[Any, Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    """The working dtype, a cast, a stack on a new last axis and a concatenation on the last."""
    import torch

    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (work, lambda t, d: t.to(d), lambda t: torch.stack(t, dim=-1),
            lambda t: torch.cat(t, dim=-1))


def _numpy_ops(x: Array) -> Tuple[Any, Callable[[Any, Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    import numpy as np

    work = np.float64 if x.dtype == np.float64 else np.float32
    return (work, lambda t, d: t.astype(d), lambda t: np.stack(t, axis=-1),
            lambda t: np.concatenate(t, axis=-1))


def apply_rotary_emb(x: Array, cos: Array, sin: Array, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: Union[int, Array] = 0,
                     cu_seqlens: Optional[Array] = None,
                     max_seqlen: Optional[int] = None) -> Array:
    """FlashAttention-2's apply_rotary_emb: x [batch, seqlen, heads, head_dim] (varlen:
    [total, heads, head_dim] with cu_seqlens [batch + 1]); cos and sin [seqlen_rotary,
    rotary_dim / 2] with rotary_dim <= head_dim; seqlen_offsets an int or [batch] (each
    sequence's first position). Every position must be < seqlen_rotary. Returns the rotated
    x (x itself, written, with inplace=True). max_seqlen is accepted for FlashAttention's
    signature and not needed."""
    del max_seqlen
    torch_like = _is_torch(x)
    if _is_torch(cos) != torch_like or _is_torch(sin) != torch_like:
        raise TypeError("x, cos and sin must all be torch tensors or all NumPy arrays")
    want_rank = 3 if cu_seqlens is not None else 4
    if x.ndim != want_rank:
        layout = "[total, heads, head_dim]" if want_rank == 3 else "[batch, seqlen, heads, head_dim]"
        raise ValueError(f"x must be {layout}, got shape {tuple(x.shape)}")
    if cos.ndim != 2 or tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"cos and sin must both be [seqlen_rotary, rotary_dim / 2], got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    half = cos.shape[1]
    head_dim = x.shape[-1]
    if half == 0 or 2 * half > head_dim:
        raise ValueError(f"rotary_dim = 2 * cos.shape[1] = {2 * half} must be in [2, head_dim = "
                         f"{head_dim}]")
    pos = _positions(x, seqlen_offsets, cu_seqlens, x.shape[0], torch_like)
    if pos.numel() if torch_like else pos.size:
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= cos.shape[0]:
            raise ValueError(f"positions reach {hi if hi >= cos.shape[0] else lo}: seqlen_offsets "
                             f"plus the sequence length must stay within cos.shape[0] = "
                             f"{cos.shape[0]} (and offsets >= 0)")

    rd = 2 * half
    work, cast, stack, cat = _torch_ops(x) if torch_like else _numpy_ops(x)
    c, s = cast(cos, work)[pos], cast(sin, work)[pos]
    xf = cast(x[..., :rd], work)
    back = lambda t: cast(t, x.dtype)  # noqa: E731
    c, s = c[..., None, :], s[..., None, :]  # one angle per token, the same for every head
    a, b = (xf[..., 0::2], xf[..., 1::2]) if interleaved else (xf[..., :half], xf[..., half:])
    ra, rb = a * c - b * s, a * s + b * c
    turned = back(stack((ra, rb)).reshape(xf.shape) if interleaved else cat((ra, rb)))
    if inplace:
        x[..., :rd] = turned
        return x
    return turned if rd == head_dim else cat((turned, x[..., rd:]))
