"""`python -m flashlab.bench`: FlashLab next to its peers, in one process, on the same inputs.

GPU (the default when torch sees a CUDA device): every FlashLab kernel that supports the
shape (auto and fa2_mma by default; --ladder adds the slow rungs), the Triton rung
(flashlab.triton_fa2), PyTorch SDPA with each backend (flash, cuDNN, efficient, math) and a
naive PyTorch attention. Sweeps head dim {64, 128, 256} x seqlen {512 .. 16k} at 16k tokens
and hidden 2048 (heads = 2048 / head dim, batch = 16384 / seqlen), causal and not, forward
and backward; --decode adds one query token against {4k, 16k, 64k} keys (GQA 32/8, head
dim 128), judged by the bytes of K and V read. --quick is the short preset.

CPU (--device cpu): cpu_flash and cpu_reference next to PyTorch's CPU SDPA (when torch is
installed) on one shape given by --batch --heads --seqlen --hdim --dtype (fp32 or fp16).

Method (the same as `flashlab bench`, docs/BENCHMARK.md):
- every entry runs once on input set 0 and is checked against a float64 reference on two
  (batch, kv head) slices: it passes when, for each output, its max abs error is at most 2x
  that of attention computed plainly in the input dtype, + 1e-5. A failing entry shows FAIL
  and is not timed; an implementation that refuses the shape shows "-" with its reason.
- CUDA: the sweep starts after about a second of matrix products (an idle GPU's clocks are
  low: the device's H100 reads 345 MHz idle, 1980 MHz busy). Each entry then gets warm-up
  calls (at least --warmup of them and at least --warmup-ms of them), then timed calls, a
  CUDA event pair around each, median, as many as fit --budget at the cost of one call (the
  second call's, when the first carried one-time work such as loading the kernels). The
  calls rotate among enough input sets that one rotation exceeds 2x the L2 cache.
  CPU: time.perf_counter around each call, median.
- FLOPs: forward 4·B·H·(unmasked query-key pairs)·D, backward 2.5x; decode: TB/s of K+V read.
- SDPA gets q.transpose(1, 2) views of the same [B, S, H, D] tensors (what a model passes).

Outputs: a markdown table (stdout and OUT/bench.md) with TFLOP/s and the ratio of each FlashLab
kernel to SDPA flash and cuDNN; OUT/bench.csv and OUT/bench.json; OUT/plots/*.png (TFLOP/s vs
seqlen per head dim, one line per implementation) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import flashlab
from flashlab import _flashlab

OUTPUTS = {"fwd": ("out",), "bwd": ("dq", "dk", "dv")}
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_math": "MATH"}
GPU_PEERS = ("triton_fa2",) + tuple(SDPA_BACKENDS) + ("torch_naive",)  # the sweep's order
LADDER_KERNELS = ("naive", "fa1", "fa2_simt")  # seconds per call at 16k tokens: opt-in
TOKENS, HIDDEN = 16384, 2048


class Skip(Exception):
    """An implementation that does not run a shape, with the reason."""


# ---- shapes, FLOPs and bytes ----------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    dtype: str  # "bf16", "fp16", "fp32"
    decode: bool = False

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def label(self) -> str:
        heads = (f"{self.heads_q}" if self.heads_q == self.heads_kv
                 else f"{self.heads_q}/{self.heads_kv}")
        seq = (f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k
               else f"{self.seqlen_q}x{self.seqlen_k}")
        return f"{self.batch}x{seq}x{heads}x{self.head_dim}"


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Query-key pairs the mask leaves: all, or under bottom-right causal
    sum over rows i of clamp(i + Sk - Sq + 1, 0, Sk)."""
    if not causal:
        return seqlen_q * seqlen_k
    diag = seqlen_k - seqlen_q
    first_full = max(0, seqlen_k - diag - 1)  # rows from here on see every key
    rows_cut = min(seqlen_q, first_full)
    lo = max(0, -diag)  # rows before lo see nothing
    cut = sum(min(seqlen_k, i + diag + 1) for i in range(lo, rows_cut)) if rows_cut > lo else 0
    return cut + max(0, seqlen_q - max(rows_cut, lo)) * seqlen_k


def flops(shape: Shape, direction: str) -> float:
    fwd = 4.0 * shape.batch * shape.heads_q * shape.head_dim * visible_pairs(
        shape.seqlen_q, shape.seqlen_k, shape.causal)
    return fwd * (2.5 if direction == "bwd" else 1.0)


def kv_bytes(shape: Shape) -> float:
    elem = 4 if shape.dtype == "fp32" else 2
    return 2.0 * shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim * elem


def quadratic_bytes(shape: Shape) -> float:
    """The S x S score matrix in fp32, which the naive and math paths materialize."""
    return 4.0 * shape.batch * shape.heads_q * shape.seqlen_q * shape.seqlen_k


@dataclass
class Result:
    shape: Shape
    direction: str
    impl: str
    status: str  # ok, FAIL, skip, error
    reason: str = ""
    ms: float = float("nan")
    runs: int = 0
    err: Dict[str, float] = field(default_factory=dict)
    tol: Dict[str, float] = field(default_factory=dict)

    @property
    def tflops(self) -> float:
        return flops(self.shape, self.direction) / (self.ms * 1e-3) / 1e12

    @property
    def tbps(self) -> float:
        return kv_bytes(self.shape) / (self.ms * 1e-3) / 1e12

    def value(self) -> float:
        if self.status != "ok":
            return float("nan")
        return self.tbps if self.shape.decode else self.tflops


