"""The peers of `python -m flashlab.bench` (flashlab.bench runs the sweep): each maker returns
run(set) -> {output name: tensor}, one call of its implementation on input set `set` on
torch's current stream, or raises Skip with the reason it does not run the problem. Inputs
are torch views of the native harness's buffers: {q, k, v[, dout]} per set, with
cu_seqlens for a varlen problem and the cache tables for a decode one.

A train problem (Problem.train) times a training step: each call runs the forward through
autograd from q, k, v leaves that require grad, then torch.autograd.grad(out, (q, k, v),
dout), and returns out with the gradients. FlashLab's own entries take this path too
(flashlab.flash_attn_func through the flashlab::fwd / flashlab::bwd torch ops, make_flashlab):
that is the call a model's step makes.

A varlen problem (a packed batch of documents, Problem.lengths) runs on FlashAttention-4's
flash_attn_varlen_func; PyTorch SDPA (every backend) and the Triton rung have no varlen
entry, and say so.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable, Optional

from flashlab import _bench_decode

SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
GRAPH = "@graph"  # an entry captured in a CUDA graph, replayed per call (--graphs)
VARLEN_PEERS = ("fa4",)  # the peers with a varlen entry


class Skip(Exception):
    """An implementation that does not run a problem, with the reason."""


def refusal(impl: str, p) -> str:
    """Why a peer cannot run `p` whatever its inputs ("" when it may): a varlen problem
    needs a varlen entry."""
    if p.lengths and not impl.startswith("flashlab:") and impl.split("@")[0] not in VARLEN_PEERS:
        return "no varlen entry"
    return ""


def _scale(p) -> float:
    return 1.0 / math.sqrt(p.head_dim)


def _autograd_runner(forward: Callable, p, sets, context):
    """The forward alone; the backward alone through autograd (one graph per input set,
    kept with retain_graph); or a training step, both in every call. `forward` returns out,
    or (out, lse) to have LSE checked too."""
    import torch

    if p.train:
        leaves = [[s[n].detach().requires_grad_() for n in ("q", "k", "v")] for s in sets]

        def step(i):
            with context(), torch.enable_grad():
                out = forward(*leaves[i])
                out, extra = (out[0], {"lse": out[1]}) if isinstance(out, tuple) else (out, {})
                dq, dk, dv = torch.autograd.grad(out, leaves[i], sets[i]["dout"])
            return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv, **extra}
        return step
    if not p.backward:
        def run(i):
            with context(), torch.no_grad():
                return {"out": forward(sets[i]["q"], sets[i]["k"], sets[i]["v"])}
        return run
    graphs = []
    for s in sets:
        leaves = [s[n].detach().requires_grad_() for n in ("q", "k", "v")]
        with context(), torch.enable_grad():
            graphs.append((leaves, forward(*leaves)))

    def run(i):
        leaves, out = graphs[i]
        with context():
            dq, dk, dv = torch.autograd.grad(out, leaves, sets[i]["dout"], retain_graph=True)
        return {"dq": dq, "dk": dk, "dv": dv}
    return run


def _sdpa_context(impl: Optional[str]) -> Callable:
    """A context that pins SDPA to impl's backend (nothing for impl None: SDPA's choice)."""
    if impl is None:
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
    return lambda: sdpa_kernel(backend)


def first_line(e: Exception) -> str:
    return " ".join(str(e).split("\n")[0].split())[:240]


def make_sdpa(impl: Optional[str], p, sets):
    """PyTorch SDPA on [B, H, S, D] views of the [B, S, H, D] inputs (what a model passes),
    with one backend (GPU), or its own choice (impl None, the CPU)."""
    import torch.nn.functional as F

    if p.causal and p.seqlen_q != p.seqlen_k:
        raise Skip("SDPA's is_causal is top-left aligned when seqlen_q != seqlen_k")
    gqa = {"enable_gqa": True} if p.heads_q != p.heads_kv else {}

    def forward(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=p.causal,
                                           scale=_scale(p), **gqa)
        return o.transpose(1, 2)

    context = _sdpa_context(impl)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = _autograd_runner(forward, p, sets, context)
            run(0)
            return run
        except RuntimeError as e:
            raise Skip(_sdpa_refusal(caught, e)) from None


def _sdpa_refusal(caught, error: Exception) -> str:
    """SDPA says why a backend refused through warnings; keep their text, without the
    "(Triggered internally at ...)" trailer."""
    why = []
    for w in caught:
        text = " ".join(str(w.message).split()).split(" (Triggered internally")[0]
        if text and text not in why:
            why.append(text)
    return (" ".join(why) if why else first_line(error))[:240]


def make_triton(p, sets):
    """The Triton rung: its forward and backward launched directly, or for a training step
    its flash_attn_func through autograd."""
    from flashlab import triton_fa2

    scale, causal = _scale(p), p.causal
    try:
        if p.train:
            run = _autograd_runner(lambda q, k, v: triton_fa2.flash_attn_func(
                q, k, v, softmax_scale=scale, causal=causal), p, sets, contextlib.nullcontext)
            run(0)
            return run
        if not p.backward:
            def run(i):
                s = sets[i]
                return {"out": triton_fa2.attention_forward(s["q"], s["k"], s["v"], scale, causal)[0]}
            run(0)
            return run
        saved = [triton_fa2.attention_forward(s["q"], s["k"], s["v"], scale, causal) for s in sets]

        def run(i):
            s = sets[i]
            dq, dk, dv = triton_fa2.attention_backward(s["dout"], s["q"], s["k"], s["v"],
                                                       *saved[i], scale, causal)
            return {"dq": dq, "dk": dk, "dv": dv}
        run(0)
        return run
    except ValueError as e:
        raise Skip(first_line(e)) from None


def make_flashlab(kernel: str, p, sets):
    """FlashLab's training step as a model makes it: flashlab.flash_attn_func (or
    flash_attn_varlen_func with the harness's cu_seqlens) through torch autograd, `kernel`
    for both passes (one without a pass leaves it to "auto", as the function does), with
    its LSE checked too. A kernel's refusal (ValueError) is the row's reason."""
    import flashlab

    extra = dict(causal=p.causal, softmax_scale=_scale(p), softcap=p.softcap, kernel=kernel,
                 window_size=(p.window_left, p.window_right), return_attn_probs=True)

    def forward(q, k, v):
        if p.lengths:
            cu = sets[0]["cu_seqlens"]  # the same in every set
            out, lse, _ = flashlab.flash_attn_varlen_func(q, k, v, cu, cu, p.seqlen_q, p.seqlen_k,
                                                          **extra)
        else:
            out, lse, _ = flashlab.flash_attn_func(q, k, v, **extra)
        return out, lse

    try:
        run = _autograd_runner(forward, p, sets, contextlib.nullcontext)
        run(0)
        return run
    except ValueError as e:
        raise Skip(first_line(e).replace(f"kernel '{kernel}' ", "", 1)) from None


def make_fa4(p, sets):
    """FlashAttention-4 (the flash_attn.cute package), forward alone or backward through
    autograd: flash_attn_func, or on a varlen problem flash_attn_varlen_func with the
    harness's cu_seqlens (one array for queries and keys, the same in every set)."""
    try:
        from flash_attn.cute import interface
    except ImportError as e:
        raise Skip(f"FlashAttention-4 (flash_attn.cute) is not importable: {e}") from None
    call, extra = interface.flash_attn_func, {}
    if p.lengths:
        cu = sets[0]["cu_seqlens"]
        call = interface.flash_attn_varlen_func
        extra = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p.seqlen_q, max_seqlen_k=p.seqlen_k)

    def forward(q, k, v):
        out = call(q, k, v, softmax_scale=_scale(p), causal=p.causal, **extra)
        return out[0] if isinstance(out, tuple) else out

    try:
        run = _autograd_runner(forward, p, sets, contextlib.nullcontext)
        run(0)
        return run
    except (RuntimeError, ValueError, AssertionError, NotImplementedError) as e:
        raise Skip(first_line(e)) from None


