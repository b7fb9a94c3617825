"""`python -m flashlab.bench`: FlashLab next to its peers, in one process, on the same inputs.

The harness is native (include/flashlab/bench.h, as _flashlab.bench): it plans the problems,
owns the input sets, checks every implementation against cpu_reference in fp64 before
timing it, times every call with one method and counts the FLOPs. This module adds the
peers and the tables. GPU: FlashLab kernels, the Triton rung (flashlab.triton_fa2), PyTorch
SDPA's flash and cuDNN backends and FlashAttention-4 (flash_attn.cute) when importable, over
head dim x seqlen at 16k tokens and hidden 2048, causal and not, forward and backward
(--quick adds decode problems). CPU (--device cpu): cpu_flash and cpu_reference next to
PyTorch's CPU SDPA on one shape, at --seqlen or at each of --seqlens. --decode: the
KV-cache call (forward_kvcache, one query token against a full cache at each of --seqlens,
paged with --page-size) next to SDPA on [B, H, S, D] copies of the same keys and values,
judged by GB/s of K and V read; --graphs adds each implementation captured in a CUDA graph. Outputs (flashlab._bench_report): a markdown table (stdout
and OUT/bench.md), OUT/bench.csv, OUT/bench.json and OUT/plots/*.png (with matplotlib, for a
pass at two or more seqlens; otherwise one line on stderr says why none was written).
Method and commands: docs/BENCHMARK.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import math
import os
import platform
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional

import flashlab
from flashlab import _bench_decode, _flashlab
from flashlab._bench_report import write_outputs

native = _flashlab.bench

SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
GPU_PEERS = ("triton_fa2",) + tuple(SDPA_BACKENDS) + ("fa4",)  # the sweep's order
CPU_PEERS = ("sdpa_cpu",)
DECODE_PEERS = tuple(SDPA_BACKENDS)  # --decode on the GPU; the CPU's is sdpa_cpu
GRAPH = "@graph"  # an entry captured in a CUDA graph, replayed per call (--graphs)
LADDER_KERNELS = ("naive", "fa1", "fa2_simt")  # seconds per call at 16k tokens: opt-in
DECODE_SEQLENS = [4096, 16384, 65536]  # cache lengths of the decode problems on the GPU


class Skip(Exception):
    """An implementation that does not run a problem, with the reason."""


class Result:
    """One implementation on one problem: the native row (_flashlab.bench.Row) under the
    sweep's name, "flashlab:<kernel>" or a peer's."""

    def __init__(self, impl: str, row):
        self.impl, self.row, self.problem, self.status = impl, row, row.problem, row.status
        self.decode = self.problem.decode

    def value(self) -> float:
        """TFLOP/s, or for a decode problem GB/s of K and V read; NaN when not timed."""
        if self.status not in ("ok", "unchecked"):
            return math.nan
        return self.row.gbps if self.decode else self.row.tflops


# ---- peers -----------------------------------------------------------------------------------
# Each maker returns run(set) -> {output name: tensor}, one call on input set `set`, or
# raises Skip. Inputs are torch views of the harness's buffers: {q, k, v[, dout]} per set.


def _scale(p) -> float:
    return 1.0 / math.sqrt(p.head_dim)


def _autograd_runner(forward: Callable, p, sets, context):
    """The forward alone, or the backward alone through autograd (one graph per input set,
    kept with retain_graph)."""
    import torch

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


def _first_line(e: Exception) -> str:
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

    context = contextlib.nullcontext
    if impl is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        context = lambda: sdpa_kernel(backend)  # noqa: E731
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
    return (" ".join(why) if why else _first_line(error))[:240]


def make_triton(p, sets):
    from flashlab import triton_fa2

    scale, causal = _scale(p), p.causal
    try:
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
        raise Skip(_first_line(e)) from None


def make_fa4(p, sets):
    """FlashAttention-4 (the flash_attn.cute package), forward alone or backward through
    autograd."""
    try:
        from flash_attn.cute.interface import flash_attn_func
    except ImportError as e:
        raise Skip(f"FlashAttention-4 (flash_attn.cute) is not importable: {e}") from None

    def forward(q, k, v):
        out = flash_attn_func(q, k, v, softmax_scale=_scale(p), causal=p.causal)
        return out[0] if isinstance(out, tuple) else out

    try:
        run = _autograd_runner(forward, p, sets, contextlib.nullcontext)
        run(0)
        return run
    except (RuntimeError, ValueError, AssertionError, NotImplementedError) as e:
        raise Skip(_first_line(e)) from None


def make_decode_sdpa(impl: Optional[str], p, sets):
    """PyTorch SDPA on a decode problem: [B, H, S, D] copies of q and of the keys and values
    the cache holds (dense_kv), made before timing; enable_gqa where the backend takes it,
    else K and V expanded to heads_q (the row's bytes stay those of the un-expanded K+V)."""
    import torch
    import torch.nn.functional as F

    if p.causal and p.seqlen_q > 1:
        raise Skip("SDPA's is_causal is top-left aligned when seqlen_q != seqlen_k")
    context = contextlib.nullcontext
    if impl is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        context = lambda: sdpa_kernel(backend)  # noqa: E731
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
            raise Skip(f"not capturable in a CUDA graph: {_first_line(e)}") from None
    if impl.startswith("flashlab:"):  # an entry the native harness does not run (+rotary)
        return _bench_decode.flashlab_runner(impl.split(":", 1)[1], p, sets)
    if p.decode:
        return make_decode_sdpa(None if impl == "sdpa_cpu" else impl, p, sets)
    if impl == "triton_fa2":
        return make_triton(p, sets)
    if impl == "fa4":
        return make_fa4(p, sets)
    return make_sdpa(None if impl == "sdpa_cpu" else impl, p, sets)


# ---- the sweep -------------------------------------------------------------------------------


def fa4_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None and \
        importlib.util.find_spec("flash_attn.cute") is not None


def gpu_impls(args, backward: bool, decode: bool = False) -> List[str]:
    names = {k["name"]: k for k in flashlab.kernels() if k["arch"] != "cpu"}
    if decode:
        ours = [k for k in args.kernels or ["auto"] if k == "auto" or names.get(k, {}).get("kvcache")]
        ours += [k + _bench_decode.ROTARY for k in ours] if args.rotary else []
        impls = [f"flashlab:{k}" for k in ours] + [q for q in DECODE_PEERS if q in (args.peers or DECODE_PEERS)]
        return impls + ([i + GRAPH for i in impls] if args.graphs else [])
    if args.kernels:
        chosen = [k for k in args.kernels if k == "auto" or k in names]
    elif backward:
        chosen = ["auto"] + [n for n, k in names.items() if k["backward"]]
    else:
        chosen = ["auto", "fa2_mma"] + (list(LADDER_KERNELS) if args.ladder else [])
    want = "backward" if backward else "forward"
    ours = [k for k in dict.fromkeys(chosen) if k == "auto" or names.get(k, {}).get(want)]
    default = [q for q in GPU_PEERS if q != "fa4" or fa4_importable()]
    return [f"flashlab:{k}" for k in ours] + [q for q in GPU_PEERS if q in (args.peers or default)]


def cpu_impls(args) -> List[str]:
    kernels = args.kernels or ["cpu_flash", "cpu_reference"]
    kernels += [k + _bench_decode.ROTARY for k in kernels] if args.decode and args.rotary else []
    return [f"flashlab:{k}" for k in kernels] + [q for q in CPU_PEERS if q in (args.peers or CPU_PEERS)]


def decode_problems(args, seqlens: List[int]) -> List[object]:
    out = native.decode_problems(seqlens, args.batch, args.dtype, args.device, args.heads,
                                 args.heads_kv or args.heads, args.hdim, args.seqlen or 1, args.page_size,
                                 args.append)
    for p in out:
        p.causal = args.causal_list == [True]
    return out


def problems(args) -> List[object]:
    if args.decode:
        out = decode_problems(args, args.seqlens)
    elif args.device == "cuda":
        out = native.sweep_problems(args.hdims, args.seqlens, args.causal_list,
                                    "fwd" in args.directions, "bwd" in args.directions,
                                    args.dtype, "cuda")
        if args.quick:  # the decode problems at their defaults
            out += native.decode_problems(DECODE_SEQLENS, 1, args.dtype, "cuda")
    else:
        out = []  # the CPU shape, at each of --seqlens (default: --seqlen alone)
        for seqlen, causal, direction in itertools.product(args.seqlens, args.causal_list,
                                                           args.directions):
            p = native.Problem()
            p.batch, p.heads_q, p.heads_kv = args.batch, args.heads, args.heads_kv or args.heads
            p.seqlen_q, p.seqlen_k = seqlen, args.seqlen_k or seqlen
            p.head_dim = p.head_dim_v = args.hdim
            p.dtype, p.device, p.causal, p.backward = args.dtype, "cpu", causal, direction == "bwd"
            out.append(p)
    for p in out:
        p.quadratic_workspace_limit = int(args.quadratic_limit * 2**30)
    return out


def input_sets(bench):
    """The harness's input sets as torch tensors (zero copy), or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    names = ("q", "k", "v", "dout", "k_new", "v_new", "cache_seqlens", "block_table")
    return [{n: x for n in names if (x := bench.input(i, n)) is not None}
            for i in range(bench.set_count)]


def prepare(bench, impl: str, p, sets) -> object:
    """The entry of one implementation: checked, ready to time (or refused, with the reason)."""
    if impl.startswith("flashlab:") and not impl.endswith(GRAPH) and _bench_decode.ROTARY not in impl:
        return bench.add_kernel(impl.split(":", 1)[1])
    if sets is None:
        return bench.refused(impl, "torch is not installed")
    try:
        run = make_peer(impl, p, sets)
    except Skip as e:
        return bench.refused(impl, str(e))
    except Exception as e:  # a crash of one peer is reported, not fatal to the sweep
        return bench.refused(impl, f"{type(e).__name__}: {_first_line(e)}", True)
    return bench.add(impl, run)


def timing_options(args):
    t = native.TimingOptions()
    t.warmup, t.iters, t.rounds = args.warmup, args.iters, args.rounds
    t.warmup_ms, t.budget_ms = args.warmup_ms, args.budget * 1e3
    return t


def spin_up_gpu(seconds: float) -> None:
    """Matrix products for `seconds`, so that the first entry of the sweep does not run on
    idle clocks."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


def sweep_stream(device: str):
    """(context, handle): the stream of every call of a sweep. CUDA: a stream of its own,
    made torch's current stream by the context and given to each native Bench, so that the
    peers (which launch on torch's current stream), the registry kernels and the harness's
    events, fills and waits are in one order. Not torch's default stream: its handle is 0,
    which Bench takes for "make a stream of your own", and that stream (non-blocking) would
    neither wait for a peer's work before the check reads its outputs nor hold it between
    the events that time it. CPU: no stream (0)."""
    if device != "cuda":
        return contextlib.nullcontext(), 0
    import torch

    stream = torch.cuda.Stream()
    return torch.cuda.stream(stream), stream.cuda_stream


def run(args, footer: Dict[str, str]) -> List[Result]:
    """Every problem: a native Bench on it, its entries checked, then timed (each alone, or
    with --rounds in alternating turns), all on sweep_stream's stream."""
    context, stream = sweep_stream(args.device)
    with context:
        return _run(args, footer, stream)


def _run(args, footer: Dict[str, str], stream: int) -> List[Result]:
    if args.device == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        if args.spin_up > 0:
            spin_up_gpu(args.spin_up)
    work = [(p, gpu_impls(args, p.backward, p.decode) if args.device == "cuda" else cpu_impls(args))
            for p in problems(args)]
    progress = native.Progress(not args.no_progress, sum(len(i) for _, i in work))
    results: List[Result] = []
    for p, impls in work:
        bench = native.Bench(p, timing_options(args), args.seed, args.threads, True,
                             args.check_gflops, stream, not args.no_progress and args.device == "cpu")
        sets = input_sets(bench)
        turns = []  # --rounds: every entry checked first, then timed in turns
        for impl in impls:
            entry = prepare(bench, impl, p, sets)
            if args.rounds > 1:
                turns.append((impl, entry))
            else:  # timed alone; its launch (and what it holds) goes before the next
                bench.time([entry])
                results.append(Result(impl, entry.row))
            del entry
            progress.step(f"{'bwd' if p.backward else 'dec' if p.decode else 'fwd'} {p.shape} {p.mask} {impl}")
        if turns:
            bench.time([e for _, e in turns])
            results += [Result(impl, e.row) for impl, e in turns]
        footer.setdefault("device", bench.describe()["device"])
        footer.setdefault("timing", bench.describe()["timing"])
        del turns, sets, bench
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return results


# ---- output (the tables, files and plots: flashlab._bench_report) -------------------------------


def describe(args, footer: Dict[str, str]) -> str:
    parts = [f"flashlab.bench on {platform.node() or 'this machine'}", footer.get("device", "")]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
        if args.device == "cuda":
            parts.append(f"cuDNN {torch.backends.cudnn.version()}")
    except ImportError:
        parts.append("torch not installed")
    spin = f"{args.spin_up:g} s spin-up; " if args.device == "cuda" else ""
    return (f"## {', '.join(x for x in parts if x)}\n\n{args.dtype}; {spin}timing: "
            f"{footer.get('timing', '')}; every entry checked against cpu_reference in fp64 "
            "first (docs/BENCHMARK.md).")


# ---- command line ----------------------------------------------------------------------------


def _ints(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def _names(text: str) -> List[str]:
    return [k for k in text.split(",") if k]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashlab.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="short preset, fewer and shorter runs. GPU: head dim 64,128,256 x seqlen "
                        "1k,4k,16k (or --seqlens), and the decode sweep. CPU: the CPU shape "
                        "as given (--seqlen or --seqlens), without decode")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when torch sees one")
    p.add_argument("--hdims", type=_ints, default=[64, 128, 256])
    p.add_argument("--seqlens", type=_ints,
                   help="GPU: the sweep's seqlens (default 512,1k,2k,4k,8k,16k). CPU: one problem "
                        "per seqlen on the CPU shape, in place of --seqlen")
    p.add_argument("--causal", choices=("0", "1", "both"), default="both")
    p.add_argument("--direction", choices=("fwd", "bwd", "both"))
    p.add_argument("--decode", action="store_true",
                   help="the KV-cache call (forward_kvcache) instead of the sweep: --seqlens are "
                        "the cache lengths (GPU default 4k,16k,64k; CPU 1k,4k), --seqlen the "
                        "query rows [1], --batch/--heads/--heads-kv/--hdim the shape (GPU "
                        "default 1 x 32/8 heads x 128, CPU 1 x 8/2 x 128); GB/s of K+V read")
    p.add_argument("--page-size", type=int, default=0,
                   help="--decode: a paged cache of this many rows per page, shuffled in the "
                        "pool (0: contiguous)")
    p.add_argument("--append", type=int, default=0,
                   help="--decode: rows each call appends (k_new/v_new); it still attends to "
                        "the cache length")
    p.add_argument("--rotary", action="store_true",
                   help="--decode with --append: also each FlashLab entry with rotary "
                        "(<entry>+rotary, through flash_attn_with_kvcache; identity tables, so "
                        "the outputs check as without, at the cost of any angles)")
    p.add_argument("--graphs", action="store_true",
                   help="--decode on the GPU: also each implementation captured in a CUDA graph "
                        "(name@graph), its time without Python's per-call overhead")
    p.add_argument("--kernels", type=_names,
                   help="FlashLab kernels to run (comma-separated registry names, or auto)")
    p.add_argument("--peers", type=_names,
                   help="the peers to time (comma-separated, of " + ", ".join(GPU_PEERS + CPU_PEERS)
                        + "; default all that can run). With one peer and --rounds, the sweep "
                        "alternates the two")
    p.add_argument("--ladder", action="store_true", help="add naive, fa1, fa2_simt (slow)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--iters", type=int, default=20, help="timed calls (at most)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per entry (at least)")
    p.add_argument("--warmup-ms", type=float, default=100.0,
                   help="warm-up calls per entry last at least this long")
    p.add_argument("--spin-up", type=float, default=1.0,
                   help="GPU: seconds of matrix products before the sweep (0: none)")
    p.add_argument("--budget", type=float, default=3.0,
                   help="seconds per entry; a slow call means fewer timed calls")
    p.add_argument("--rounds", type=int, default=1,
                   help="time each problem's entries in this many alternating rounds (the order "
                        "rotated each round), each entry's time the median of its rounds' "
                        "medians; 1: each entry timed alone, one after the other")
    p.add_argument("--check-gflops", type=float, default=4.0,
                   help="the fp64 reference's budget per problem; larger ones are checked on a slice")
    p.add_argument("--quadratic-limit", type=float, default=4.0,
                   help="GiB of O(seqlen^2) workspace the naive rung may take")
    p.add_argument("--csv"), p.add_argument("--json"), p.add_argument("--plots")  # one file each
    p.add_argument("--out", help="folder for bench.md, bench.csv, bench.json and plots/")
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("CPU shape (--device cpu)")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--heads", type=int, help="default 8 (--decode on the GPU: 32)")
    g.add_argument("--heads-kv", type=int, help="default --heads (--decode: 8 on the GPU, 2 on the CPU)")
    g.add_argument("--seqlen", type=int, help="default 4096")
    g.add_argument("--seqlen-k", type=int)
    g.add_argument("--hdim", type=int, default=128)
    g.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    g.add_argument("--seed", type=int, help="seed of the random inputs (default: a fresh one)")
    args = p.parse_args(argv)
    unknown = [k for k in args.peers or [] if k not in GPU_PEERS + CPU_PEERS]
    if unknown:
        p.error(f"--peers: unknown {', '.join(unknown)} (the peers: {', '.join(GPU_PEERS + CPU_PEERS)})")
    if args.device is None:
        args.device = "cuda" if _cuda_ready() else "cpu"
    if args.device == "cuda" and not _cuda_ready():
        p.error("--device cuda: torch sees no CUDA device, or this flashlab build has no CUDA")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.causal_list = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    args.direction = args.direction or ("both" if args.device == "cuda" else "fwd")
    args.directions = ["fwd", "bwd"] if args.direction == "both" else [args.direction]
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(8), "little")
    cuda = args.device == "cuda"
    if not args.decode and (args.page_size or args.append or args.graphs or args.rotary):
        p.error("--page-size, --append, --rotary and --graphs belong to --decode")
    if args.rotary and args.append < 1:
        p.error("--rotary rotates the appended keys: give --append 1 (or more)")
    if args.graphs and not cuda:
        p.error("--graphs captures CUDA graphs: it needs --device cuda")
    if args.decode and args.heads is None:
        args.heads, args.heads_kv = (32, args.heads_kv or 8) if cuda else (8, args.heads_kv or 2)
    args.heads = args.heads or 8
    if args.decode:
        args.seqlens = args.seqlens or (DECODE_SEQLENS if cuda else [1024, 4096])
    elif args.device == "cpu":
        if args.seqlens and args.seqlen:
            p.error("--seqlen and --seqlens: give one (on the CPU, --seqlens takes the place of --seqlen)")
        args.seqlens = args.seqlens or [args.seqlen or 4096]
    elif not args.seqlens:
        args.seqlens = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    if args.quick:
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
    footer: Dict[str, str] = {}
    results = run(args, footer)
    table = write_outputs(results, describe(args, footer), args)
    print(table)
    print(f"({len(results)} entries in {time.perf_counter() - t0:.0f} s, seed {args.seed}"
          + (f"; files in {args.out}" if args.out else "") + ")")
    return 1 if any(r.status in ("FAIL", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