# ---- timing ----------------------------------------------------------------------------------


@dataclass
class Plan:
    warmup: int
    iters: int
    budget_s: float  # per entry: fewer timed calls when the first one is slow
    warm_s: float = 0.0  # per entry: warm-up lasts at least this long (GPU)


def plan_runs(plan: Plan, first_s: float) -> Tuple[int, int]:
    if first_s >= plan.budget_s:
        return 0, 1
    fit = int(plan.budget_s / max(first_s, 1e-6))
    return min(plan.warmup, max(0, fit // 4)), max(3, min(plan.iters, fit))


def time_cuda(run: Callable[[int], object], nsets: int, warmup: int, iters: int,
              warm_s: float = 0.0) -> List[float]:
    """Warm-up: `warmup` calls, then more until `warm_s` seconds have passed since the first
    (the clocks of a GPU that was idle, e.g. during the check, rise only under load). An
    entry planned with no warm-up (its first call took the whole budget) gets none."""
    import torch

    t0 = time.perf_counter()
    i = 0
    while i < warmup or (warmup > 0 and time.perf_counter() - t0 < warm_s):
        run((1 + i) % nsets)
        i += 1
        if i >= warmup:
            torch.cuda.synchronize()
    warmup = i
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for i, (start, end) in enumerate(events):
        start.record()
        run((1 + warmup + i) % nsets)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def time_cpu(run: Callable[[int], object], nsets: int, warmup: int, iters: int) -> List[float]:
    for i in range(warmup):
        run((1 + i) % nsets)
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        run((1 + warmup + i) % nsets)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


class Progress:
    """A one-line progress bar on stderr; on a pipe, one line per tenth of the work."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last_tenth = -1

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.start
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        line = f"[{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {what}"
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
            if self.done == self.total:
                sys.stderr.write("\n")
        elif int(10 * frac) != self.last_tenth:
            self.last_tenth = int(10 * frac)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---- the float64 reference and the check -----------------------------------------------------


def _np_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float32) rounded to `dtype` and back: the rounding points of an fp16/bf16 path."""
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.astype(np.float32).view(np.uint32)
        u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return u.view(np.float32)
    return x.astype(np.float32)


def np_attention(q, k, v, dout, causal: bool, scale: float, dtype: Optional[str]):
    """Textbook attention of one (batch, kv head) slice, q [Sq, G, D], k/v [Sk, D]: float64
    when dtype is None, else float32 arithmetic rounded to `dtype` after each product and the
    softmax. Returns {"out", and with dout "dq", "dk", "dv"}."""
    f = np.float64 if dtype is None else np.float32
    r = (lambda x: x) if dtype is None else (lambda x: _np_round(x, dtype))
    q, k, v = (np.asarray(x, dtype=f) for x in (q, k, v))
    sq, sk = q.shape[0], k.shape[0]
    s = r(np.einsum("qgd,kd->gqk", r(q * scale), k))  # (G, Sq, Sk)
    if causal:
        hidden = np.arange(sk)[None, :] > np.arange(sq)[:, None] + sk - sq
        s = np.where(hidden[None], -np.inf, s)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    p = r(e / np.where(total == 0, 1, total))
    out = {"out": r(np.einsum("gqk,kd->qgd", p, v))}
    if dout is not None:
        do = np.asarray(dout, dtype=f)
        dv = np.einsum("gqk,qgd->kd", p, do)
        dp = r(np.einsum("qgd,kd->gqk", do, v))
        delta = np.einsum("gqk,gqk->gq", p, dp)[..., None]  # = rowsum(dO ∘ O)
        ds = r(p * (dp - delta))
        out.update(dq=r(np.einsum("gqk,kd->qgd", ds, k) * scale),
                   dk=r(np.einsum("gqk,qgd->kd", ds, q) * scale), dv=r(dv))
    return out


def check_slices(shape: Shape) -> List[Tuple[int, int]]:
    """(batch, kv head) pairs checked: the first and the last."""
    return sorted({(0, 0), (shape.batch - 1, shape.heads_kv - 1)})


class Checker:
    """The reference outputs of input set 0 on the checked slices, computed once per shape:
    float64 (the oracle) and plain input-dtype arithmetic (the error to be within 2x of).
    On CUDA both come from torch on the device; on the CPU from NumPy."""

    def __init__(self, shape: Shape, inputs: Dict[str, object], directions: Sequence[str]):
        self.shape, self.ref, self.base_err = shape, {}, {}
        need_grad = "bwd" in directions
        for b, hk in check_slices(shape):
            sl = self._slice_inputs(inputs, b, hk)
            oracle = self._attention(sl, need_grad, plain=False)
            plain = self._attention(sl, need_grad, plain=True)
            for name, ref in oracle.items():
                self.ref[(b, hk, name)] = ref
                err = _max_abs(plain[name], ref)
                self.base_err[name] = max(self.base_err.get(name, 0.0), err)

    def _slice_inputs(self, inputs, b, hk):
        g = self.shape.group
        heads = slice(hk * g, (hk + 1) * g)
        dout = inputs["dout"]
        return {"q": inputs["q"][b, :, heads], "k": inputs["k"][b, :, hk],
                "v": inputs["v"][b, :, hk], "dout": None if dout is None else dout[b, :, heads]}

    def _attention(self, sl, need_grad, plain):
        s = self.shape
        if _is_torch(sl["q"]) and sl["q"].is_cuda:
            return torch_attention_slice(sl, s.causal, s.scale, need_grad, plain)
        host = {name: None if x is None else _to_numpy(x) for name, x in sl.items()}
        return np_attention(host["q"], host["k"], host["v"], host["dout"] if need_grad else None,
                            s.causal, s.scale, s.dtype if plain else None)

    def check(self, outputs: Dict[str, object]) -> Tuple[bool, Dict[str, float], Dict[str, float]]:
        g = self.shape.group
        errs, tols = {}, {}
        for name, x in outputs.items():
            err = 0.0
            for b, hk in check_slices(self.shape):
                part = x[b, :, hk * g:(hk + 1) * g] if name in ("out", "dq") else x[b, :, hk]
                ref = self.ref[(b, hk, name)]
                if _is_torch(part) and part.is_cuda:
                    err = max(err, float((part.double() - ref).abs().max().nan_to_num(math.inf)))
                else:
                    err = max(err, _max_abs(_to_numpy(part), ref))
            errs[name] = err
            tols[name] = 2 * self.base_err[name] + 1e-5
        return all(errs[n] <= tols[n] for n in errs), errs, tols


def torch_attention_slice(sl, causal, scale, need_grad, plain):
    """The CUDA reference of one slice through torch: float64, or the input dtype with
    PyTorch's math-path rounding points (for the 2x rule)."""
    import torch

    dt = sl["q"].dtype if plain else torch.float64
    q, k, v = (sl[n].to(dt).detach().requires_grad_(need_grad) for n in ("q", "k", "v"))
    with torch.enable_grad():
        out = math_attention(q.unsqueeze(0), k[:, None].unsqueeze(0), v[:, None].unsqueeze(0),
                             causal, scale)[0]
        res = {"out": out.detach()}
        if need_grad:
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), sl["dout"].to(dt))
            res.update(dq=dq, dk=dk, dv=dv)
    if plain:
        return {n: x.double() for n, x in res.items()}
    return res


