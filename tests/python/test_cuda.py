"""The package on CUDA tensors: values, LSE and autograd gradients against the fp64 oracle
under docs/DESIGN.md's rule (error <= 2 x that of PyTorch's math path in the input dtype
+ 1e-5), auto and every GPU kernel by name, GQA, varlen, windows, softcap, strided inputs,
the caller's current stream (and CUDA graph capture), torch.compile(fullgraph=True), and
the errors a CUDA call can meet before any kernel runs."""

from __future__ import annotations

import pytest

import flashlab
import reference as ref
from reference import check_rule

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")

GPU_KERNELS = [k["name"] for k in flashlab.kernels() if k["arch"] != "cpu"]


def make(shape, dtype, grad=True):
    return torch.randn(shape, device="cuda", dtype=dtype).requires_grad_(grad)


def run_and_check(q, k, v, grads=True, kernel="auto", causal=False, window=(-1, -1),
                  softcap=0.0):
    """flash_attn_func's out and LSE, and (grads) dq/dk/dv through autograd, under the rule."""
    mask = dict(causal=causal, window=window, softcap=softcap)
    out, lse, none = flashlab.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                              softcap=softcap, return_attn_probs=True,
                                              kernel=kernel)
    assert none is None and out.dtype == q.dtype and lse.dtype == torch.float32
    assert out.device == q.device and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    ref.check_torch_call(q, k, v, out, lse, grads=grads, **mask)


CASES = {
    "basic": dict(b=2, sq=256, sk=256, hq=4, hkv=4, mask={}),
    "causal_sq_lt_sk": dict(b=1, sq=100, sk=300, hq=2, hkv=2, mask=dict(causal=True)),
    "causal_sq_gt_sk": dict(b=1, sq=300, sk=100, hq=2, hkv=2, mask=dict(causal=True)),
    "gqa_8to1_causal": dict(b=2, sq=200, sk=200, hq=8, hkv=1, mask=dict(causal=True)),
    "window_32_8": dict(b=1, sq=333, sk=333, hq=2, hkv=1, mask=dict(window=(32, 8))),
    "softcap_30": dict(b=1, sq=128, sk=192, hq=2, hkv=2, mask=dict(softcap=30.0)),
    "softcap_window_causal": dict(b=1, sq=160, sk=160, hq=4, hkv=2,
                                  mask=dict(causal=True, window=(40, -1), softcap=10.0)),
    "seqlen_1000_odd": dict(b=1, sq=1000, sk=1000, hq=2, hkv=2, mask=dict(causal=True)),
    "seqlen_1": dict(b=3, sq=1, sk=1, hq=2, hkv=2, mask={}),
}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients(case, dtype, d):
    c = CASES[case]
    dt = getattr(torch, dtype)
    q = make((c["b"], c["sq"], c["hq"], d), dt)
    k, v = make((c["b"], c["sk"], c["hkv"], d), dt), make((c["b"], c["sk"], c["hkv"], d), dt)
    run_and_check(q, k, v, **c["mask"])


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", GPU_KERNELS or [pytest.param(
    "none", marks=pytest.mark.skip(reason="this build has no GPU kernels"))])
def test_every_gpu_kernel_by_name(kernel, dtype, d):
    # A forward-only kernel's backward runs on auto, a backward-only kernel's forward too.
    if kernel.startswith("cute_fa3_") and (dtype, d) != ("bfloat16", 128):
        pytest.skip(f"{kernel} is a schedule ablation of cute_fa3, built for bf16 head dim 128")
    dt = getattr(torch, dtype)
    q, k, v = make((2, 130, 4, d), dt), make((2, 150, 2, d), dt), make((2, 150, 2, d), dt)
    run_and_check(q, k, v, kernel=kernel, causal=True)


@pytest.mark.parametrize("dtype, d", [("float16", 96), ("bfloat16", 40), ("float32", 64),
                                      ("float32", 128)])
def test_other_head_dims_and_fp32(dtype, d):
    dt = getattr(torch, dtype)
    q, k, v = make((1, 150, 4, d), dt), make((1, 170, 2, d), dt), make((1, 170, 2, d), dt)
    run_and_check(q, k, v, window=(50, 10))


def test_fully_masked_rows():
    q, k, v = (make((1, s, 2, 64), torch.float16, grad=False) for s in (40, 9, 9))
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[0, :31] == 0) and torch.all(torch.isneginf(lse[0, :, :31]))
    assert torch.all(torch.isfinite(lse[0, :, 31:])) and torch.all(torch.isfinite(out))


