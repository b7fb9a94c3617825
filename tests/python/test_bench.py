"""The peer benchmark (python -m flashlab.bench) over the native harness, on the CPU: the
run plan, alternating rounds of Python callables, the fp64 check of a peer's outputs, the
FLOP formula, the choice of peers, and a whole run. No GPU and no torch needed, but for the
last test (marker `cuda`): the check and the timer wait for a peer's GPU work."""

from __future__ import annotations

import contextlib
import json
import sys
import types
from unittest import mock

import numpy as np
import pytest

from flashlab import bench

native = bench.native


def _timing(warmup=5, iters=20, budget_ms=1000.0, rounds=1, warmup_ms=0.0):
    t = native.TimingOptions()
    t.warmup, t.iters, t.budget_ms, t.rounds, t.warmup_ms = warmup, iters, budget_ms, rounds, warmup_ms
    return t


def _problem(batch=1, heads=2, heads_kv=None, seqlen=48, seqlen_k=None, hdim=16, causal=False):
    p = native.Problem()
    p.batch, p.heads_q, p.heads_kv = batch, heads, heads_kv or heads
    p.seqlen_q, p.seqlen_k = seqlen, seqlen_k or seqlen
    p.head_dim = p.head_dim_v = hdim
    p.dtype, p.device, p.causal = "fp32", "cpu", causal
    return p


def _bench(p, check=True, **timing):
    return native.Bench(p, _timing(**timing), seed=11, threads=1, check=check)


def test_plan_runs_fits_the_budget():
    t = _timing(warmup=5, iters=20, budget_ms=3000.0)
    assert native.plan_runs(3500.0, t) == (0, 1)  # over budget: one timed call, no warm-up
    assert native.plan_runs(500.0, t) == (1, 6)  # six calls fit; warm-up a quarter of them
    assert native.plan_runs(0.01, t) == (5, 20)


def test_rounds_alternate_the_entries_and_take_the_median_of_their_medians():
    b = _bench(_problem(), check=False, warmup=1, iters=3, rounds=4)
    calls = []

    def peer(name):
        def run(i):
            calls.append(name)
            return {}
        return run

    entries = [b.add(name, peer(name)) for name in "abc"]
    assert [e.row.status for e in entries] == ["unchecked"] * 3
    b.time(entries)
    turns = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
    assert "".join(turns) == "abc" + "abc" "bca" "cab" "abc"  # checked calls, then 4 rounds
    for e in entries:
        row = e.row
        assert len(row.round_ms) == 4 and row.timed_runs == 12 and row.warmup_runs == 4
        assert row.time_ms == native.median(row.round_ms)