def math_attention(q, k, v, causal: bool, scale: float):
    """Naive attention in the tensors' dtype, [B, S, H, D] in and out: S = Q Kᵀ in HBM,
    softmax, P V (GQA by repeating K and V). Bottom-right causal."""
    import torch

    group = q.shape[2] // k.shape[2]
    if group > 1:
        k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)
        s = s.masked_fill(hidden, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _to_numpy(x) -> np.ndarray:
    if _is_torch(x):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def _max_abs(x, ref) -> float:
    if _is_torch(ref):
        return float((x.double() - ref.double()).abs().max().nan_to_num(math.inf))
    d = np.abs(np.asarray(x, dtype=np.float64) - ref)
    return float(np.nan_to_num(d, nan=math.inf).max()) if d.size else 0.0


# ---- GPU implementations ---------------------------------------------------------------------
# Each maker returns run(set_index) -> {output name: tensor}, or raises Skip.


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def make_flashlab(kernel: str, shape: Shape, direction: str, sets):
    import torch

    flashlab._torch()  # registers torch.ops.flashlab
    ops = torch.ops.flashlab
    # (cu_seqlens_q/k, max_seqlen_q/k, dropout_p, rng, scale, causal, window, softcap,
    #  deterministic): torch.ops.flashlab's positional order (_torch_ops.py).
    fwd_args = (None, None, 0, 0, 0.0, None, shape.scale, shape.causal, -1, -1, 0.0, False)

    def forward(s, name):
        return ops.fwd(s["q"], s["k"], s["v"], *fwd_args, name)

    try:
        if direction == "fwd":
            forward(sets[0], kernel)
            return lambda i: {"out": forward(sets[i], kernel)[0]}
        saved = [forward(s, "auto") for s in sets]  # out, lse of record
        bwd_args = fwd_args + (kernel,)

        def run(i):
            s = sets[i]
            dq, dk, dv = ops.bwd(s["dout"], s["q"], s["k"], s["v"], *saved[i], *bwd_args)
            return {"dq": dq, "dk": dk, "dv": dv}

        run(0)
        return run
    except ValueError as e:
        raise Skip(" ".join(str(e).split())[:240]) from None


def make_triton(shape: Shape, direction: str, sets):
    from flashlab import triton_fa2

    try:
        if direction == "fwd":
            def run(i):
                s = sets[i]
                return {"out": triton_fa2.attention_forward(s["q"], s["k"], s["v"], shape.scale,
                                                            shape.causal)[0]}
            run(0)
            return run
        saved = [triton_fa2.attention_forward(s["q"], s["k"], s["v"], shape.scale, shape.causal)
                 for s in sets]

        def run(i):
            s = sets[i]
            dq, dk, dv = triton_fa2.attention_backward(s["dout"], s["q"], s["k"], s["v"],
                                                       *saved[i], shape.scale, shape.causal)
            return {"dq": dq, "dk": dk, "dv": dv}

        run(0)
        return run
    except ValueError as e:
        raise Skip(str(e)) from None


def _autograd_runner(forward: Callable, direction: str, sets, context):
    """Time the forward alone, or the backward alone through autograd (one graph per input
    set, kept with retain_graph)."""
    import torch

    if direction == "fwd":
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


def make_sdpa(impl: str, shape: Shape, direction: str, sets, quadratic_limit: float):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "sdpa_math" and quadratic_bytes(shape) > quadratic_limit:
        raise Skip(f"materializes S: {quadratic_bytes(shape) / 2**30:.0f} GiB > "
                   f"--quadratic-limit {quadratic_limit / 2**30:.0f} GiB")
    if shape.causal and shape.seqlen_q != shape.seqlen_k:
        raise Skip("SDPA's is_causal is top-left aligned when seqlen_q != seqlen_k")
    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
    gqa = {"enable_gqa": True} if shape.group > 1 else {}

    def forward(q, k, v):  # [B, S, H, D] in and out; SDPA sees [B, H, S, D] views
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=shape.causal,
                                           scale=shape.scale, **gqa)
        return o.transpose(1, 2)

    context = lambda: sdpa_kernel(backend)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = _autograd_runner(forward, direction, sets, context)
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
    return (" ".join(why) if why else str(error).splitlines()[0])[:240]


