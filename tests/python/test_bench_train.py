"""--direction train of the peer benchmark (python -m flashlab.bench), on the CPU: a training
step per call (the forward through autograd, then torch.autograd.grad of its output with
dout) for every entry, FlashLab's through flashlab.flash_attn_func; 3.5x the forward's
FLOPs; out and dq/dk/dv checked against the fp64 reference. Tests marked `torch` run real
torch CPU autograd."""

from __future__ import annotations

import contextlib
import json
import sys
from unittest import mock

import pytest
from test_bench import _fake_matplotlib  # the stand-in the other plot tests use

from flashlab import _bench_peers, bench

native = bench.native

_ARGS = ["--device", "cpu", "--heads", "4", "--heads-kv", "2", "--hdim", "16", "--budget", "0.05",
         "--warmup-ms", "0", "--threads", "1", "--no-progress", "--direction", "train"]


def _train_problem(seqlen=40, causal=True):
    p = native.Problem()
    p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k = 2, 4, 2, seqlen, seqlen
    p.head_dim = p.head_dim_v = 16
    p.dtype, p.device, p.causal, p.train = "fp32", "cpu", causal, True
    return p


def _forward_flops(p) -> float:
    f = native.Problem()
    for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "causal"):
        setattr(f, name, getattr(p, name))
    return f.flops


def test_a_train_problem_counts_three_and_a_half_forwards():
    for causal in (False, True):
        p = _train_problem(48, causal)
        assert p.train and not p.backward
        assert p.flops == 3.5 * _forward_flops(p)
        p.backward = True  # ignored by a training step
        assert p.flops == 3.5 * _forward_flops(p)


def test_the_train_direction_plans_train_problems_on_each_device():
    args = bench.parse_args(_ARGS + ["--seqlens", "32,64", "--causal", "both"])
    assert args.directions == ["train"]
    ps = bench.problems(args)
    assert [(p.seqlen_q, p.causal, p.train, p.backward) for p in ps] == [
        (32, False, True, False), (32, True, True, False), (64, False, True, False), (64, True, True, False)]
    args.device, args.hdims, args.seqlens = "cuda", [64, 128], [4096, 16384]  # the GPU plan, on any machine
    gpu = bench.problems(args)
    assert len(gpu) == 2 * 2 * 2 and all(p.train and not p.backward and p.device == "cuda" for p in gpu)
    assert {(p.head_dim, p.heads_q, p.batch, p.seqlen_q) for p in gpu} == {
        (64, 32, 4, 4096), (64, 32, 1, 16384), (128, 16, 4, 4096), (128, 16, 1, 16384)}
    varlen = bench.parse_args(_ARGS + ["--varlen", "100-1000"])
    varlen.device, varlen.hdims = "cuda", [128]
    assert [(p.train, sum(p.lengths)) for p in bench.problems(varlen)] == [(True, 16384)] * 2


def test_flashlab_trains_through_the_torch_function_not_the_native_harness():
    p = _train_problem()
    assert not bench.native_entry("flashlab:auto", p)
    p.train = False
    assert bench.native_entry("flashlab:auto", p)
    p.backward = True
    assert bench.native_entry("flashlab:cpu_flash", p)


def test_without_torch_every_train_row_says_so(capsys):
    with mock.patch.dict(sys.modules, {"torch": None, "matplotlib": None}):
        assert bench.main(_ARGS + ["--seqlen", "32", "--causal", "0"]) == 0
    out = capsys.readouterr().out
    assert "### training step (forward + backward) (TFLOP/s)" in out
    assert "flashlab:cpu_flash: torch is not installed" in out and "sdpa_cpu: torch is not installed" in out


# ---- real torch CPU autograd --------------------------------------------------------------------


def _bench(p):
    t = native.TimingOptions()
    t.warmup, t.iters, t.budget_ms, t.warmup_ms = 2, 3, 1000.0, 0.0
    return native.Bench(p, t, seed=5, threads=1, check=True)


