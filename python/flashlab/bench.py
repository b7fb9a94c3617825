"""`python -m flashlab.bench`: FlashLab next to its peers, in one process, on the same inputs.

The harness is native (include/flashlab/bench.h, as _flashlab.bench): it plans the problems,
owns the input sets, checks every implementation against cpu_reference in fp64 before timing
it, times every call with one method and counts the FLOPs. This module runs the sweep with
the peers (flashlab._bench_peers) and writes the tables. GPU: FlashLab kernels, the Triton
rung (flashlab.triton_fa2), PyTorch SDPA's flash and cuDNN backends and FlashAttention-4
(flash_attn.cute) when importable, over head dim x seqlen at 16k tokens and hidden 2048,
causal and not, forward and backward (--quick adds decode problems). --direction train: a
training step per call instead, the forward through autograd then torch.autograd.grad of
its output, for every implementation, FlashLab's through flashlab.flash_attn_func (the
torch ops a model's step calls). CPU (--device cpu):
cpu_flash and cpu_reference next to PyTorch's CPU SDPA on one shape, at --seqlen or at each
of --seqlens. --decode: the KV-cache call (forward_kvcache, one query token against a full
cache at each of --seqlens, paged with --page-size) next to SDPA on [B, H, S, D] copies of
the same keys and values, judged by GB/s of K and V read; --graphs adds each implementation
captured in a CUDA graph. --varlen LO-HI: a packed batch of documents of LO to HI tokens in
place of the seqlens, FlashAttention-4's varlen call its one peer. Outputs
(flashlab._bench_report): a markdown table (stdout and OUT/bench.md), OUT/bench.csv,
OUT/bench.json and OUT/plots/*.png (with matplotlib, for a pass at two or more seqlens;
otherwise one line on stderr says why none was written).
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
from typing import Dict, List

import flashlab
from flashlab import _bench_decode, _flashlab
from flashlab._bench_peers import GRAPH, SDPA_BACKENDS, Skip, first_line, make_peer, refusal
from flashlab._bench_report import direction, write_outputs

native = _flashlab.bench

GPU_PEERS = ("triton_fa2",) + tuple(SDPA_BACKENDS) + ("fa4",)  # the sweep's order
CPU_PEERS = ("sdpa_cpu",)
DECODE_PEERS = tuple(SDPA_BACKENDS)  # --decode on the GPU; the CPU's is sdpa_cpu
LADDER_KERNELS = ("naive", "fa1", "fa2_simt")  # seconds per call at 16k tokens: opt-in
DECODE_SEQLENS = [4096, 16384, 65536]  # cache lengths of the decode problems on the GPU
VARLEN_SEED = 0  # --varlen: the documents' lengths are the same in every run


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


# ---- the sweep -------------------------------------------------------------------------------


def fa4_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None and \
        importlib.util.find_spec("flash_attn.cute") is not None


def gpu_impls(args, backward: bool, decode: bool = False) -> List[str]:
    names = {k["name"]: k for k in flashlab.kernels() if k["arch"] != "cpu"}
    if decode:
        ours = [k for k in args.kernels or ["auto"] if k == "auto" or names.get(k, {}).get("kvcache")]
        ours += [k + _bench_decode.ROTARY for k in ours] if args.rotary else []
        ours += [k + _bench_decode.CACHED for k in ours if not k.endswith(_bench_decode.ROTARY)] if args.append else []
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
    kernels += [k + _bench_decode.CACHED for k in kernels if not k.endswith(_bench_decode.ROTARY)] if args.decode and args.append else []
    return [f"flashlab:{k}" for k in kernels] + [q for q in CPU_PEERS if q in (args.peers or CPU_PEERS)]


def decode_problems(args, seqlens: List[int]) -> List[object]:
    out = native.decode_problems(seqlens, args.batch, args.dtype, args.device, args.heads,
                                 args.heads_kv or args.heads, args.hdim, args.seqlen or 1, args.page_size,
                                 args.append)
    for p in out:
        p.causal = args.causal_list == [True]
    return out


def documents(args, tokens: int) -> List[int]:
    """--varlen LO-HI: the lengths of the documents that fill `tokens`."""
    return native.document_lengths(tokens, args.varlen[0], args.varlen[1], VARLEN_SEED)


def problems(args) -> List[object]:
    if args.decode:
        out = decode_problems(args, args.seqlens)
    elif args.device == "cuda" and args.varlen:
        out = native.varlen_problems(args.hdims, args.causal_list, "fwd" in args.directions,
                                     "bwd" in args.directions, args.dtype, "cuda",
                                     documents(args, native.sweep_tokens()),
                                     train="train" in args.directions)
    elif args.device == "cuda":
        out = native.sweep_problems(args.hdims, args.seqlens, args.causal_list,
                                    "fwd" in args.directions, "bwd" in args.directions,
                                    args.dtype, "cuda", train="train" in args.directions)
        if args.quick:  # the decode problems at their defaults
            out += native.decode_problems(DECODE_SEQLENS, 1, args.dtype, "cuda")
    else:
        out = []  # the CPU shape, at each of --seqlens (default: --seqlen alone), or its tokens in documents
        for seqlen, causal, direction in itertools.product(args.seqlens, args.causal_list,
                                                           args.directions):
            p = native.Problem()
            p.batch, p.heads_q, p.heads_kv = args.batch, args.heads, args.heads_kv or args.heads
            p.seqlen_q, p.seqlen_k = seqlen, args.seqlen_k or seqlen
            p.head_dim = p.head_dim_v = args.hdim
            p.dtype, p.device, p.causal = args.dtype, "cpu", causal
            p.backward, p.train = direction == "bwd", direction == "train"
            if args.varlen:
                p.lengths = documents(args, seqlen)
            out.append(p)
    for p in out:
        p.quadratic_workspace_limit = int(args.quadratic_limit * 2**30)
    return out


def input_sets(bench):
    """The harness's input sets as torch tensors (zero copy), or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    names = ("q", "k", "v", "dout", "k_new", "v_new", "cache_seqlens", "block_table", "cu_seqlens")
    return [{n: x for n in names if (x := bench.input(i, n)) is not None}
            for i in range(bench.set_count)]