# Head dims 192 and 256: auto's backward is cute_fa3's wide step on an H100/H200, with its
# 96- and 80-key blocks ragged at every sequence's end.
@pytest.mark.parametrize("d", [128, 192, 256])
def test_varlen_with_zero_length_sequences(d):
    lens_q, lens_k = [100, 0, 257, 1, 64], [120, 5, 257, 0, 64]
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32,
                                 device="cuda")
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    q = make((sum(lens_q), 4, d), torch.bfloat16)
    k, v = make((sum(lens_k), 2, d), torch.bfloat16), make((sum(lens_k), 2, d), torch.bfloat16)
    out, lse, _ = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lens_q))
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for b in range(len(lens_q)):
        q0, q1 = cu_q[b].item(), cu_q[b + 1].item()
        k0, k1 = cu_k[b].item(), cu_k[b + 1].item()
        if q1 == q0 or k1 == k0:  # no queries: its keys get no gradient; no keys: out is 0
            assert torch.all(dk[k0:k1] == 0) and torch.all(dv[k0:k1] == 0)
            assert torch.all(out[q0:q1] == 0) and torch.all(dq[q0:q1] == 0)
            assert torch.all(torch.isneginf(lse[:, q0:q1]))
            continue
        seq = [x.detach()[a:z][None] for x, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1))]
        oracle = ref.torch_attention(*seq, causal=True, dtype=torch.float64)
        yard = ref.torch_attention(*seq, causal=True)
        check_rule(f"out[{b}]", out[q0:q1][None], yard[0], oracle[0])
        check_rule(f"lse[{b}]", lse[:, q0:q1][None], yard[1], oracle[1])
        d = dout[q0:q1][None]
        want = ref.torch_grads(*seq, d, torch.float64, causal=True)
        yard = ref.torch_grads(*seq, d, q.dtype, causal=True)
        got = (dq[q0:q1][None], dk[k0:k1][None], dv[k0:k1][None])
        slack = ref.gradient_slack(*seq, d, causal=True)
        for name, g, y, w in zip(("dq", "dk", "dv"), got, yard, want):
            check_rule(f"{name}[{b}]", g, y, w, *slack.get(name, (0.0, 0.0)))


def test_strided_views_of_packed_qkv():
    qkv = torch.randn(2, 300, 3, 4, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    q, k, v = qkv.unbind(dim=2)  # strided views, last dim contiguous
    assert not q.is_contiguous()
    run_and_check(q, k, v, causal=True)
    out = flashlab.flash_attn_func(q, k, v, causal=True)
    dense = flashlab.flash_attn_func(*(x.detach().contiguous() for x in (q, k, v)), causal=True)
    packed = flashlab.flash_attn_qkvpacked_func(qkv, causal=True)
    assert torch.equal(out, dense) and torch.equal(packed, dense)
    packed.backward(torch.ones_like(packed))  # a gradient through the packed views
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all() and qkv.grad.abs().sum() > 0


def test_runs_on_the_current_stream():
    q, k, v = (make((2, 512, 8, 128), torch.bfloat16, grad=False) for _ in range(3))
    new_q = torch.randn_like(q)
    want = flashlab.flash_attn_func(new_q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the side stream is busy for tens of milliseconds ...
        q.copy_(new_q)  # ... before q changes: a kernel on any other stream reads the old q
        got = flashlab.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_captures_in_a_cuda_graph():
    q, k, v = (make((2, 512, 8, 128), torch.bfloat16, grad=False) for _ in range(3))
    flashlab.flash_attn_func(q, k, v, causal=True)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a launch on any other stream breaks the capture
        captured = flashlab.flash_attn_func(q, k, v, causal=True)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flashlab.flash_attn_func(q, k, v, causal=True))


def _hopper_backward():
    has = any(k["name"] == "cute_fa3" and k["backward"] for k in flashlab.kernels())
    return has and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper_backward = pytest.mark.skipif(
    not _hopper_backward(), reason="cute_fa3's backward needs an sm_90 device and a build with it")


@needs_hopper_backward
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_captures_in_a_cuda_graph(deterministic):
    # The Hopper backward launches its main kernel and postprocess as programmatic dependents
    # of the kernel before; captured, the graph keeps those edges. Replayed on new inputs it
    # matches an eager call: bit for bit in the deterministic mode.
    q, k, v = (make((2, 700, 8, 128), torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)

    def grads():
        out = flashlab.flash_attn_func(q, k, v, causal=True, deterministic=deterministic,
                                       kernel="cute_fa3")
        return torch.autograd.grad(out, (q, k, v), dout)

    grads()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grads()
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    for got, want, name in zip(captured, grads(), ("dq", "dk", "dv")):
        if deterministic:
            assert torch.equal(got, want), name
        else:
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=name)


@needs_hopper_backward
def test_backward_with_no_key_in_any_sequence():
    # cu_seqlens_k all 0 while k has rows and max_seqlen_k > 0: cute_fa3's compact varlen grid
    # (an upper bound from the arguments) has CTAs but no key block, so no CTA of its main
    # kernel waits for the preprocess; dQ must still be the preprocess's zeros.
    lens_q = [70, 0, 130]
    cu_q = torch.tensor([0, 70, 70, 200], dtype=torch.int32, device="cuda")
    cu_k = torch.zeros(4, dtype=torch.int32, device="cuda")
    q = make((200, 4, 128), torch.bfloat16)
    k, v = make((300, 2, 128), torch.bfloat16), make((300, 2, 128), torch.bfloat16)
    out = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), 256, kernel="cute_fa3")
    assert torch.all(out == 0)
    dq, = torch.autograd.grad(out, (q,), torch.randn_like(out))
    assert torch.all(dq == 0)


