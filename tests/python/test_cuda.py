"""The package on CUDA tensors: values, LSE and autograd gradients against an fp64 oracle
under DESIGN.md's rule (error <= 2 x that of PyTorch's math path in the input dtype
+ 1e-5), every named GPU kernel, GQA, varlen, windows, softcap, strided inputs, the
caller's stream (CUDA graph capture), torch.compile(fullgraph=True), and device errors."""

from __future__ import annotations

import math

import pytest

import flashlab

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")


def attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, dtype=None):
    """Attention in `dtype` (float64: the oracle; the input dtype: PyTorch math-path
    rounding, the yardstick), bottom-right causal, windows, softcap, GQA. Returns (out, lse)."""
    dtype = dtype or q.dtype
    q, k, v = (x.to(dtype) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.float() if dtype != torch.float64 else s
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def max_err(a, b):
    a, b = a.double(), b.double()
    same_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return (a - b).abs().masked_fill(same_inf, 0.0).max().item() if a.numel() else 0.0


def check_rule(name, got, lowp, oracle):
    e, y = max_err(got, oracle), max_err(lowp, oracle)
    assert e <= 2 * y + 1e-5, f"{name}: error {e:.3g} > 2 x {y:.3g} (yardstick) + 1e-5"


def make(shape, dtype, grad=True):
    return torch.randn(shape, device="cuda", dtype=dtype).requires_grad_(grad)


def run_and_check(q, k, v, grads=True, kernel="auto", causal=False, window=(-1, -1),
                  softcap=0.0):
    mask = dict(causal=causal, window=window, softcap=softcap)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                           softcap=softcap, return_attn_probs=True, kernel=kernel)
    oracle = attention(q.detach(), k.detach(), v.detach(), dtype=torch.float64, **mask)
    lowp = attention(q.detach(), k.detach(), v.detach(), **mask)
    assert out.dtype == q.dtype and out.is_cuda and lse.dtype == torch.float32
    check_rule("out", out, lowp[0], oracle[0])
    check_rule("lse", lse, lowp[1], oracle[1])
    if not grads:
        return
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    leaves = lambda dt: [x.detach().to(dt).requires_grad_() for x in (q, k, v)]
    o64, olp = leaves(torch.float64), leaves(q.dtype)
    want = torch.autograd.grad(attention(*o64, **mask)[0], o64, dout.double())
    yard = torch.autograd.grad(attention(*olp, **mask)[0], olp, dout)
    for n, g, y, w in zip(("dq", "dk", "dv"), got, yard, want):
        check_rule(n, g, y, w)


CASES = {
    "basic": dict(b=2, sq=256, sk=256, hq=4, hkv=4, mask={}),
    "causal_sq_lt_sk": dict(b=1, sq=100, sk=300, hq=2, hkv=2, mask=dict(causal=True)),
    "gqa_8to1_causal": dict(b=2, sq=200, sk=200, hq=8, hkv=1, mask=dict(causal=True)),
    "window_32_8": dict(b=1, sq=333, sk=333, hq=2, hkv=1, mask=dict(window=(32, 8))),
    "softcap_30": dict(b=1, sq=128, sk=192, hq=2, hkv=2, mask=dict(softcap=30.0)),
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


@pytest.mark.parametrize("kernel", [k["name"] for k in flashlab.kernels()
                                    if k["arch"] != "cpu" and k["forward"]])
def test_every_named_gpu_kernel(kernel):
    q, k, v = make((1, 130, 4, 64), torch.bfloat16), make((1, 150, 2, 64), torch.bfloat16), \
        make((1, 150, 2, 64), torch.bfloat16)
    run_and_check(q, k, v, kernel=kernel, causal=True)


def test_fully_masked_rows():
    q, k, v = (make((1, s, 2, 64), torch.float16, grad=False) for s in (40, 9, 9))
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[0, :31] == 0) and torch.all(torch.isneginf(lse[0, :, :31]))
    assert torch.all(torch.isfinite(lse[0, :, 31:]))