def native_entry(impl: str, p) -> bool:
    """Whether the native harness calls this entry itself: a FlashLab kernel's forward or
    backward. Its training step goes through flashlab.flash_attn_func and torch autograd,
    like the peers' (make_flashlab), as a model's step does."""
    return impl.startswith("flashlab:") and not impl.endswith(GRAPH) and \
        not impl.endswith((_bench_decode.ROTARY, _bench_decode.CACHED)) and not p.train


def prepare(bench, impl: str, p, sets) -> object:
    """The entry of one implementation: checked, ready to time (or refused, with the reason)."""
    if native_entry(impl, p):
        return bench.add_kernel(impl.split(":", 1)[1])
    if why := refusal(impl, p):
        return bench.refused(impl, why)
    if sets is None:
        return bench.refused(impl, "torch is not installed")
    try:
        run = make_peer(impl, p, sets)
    except Skip as e:
        return bench.refused(impl, str(e))
    except Exception as e:  # a crash of one peer is reported, not fatal to the sweep
        return bench.refused(impl, f"{type(e).__name__}: {first_line(e)}", True)
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
    # A training step's entries are the backward's: "auto" and the kernels with a backward.
    work = [(p, gpu_impls(args, p.backward or p.train, p.decode) if args.device == "cuda"
             else cpu_impls(args)) for p in problems(args)]
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
            progress.step(f"{'dec' if p.decode else direction(p)} {p.shape} {p.mask} {impl}")
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
    text = (f"## {', '.join(x for x in parts if x)}\n\n{args.dtype}; {spin}timing: "
            f"{footer.get('timing', '')}; every entry checked against cpu_reference in fp64 "
            "first (docs/BENCHMARK.md).")
    if args.varlen:
        tokens = [native.sweep_tokens()] if args.device == "cuda" else args.seqlens
        docs = "; ".join(f"{t} tokens in {', '.join(map(str, documents(args, t)))}" for t in tokens)
        text += (f"\n\nVarlen documents (lengths uniform in [{args.varlen[0]}, {args.varlen[1]}], "
                 f"seed {VARLEN_SEED}, the last cut to fill): {docs}.")
    if "train" in args.directions:
        text += ("\n\nTraining step: each call runs the forward through autograd, then "
                 "torch.autograd.grad(out, (q, k, v), dout); FlashLab's entries through "
                 "flashlab.flash_attn_func (kernel= for both passes); checked on out and dq/dk/dv; "
                 "FLOPs 3.5x the forward's.")
    return text


# ---- command line ----------------------------------------------------------------------------


def _ints(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def _names(text: str) -> List[str]:
    return [k for k in text.split(",") if k]


def _range(text: str) -> List[int]:
    lo, sep, hi = text.partition("-")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit() or not 1 <= int(lo) <= int(hi):
        raise argparse.ArgumentTypeError(f"LO-HI with 1 <= LO <= HI, got '{text}'")
    return [int(lo), int(hi)]


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
    p.add_argument("--direction", choices=("fwd", "bwd", "both", "train"),
                   help="fwd, bwd, both (fwd and bwd rows; the GPU default; CPU: fwd), or "
                        "train: one training step per call, the forward through autograd then "
                        "torch.autograd.grad(out, (q, k, v), dout), 3.5x the forward's FLOPs")
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
                        "the cache length. Each FlashLab entry also runs as <entry>+cached: the "
                        "same keys with the new rows written into the cache beforehand and none "
                        "appended (the plain decode an append's cost is read against)")
    p.add_argument("--rotary", action="store_true",
                   help="--decode with --append: also each FlashLab entry with rotary "
                        "(<entry>+rotary, through flash_attn_with_kvcache; identity tables, so "
                        "the outputs check as without, at the cost of any angles)")
    p.add_argument("--graphs", action="store_true",
                   help="--decode on the GPU: also each implementation captured in a CUDA graph "
                        "(name@graph), its time without Python's per-call overhead")
    p.add_argument("--varlen", type=_range, metavar="LO-HI",
                   help="a packed varlen batch instead of the sweep's seqlens: documents of LO to "
                        "HI tokens (uniform, a fixed seed, the last cut to fill) filling the tokens, "
                        "causal as --causal. GPU: 16k tokens, one problem per head dim, mask and "
                        "direction at hidden 2048; CPU: --seqlen (or each of --seqlens) tokens on "
                        "the CPU shape. Peers without a varlen entry (SDPA, triton_fa2) say so")
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
    if args.varlen and (args.decode or args.seqlen_k):
        p.error("--varlen: queries and keys share the documents (no --seqlen-k), and decode has none")
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