def _attention(q, k, v, causal):
    """Textbook attention in float64, [B, S, H, D] (bottom-right causal)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None] + sk - sq, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("spoil, status, reason", [
    (None, "ok", ""),
    (lambda o: o.__setitem__((0, 5, 1, 3), o[0, 5, 1, 3] + 1e-3), "FAIL", "out: error"),
    (lambda o: o.__setitem__((0, 0, 0, 0), np.nan), "FAIL", "out: 1 of"),
])
def test_a_peer_is_checked_against_the_fp64_reference(spoil, status, reason):
    p = _problem(batch=2, heads=4, heads_kv=2, seqlen=40, seqlen_k=56, causal=True)
    b = _bench(p)
    q, k, v = (b.input(0, n, "numpy") for n in "qkv")

    def run(i):
        out = _attention(q, k, v, True).astype(np.float32)
        if spoil:
            spoil(out)
        return {"out": out}

    e = b.add("numpy", run)
    assert e.row.status == status and reason in e.row.reason
    assert e.timed == (status == "ok")
    if status == "ok":
        assert e.row.errors["out"] < 1e-6


def test_a_peer_that_raises_is_an_error_row():
    b = _bench(_problem())

    def run(i):
        raise RuntimeError("no kernel for this shape\nmore")

    e = b.add("broken", run)
    assert e.row.status == "error" and e.row.reason == "RuntimeError: no kernel for this shape"
    assert not e.timed


def test_flops_are_the_native_formula():
    p = _problem(batch=2, heads=3, seqlen=64, seqlen_k=96, hdim=32)
    assert p.flops == 4 * 2 * 3 * 64 * 96 * 32
    p.causal = True
    p.seqlen_k = 64
    assert p.flops == 2 * 3 * 2 * (32 + 32) * (64 * 65 // 2)
    p.backward = True
    assert p.flops == 2.5 * 2 * 3 * 2 * 64 * (64 * 65 // 2)


def test_the_sweep_keeps_tokens_and_hidden_size():
    ps = native.sweep_problems([64, 128], [1024, 16384], [False, True], True, True, "bf16", "cuda")
    assert len(ps) == 2 * 2 * 2 * 2
    assert {(p.batch, p.heads_q, p.seqlen_q) for p in ps if p.head_dim == 128} == {(16, 16, 1024), (1, 16, 16384)}
    assert [p.backward for p in ps[:2]] == [False, True]


def test_peers_restrict_the_gpu_entries_in_the_sweeps_order():
    args = bench.parse_args(["--device", "cpu", "--kernels", "fa2_mma", "--peers",
                             "sdpa_cudnn,triton_fa2"])
    peers = [i for i in bench.gpu_impls(args, False) if not i.startswith("flashlab:")]
    assert peers == ["triton_fa2", "sdpa_cudnn"]
    args = bench.parse_args(["--device", "cpu", "--kernels", "fa2_mma"])
    peers = [i for i in bench.gpu_impls(args, False) if not i.startswith("flashlab:")]
    assert peers == [q for q in bench.GPU_PEERS if q != "fa4" or bench.fa4_importable()]


def test_an_unknown_peer_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--peers", "sdpa_cudnn,cudnn"])
    assert "--peers: unknown cudnn" in capsys.readouterr().err


def test_a_cpu_run_checks_and_times_every_entry(tmp_path, capsys):
    rc = bench.main(["--device", "cpu", "--heads", "2", "--seqlen", "64", "--hdim", "16",
                     "--direction", "both", "--causal", "1", "--budget", "0.1", "--warmup-ms", "0",
                     "--threads", "1", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "### forward (TFLOP/s)" in table and "### backward (TFLOP/s)" in table
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    ours = [r for r in recs if r["impl"].startswith("flashlab:")]
    assert len(ours) == 4 and all(r["status"] == "ok" and r["tflops"] > 0 for r in ours)


_TINY = ["--device", "cpu", "--heads", "2", "--hdim", "16", "--causal", "0", "--budget", "0.05",
         "--warmup-ms", "0", "--threads", "1", "--no-progress"]


def test_the_cpu_plan_takes_seqlens():
    def seqlens(*argv):
        return [(p.seqlen_q, p.seqlen_k) for p in bench.problems(bench.parse_args(_TINY + list(argv)))]

    assert seqlens() == [(4096, 4096)]
    assert seqlens("--seqlen", "100") == [(100, 100)]
    assert seqlens("--seqlens", "32,64") == [(32, 32), (64, 64)]
    assert seqlens("--seqlens", "1k,2k", "--seqlen-k", "80") == [(1024, 80), (2048, 80)]
    assert seqlens("--seqlens", "32,64", "--direction", "both", "--causal", "both") == \
        [(32, 32)] * 4 + [(64, 64)] * 4


def test_seqlen_and_seqlens_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(_TINY + ["--seqlen", "64", "--seqlens", "32,64"])
    assert "--seqlen and --seqlens: give one" in capsys.readouterr().err


def test_quick_on_the_cpu_keeps_the_cpu_shape_with_fewer_runs():
    args = bench.parse_args(["--device", "cpu", "--quick"])
    assert args.seqlens == [4096] and not args.decode
    assert (args.iters, args.warmup, args.budget) == (10, 2, 1.0)
    assert bench.parse_args(["--device", "cpu", "--quick", "--seqlens", "64,128"]).seqlens == [64, 128]


def test_the_quick_help_says_what_runs_on_each_device(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    quick = text[text.index("--quick short preset"):text.index("--device {cuda,cpu} default")]
    assert "GPU: head dim 64,128,256 x seqlen 1k,4k,16k" in quick and "decode" in quick
    assert "CPU: the CPU shape as given (--seqlen or --seqlens)" in quick


def test_a_cpu_run_over_seqlens_times_each_one(tmp_path, capsys):
    with mock.patch.dict(sys.modules, {"matplotlib": None}):  # import matplotlib fails
        rc = bench.main(_TINY + ["--seqlens", "32,48", "--out", str(tmp_path)])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "| 1x32x2x16 | no |" in out and "| 1x48x2x16 | no |" in out
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    ours = [(r["impl"], r["seqlen_q"]) for r in recs if r["impl"].startswith("flashlab:")]
    assert sorted(ours) == [(f"flashlab:{k}", s) for k in ("cpu_flash", "cpu_reference") for s in (32, 48)]
    assert all(r["status"] == "ok" for r in recs if r["impl"].startswith("flashlab:"))
    assert err.count("plots: matplotlib is not installed; no PNG written\n") == 1


def test_without_matplotlib_a_run_says_no_plot_was_written(capsys):
    with mock.patch.dict(sys.modules, {"matplotlib": None}):
        assert bench.main(_TINY + ["--seqlen", "32"]) == 0  # no --out either
    assert capsys.readouterr().err.count("plots: matplotlib is not installed; no PNG written") == 1


def _fake_matplotlib():
    """matplotlib and its pyplot as mocks: what the plot draws, without drawing it."""
    plt = mock.MagicMock()
    ax = mock.MagicMock()
    ax.get_legend_handles_labels.return_value = ([], [])
    fig = mock.MagicMock()
    axes = np.empty((1, 1), dtype=object)  # what subplots(squeeze=False) gives for one panel
    axes[0, 0] = ax
    plt.subplots.return_value = (fig, axes)
    mpl = types.ModuleType("matplotlib")
    mpl.use, mpl.pyplot = (lambda backend: None), plt
    return {"matplotlib": mpl, "matplotlib.pyplot": plt}, fig, ax


def test_a_plot_is_written_per_pass_with_two_or_more_seqlens(tmp_path, capsys):
    modules, fig, ax = _fake_matplotlib()
    with mock.patch.dict(sys.modules, modules):
        assert bench.main(_TINY + ["--seqlens", "32,48", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"plots: {tmp_path / 'plots' / 'fwd.png'}\n" in err
    fig.savefig.assert_called_once_with(str(tmp_path / "plots" / "fwd.png"), dpi=110)
    assert {c.kwargs["label"] for c in ax.plot.call_args_list} >= {"cpu_flash", "cpu_reference"}
    assert ax.set.call_args.kwargs["xlabel"] == "seqlen"  # batch 1: the tokens change with seqlen
    assert "hidden 32" in fig.suptitle.call_args.args[0]


@pytest.mark.parametrize("argv, why", [
    (["--seqlen", "32", "--direction", "both"],
     "no fwd.png (one seqlen; a plot needs two or more, --seqlens); no bwd.png (one seqlen"),
    (["--seqlens", "32,48"], "plots: no PNG written (--out or --plots names the folder)"),
])
def test_a_run_without_a_plot_says_why(argv, why, tmp_path, capsys):
    modules, fig, _ = _fake_matplotlib()
    out = ["--out", str(tmp_path)] if "--seqlen" in argv else []
    with mock.patch.dict(sys.modules, modules):
        assert bench.main(_TINY + argv + out) == 0
    assert why in capsys.readouterr().err
    fig.savefig.assert_not_called()


# ---- --decode: the KV-cache call ----------------------------------------------------------------


def _decode_problem(page_size=16, append=1):
    p = native.decode_problems([40], 2, "fp32", "cpu", heads_q=4, heads_kv=2, head_dim=16,
                               page_size=page_size, seqlen_new=append)[0]
    assert p.decode and (p.seqlen_q, p.seqlen_k, p.page_size, p.seqlen_new) == (1, 40, page_size, append)
    return p


@pytest.mark.parametrize("table_in_pool_order", [False, True])
def test_a_decode_peer_is_checked_against_the_gathered_cache(table_in_pool_order):
    p = _decode_problem()
    b = _bench(p)
    s = {n: b.input(0, n, "numpy") for n in ("q", "k", "v", "k_new", "v_new", "cache_seqlens",
                                             "block_table")}
    assert s["block_table"].shape == (2, 3) and sorted(s["block_table"].ravel()) == list(range(6))
    assert list(s["cache_seqlens"]) == [39, 39]
    table = np.arange(6).reshape(2, 3) if table_in_pool_order else s["block_table"]
    k, v = (np.concatenate([c[table].reshape(2, 48, 2, 16)[:, :39], new], 1)
            for c, new in ((s["k"], s["k_new"]), (s["v"], s["v_new"])))

    e = b.add("numpy", lambda i: {"out": _attention(s["q"], k, v, False).astype(np.float32)})
    assert e.row.status == ("FAIL" if table_in_pool_order else "ok"), e.row.reason
    assert e.row.kv_bytes == 2 * 2 * 40 * 2 * 16 * 4


def test_a_cpu_decode_run_reports_gbps(tmp_path, capsys):
    rc = bench.main(["--device", "cpu", "--decode", "--seqlens", "64,200", "--heads", "4",
                     "--heads-kv", "2", "--hdim", "32", "--page-size", "16", "--append", "1",
                     "--budget", "0.05", "--warmup-ms", "0", "--threads", "1", "--no-progress",
                     "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "### decode forward (GB/s of K+V read)" in out
    assert "| 1x1x200x4/2x32 paged(16) append(1) | no |" in out
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    ours = [r for r in recs if r["impl"].startswith("flashlab:") and "+" not in r["impl"]]
    assert sorted((r["impl"], r["seqlen_k"]) for r in ours) == \
        [(f"flashlab:{k}", s) for k in ("cpu_flash", "cpu_reference") for s in (64, 200)]
    assert all(r["status"] == "ok" and r["gbps"] > 0 and r["decode"] for r in ours)
    # An appending run also times each kernel's plain decode of the same keys (through
    # torch: refused without it, and checked and timed in the torch test below).
    cached = [r for r in recs if r["impl"].endswith("+cached")]
    assert sorted(r["impl"] for r in cached) == \
        sorted(f"flashlab:{k}+cached" for k in ("cpu_flash", "cpu_reference") for _ in (64, 200))


def test_decode_flags_and_entries():
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--page-size", "16"])  # without --decode
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--decode", "--graphs"])  # graphs need CUDA
    args = bench.parse_args(["--device", "cpu", "--decode"])
    assert (args.heads, args.heads_kv, args.seqlens) == (8, 2, [1024, 4096])
    assert [(p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k) for p in bench.problems(args)] == \
        [(8, 2, 1, 1024), (8, 2, 1, 4096)]
    args.graphs = True
    assert bench.gpu_impls(args, False, True) == [
        "flashlab:auto", "sdpa_flash", "sdpa_cudnn",
        "flashlab:auto@graph", "sdpa_flash@graph", "sdpa_cudnn@graph"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--decode", "--rotary"])  # rotary needs --append
    args.rotary = True
    assert bench.gpu_impls(args, False, True)[:2] == ["flashlab:auto", "flashlab:auto+rotary"]
    assert "flashlab:auto+rotary@graph" in bench.gpu_impls(args, False, True)


@pytest.mark.torch
def test_a_cpu_decode_run_with_rotary_checks_and_times_it_and_the_plain_decode(tmp_path, capsys):
    rc = bench.main(["--device", "cpu", "--decode", "--seqlens", "64", "--heads", "4",
                     "--heads-kv", "2", "--hdim", "32", "--page-size", "16", "--append", "1",
                     "--rotary", "--kernels", "cpu_flash", "--peers", "sdpa_cpu", "--budget",
                     "0.05", "--warmup-ms", "0", "--threads", "1", "--no-progress", "--out",
                     str(tmp_path)])
    assert rc == 0, capsys.readouterr().out
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    for entry in ("flashlab:cpu_flash+rotary", "flashlab:cpu_flash+cached"):
        rec = [r for r in recs if r["impl"] == entry]
        assert len(rec) == 1 and rec[0]["status"] == "ok" and rec[0]["gbps"] > 0, entry


# ---- CUDA: one stream for the harness and the peers ---------------------------------------------


class _Stop(Exception):
    pass


def _fake_torch():
    """torch's stream API as the sweep uses it: a current stream (at first the default one,
    handle 0, as torch reports it), Stream() and the stream(s) context that makes s current."""
    current = [types.SimpleNamespace(cuda_stream=0)]

    @contextlib.contextmanager
    def make_current(s):
        before, current[0] = current[0], s
        try:
            yield
        finally:
            current[0] = before

    cuda = types.SimpleNamespace(Stream=lambda: types.SimpleNamespace(cuda_stream=0x5EED),
                                 stream=make_current, current_stream=lambda device=None: current[0])
    backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace()))
    return types.SimpleNamespace(cuda=cuda, backends=backends), current


def test_a_cuda_sweep_gives_the_harness_the_stream_its_peers_launch_on():
    """The peers launch on torch's current stream; the harness must time and wait on that one.
    Handed torch's default stream (0), Bench made a non-blocking stream of its own, and the
    check read a peer's outputs before its kernels had run."""
    torch, current = _fake_torch()
    seen = []

    class Native:
        def __getattr__(self, name):
            return getattr(native, name)

        def Bench(self, p, timing, seed, threads, check, check_gflops, stream, progress):
            seen.append((stream, current[0].cuda_stream))
            raise _Stop

    args = bench.parse_args(["--device", "cpu", "--decode", "--seqlens", "64", "--spin-up", "0",
                             "--no-progress"])
    args.device = "cuda"
    with mock.patch.dict(sys.modules, {"torch": torch}), mock.patch.object(bench, "native", Native()):
        with pytest.raises(_Stop):
            bench.run(args, {})
    assert seen == [(0x5EED, 0x5EED)]
    assert current[0].cuda_stream == 0  # the sweep's stream is current only during the sweep