def make_naive(shape: Shape, direction: str, sets, quadratic_limit: float):
    import contextlib

    if quadratic_bytes(shape) > quadratic_limit:
        raise Skip(f"materializes S: {quadratic_bytes(shape) / 2**30:.0f} GiB > "
                   f"--quadratic-limit {quadratic_limit / 2**30:.0f} GiB")

    def forward(q, k, v):
        return math_attention(q, k, v, shape.causal, shape.scale)

    run = _autograd_runner(forward, direction, sets, contextlib.nullcontext)
    run(0)
    return run


# ---- CPU implementations ---------------------------------------------------------------------


def _cpu_options(shape: Shape, kernel: str, threads: int):
    o = _flashlab.Options()
    o.softmax_scale = shape.scale
    o.causal = shape.causal
    o.kernel = kernel
    o.num_threads = threads
    return o


def make_flashlab_cpu(kernel: str, shape: Shape, direction: str, sets, threads: int):
    """A FlashLab CPU kernel on NumPy arrays, with the thread count given."""

    def forward(s, name):
        out = np.empty_like(s["q"])
        lse = np.empty((shape.batch, shape.heads_q, shape.seqlen_q), dtype=np.float32)
        o = _cpu_options(shape, name, threads)
        o.workspace = np.empty(_flashlab.forward(s["q"], s["k"], s["v"], out, lse, o, True),
                               dtype=np.uint8)
        _flashlab.forward(s["q"], s["k"], s["v"], out, lse, o)
        return out, lse

    try:
        if direction == "fwd":
            forward(sets[0], kernel)
            return lambda i: {"out": forward(sets[i], kernel)[0]}
        saved = [forward(s, "cpu_flash") for s in sets]

        def run(i):
            s = sets[i]
            grads = [np.empty_like(s[n]) for n in ("q", "k", "v")]
            args = (s["q"], s["k"], s["v"], saved[i][0], s["dout"], saved[i][1], *grads, False)
            o = _cpu_options(shape, kernel, threads)
            o.workspace = np.empty(_flashlab.backward(*args, o, True), dtype=np.uint8)
            _flashlab.backward(*args, o)
            return dict(zip(("dq", "dk", "dv"), grads))

        run(0)
        return run
    except ValueError as e:
        raise Skip(str(e).splitlines()[0]) from None


