"""The package on CPU arrays: NumPy through DLPack (forward and attention_backward) and,
when torch is installed, CPU tensors with autograd and torch.compile, all against the
fp64 oracle in reference.py."""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
import reference as ref

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, softcap)
CASES = {
    "basic": (2, 64, 64, 2, 2, 64, False, (-1, -1), 0.0),
    "causal": (1, 77, 77, 2, 2, 64, True, (-1, -1), 0.0),
    "sq_lt_sk_causal": (1, 17, 100, 2, 2, 32, True, (-1, -1), 0.0),
    "sq_gt_sk_causal_masked_rows": (1, 100, 17, 2, 2, 32, True, (-1, -1), 0.0),
    "gqa_4to1": (2, 50, 70, 4, 1, 64, False, (-1, -1), 0.0),
    "window_16_4": (1, 90, 90, 2, 1, 48, False, (16, 4), 0.0),
    "softcap_causal": (1, 60, 60, 2, 2, 64, True, (-1, -1), 5.0),
    "seqlen_1": (3, 1, 1, 2, 2, 128, False, (-1, -1), 0.0),
}


def _inputs(rng, b, sq, sk, hq, hkv, d, dtype=np.float32):
    mk = lambda *s: rng.standard_normal(s).astype(dtype)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)


def _max_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        return float(np.where(both_inf, 0.0, np.abs(a - b)).max(initial=0.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_numpy_forward(rng, name, dtype):
    b, sq, sk, hq, hkv, d, causal, window, softcap = CASES[name]
    q, k, v = _inputs(rng, b, sq, sk, hq, hkv, d, dtype)
    out, lse, none = flashlab.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                              softcap=softcap, return_attn_probs=True)
    want, want_lse = ref.attention(q, k, v, causal=causal, window=window, softcap=softcap)
    assert none is None
    assert out.dtype == dtype and out.shape == (b, sq, hq, d)
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq)
    assert _max_err(out, want) < 2e-5
    assert _max_err(lse, want_lse) < 2e-5


def test_numpy_forward_fp16_within_the_rule(rng):
    q, k, v = _inputs(rng, 2, 80, 80, 4, 2, 64, np.float16)
    out = flashlab.flash_attn_func(q, k, v, causal=True)
    want, _ = ref.attention(q, k, v, causal=True)
    yardstick = _max_err(ref.lowp_attention(q, k, v, causal=True), want)
    assert out.dtype == np.float16
    assert _max_err(out, want) <= 2 * yardstick + 1e-5


def test_fully_masked_rows_write_zero_and_minus_inf(rng):
    # seqlen_q > seqlen_k with causal: the first sq − sk rows see no key.
    q, k, v = _inputs(rng, 1, 20, 5, 1, 1, 16)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[0, :15] == 0) and np.all(np.isneginf(lse[0, 0, :15]))
    assert np.all(np.isfinite(lse[0, 0, 15:]))


@pytest.mark.parametrize("name", ["basic", "causal", "sq_lt_sk_causal", "gqa_4to1",
                                  "window_16_4", "softcap_causal"])
def test_numpy_backward(rng, name):
    b, sq, sk, hq, hkv, d, causal, window, softcap = CASES[name]
    q, k, v = _inputs(rng, b, sq, sk, hq, hkv, d)
    dout = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse, _ = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    dq, dk, dv = flashlab.attention_backward(q, k, v, out, dout, lse, **kw)
    want = ref.attention_backward(q, k, v, dout, causal=causal, window=window, softcap=softcap)
    for got, w, what in zip((dq, dk, dv), want, "qkv"):
        assert got.shape == w.shape, what
        assert _max_err(got, w) < 1e-4, f"d{what}"


def test_varlen_with_a_zero_length_sequence(rng):
    lens_q, lens_k = [5, 0, 33, 1], [7, 4, 33, 0]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], 4, 32)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], 2, 32)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], 2, 32)).astype(np.float32)
    out, lse, _ = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=True, return_attn_probs=True)
    want, want_lse = ref.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    assert lse.shape == (4, cu_q[-1])
    assert _max_err(out, want) < 2e-5
    assert _max_err(lse, want_lse) < 2e-5