def test_a_graphed_entry_keeps_alive_what_its_graphs_read():
    """A captured graph holds raw pointers to what the runner allocated outside it (a rotary
    entry's tables, held by the runner's closure): the replay must keep the runner, or
    torch's allocator hands that memory on while the graphs still read it."""
    import gc
    import weakref

    from flashlab import _bench_decode

    class Graph:
        def replay(self):
            pass

    cuda = types.SimpleNamespace(synchronize=lambda: None, CUDAGraph=Graph,
                                 graph=lambda g: contextlib.nullcontext())
    torch = types.SimpleNamespace(cuda=cuda)

    class Tables:  # stands for the tensors a runner allocates once, outside the graphs
        pass

    def make_run():
        tables = Tables()

        def run(i):
            return {"out": i if tables else None}
        return run, weakref.ref(tables)

    run, tables = make_run()
    with mock.patch.dict(sys.modules, {"torch": torch}):
        replay = _bench_decode.graphed(run, 2)
    del run
    gc.collect()
    assert tables() is not None
    assert replay(1)["out"] == 1
    del replay
    gc.collect()
    assert tables() is None


@pytest.mark.cuda
def test_the_check_and_the_timer_wait_for_a_peers_gpu_work():
    """A peer whose output is written ~20 ms of GPU time after its call returns: the check
    must read what it wrote, and its time must hold that wait."""
    import torch

    from flashlab import _bench_decode

    cycles = 40_000_000
    context, stream = bench.sweep_stream("cuda")
    with context:
        p = native.decode_problems([4096], 1, "bf16", "cuda", heads_q=8, heads_kv=2)[0]
        b = native.Bench(p, _timing(warmup=1, iters=5, budget_ms=2000.0), seed=11, threads=1,
                         check=True, check_gflops=4.0, stream=stream)
        sets = bench.input_sets(b)
        attend = _bench_decode.flashlab_runner("auto", p, sets)
        late = torch.full_like(sets[0]["q"], float("nan"))  # the peer's output, NaN until written
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        sleep_ms = start.elapsed_time(stop)

        def slow(i):
            out = attend(i)["out"]
            torch.cuda._sleep(cycles)
            late.copy_(out)
            return {"out": late}

        e = b.add("slow", slow)
        assert e.row.status == "ok", e.row.reason
        b.time([e])
        # _sleep counts cycles, and the H100's clock moves by up to a third between the
        # measurement above and the timed calls (measured: 29.6 ms, then 20.2 ms per call).
        # A timer that does not wait for the peer reads the attention alone, ~0.05 ms.
        assert e.row.status == "ok" and e.row.time_ms >= 0.5 * sleep_ms, (e.row.time_ms, sleep_ms)