def test_varlen_with_zero_length_sequence():
    lens_q, lens_k = [100, 0, 257, 1, 64], [120, 5, 257, 0, 64]
    cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32,
                                 device="cuda")
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    q = make((sum(lens_q), 4, 128), torch.bfloat16)
    k, v = make((sum(lens_k), 2, 128), torch.bfloat16), make((sum(lens_k), 2, 128), torch.bfloat16)
    out, lse, _ = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=True, return_attn_probs=True)
    assert lse.shape == (4, sum(lens_q))
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for bi in range(len(lens_q)):
        q0, q1 = cu_q[bi].item(), cu_q[bi + 1].item()
        k0, k1 = cu_k[bi].item(), cu_k[bi + 1].item()
        if q1 == q0 or k1 == k0:  # no queries: its keys get no gradient; no keys: out is 0
            assert torch.all(dk[k0:k1] == 0) and torch.all(dv[k0:k1] == 0)
            assert torch.all(out[q0:q1] == 0) and torch.all(dq[q0:q1] == 0)
            continue
        leaves = lambda dt: [x.detach()[a:b][None].to(dt).requires_grad_()
                             for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))]
        o64, olp = leaves(torch.float64), leaves(q.dtype)
        oracle, lowp = attention(*o64, causal=True), attention(*olp, causal=True)
        check_rule(f"out[{bi}]", out[q0:q1][None], lowp[0], oracle[0])
        check_rule(f"lse[{bi}]", lse[:, q0:q1][None], lowp[1], oracle[1])
        d = dout[q0:q1][None]
        want = torch.autograd.grad(oracle[0], o64, d.double())
        yard = torch.autograd.grad(lowp[0], olp, d)
        got = (dq[q0:q1][None], dk[k0:k1][None], dv[k0:k1][None])
        for n, g, y, w in zip(("dq", "dk", "dv"), got, yard, want):
            check_rule(f"{n}[{bi}]", g, y, w)


def test_strided_inputs_match_contiguous():
    qkv = torch.randn(2, 300, 3, 4, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    q, k, v = qkv.unbind(dim=2)  # strided views, last dim contiguous
    assert not q.is_contiguous()
    out = flashlab.flash_attn_func(q, k, v, causal=True)
    ref = flashlab.flash_attn_func(*(x.detach().contiguous() for x in (q, k, v)), causal=True)
    assert torch.equal(out, ref)
    out.sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()
    packed = flashlab.flash_attn_qkvpacked_func(qkv.detach(), causal=True)
    assert torch.equal(packed, ref)


def test_runs_on_the_current_stream_and_captures_in_a_cuda_graph():
    q, k, v = (make((2, 512, 8, 128), torch.bfloat16, grad=False) for _ in range(3))
    want = flashlab.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = flashlab.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a launch on any other stream would break the capture
        captured = flashlab.flash_attn_func(q, k, v, causal=True)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flashlab.flash_attn_func(q, k, v, causal=True))


def test_torch_compile_fullgraph():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(128, 128, device="cuda", dtype=torch.bfloat16)

        def forward(self, x):
            q = self.proj(x).view(x.shape[0], x.shape[1], 4, 32)
            return flashlab.flash_attn_func(q, q, q, causal=True).flatten(2)

    model = Block()
    x = torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    y = compiled(x)
    y.float().square().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    model(x).float().square().sum().backward()
    assert max_err(y, model(x)) < 1e-2
    assert max_err(gx, x.grad) < 5e-2


def test_mixed_devices_are_refused_before_any_kernel():
    q = make((1, 16, 2, 64), torch.float16, grad=False)
    k = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"\bk\b.*(is on|device)"):
        flashlab.flash_attn_func(q, k, k)


def test_deterministic_backward_says_why():
    q, k, v = (make((1, 64, 2, 64), torch.float16) for _ in range(3))
    out = flashlab.flash_attn_func(q, k, v, deterministic=True)
    with pytest.raises(ValueError, match="deterministic"):
        out.sum().backward()