@pytest.mark.torch
def test_every_call_of_flashlabs_entry_runs_the_forward_and_the_backward():
    from flashlab import _torch_ops

    calls = []

    def counted(name, op):
        def call(*args, **kwargs):
            calls.append(name)
            return op(*args, **kwargs)
        return call

    p = _train_problem()
    b = _bench(p)
    with mock.patch.object(_torch_ops, "fwd", counted("fwd", _torch_ops.fwd)), \
            mock.patch.object(_torch_ops, "bwd", counted("bwd", _torch_ops.bwd)):
        e = bench.prepare(b, "flashlab:cpu_flash", p, bench.input_sets(b))
        assert e.row.status == "ok", e.row.reason
        b.time([e])
    row = e.row
    assert set(row.errors) == {"out", "lse", "dq", "dk", "dv"}  # LSE too: flash_attn_func returns it
    assert row.errors["out"] < 1e-5 and max(row.errors[g] for g in ("dq", "dk", "dv")) < 1e-5
    n = 2 + row.warmup_runs + row.timed_runs  # the maker's first call and the checked one, then timed
    assert row.timed_runs >= 1 and calls == ["fwd", "bwd"] * n
    assert row.flops == 3.5 * _forward_flops(p)


@pytest.mark.torch
def test_a_wrong_gradient_alone_fails_a_train_row():
    """SDPA as a peer, and SDPA with q's gradient scaled by 1.01 on its way back: the same
    out, a wrong dq, and the second row fails on dq alone."""
    import torch
    import torch.nn.functional as F

    class SkewDq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g * 1.01

    def skewed(q, k, v):
        q, k, v = (x.transpose(1, 2) for x in (SkewDq.apply(q), k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True).transpose(1, 2)

    p = _train_problem(32, False)
    b = _bench(p)
    sets = bench.input_sets(b)
    good = bench.make_peer("sdpa_cpu", p, sets)
    bad = _bench_peers._autograd_runner(skewed, p, sets, contextlib.nullcontext)
    rows = [b.add("good", good).row, b.add("bad", bad).row]
    assert rows[0].status == "ok" and set(rows[0].errors) == {"out", "dq", "dk", "dv"}, rows[0].reason
    assert rows[1].status == "FAIL" and rows[1].reason.startswith("dq: error"), rows[1].reason
    assert "out" not in rows[1].reason and rows[1].errors["out"] < 1e-5


@pytest.mark.torch
def test_a_cpu_train_run_checks_and_times_every_entry(tmp_path, capsys):
    modules, fig, _ = _fake_matplotlib()  # one panel: one mask
    with mock.patch.dict(sys.modules, modules):
        rc = bench.main(_ARGS + ["--seqlens", "32,48", "--causal", "1", "--kernels",
                                 "cpu_flash,cpu_reference", "--peers", "sdpa_cpu", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, out
    assert "### training step (forward + backward) (TFLOP/s)" in out and "torch.autograd.grad(out" in out
    assert "| 1x32x4/2x16 | yes |" in out
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert len(recs) == 2 * 3 and {r["direction"] for r in recs} == {"train"}
    for r in recs:
        assert r["status"] == "ok" and r["tflops"] > 0, r
        assert all(r[f"err_{g}"] < 1e-4 for g in ("out", "dq", "dk", "dv")), r
        forward = 4 * 4 * 16 * (r["seqlen_q"] * (r["seqlen_q"] + 1) // 2)  # causal: the triangle
        assert r["flops"] == 3.5 * forward
    assert f"plots: {tmp_path / 'plots' / 'train.png'}" in err
    assert "training step" in fig.suptitle.call_args.args[0]


@pytest.mark.cuda
def test_a_gpu_train_run_checks_auto_and_its_peers(tmp_path, capsys):
    rc = bench.main(["--device", "cuda", "--direction", "train", "--hdims", "128", "--seqlens", "4k",
                     "--causal", "both", "--kernels", "auto", "--peers", "triton_fa2,sdpa_cudnn,fa4",
                     "--budget", "0.3", "--rounds", "2", "--no-progress", "--out", str(tmp_path)])
    recs = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert rc == 0, capsys.readouterr().out
    assert {r["direction"] for r in recs} == {"train"}
    for r in recs:
        if r["impl"] == "fa4" and "not importable" in r["reason"]:
            continue
        assert r["status"] == "ok" and r["tflops"] > 0, r
        assert all(f"err_{g}" in r for g in ("out", "dq", "dk", "dv")), r
