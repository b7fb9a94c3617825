"""PyTorch integration: `flashlab::fwd` / `flashlab::bwd` custom ops with fake (meta)
implementations, so torch.compile(fullgraph=True) traces through them, and autograd
wired with torch.library.register_autograd. Imported lazily by flashlab on first use; it
imports only the native module and flashlab._options, never the package itself.

Tensors cross as DLPack capsules from torch.utils.dlpack.to_dlpack, not through
`tensor.__dlpack__()`: called with no stream, as the binding would, that method makes the
legacy default stream wait on the current one (an event per tensor per call off the default
stream) and costs about 7x more. The kernels run on the current stream of the tensors'
device, so no sync is due.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch.utils.dlpack import to_dlpack

from . import _flashlab
from ._options import kernel_for, options


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _dl(*tensors: Optional[torch.Tensor]) -> List[Any]:
    """DLPack capsules (None stays None). A capsule is consumed once: make fresh ones per call."""
    return [None if t is None else to_dlpack(t) for t in tensors]


def _opts(max_q: int, max_k: int, dropout_p: float, rng: Optional[torch.Tensor],
          scale: Optional[float], causal: bool, wl: int, wr: int, softcap: float, kernel: str,
          check_inputs: bool, backward: bool, like: torch.Tensor) -> "_flashlab.Options":
    """The call's Options, on the current stream of `like`'s device. The cu_seqlens capsules
    are set per native call (see _dl). `rng` holds dropout's (seed, offset)."""
    seed, offset = rng.tolist() if rng is not None and dropout_p > 0.0 else (0, 0)
    o = options(softmax_scale=scale, causal=causal, window_size=(wl, wr), softcap=softcap,
                kernel=kernel_for(kernel, backward), max_seqlen_q=max_q, max_seqlen_k=max_k,
                dropout_p=dropout_p, dropout_seed=seed, dropout_offset=offset,
                check_inputs=check_inputs)
    o.stream = _stream(like)
    return o


def _lse_shape(q: torch.Tensor, varlen: bool) -> Tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _workspace(nbytes: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device)


@torch.library.custom_op("flashlab::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
        cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
        dropout_p: float, rng: Optional[torch.Tensor], softmax_scale: Optional[float],
        causal: bool, window_left: int, window_right: int, softcap: float, deterministic: bool,
        kernel: str, check_inputs: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` only matters to the backward; the op carries it for autograd.
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lse = torch.empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32, device=q.device)
    o = _opts(max_seqlen_q, max_seqlen_k, dropout_p, rng, softmax_scale, causal, window_left,
              window_right, softcap, kernel, check_inputs, False, q)
    tensors = (q, k, v, out, lse)

    def call(size_only: bool) -> int:
        o.cu_seqlens_q, o.cu_seqlens_k = _dl(cu_seqlens_q, cu_seqlens_k)
        return _flashlab.forward(*_dl(*tensors), o, size_only)

    workspace = _workspace(call(True), q)
    o.workspace = to_dlpack(workspace)
    call(False)
    return out, lse


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, rng,
      softmax_scale, causal, window_left, window_right, softcap, deterministic, kernel,
      check_inputs):
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashlab::bwd", mutates_args=())
def bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
        cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
        dropout_p: float, rng: Optional[torch.Tensor], softmax_scale: Optional[float],
        causal: bool, window_left: int, window_right: int, softcap: float, deterministic: bool,
        kernel: str, check_inputs: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    o = _opts(max_seqlen_q, max_seqlen_k, dropout_p, rng, softmax_scale, causal, window_left,
              window_right, softcap, kernel, check_inputs, True, q)
    # autograd may hand over a broadcast (stride-0) or otherwise strided gradient.
    tensors = (q, k, v, out, dout.contiguous(), lse, dq, dk, dv)

    def call(size_only: bool) -> int:
        o.cu_seqlens_q, o.cu_seqlens_k = _dl(cu_seqlens_q, cu_seqlens_k)
        return _flashlab.backward(*_dl(*tensors), deterministic, o, size_only)

    workspace = _workspace(call(True), q)
    o.workspace = to_dlpack(workspace)
    call(False)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]
                   ) -> None:
    (q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, rng, scale, causal, wl, wr, softcap, det,
     kernel, check) = inputs
    out, lse = output
    # The backward has no dLSE term: a loss through softmax_lse would get wrong gradients,
    # so lse is a constant to autograd.
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rng)
    ctx.args = (max_q, max_k, dropout_p, scale, causal, wl, wr, softcap, det, kernel, check)


def _backward(ctx: Any, dout: torch.Tensor, dlse: Optional[torch.Tensor]) -> Tuple[Any, ...]:
    q, k, v, out, lse, cu_q, cu_k, rng = ctx.saved_tensors
    max_q, max_k, dropout_p, scale, causal, wl, wr, softcap, det, kernel, check = ctx.args
    dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout_p, rng, scale,
                     causal, wl, wr, softcap, det, kernel, check)
    return (dq, dk, dv) + (None,) * 14


torch.library.register_autograd("flashlab::fwd", _backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              cu_q: Optional[torch.Tensor], cu_k: Optional[torch.Tensor], max_q: int, max_k: int,
              dropout_p: float, scale: Optional[float], causal: bool, window: Tuple[int, int],
              softcap: float, deterministic: bool, dropout_seed: Optional[int], kernel: str,
              check_inputs: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward through the custom op; autograd reaches flashlab::bwd. Dropout's (seed,
    offset) is a CPU int64 tensor drawn from torch's default generator (or the caller's
    seed), which torch.compile traces like any other random op; the backward gets the
    same tensor."""
    rng = None
    if dropout_p > 0.0:
        if dropout_seed is None:
            rng = torch.randint(0, 2**62, (2,), dtype=torch.int64)
        else:
            rng = torch.tensor([int(dropout_seed), 0], dtype=torch.int64)
    return fwd(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, rng, scale, causal, window[0],
               window[1], softcap, deterministic, kernel, check_inputs)