def make_torch_cpu(shape: Shape, direction: str, sets):
    """PyTorch's CPU SDPA (its own backend choice) on zero-copy views of the NumPy inputs."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise Skip("torch is not installed") from None
    import contextlib

    if shape.causal and shape.seqlen_q != shape.seqlen_k:
        raise Skip("SDPA's is_causal is top-left aligned when seqlen_q != seqlen_k")
    tsets = [{n: torch.from_numpy(x) for n, x in s.items()} for s in sets]
    gqa = {"enable_gqa": True} if shape.group > 1 else {}

    def forward(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=shape.causal,
                                              scale=shape.scale, **gqa).transpose(1, 2)

    run = _autograd_runner(forward, direction, tsets, contextlib.nullcontext)
    run(0)
    return run


# ---- the sweep -------------------------------------------------------------------------------


def sweep_shapes(args) -> List[Shape]:
    shapes = []
    for d in args.hdims:
        for s in args.seqlens:
            if TOKENS % s or HIDDEN % d:
                continue
            for c in args.causal_list:
                shapes.append(Shape(TOKENS // s, s, s, HIDDEN // d, HIDDEN // d, d, c, args.dtype))
    return shapes


def decode_shapes(args) -> List[Shape]:
    return [Shape(args.decode_batch, 1, sk, 32, 8, 128, False, args.dtype, decode=True)
            for sk in args.decode_seqlens]


def gpu_impls(args, direction: str) -> List[str]:
    names = {k["name"]: k for k in flashlab.kernels() if k["arch"] != "cpu"}
    if args.kernels:
        chosen = [k for k in args.kernels if k == "auto" or k in names]
    else:
        chosen = ["auto", "fa2_mma"] + (list(LADDER_KERNELS) if args.ladder else [])
        if direction == "bwd":
            chosen = ["auto"] + [n for n, k in names.items() if k["backward"]]
    want = "backward" if direction == "bwd" else "forward"
    fl = [k for k in dict.fromkeys(chosen) if k == "auto" or names.get(k, {}).get(want)]
    return [f"flashlab:{k}" for k in fl] + [p for p in GPU_PEERS
                                            if args.peers is None or p in args.peers]


def input_sets_cuda(shape: Shape, direction: str, l2_bytes: int):
    import torch

    dt = _torch_dtype(shape.dtype)
    elem = torch.finfo(dt).bits // 8
    per_set = elem * (2 * shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim
                      + 2 * shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim)
    free = torch.cuda.mem_get_info()[0]
    count = max(2, min(32, math.ceil(2 * l2_bytes / per_set) + 1, int(free // 8 // per_set)))
    sets = []
    for _ in range(count):
        sets.append({
            "q": torch.randn(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim,
                             device="cuda", dtype=dt),
            "k": torch.randn(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim,
                             device="cuda", dtype=dt),
            "v": torch.randn(shape.batch, shape.seqlen_k, shape.heads_kv, shape.head_dim,
                             device="cuda", dtype=dt),
            "dout": torch.randn(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim,
                                device="cuda", dtype=dt) if direction == "bwd" else None,
        })
    return sets


def _error_reason(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def prepare_entry(impl: str, shape: Shape, direction: str, make: Callable, checker: Checker,
                  sync: Callable, budget_s: float):
    """Builds an entry and checks its first call: (result, run, seconds a call costs), with
    run None when the entry is not to be timed (it failed the check, refused or broke)."""
    res = Result(shape, direction, impl, "ok")
    try:
        t0 = time.perf_counter()
        run = make()
        outputs = run(0)
        sync()
        first_s = time.perf_counter() - t0
        ok, res.err, res.tol = checker.check(outputs)
        del outputs
        if not ok:
            res.status = "FAIL"
            res.reason = "; ".join(f"{n} err {res.err[n]:.2e} > tol {res.tol[n]:.2e}"
                                   for n in res.err if res.err[n] > res.tol[n])
            return res, None, 0.0
        # The first call can carry one-time costs (loading the library's kernels, Triton's
        # compile): when it used much of the budget, a second call says what a call costs.
        if first_s >= budget_s / 8:
            t0 = time.perf_counter()
            run(0)
            sync()
            first_s = time.perf_counter() - t0
        return res, run, first_s
    except Skip as e:
        res.status, res.reason = "skip", str(e)
    except Exception as e:  # a crash of one entry is reported, not fatal to the sweep
        res.status, res.reason = "error", _error_reason(e)
    return res, None, 0.0


def time_entries(entries, timer: Callable, nsets: int, plan: Plan, rounds: int = 1) -> None:
    """Times the prepared entries [(result, run, first_s)] of one shape and fills each
    result's ms (the median) and runs. With rounds > 1 the entries take turns: each round
    times every entry once (the order rotated round by round, a budget / rounds share each),
    so that all see the same clocks and temperatures, and an entry's time is the median of
    its rounds' medians."""
    live = [e for e in entries if e[1] is not None]
    if not live:
        return
    rounds = max(rounds, 1)
    per_round: Dict[int, List[float]] = {id(e[0]): [] for e in live}
    share = Plan(plan.warmup, plan.iters, plan.budget_s / rounds, plan.warm_s)
    for r in range(rounds):
        for res, run, first_s in live[r % len(live):] + live[:r % len(live)]:
            try:
                warm, iters = plan_runs(share, first_s)
                samples = timer(run, nsets, warm, iters)
                per_round[id(res)].append(statistics.median(samples))
                res.runs += len(samples)
            except Exception as e:  # reported, not fatal, as in prepare_entry
                res.status, res.reason = "error", _error_reason(e)
    for res, _, _ in live:
        if res.status == "ok":
            res.ms = statistics.median(per_round[id(res)])


def run_entry(impl: str, shape: Shape, direction: str, make: Callable, checker: Checker,
              timer: Callable, nsets: int, plan: Plan, sync: Callable) -> Result:
    entry = prepare_entry(impl, shape, direction, make, checker, sync, plan.budget_s)
    time_entries([entry], timer, nsets, plan)
    return entry[0]