def test_torch_compile_fullgraph_forward_and_backward():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(128, 3 * 128, device="cuda", dtype=torch.bfloat16)

        def forward(self, x):
            qkv = self.proj(x).view(x.shape[0], x.shape[1], 3, 4, 32)
            q, k, v = qkv.unbind(dim=2)
            return flashlab.flash_attn_func(q, k, v, causal=True).flatten(2)

    model = Block()
    x = torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    y = compiled(x)
    y.float().square().sum().backward()
    gx, gw = x.grad.clone(), model.proj.weight.grad.clone()
    x.grad = model.proj.weight.grad = None
    y_eager = model(x)
    y_eager.float().square().sum().backward()
    # Inductor may fuse the projection differently: bf16-level agreement, not bitwise.
    assert ref.max_err(y, y_eager) < 2e-2
    assert ref.max_err(gx, x.grad) < 5e-2 * max(1.0, x.grad.abs().max().item())
    assert ref.max_err(gw, model.proj.weight.grad) < 5e-2 * max(1.0, gw.abs().max().item())


def test_mixed_devices_are_refused_before_any_kernel():
    q = make((1, 16, 2, 64), torch.float16, grad=False)
    k = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"k is on cpu:0 but q is on cuda:0"):
        flashlab.flash_attn_func(q, k, q)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be on the device of q \(cuda\)"):
        flashlab.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.cuda(), 16, 16)


def test_cuda_layout_rules():
    q = make((1, 16, 2, 36), torch.float16, grad=False)  # rows of 72 bytes
    with pytest.raises(ValueError, match=r"q\.stride\[\d\] .* must be a multiple of 16 bytes"):
        flashlab.flash_attn_func(q, q, q)


def test_named_kernel_that_cannot_run_says_why():
    q = make((1, 16, 2, 64), torch.float32, grad=False)
    if "fa2_mma" in GPU_KERNELS:
        with pytest.raises(ValueError, match=r"kernel 'fa2_mma' does not support this call: fp32"):
            flashlab.flash_attn_func(q, q, q, kernel="fa2_mma")
    with pytest.raises(ValueError, match=r"kernel 'cpu_flash' does not support this call: runs "
                                         r"on CPU tensors only"):
        flashlab.flash_attn_func(q, q, q, kernel="cpu_flash")


@pytest.mark.skipif(not any(k["name"] == "cute_fa2" and k["backward"] for k in flashlab.kernels()),
                    reason="no cute_fa2 backward in this build: no CUDA backward is deterministic")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_deterministic_backward_is_bitwise_reproducible(dtype):
    """deterministic=True (auto's backward is cute_fa2's): gradients bitwise equal run after
    run, on a shape where 16 key blocks add into every query row (GQA 4:1, causal). Their
    values against the oracle: tests/gpu/cute_fa2_bwd_test.cpp."""
    dt = getattr(torch, dtype)
    q = make((2, 1000, 8, 128), dt)
    k, v = make((2, 1000, 2, 128), dt), make((2, 1000, 2, 128), dt)
    dout = torch.randn_like(q)
    runs = []
    for _ in range(5):
        out = flashlab.flash_attn_func(q, k, v, causal=True, deterministic=True)
        runs.append([g.view(torch.int16) for g in torch.autograd.grad(out, (q, k, v), dout)])
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(first, again), f"{name} differs bitwise between runs"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_values_and_gradients(causal, dtype, d):
    """auto with dropout_p > 0: out (and, where a GPU backward takes dropout, the gradients)
    against the oracle with reference.dropout_keep's mask, under the rule."""
    p, seed = 0.2, 20261122 + d
    dt = getattr(torch, dtype)
    q = make((2, 300, 4, d), dt)
    k, v = make((2, 300, 2, d), dt), make((2, 300, 2, d), dt)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                           dropout_seed=seed, return_attn_probs=True)
    mask = dict(causal=causal, dropout=(p, ref.dropout_keep(2, 4, 300, 300, p, seed)))
    try:  # out and LSE first, then the gradients
        ref.check_torch_call(q, k, v, out, lse, **mask)
    except ValueError as e:
        if "dropout_p > 0 is not supported" not in str(e):
            raise
        pytest.skip(f"forward checked; no GPU backward takes dropout in this build: {e}")