# ---- --varlen: a packed batch of documents ------------------------------------------------------


def test_the_documents_are_fixed_and_fill_the_tokens():
    docs = native.document_lengths(16384, 100, 4000)
    assert docs == native.document_lengths(16384, 100, 4000, 0) != native.document_lengths(16384, 100, 4000, 1)
    assert sum(docs) == 16384 and all(100 <= n <= 4000 for n in docs[:-1]) and 1 <= docs[-1] <= 4000
    with pytest.raises(RuntimeError, match="1 <= lo <= hi"):
        native.document_lengths(100, 50, 10)


def test_varlen_problems_on_each_device():
    args = bench.parse_args(_TINY + ["--seqlens", "300,500", "--varlen", "20-120", "--direction", "both"])
    ps = bench.problems(args)
    assert [(sum(p.lengths), p.backward) for p in ps] == [(300, False), (300, True), (500, False), (500, True)]
    assert all(p.batch == len(p.lengths) and p.seqlen_q == p.seqlen_k == max(p.lengths) for p in ps)
    assert ps[0].lengths == bench.documents(args, 300) and ps[0].shape.startswith(f"varlen({ps[0].batch} docs, 300 tokens")
    args.device, args.hdims, args.causal_list = "cuda", [64, 128], [True]  # the GPU plan, built on any machine
    gpu = bench.problems(args)
    assert [(p.head_dim, p.heads_q, p.backward) for p in gpu] == [(64, 32, False), (64, 32, True),
                                                                  (128, 16, False), (128, 16, True)]
    assert all(sum(p.lengths) == native.sweep_tokens() == 16384 and p.causal and p.device == "cuda" for p in gpu)
    with pytest.raises(SystemExit):
        bench.parse_args(_TINY + ["--varlen", "120-20"])
    with pytest.raises(SystemExit):
        bench.parse_args(_TINY + ["--varlen", "20-120", "--decode"])