def spin_up_gpu(seconds: float) -> None:
    """Matrix products for `seconds`, so that the first entry of the sweep does not run on
    idle clocks."""
    import torch

    if seconds <= 0:
        return
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def run_gpu(args) -> List[Result]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    plan = Plan(args.warmup, args.iters, args.budget, args.warmup_ms / 1e3)
    work = []  # (shape, [(direction, impls)])
    for shape in sweep_shapes(args) + (decode_shapes(args) if args.decode else []):
        dirs = ["fwd"] if shape.decode else args.directions
        work.append((shape, [(d, gpu_impls(args, d)) for d in dirs]))
    progress = Progress(sum(len(i) for _, ds in work for _, i in ds), not args.no_progress)
    limit = args.quadratic_limit * 2**30
    results = []
    spin_up_gpu(args.spin_up)
    timer = functools.partial(time_cuda, warm_s=plan.warm_s)
    for shape, dirs in work:
        for direction, impls in dirs:
            sets = input_sets_cuda(shape, direction, l2)
            checker = Checker(shape, sets[0], [direction])
            label = f"{direction} {shape.label()} {'causal ' if shape.causal else ''}"
            if args.rounds > 1:  # every entry built first, then timed in turns
                entries = []
                for impl in impls:
                    make = _gpu_maker(impl, shape, direction, sets, limit)
                    entries.append(prepare_entry(impl, shape, direction, make, checker,
                                                 torch.cuda.synchronize, plan.budget_s))
                time_entries(entries, timer, len(sets), plan, args.rounds)
                results.extend(e[0] for e in entries)
                for impl in impls:
                    progress.step(label + impl)
                del entries
            else:
                for impl in impls:
                    make = _gpu_maker(impl, shape, direction, sets, limit)
                    results.append(run_entry(impl, shape, direction, make, checker, timer,
                                             len(sets), plan, torch.cuda.synchronize))
                    progress.step(label + impl)
                    torch.cuda.empty_cache()
            del sets, checker
            torch.cuda.empty_cache()
    return results


def _gpu_maker(impl: str, shape: Shape, direction: str, sets, limit: float) -> Callable:
    if impl.startswith("flashlab:"):
        return lambda: make_flashlab(impl.split(":", 1)[1], shape, direction, sets)
    if impl == "triton_fa2":
        return lambda: make_triton(shape, direction, sets)
    if impl == "torch_naive":
        return lambda: make_naive(shape, direction, sets, limit)
    return lambda: make_sdpa(impl, shape, direction, sets, limit)


def run_cpu(args) -> List[Result]:
    np_dtype = {"fp32": np.float32, "fp16": np.float16}.get(args.dtype)
    if np_dtype is None:
        raise SystemExit(f"--dtype {args.dtype} on the CPU: NumPy has no bfloat16; use fp32 or fp16")
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
    except ImportError:
        pass
    plan = Plan(args.warmup, args.iters, args.budget)
    rng = np.random.default_rng(args.seed)
    results = []
    shapes = [Shape(args.batch, args.seqlen, args.seqlen_k or args.seqlen, args.heads,
                    args.heads_kv or args.heads, args.hdim, c, args.dtype)
              for c in args.causal_list]
    impls = (["flashlab:cpu_flash", "flashlab:cpu_reference", "torch_sdpa_cpu"]
             if not args.kernels else [f"flashlab:{k}" for k in args.kernels] + ["torch_sdpa_cpu"])
    progress = Progress(len(shapes) * len(args.directions) * len(impls), not args.no_progress)
    for shape in shapes:
        for direction in args.directions:
            def rand(s, h):
                return rng.standard_normal((shape.batch, s, h, shape.head_dim),
                                           dtype=np.float32).astype(np_dtype)
            sets = [{"q": rand(shape.seqlen_q, shape.heads_q), "k": rand(shape.seqlen_k, shape.heads_kv),
                     "v": rand(shape.seqlen_k, shape.heads_kv),
                     "dout": rand(shape.seqlen_q, shape.heads_q)} for _ in range(2)]
            checker = Checker(shape, sets[0], [direction])
            for impl in impls:
                if impl == "torch_sdpa_cpu":
                    make = lambda: make_torch_cpu(shape, direction, sets)  # noqa: E731
                else:
                    kernel = impl.split(":", 1)[1]
                    make = (lambda kernel=kernel:  # noqa: E731
                            make_flashlab_cpu(kernel, shape, direction, sets, args.threads))
                results.append(run_entry(impl, shape, direction, make, checker, time_cpu, 2,
                                         plan, lambda: None))
                progress.step(f"{direction} {shape.label()} {impl}")
    return results


# ---- output ----------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _cell(r: Optional[Result], notes: Dict[str, int]) -> str:
    if r is None:
        return ""
    if r.status == "ok":
        return _fmt(r.value())
    key = f"{r.impl}: {r.reason}"
    notes.setdefault(key, len(notes) + 1)
    return f"{'FAIL' if r.status == 'FAIL' else ('error' if r.status == 'error' else '-')}" \
           f"<sup>{notes[key]}</sup>"