def make_decode_sdpa(impl: Optional[str], p, sets):
    """PyTorch SDPA on a decode problem: [B, H, S, D] copies of q and of the keys and values
    the cache holds (dense_kv), made before timing; enable_gqa where the backend takes it,
    else K and V expanded to heads_q (the row's bytes stay those of the un-expanded K+V)."""
    import torch
    import torch.nn.functional as F

    if p.causal and p.seqlen_q > 1:
        raise Skip("SDPA's is_causal is top-left aligned when seqlen_q != seqlen_k")
    context = _sdpa_context(impl)
    copies = [[x.transpose(1, 2).contiguous() for x in [s["q"]] + _bench_decode.dense_kv(p, s)]
              for s in sets]
    group = p.heads_q // p.heads_kv

    def runner(gqa: bool):
        args = copies if gqa or group == 1 else \
            [[q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)] for q, k, v in copies]
        extra = {"enable_gqa": True} if gqa and group > 1 else {}

        def run(i):
            q, k, v = args[i]
            with context(), torch.no_grad():
                o = F.scaled_dot_product_attention(q, k, v, scale=_scale(p), **extra)
            return {"out": o.transpose(1, 2)}
        return run

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = runner(True)
            run(0)
            return run
        except RuntimeError:
            pass
        try:
            run = runner(False)
            run(0)
            return run
        except RuntimeError as e:
            raise Skip(_sdpa_refusal(caught, e)) from None


def make_peer(impl: str, p, sets):
    if impl.endswith(GRAPH):
        base = impl[:-len(GRAPH)]
        run = _bench_decode.flashlab_runner(base.split(":", 1)[1], p, sets) \
            if base.startswith("flashlab:") else make_peer(base, p, sets)
        try:
            return _bench_decode.graphed(run, len(sets))
        except RuntimeError as e:
            raise Skip(f"not capturable in a CUDA graph: {first_line(e)}") from None
    if impl.startswith("flashlab:"):  # an entry the native harness does not run: train, +rotary
        if p.train:
            return make_flashlab(impl.split(":", 1)[1], p, sets)
        return _bench_decode.flashlab_runner(impl.split(":", 1)[1], p, sets)
    if why := refusal(impl, p):
        raise Skip(why)
    if p.decode:
        return make_decode_sdpa(None if impl == "sdpa_cpu" else impl, p, sets)
    if impl == "triton_fa2":
        return make_triton(p, sets)
    if impl == "fa4":
        return make_fa4(p, sets)
    return make_sdpa(None if impl == "sdpa_cpu" else impl, p, sets)