def test_every_peer_but_fa4_refuses_a_varlen_problem():
    p = _problem()
    p.lengths = [30, 18]
    for impl in ("sdpa_cpu", "sdpa_flash", "sdpa_cudnn", "triton_fa2", "sdpa_cudnn@graph"):
        with pytest.raises(bench.Skip, match="^no varlen entry$"):
            bench.make_peer(impl, p, [])
    assert bench.refusal("fa4", p) == "" and bench.refusal("flashlab:auto", p) == ""
    p.lengths = []
    assert bench.refusal("sdpa_cpu", p) == ""


def test_a_cpu_varlen_run_checks_cpu_flash_and_refuses_sdpa(tmp_path, capsys):
    rc = bench.main(_TINY + ["--seqlen", "300", "--varlen", "20-120", "--direction", "both", "--causal",
                             "1", "--kernels", "cpu_flash", "--peers", "sdpa_cpu", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    docs = bench.documents(bench.parse_args(_TINY + ["--varlen", "20-120"]), 300)
    assert f"300 tokens in {', '.join(map(str, docs))}." in out  # the documents, in the header
    assert f"| varlen({len(docs)} docs, 300 tokens, max {max(docs)})x2x16 | yes |" in out
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [(r["impl"], r["direction"], r["status"]) for r in recs] == [
        ("flashlab:cpu_flash", "fwd", "ok"), ("sdpa_cpu", "fwd", "unsupported"),
        ("flashlab:cpu_flash", "bwd", "ok"), ("sdpa_cpu", "bwd", "unsupported")]
    assert all(r["lengths"] == docs for r in recs)
    assert all(r["tflops"] > 0 for r in recs if r["status"] == "ok")
    assert {r["reason"] for r in recs if r["impl"] == "sdpa_cpu"} == {"no varlen entry"}


@pytest.mark.cuda
def test_a_gpu_varlen_run_checks_auto_and_fa4(tmp_path, capsys):
    rc = bench.main(["--device", "cuda", "--varlen", "100-1000", "--hdims", "128", "--causal", "1",
                     "--kernels", "auto", "--peers", "fa4,sdpa_cudnn", "--budget", "0.2",
                     "--no-progress", "--out", str(tmp_path)])
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert rc == 0, capsys.readouterr().out
    ours = [r for r in recs if r["impl"] == "flashlab:auto"]
    assert len(ours) == 2 and all(r["status"] == "ok" and r["tflops"] > 0 for r in ours)
    assert {r["reason"] for r in recs if r["impl"] == "sdpa_cudnn"} == {"no varlen entry"}
    fa4 = [r for r in recs if r["impl"] == "fa4"]
    assert all(r["status"] == "ok" or "not importable" in r["reason"] for r in fa4), fa4