def markdown(results: List[Result], header: str) -> str:
    lines = [header, ""]
    notes: Dict[str, int] = {}
    groups: Dict[Tuple[str, bool], List[Result]] = {}
    for r in results:
        groups.setdefault((r.direction, r.shape.decode), []).append(r)
    for (direction, decode), rs in groups.items():
        impls = list(dict.fromkeys(r.impl for r in rs))
        ours = [i for i in impls if i.startswith("flashlab:") or i == "triton_fa2"]
        peers = [p for p in ("sdpa_flash", "sdpa_cudnn", "torch_sdpa_cpu") if p in impls]
        unit = "TB/s of K+V read" if decode else "TFLOP/s"
        title = {"fwd": "forward", "bwd": "backward"}[direction]
        lines += [f"### {'decode ' if decode else ''}{title} ({unit})", ""]
        ratio_cols = [(o, p) for o in ours for p in peers]
        head = ["shape B x S x H x D", "causal"] + [i.replace("flashlab:", "") for i in impls] \
            + [f"{o.replace('flashlab:', '')}/{p.replace('sdpa_', '')}" for o, p in ratio_cols]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows: Dict[Tuple, Dict[str, Result]] = {}
        for r in rs:
            rows.setdefault((r.shape.head_dim, r.shape.seqlen_k, r.shape.causal, r.shape), {})[r.impl] = r
        for (_, _, causal, shape), by in sorted(rows.items(), key=lambda kv: kv[0][:3]):
            cells = [shape.label(), "yes" if causal else "no"]
            cells += [_cell(by.get(i), notes) for i in impls]
            for o, p in ratio_cols:
                a, b = by.get(o), by.get(p)
                ok = a and b and a.status == "ok" and b.status == "ok"
                cells.append(f"{a.value() / b.value():.2f}x" if ok else "")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if notes:
        lines += ["Notes:", ""] + [f"{n}. {key}" for key, n in notes.items()] + [""]
    return "\n".join(lines)


