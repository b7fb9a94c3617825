"""The package on CPU arrays: NumPy through DLPack (forward and attention_backward) and,
when torch is installed, CPU tensors with autograd and torch.compile, all against the
oracle in reference.py: a tight absolute bound for fp32/fp64, docs/DESIGN.md's rule for fp16/bf16."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import flashlab
import reference as ref
from reference import check_rule, max_err

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, softcap)
CASES = {
    "basic": (2, 64, 64, 2, 2, 64, False, (-1, -1), 0.0),
    "causal": (1, 77, 77, 2, 2, 64, True, (-1, -1), 0.0),
    "sq_lt_sk_causal": (1, 17, 100, 2, 2, 32, True, (-1, -1), 0.0),
    "sq_gt_sk_causal_masked_rows": (1, 100, 17, 2, 2, 32, True, (-1, -1), 0.0),
    "gqa_4to1": (2, 50, 70, 4, 1, 64, False, (-1, -1), 0.0),
    "window_16_4": (1, 90, 90, 2, 1, 48, False, (16, 4), 0.0),
    "window_left_only_causal": (1, 70, 90, 2, 2, 32, True, (8, -1), 0.0),
    "softcap_causal": (1, 60, 60, 2, 2, 64, True, (-1, -1), 5.0),
    "softcap_window_gqa": (2, 45, 45, 4, 2, 16, False, (5, 5), 2.0),
    "seqlen_1": (3, 1, 1, 2, 2, 128, False, (-1, -1), 0.0),
}
GRAD_CASES = ["basic", "causal", "sq_lt_sk_causal", "sq_gt_sk_causal_masked_rows", "gqa_4to1",
              "window_16_4", "softcap_causal", "softcap_window_gqa"]
FP32_TOL, FP32_GRAD_TOL, FP64_TOL = 2e-5, 1e-4, 1e-10


def _inputs(rng, b, sq, sk, hq, hkv, d, dtype=np.float32, dv=None):
    mk = lambda *s: rng.standard_normal(s).astype(dtype)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, dv or d)


def _mask(case):
    causal, window, softcap = CASES[case][6:]
    return dict(causal=causal, window=window, softcap=softcap)


def _fa2_mask(case):
    causal, window, softcap = CASES[case][6:]
    return dict(causal=causal, window_size=window, softcap=softcap)


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


# ---- NumPy ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", list(CASES))
def test_numpy_forward(rng, case, dtype):
    b, sq, sk, hq, hkv, d = CASES[case][:6]
    q, k, v = _inputs(rng, b, sq, sk, hq, hkv, d, dtype)
    out, lse, none = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, **_fa2_mask(case))
    # The API's softmax_scale is fp32: the fp64 oracle uses the same rounded default.
    want, want_lse = ref.attention(q, k, v, scale=float(np.float32(1 / np.sqrt(d))),
                                   **_mask(case))
    tol = FP32_TOL if dtype == np.float32 else FP64_TOL
    assert none is None
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == (b, sq, hq, d)
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq)
    assert max_err(out, want) < tol
    assert max_err(lse, want_lse) < FP32_TOL  # LSE is fp32 whatever the input dtype


@pytest.mark.parametrize("kernel", ["auto", "cpu_flash", "cpu_reference"])
def test_numpy_forward_fp16_within_the_rule(rng, kernel):
    q, k, v = _inputs(rng, 2, 80, 80, 4, 2, 64, np.float16)
    out = flashlab.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    want, _ = ref.attention(q, k, v, causal=True)
    assert out.dtype == np.float16
    check_rule("out", out, ref.lowp_attention(q, k, v, causal=True), want)


def test_head_dim_v_differs_from_head_dim(rng):
    q, k, v = _inputs(rng, 1, 40, 50, 2, 1, 64, dv=32)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    want, want_lse = ref.attention(q, k, v, causal=True)
    assert out.shape == (1, 40, 2, 32)
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL


def test_fully_masked_rows_write_zero_and_minus_inf(rng):
    # seqlen_q > seqlen_k with causal (bottom-right): the first sq − sk rows see no key.
    q, k, v = _inputs(rng, 1, 20, 5, 1, 1, 16)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[0, :15] == 0) and np.all(np.isneginf(lse[0, 0, :15]))
    assert np.all(np.isfinite(lse[0, 0, 15:])) and np.all(np.isfinite(out))


@pytest.mark.parametrize("kernel", ["auto", "cpu_reference"])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_numpy_backward(rng, case, kernel):
    b, sq, sk, hq, hkv, d = CASES[case][:6]
    q, k, v = _inputs(rng, b, sq, sk, hq, hkv, d)
    dout = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, kernel=kernel,
                                           **_fa2_mask(case))
    got = flashlab.attention_backward(q, k, v, out, dout, lse, kernel=kernel, **_fa2_mask(case))
    want = ref.attention_backward(q, k, v, dout, **_mask(case))
    for g, w, x, what in zip(got, want, (q, k, v), ("dq", "dk", "dv")):
        assert g.shape == x.shape and g.dtype == x.dtype, what
        assert max_err(g, w) < FP32_GRAD_TOL, what


def test_deterministic_backward_on_cpu_repeats_bitwise(rng):
    q, k, v = _inputs(rng, 2, 64, 96, 4, 2, 32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    runs = [flashlab.attention_backward(q, k, v, out, dout, lse, causal=True, deterministic=True)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)
    want = ref.attention_backward(q, k, v, dout, causal=True)
    assert max(max_err(g, w) for g, w in zip(runs[0], want)) < FP32_GRAD_TOL


def test_varlen_with_zero_length_sequences(rng):
    lens_q, lens_k = [5, 0, 33, 1, 9], [7, 4, 33, 0, 12]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = rng.standard_normal((cu_q[-1], 4, 32)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], 2, 32)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], 2, 32)).astype(np.float32)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                  max_seqlen_k=max(lens_k))
    out, lse, _ = flashlab.flash_attn_varlen_func(q, k, v, **varlen, causal=True,
                                                  return_attn_probs=True)
    want, want_lse = ref.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    assert out.shape == q.shape and lse.shape == (4, cu_q[-1])
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL
    assert np.all(out[cu_q[3]:cu_q[4]] == 0)  # sequence 3 has no keys
    dout = rng.standard_normal(out.shape).astype(np.float32)
    got = flashlab.attention_backward(q, k, v, out, dout, lse, causal=True, **varlen)
    grads = ref.varlen_attention_backward(q, k, v, dout, cu_q, cu_k, causal=True)
    for g, w, what in zip(got, grads, ("dq", "dk", "dv")):
        assert max_err(g, w) < FP32_GRAD_TOL, what
    assert np.all(got[1][cu_k[1]:cu_k[2]] == 0)  # keys of the sequence with no queries


def test_empty_batch_and_empty_sequence(rng):
    q, k, v = _inputs(rng, 1, 8, 8, 2, 2, 32)
    out, lse, _ = flashlab.flash_attn_func(q[:, :0], k, v, return_attn_probs=True)
    assert out.shape == (1, 0, 2, 32) and lse.shape == (1, 2, 0)
    assert flashlab.flash_attn_func(q[:0], k[:0], v[:0]).shape == (0, 8, 2, 32)
    out, lse, _ = flashlab.flash_attn_func(q, k[:, :0], v[:, :0], return_attn_probs=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_qkvpacked_views(rng):
    qkv = rng.standard_normal((2, 40, 3, 2, 64)).astype(np.float32)
    out, lse, _ = flashlab.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    want, want_lse = ref.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL


def test_strided_inputs(rng):
    # [B, H, S, D] storage seen as [B, S, H, D]: strided, last dim contiguous.
    q, k, v = (rng.standard_normal((2, 3, 50, 32)).astype(np.float32).transpose(0, 2, 1, 3)
               for _ in range(3))
    assert not q.flags.c_contiguous
    out = flashlab.flash_attn_func(q, k, v, window_size=(7, 0))
    assert max_err(out, ref.attention(q, k, v, window=(7, 0))[0]) < FP32_TOL


def test_softmax_scale(rng):
    q, k, v = _inputs(rng, 1, 30, 30, 2, 2, 64)
    out = flashlab.flash_attn_func(q, k, v, softmax_scale=0.3)
    assert max_err(out, ref.attention(q, k, v, scale=0.3)[0]) < FP32_TOL


def test_named_kernel_runs_and_unknown_kernel_lists_the_known(rng):
    q, k, v = _inputs(rng, 1, 30, 30, 2, 2, 64)
    out = flashlab.flash_attn_func(q, k, v, kernel="cpu_reference")
    assert max_err(out, ref.attention(q, k, v)[0]) < FP32_TOL
    with pytest.raises(ValueError, match=r"kernel 'nope' is not in this build; known kernels: "
                                         r".*cpu_reference.*"):
        flashlab.flash_attn_func(q, k, v, kernel="nope")


def test_named_kernel_that_cannot_run_says_why(rng):
    q, k, v = _inputs(rng, 1, 16, 16, 2, 2, 32, np.float64)
    with pytest.raises(ValueError, match=r"kernel 'cpu_flash' does not support this call: fp64"):
        flashlab.flash_attn_func(q, k, v, kernel="cpu_flash")


def test_torch_imports_after_flashlab():
    """flashlab first, torch second, in a fresh process: once crashed in torch's operator
    registry, because the module exported the libstdc++ it had linked statically."""
    pytest.importorskip("torch")
    code = "import flashlab, torch; torch.ops.aten.add; print('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


def test_numpy_dropout_against_the_mask(rng):
    """NumPy with an explicit seed: out = (P ∘ keep / (1 − p)) V with reference.dropout_keep's
    mask, which re-derives src/common/dropout.h; the backward regenerates it."""
    p, seed = 0.25, 987654321
    q, k, v = _inputs(rng, 2, 40, 56, 4, 2, 32, np.float64)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=seed,
                                           return_attn_probs=True)
    keep = ref.dropout_keep(2, 4, 40, 56, p, seed)
    _, _, vv, _, s, _, _ = ref._scores(q, k, v, None, False, (-1, -1), 0.0)
    probs, _, _ = ref._softmax(s)
    z = probs * keep / (1.0 - float(np.float32(p)))
    want = np.einsum("bhqk,bkhd->bhqd", z, vv).transpose(0, 2, 1, 3)
    # (1e-6: the API's scale is an fp32 1/sqrt(d), the oracle's an fp64 one.)
    assert max_err(out, want) < 1e-6
    assert max_err(lse, ref.attention(q, k, v)[1]) < 1e-5  # the mask leaves LSE alone
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = flashlab.attention_backward(q, k, v, out, dout, lse, dropout_p=p,
                                             dropout_seed=seed)
    # dV = Zᵀ dO, summed over the query heads of a kv head.
    dvv = np.einsum("bhqk,bhqd->bkhd", z, dout.transpose(0, 2, 1, 3))
    assert max_err(dv, dvv.reshape(2, 56, 2, 2, 32).sum(axis=3)) < 1e-6
    assert np.isfinite(dq).all() and np.isfinite(dk).all()


@pytest.mark.parametrize("causal", [False, True])
def test_torch_cpu_dropout_values_and_gradients(rng, causal):
    torch = pytest.importorskip("torch")
    p, seed = 0.3, 1234
    q, k, v = (torch.from_numpy(x).float().requires_grad_()
               for x in _inputs(rng, 2, 70, 70, 4, 2, 32, np.float64))
    out, lse, _ = flashlab.flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                           dropout_seed=seed, return_attn_probs=True)
    mask = dict(causal=causal, dropout=(p, ref.dropout_keep(2, 4, 70, 70, p, seed)))
    ref.check_torch_call(q, k, v, out, lse, **mask)


def test_torch_dropout_seed_follows_torch_manual_seed(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x).float() for x in _inputs(rng, 1, 64, 64, 2, 2, 32, np.float64))

    def run(seed):
        torch.manual_seed(seed)
        return flashlab.flash_attn_func(q, k, v, dropout_p=0.5)

    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(flashlab.flash_attn_func(q, k, v, dropout_p=0.5),
                           flashlab.flash_attn_func(q, k, v, dropout_p=0.5))


def test_kernels_lists_the_registry():
    ks = flashlab.kernels()
    names = [k["name"] for k in ks]
    assert "cpu_reference" in names and "cpu_flash" in names
    assert len(set(names)) == len(names)
    for k in ks:
        assert set(k) == {"name", "arch", "summary", "forward", "backward", "kvcache"}
        assert k["summary"] and (k["forward"] or k["backward"])
        # forward_kvcache runs on the CPU by composing forward(): only device kernels have
        # a KV-cache pass of their own.
        assert not (k["kvcache"] and k["arch"] == "cpu")
    assert isinstance(flashlab.cuda_available(), bool)
    if not any(k["arch"] != "cpu" for k in ks):
        assert not flashlab.cuda_available()


# ---- torch on the CPU -------------------------------------------------------------------


def _torch_inputs(rng, b, sq, sk, hq, hkv, d, dtype=None):
    import torch

    dtype = dtype or torch.float32
    return [torch.from_numpy(x).to(dtype).requires_grad_()
            for x in _inputs(rng, b, sq, sk, hq, hkv, d)]


@pytest.mark.torch
@pytest.mark.parametrize("kernel", ["auto", "cpu_reference"])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_torch_cpu_fp32_values_and_autograd(rng, case, kernel):
    import torch

    q, k, v = _torch_inputs(rng, *CASES[case][:6])
    out, lse, _ = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, kernel=kernel,
                                           **_fa2_mask(case))
    dout = torch.randn_like(out)
    out.backward(dout)
    n = lambda t: t.detach().numpy()
    want, want_lse = ref.attention(n(q), n(k), n(v), **_mask(case))
    grads = ref.attention_backward(n(q), n(k), n(v), n(dout), **_mask(case))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL
    for t, w, what in zip((q, k, v), grads, ("dq", "dk", "dv")):
        assert max_err(t.grad, w) < FP32_GRAD_TOL, what


@pytest.mark.torch
@pytest.mark.parametrize("kernel", ["auto", "cpu_reference"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["causal", "gqa_4to1", "window_16_4", "softcap_window_gqa"])
def test_torch_cpu_low_precision_within_the_rule(rng, case, dtype, kernel):
    import torch

    dt = getattr(torch, dtype)
    q, k, v = _torch_inputs(rng, *CASES[case][:6], dtype=dt)
    mask = _mask(case)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, kernel=kernel,
                                           **_fa2_mask(case))
    assert out.dtype == dt and lse.dtype == torch.float32
    ref.check_torch_call(q, k, v, out, lse, **mask)


@pytest.mark.torch
def test_torch_cpu_varlen_autograd_with_zero_length_sequences(rng):
    import torch

    lens_q, lens_k = [9, 0, 20, 3], [9, 6, 31, 0]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = torch.randn(int(cu_q[-1]), 4, 32, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 1, 32, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 1, 32, requires_grad=True)
    out, lse, _ = flashlab.flash_attn_varlen_func(
        q, k, v, torch.from_numpy(cu_q), torch.from_numpy(cu_k), max(lens_q), max(lens_k),
        window_size=(4, 2), return_attn_probs=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    n = lambda t: t.detach().numpy()
    want, want_lse = ref.varlen_attention(n(q), n(k), n(v), cu_q, cu_k, window=(4, 2))
    grads = ref.varlen_attention_backward(n(q), n(k), n(v), n(dout), cu_q, cu_k, window=(4, 2))
    assert lse.shape == (4, cu_q[-1])
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL
    for t, w, what in zip((q, k, v), grads, ("dq", "dk", "dv")):
        assert max_err(t.grad, w) < FP32_GRAD_TOL, what


@pytest.mark.torch
def test_torch_cpu_strided_views_and_qkvpacked_autograd(rng):
    import torch

    qkv = torch.randn(2, 48, 3, 4, 32, requires_grad=True)
    q, k, v = qkv.unbind(dim=2)  # strided views, last dim contiguous
    assert not q.is_contiguous()
    out = flashlab.flash_attn_func(q, k, v, causal=True)
    packed = flashlab.flash_attn_qkvpacked_func(qkv, causal=True)
    assert torch.equal(out, packed)
    dout = torch.randn_like(out)
    packed.backward(dout)
    n = lambda t: t.detach().numpy()
    want = ref.attention(n(q), n(k), n(v), causal=True)[0]
    grads = ref.attention_backward(n(q), n(k), n(v), n(dout), causal=True)
    assert max_err(out, want) < FP32_TOL
    for i, (w, what) in enumerate(zip(grads, ("dq", "dk", "dv"))):
        assert max_err(qkv.grad[:, :, i], w) < FP32_GRAD_TOL, what


@pytest.mark.torch
def test_torch_cpu_lse_is_returned_but_not_differentiable(rng):
    import torch

    q, k, v = _torch_inputs(rng, 1, 33, 33, 2, 2, 64)
    out, lse, none = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert none is None and lse.shape == (1, 2, 33) and lse.dtype == torch.float32
    assert out.requires_grad and not lse.requires_grad
    (out.sum() + lse.sum()).backward()  # lse is a constant: the gradient is out's alone
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    flashlab.flash_attn_func(q2, k2, v2, causal=True).sum().backward()
    assert torch.equal(q.grad, q2.grad) and torch.equal(v.grad, v2.grad)


@pytest.mark.torch
def test_torch_cpu_deterministic_backward_repeats_bitwise(rng):
    import torch

    q, k, v = _torch_inputs(rng, 1, 64, 64, 4, 2, 32)
    grads = []
    for _ in range(2):
        out = flashlab.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.torch
def test_torch_compile_fullgraph_traces_the_custom_op(rng):
    import torch

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            out, lse, _ = flashlab.flash_attn_func(q * 1.0, k, v, causal=True,
                                                   return_attn_probs=True)
            return out.square().sum(), lse

    q, k, v = _torch_inputs(rng, 1, 40, 40, 2, 1, 32)
    compiled = torch.compile(Attn(), fullgraph=True, backend="aot_eager")
    loss, lse = compiled(q, k, v)
    loss.backward()
    eager_q = q.detach().clone().requires_grad_()
    eager_loss, eager_lse = Attn()(eager_q, k.detach(), v.detach())
    eager_loss.backward()
    assert torch.equal(lse, eager_lse) and torch.allclose(loss, eager_loss)
    assert torch.allclose(q.grad, eager_q.grad, atol=1e-6)
    n = lambda t: t.detach().numpy()
    out = ref.attention(n(q), n(k), n(v), causal=True)[0]
    dq = ref.attention_backward(n(q), n(k), n(v), 2 * out, causal=True)[0]
    assert max_err(q.grad, dq) < FP32_GRAD_TOL


@pytest.mark.torch
def test_torch_and_numpy_do_not_mix(rng):
    import torch

    q, k, v = _inputs(rng, 1, 8, 8, 2, 2, 32)
    with pytest.raises(TypeError, match=r"k is a torch\.Tensor but q is not a torch tensor"):
        flashlab.flash_attn_func(q, torch.from_numpy(k), v)
    with pytest.raises(TypeError, match=r"v is a numpy\.ndarray but q is a torch tensor"):
        flashlab.flash_attn_func(torch.from_numpy(q), torch.from_numpy(k), v)