def test_qkvpacked_views_without_copy(rng):
    qkv = rng.standard_normal((2, 40, 3, 2, 64)).astype(np.float32)
    out = flashlab.flash_attn_qkvpacked_func(qkv, causal=True)
    want, _ = ref.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert _max_err(out, want) < 2e-5


def test_softmax_scale(rng):
    q, k, v = _inputs(rng, 1, 30, 30, 2, 2, 64)
    out = flashlab.flash_attn_func(q, k, v, softmax_scale=0.3)
    assert _max_err(out, ref.attention(q, k, v, scale=0.3)[0]) < 2e-5


def test_named_kernel_runs_and_unknown_kernel_lists_the_known(rng):
    q, k, v = _inputs(rng, 1, 30, 30, 2, 2, 64)
    out = flashlab.flash_attn_func(q, k, v, kernel="cpu_reference")
    assert _max_err(out, ref.attention(q, k, v)[0]) < 2e-5
    with pytest.raises(ValueError, match="kernel 'nope'.*known kernels: .*cpu_flash"):
        flashlab.flash_attn_func(q, k, v, kernel="nope")


def test_kernels_lists_the_registry():
    ks = flashlab.kernels()
    names = [k["name"] for k in ks]
    assert "cpu_reference" in names and "cpu_flash" in names
    for k in ks:
        assert set(k) >= {"name", "arch", "summary", "forward", "backward"}
        assert k["forward"] or k["backward"]
    assert isinstance(flashlab.cuda_available(), bool)


# ---- torch on the CPU -------------------------------------------------------------------


def _torch_inputs(rng, torch, b, sq, sk, hq, hkv, d):
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in _inputs(rng, b, sq, sk, hq, hkv, d))
    return q, k, v


@pytest.mark.torch
@pytest.mark.parametrize("name", ["basic", "sq_lt_sk_causal", "gqa_4to1", "window_16_4",
                                  "softcap_causal"])
def test_torch_cpu_forward_and_autograd(rng, name):
    import torch

    b, sq, sk, hq, hkv, d, causal, window, softcap = CASES[name]
    q, k, v = _torch_inputs(rng, torch, b, sq, sk, hq, hkv, d)
    out = flashlab.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
    dout = torch.randn_like(out)
    out.backward(dout)
    n = lambda t: t.detach().numpy()
    want = ref.attention(n(q), n(k), n(v), causal=causal, window=window, softcap=softcap)[0]
    grads = ref.attention_backward(n(q), n(k), n(v), n(dout), causal=causal, window=window,
                                   softcap=softcap)
    assert _max_err(n(out), want) < 2e-5
    for t, w, what in zip((q, k, v), grads, "qkv"):
        assert _max_err(n(t.grad), w) < 1e-4, f"d{what}"


@pytest.mark.torch
def test_torch_cpu_return_attn_probs_and_forward_only_kernel(rng):
    import torch

    q, k, v = _torch_inputs(rng, torch, 1, 33, 33, 2, 2, 64)
    out, lse, none = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                              kernel="cpu_reference")
    assert none is None and lse.dtype == torch.float32 and lse.shape == (1, 2, 33)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.torch
def test_torch_compile_fullgraph_traces_the_custom_op(rng):
    import torch

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return flashlab.flash_attn_func(q * 1.0, k, v, causal=True).sum()

    q, k, v = _torch_inputs(rng, torch, 1, 40, 40, 2, 1, 32)
    compiled = torch.compile(Attn(), fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    loss.backward()
    eager_q = q.detach().clone().requires_grad_()
    Attn()(eager_q, k.detach(), v.detach()).backward()
    assert torch.allclose(q.grad, eager_q.grad, atol=1e-6)