def write_outputs(results: List[Result], header: str, args) -> str:
    table = markdown(results, header)
    paths = {"md": None, "csv": args.csv, "json": args.json, "plots": args.plots}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        paths["md"] = os.path.join(args.out, "bench.md")
        paths["csv"] = paths["csv"] or os.path.join(args.out, "bench.csv")
        paths["json"] = paths["json"] or os.path.join(args.out, "bench.json")
        paths["plots"] = paths["plots"] or os.path.join(args.out, "plots")
    records = []
    for r in results:
        rec = {k: v for k, v in asdict(r.shape).items()}
        rec.update(direction=r.direction, impl=r.impl, status=r.status, reason=r.reason,
                   ms=r.ms, runs=r.runs, tflops=r.tflops if r.status == "ok" else None,
                   tbps=r.tbps if r.status == "ok" and r.shape.decode else None,
                   **{f"err_{n}": e for n, e in r.err.items()},
                   **{f"tol_{n}": t for n, t in r.tol.items()})
        records.append(rec)
    if paths["md"]:
        with open(paths["md"], "w") as f:
            f.write(table + "\n")
    if paths["csv"]:
        keys = list(dict.fromkeys(k for rec in records for k in rec))
        with open(paths["csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(records)
    if paths["json"]:
        with open(paths["json"], "w") as f:
            json.dump({"header": header, "results": records}, f, indent=1)
    if paths["plots"]:
        plot(results, paths["plots"])
    return table


def plot(results: List[Result], folder: str) -> None:
    """One PNG per direction: a panel per (causal, head dim), TFLOP/s against seqlen, one
    line per implementation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots: matplotlib is not installed; no PNG written", file=sys.stderr)
        return
    os.makedirs(folder, exist_ok=True)
    for direction in ("fwd", "bwd"):
        rs = [r for r in results if r.direction == direction and not r.shape.decode]
        seqlens = sorted({r.shape.seqlen_k for r in rs})
        if len(seqlens) < 2:
            continue
        hdims = sorted({r.shape.head_dim for r in rs})
        causals = sorted({r.shape.causal for r in rs})
        impls = list(dict.fromkeys(r.impl for r in rs))
        fig, axes = plt.subplots(len(causals), len(hdims), squeeze=False,
                                 figsize=(4.2 * len(hdims), 3.4 * len(causals)))
        for row, causal in enumerate(causals):
            for col, d in enumerate(hdims):
                ax = axes[row][col]
                for n, impl in enumerate(impls):
                    pts = sorted((r.shape.seqlen_k, r.value()) for r in rs
                                 if r.impl == impl and r.shape.head_dim == d
                                 and r.shape.causal == causal and r.status == "ok")
                    if not pts:
                        continue
                    style = dict(color=f"C{n % 10}", marker="os^vD<>px*"[n % 10],
                                 linestyle="-" if impl.startswith(("flashlab:", "triton"))
                                 else "--")
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            label=impl.replace("flashlab:", ""), **style)
                ax.set_xscale("log", base=2)
                ax.minorticks_off()
                ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
                ax.set_title(f"head dim {d}, {'causal' if causal else 'non-causal'}", fontsize=10)
                ax.set_xlabel("seqlen (batch x seqlen = 16k tokens)", fontsize=8)
                ax.set_ylabel("TFLOP/s", fontsize=8)
                ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
        handles = {}
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
                   ncol=min(len(handles), 5), fontsize=8)
        fig.suptitle(f"FlashLab vs peers, {'forward' if direction == 'fwd' else 'backward'} "
                     f"({rs[0].shape.dtype}, hidden 2048)", fontsize=11)
        fig.tight_layout(rect=(0, 0.09, 1, 1))
        fig.savefig(os.path.join(folder, f"{direction}.png"), dpi=110)
        plt.close(fig)


def describe(args) -> str:
    parts = [f"flashlab.bench on {platform.node() or 'this machine'}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
        if args.device == "cuda":
            parts.insert(1, torch.cuda.get_device_name(0))
            parts.append(f"cuDNN {torch.backends.cudnn.version()}")
            import triton

            parts.append(f"triton {triton.__version__}")
        else:
            parts.append(f"{torch.get_num_threads()} torch threads")
    except ImportError:
        parts.append("torch not installed")
    if args.device == "cpu":
        parts.append(f"{args.threads or os.cpu_count()} FlashLab threads")
    method = (f"{args.spin_up:g} s spin-up, CUDA events, warm-up (>= {args.warmup} calls and "
              f"{args.warmup_ms:g} ms), median, inputs rotated past 2x L2" if args.device == "cuda"
              else "perf_counter, warm-up, median")
    if args.device == "cuda" and args.rounds > 1:
        method += (f", {args.rounds} alternating rounds per shape (median of the rounds' "
                   "medians)")
    return "## " + ", ".join(parts) + f"\n\n{args.dtype}; {method}; every entry checked " \
        "against float64 first (max abs err <= 2x plain input-dtype attention + 1e-5)."


# ---- command line ----------------------------------------------------------------------------


def _ints(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashlab.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="short preset: head dim 64,128,256 x seqlen 1k,4k,16k, decode, fewer runs")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when torch sees one")
    p.add_argument("--hdims", type=_ints, default=[64, 128, 256])
    p.add_argument("--seqlens", type=_ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", choices=("0", "1", "both"), default="both")
    p.add_argument("--direction", choices=("fwd", "bwd", "both"))
    p.add_argument("--decode", action="store_true", help="add the decode sweep (GPU)")
    p.add_argument("--decode-seqlens", type=_ints, default=[4096, 16384, 65536])
    p.add_argument("--decode-batch", type=int, default=1)
    p.add_argument("--kernels", type=lambda s: [k for k in s.split(",") if k],
                   help="FlashLab kernels to run (comma-separated registry names, or auto)")
    p.add_argument("--peers", type=lambda s: [k for k in s.split(",") if k],
                   help="GPU: the peers to time (comma-separated, of " + ", ".join(GPU_PEERS)
                        + "; default all). With one peer and --rounds, the sweep alternates "
                        "the two the way docs/BENCHMARK.md's steady ratio does")
    p.add_argument("--ladder", action="store_true", help="add naive, fa1, fa2_simt (slow)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--iters", type=int, default=20, help="timed calls (at most)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per entry (at least)")
    p.add_argument("--warmup-ms", type=float, default=100.0,
                   help="GPU: warm-up calls per entry last at least this long")
    p.add_argument("--spin-up", type=float, default=1.0,
                   help="GPU: seconds of matrix products before the sweep (0: none)")
    p.add_argument("--budget", type=float, default=3.0,
                   help="seconds per entry; a slow first call means fewer timed calls")
    p.add_argument("--rounds", type=int, default=1,
                   help="GPU: time each shape's entries in this many alternating rounds (the "
                        "order rotated each round), each entry's time the median of its "
                        "rounds' medians; 1: each entry timed alone, one after the other")
    p.add_argument("--quadratic-limit", type=float, default=4.0,
                   help="GiB: skip the naive and math paths when the fp32 S matrix is larger")
    p.add_argument("--csv"), p.add_argument("--json"), p.add_argument("--plots")
    p.add_argument("--out", help="folder for bench.md, bench.csv, bench.json and plots/")
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("CPU shape (--device cpu)")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--heads-kv", type=int)
    g.add_argument("--seqlen", type=int, default=4096)
    g.add_argument("--seqlen-k", type=int)
    g.add_argument("--hdim", type=int, default=128)
    g.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    g.add_argument("--seed", type=int)
    args = p.parse_args(argv)
    unknown = [k for k in args.peers or [] if k not in GPU_PEERS]
    if unknown:
        p.error(f"--peers: unknown {', '.join(unknown)} (the peers: {', '.join(GPU_PEERS)})")
    if args.device is None:
        args.device = "cuda" if _cuda_ready() else "cpu"
    if args.device == "cuda" and not _cuda_ready():
        p.error("--device cuda: torch sees no CUDA device, or this flashlab build has no CUDA")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.causal_list = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    args.direction = args.direction or ("both" if args.device == "cuda" else "fwd")
    args.directions = ["fwd", "bwd"] if args.direction == "both" else [args.direction]
    if args.quick:
        if "--seqlens" not in " ".join(argv or sys.argv):
            args.seqlens = [1024, 4096, 16384]
        args.decode = args.device == "cuda"
        args.iters, args.warmup, args.budget = min(args.iters, 10), min(args.warmup, 2), 1.0
        args.warmup_ms = min(args.warmup_ms, 50.0)
    return args


def _cuda_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and flashlab.cuda_available()


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    results = run_gpu(args) if args.device == "cuda" else run_cpu(args)
    table = write_outputs(results, describe(args), args)
    print(table)
    print(f"({len(results)} entries in {time.perf_counter() - t0:.0f} s"
          + (f"; files in {args.out}" if args.out else "") + ")")
    return 1 if any(r.status in ("FAIL", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
