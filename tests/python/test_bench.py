"""The peer benchmark's run planning (flashlab.bench.run_entry, time_entries), with stand-ins
for the kernel, the checker and the timer: no GPU, no torch needed."""

from __future__ import annotations

import time

import pytest

from flashlab import bench


class _Shape:
    pass


class _PassingChecker:
    def check(self, outputs):
        return True, {"out": 0.0}, {"out": 1e-5}


class _RecordingTimer:
    """Stands in for time_cuda/time_cpu: records the plan, returns `iters` samples."""

    def __init__(self):
        self.warmup = self.iters = None

    def __call__(self, run, nsets, warmup, iters):
        self.warmup, self.iters = warmup, iters
        return [1.0] * iters


def _entry(first_call_s: float, budget_s: float = 1.0):
    """run_entry over a kernel whose first call takes first_call_s (one-time work) and
    every later call about nothing; returns (result, timer, calls before timing)."""
    calls = []

    def make():
        def run(i):
            if not calls:
                time.sleep(first_call_s)
            calls.append(i)
            return {"out": None}

        return run

    timer = _RecordingTimer()
    plan = bench.Plan(warmup=5, iters=20, budget_s=budget_s)
    res = bench.run_entry("stand-in", _Shape(), "fwd", make, _PassingChecker(), timer, 2, plan,
                          lambda: None)
    return res, timer, len(calls)


def test_a_slow_first_call_does_not_plan_the_runs():
    # The first call of a process's first FlashLab entry loads the library's kernels; it
    # took longer than the whole budget, and the entry was timed from one cold call.
    res, timer, calls = _entry(first_call_s=1.5, budget_s=1.0)
    assert res.status == "ok", res.reason
    assert calls == 2, "a second call measures what a call costs"
    assert timer.warmup == 5 and timer.iters == 20
    assert res.runs == 20


def test_a_fast_first_call_plans_the_runs_alone():
    res, timer, calls = _entry(first_call_s=0.0)
    assert res.status == "ok", res.reason
    assert calls == 1, "no extra call when the first was cheap"
    assert timer.warmup == 5 and timer.iters == 20


def test_plan_runs_fits_the_budget():
    plan = bench.Plan(warmup=5, iters=20, budget_s=3.0)
    assert bench.plan_runs(plan, 3.5) == (0, 1)  # over budget: one timed call, no warm-up
    warm, iters = bench.plan_runs(plan, 0.5)  # six calls fit
    assert iters == 6 and warm == 1


def test_rounds_alternate_the_entries_and_take_the_median_of_their_medians():
    # Three entries, four rounds: each round times every entry once, the order rotated, and
    # an entry's time is the median of its per-round medians.
    order = []
    times = {"a": [5.0, 1.0, 2.0, 3.0], "b": [4.0, 4.0, 9.0, 4.0], "c": [7.0, 8.0, 6.0, 5.0]}

    def timer(run, nsets, warmup, iters):
        name = run(0)
        order.append(name)
        t = times[name][sum(1 for n in order if n == name) - 1]
        return [t] * iters

    entries = []
    for name in "abc":
        res = bench.Result(_Shape(), "fwd", name, "ok")
        entries.append((res, lambda i, name=name: name, 0.0))
    plan = bench.Plan(warmup=1, iters=3, budget_s=1.0)
    bench.time_entries(entries, timer, 2, plan, rounds=4)
    assert order == list("abc" "bca" "cab" "abc")
    ms = {res.impl: res.ms for res, _, _ in entries}
    assert ms == {"a": 2.5, "b": 4.0, "c": 6.5}
    assert all(res.runs == 12 for res, _, _ in entries)


def test_rounds_skip_entries_that_were_not_prepared():
    res_ok = bench.Result(_Shape(), "fwd", "ok", "ok")
    res_skip = bench.Result(_Shape(), "fwd", "skipped", "skip", reason="refused")
    timer = _RecordingTimer()
    plan = bench.Plan(warmup=1, iters=3, budget_s=1.0)
    bench.time_entries([(res_skip, None, 0.0), (res_ok, lambda i: None, 0.0)], timer, 2, plan,
                       rounds=3)
    assert res_ok.runs == 9 and res_ok.ms == 1.0
    assert res_skip.runs == 0 and res_skip.status == "skip"


def test_peers_restrict_the_gpu_entries_in_the_sweeps_order():
    args = bench.parse_args(["--device", "cpu", "--kernels", "fa2_mma", "--peers",
                             "sdpa_cudnn,triton_fa2"])
    peers = [i for i in bench.gpu_impls(args, "fwd") if not i.startswith("flashlab:")]
    assert peers == ["triton_fa2", "sdpa_cudnn"]
    args = bench.parse_args(["--device", "cpu", "--kernels", "fa2_mma"])
    peers = [i for i in bench.gpu_impls(args, "fwd") if not i.startswith("flashlab:")]
    assert peers == list(bench.GPU_PEERS)


def test_an_unknown_peer_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--peers", "sdpa_cudnn,cudnn"])
    assert "--peers: unknown cudnn" in capsys.readouterr().err
