"""FlashAttention-2's packed variants and scaled_dot_product_attention on CPU arrays.

Each packed variant gives bitwise what flash_attn_func / flash_attn_varlen_func give on the
unpacked views, and the oracle's values; torch gradients reach the packed tensor.
scaled_dot_product_attention is checked against torch.nn.functional.scaled_dot_product_attention
under docs/DESIGN.md's rule (torch installed) and against an independent NumPy top-left-causal
reference (always). Also: the enable_gqa refusal and the layout hint of shape errors.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
import reference as ref
from reference import check_rule, max_err

FP32_TOL, FP32_GRAD_TOL = 2e-5, 1e-4
HINT = "for [batch, heads, seqlen, head_dim] use flashlab.scaled_dot_product_attention"


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


# (seqlen_q, seqlen_k, heads_q, heads_kv) for SDPA: square, Sq < Sk, Sq > Sk, with GQA
SDPA_SHAPES = {"square": (33, 33, 2, 2), "sq_lt_sk": (17, 50, 2, 2),
               "sq_gt_sk": (50, 17, 2, 2), "gqa_sq_lt_sk": (9, 40, 4, 2),
               "gqa_sq_gt_sk": (40, 9, 6, 2)}


def _sdpa_reference(q, k, v, is_causal, scale=None):
    """fp64 SDPA in PyTorch's layout and mask: [B, H, S, D], is_causal = keys j <= i
    (torch.ones(Sq, Sk).tril(), top-left), K/V heads repeated for GQA."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * (scale or 1.0 / np.sqrt(q.shape[-1]))
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), v)


# ---- NumPy ------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_kvpacked_is_flash_attn_func_on_the_views(rng, causal):
    q, kv = _randn(rng, 2, 30, 4, 32), _randn(rng, 2, 45, 2, 2, 32)
    out, lse, _ = flashlab.flash_attn_kvpacked_func(q, kv, causal=causal, window_size=(9, -1),
                                                    return_attn_probs=True)
    k, v = kv[:, :, 0], kv[:, :, 1]
    same, same_lse, _ = flashlab.flash_attn_func(q, k, v, causal=causal, window_size=(9, -1),
                                                 return_attn_probs=True)
    assert np.array_equal(out, same) and np.array_equal(lse, same_lse)
    want, want_lse = ref.attention(q, k, v, causal=causal, window=(9, -1))
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL


def test_varlen_qkvpacked_is_flash_attn_varlen_func_on_the_views(rng):
    lens = [7, 0, 25, 1]
    cu = _cu(lens)
    qkv = _randn(rng, int(cu[-1]), 3, 2, 32)
    out, lse, _ = flashlab.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True,
                                                            return_attn_probs=True)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    same, same_lse, _ = flashlab.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                        causal=True, return_attn_probs=True)
    assert np.array_equal(out, same) and np.array_equal(lse, same_lse)
    want, want_lse = ref.varlen_attention(q, k, v, cu, cu, causal=True)
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL


def test_varlen_kvpacked_is_flash_attn_varlen_func_on_the_views(rng):
    lens_q, lens_k = [5, 12, 0], [9, 3, 4]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q, kv = _randn(rng, int(cu_q[-1]), 4, 16), _randn(rng, int(cu_k[-1]), 2, 1, 16)
    out = flashlab.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   softcap=3.0)
    k, v = kv[:, 0], kv[:, 1]
    same = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                           softcap=3.0)
    assert np.array_equal(out, same)
    assert max_err(out, ref.varlen_attention(q, k, v, cu_q, cu_k, softcap=3.0)[0]) < FP32_TOL


@pytest.mark.parametrize("call, match", [
    (lambda a: flashlab.flash_attn_kvpacked_func(a((1, 8, 2, 16)), a((1, 8, 3, 2, 16))),
     r"kv must have shape \[batch, seqlen_k, 2, heads_kv, head_dim\], got \(1, 8, 3, 2, 16\)"),
    (lambda a: flashlab.flash_attn_varlen_qkvpacked_func(a((8, 2, 2, 16)), _cu([8]), 8),
     r"qkv must have shape \[total, 3, heads, head_dim\], got \(8, 2, 2, 16\)"),
    (lambda a: flashlab.flash_attn_varlen_kvpacked_func(a((8, 2, 16)), a((8, 2, 16)), _cu([8]),
                                                        _cu([8]), 8, 8),
     r"kv must have shape \[total_k, 2, heads_kv, head_dim\], got \(8, 2, 16\)"),
])
def test_packed_shape_errors_name_the_layout(call, match):
    with pytest.raises(ValueError, match=match):
        call(lambda shape: np.zeros(shape, dtype=np.float32))


def test_packed_argument_without_a_shape_is_a_type_error():
    with pytest.raises(TypeError, match="kv must be an array supporting DLPack"):
        flashlab.flash_attn_kvpacked_func(np.zeros((1, 8, 2, 16), np.float32), [1.0])


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(SDPA_SHAPES))
def test_sdpa_numpy_against_top_left_reference(rng, shape, is_causal):
    sq, sk, hq, hkv = SDPA_SHAPES[shape]
    q, k, v = _randn(rng, 2, hq, sq, 32), _randn(rng, 2, hkv, sk, 32), _randn(rng, 2, hkv, sk, 24)
    out = flashlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                enable_gqa=hq != hkv)
    assert out.shape == (2, hq, sq, 24) and out.dtype == np.float32
    assert max_err(out, _sdpa_reference(q, k, v, is_causal)) < FP32_TOL
    # the output is a transposed view of FlashAttention's [B, Sq, Hq, Dv], not a copy
    assert not out.flags.c_contiguous and out.swapaxes(1, 2).flags.c_contiguous


def test_sdpa_causal_is_top_left_not_bottom_right(rng):
    # One query, four keys: top-left causal sees key 0 only (bottom-right would see all four).
    q, k, v = _randn(rng, 1, 1, 1, 8), _randn(rng, 1, 1, 4, 8), _randn(rng, 1, 1, 4, 8)
    out = flashlab.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_err(out, v[:, :, :1]) < 1e-6
    # Four queries, one key: every row sees the key.
    q, k, v = _randn(rng, 1, 1, 4, 8), _randn(rng, 1, 1, 1, 8), _randn(rng, 1, 1, 1, 8)
    out = flashlab.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_err(out, np.broadcast_to(v, out.shape)) < 1e-6


def test_sdpa_scale(rng):
    q, k, v = _randn(rng, 1, 2, 20, 16), _randn(rng, 1, 2, 30, 16), _randn(rng, 1, 2, 30, 16)
    out = flashlab.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert max_err(out, _sdpa_reference(q, k, v, False, scale=0.3)) < FP32_TOL


def test_sdpa_gqa_needs_enable_gqa(rng):
    q, k = _randn(rng, 1, 4, 10, 16), _randn(rng, 1, 2, 10, 16)
    with pytest.raises(ValueError, match=r"q has 4 heads and k 2: .*needs enable_gqa=True"):
        flashlab.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match=r"heads_kv must divide heads_q; got q \(1, 4, 10, 16\), "
                                         r"k \(1, 3, 10, 16\)"):
        k3 = _randn(rng, 1, 3, 10, 16)
        flashlab.scaled_dot_product_attention(q, k3, k3, enable_gqa=True)


def test_sdpa_shape_errors_use_its_layout(rng):
    q = _randn(rng, 1, 2, 10, 16)
    with pytest.raises(ValueError, match=r"k must have shape \[batch, heads, seqlen, head_dim\] "
                                         r"\(PyTorch SDPA's layout\), got \(2, 10, 16\)"):
        flashlab.scaled_dot_product_attention(q, q[0], q)
    with pytest.raises(ValueError, match=r"must agree .* v \(1, 2, 11, 16\)") as e:
        flashlab.scaled_dot_product_attention(q, q, _randn(rng, 1, 2, 11, 16))
    assert HINT not in str(e.value)


# ---- the layout hint --------------------------------------------------------------------


def test_layout_hint_on_arrays_in_sdpa_layout(rng):
    # [B, H, S, D] with Sq = 7, Sk = 5: read as [B, S, H, D], 5 does not divide 7.
    q, k = _randn(rng, 1, 2, 7, 16), _randn(rng, 1, 2, 5, 16)
    with pytest.raises(ValueError) as e:
        flashlab.flash_attn_func(q, k, k)
    assert str(e.value).startswith("heads_q (7) must be a multiple of heads_kv (5)")
    assert str(e.value).endswith("q/k/v are [batch, seqlen, heads, head_dim] (FlashAttention's "
                                 "layout); " + HINT)
    with pytest.raises(ValueError, match=re.escape(HINT)):
        flashlab.flash_attn_kvpacked_func(q, np.stack([k, k], axis=2))


def test_no_layout_hint_when_swapping_would_not_help(rng):
    q, k = _randn(rng, 1, 7, 2, 16), _randn(rng, 1, 5, 2, 8)
    with pytest.raises(ValueError, match=r"k\.shape\[3\] \(head_dim\) must be 16") as e:
        flashlab.flash_attn_func(q, k, k)
    assert HINT not in str(e.value)


# ---- torch on the CPU -------------------------------------------------------------------


def _leaf(rng, *shape):
    import torch

    return torch.from_numpy(_randn(rng, *shape)).requires_grad_()


def _grads_match(got, leaves, dout, tol=FP32_GRAD_TOL):
    """`got` (gradients reaching a packed tensor, sliced) against autograd through `leaves`."""
    import torch

    want = torch.autograd.grad(leaves[0], leaves[1:], dout)
    for g, w, name in zip(got, want, ("first", "second", "third")):
        assert max_err(g, w) < tol, name


@pytest.mark.torch
def test_torch_kvpacked_gradients_reach_kv(rng):
    import torch

    q, kv = _leaf(rng, 2, 40, 4, 32), _leaf(rng, 2, 40, 2, 2, 32)
    out = flashlab.flash_attn_kvpacked_func(q, kv, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    q2 = q.detach().clone().requires_grad_()
    same = flashlab.flash_attn_func(q2, k, v, causal=True)
    assert torch.equal(out, same)
    _grads_match((q.grad, kv.grad[:, :, 0], kv.grad[:, :, 1]), (same, q2, k, v), dout)
    n = lambda t: t.detach().numpy()
    grads = ref.attention_backward(n(q), n(k), n(v), n(dout), causal=True)
    assert max_err(kv.grad[:, :, 1], grads[2]) < FP32_GRAD_TOL


@pytest.mark.torch
def test_torch_varlen_packed_gradients_reach_the_packed_tensor(rng):
    import torch

    lens_q, lens_k = [6, 0, 19], [6, 4, 11]
    cu_q, cu_k = (torch.from_numpy(_cu(x)) for x in (lens_q, lens_k))
    qkv = _leaf(rng, int(cu_q[-1]), 3, 2, 16)
    out = flashlab.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max(lens_q), window_size=(3, 1))
    dout = torch.randn_like(out)
    out.backward(dout)
    q, k, v = (qkv.detach()[:, i].clone().requires_grad_() for i in range(3))
    same = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_q, max(lens_q), max(lens_q),
                                           window_size=(3, 1))
    assert torch.equal(out, same)
    _grads_match(qkv.grad.unbind(1), (same, q, k, v), dout)

    q, kv = _leaf(rng, int(cu_q[-1]), 4, 16), _leaf(rng, int(cu_k[-1]), 2, 2, 16)
    out = flashlab.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q2 = q.detach().clone().requires_grad_()
    k, v = (kv.detach()[:, i].clone().requires_grad_() for i in range(2))
    same = flashlab.flash_attn_varlen_func(q2, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                           causal=True)
    assert torch.equal(out, same)
    _grads_match((q.grad, kv.grad[:, 0], kv.grad[:, 1]), (same, q2, k, v), dout)


@pytest.mark.torch
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(SDPA_SHAPES))
def test_torch_sdpa_against_pytorch_sdpa(rng, shape, is_causal):
    import torch
    import torch.nn.functional as F

    sq, sk, hq, hkv = SDPA_SHAPES[shape]
    q, k, v = _leaf(rng, 2, hq, sq, 32), _leaf(rng, 2, hkv, sk, 32), _leaf(rng, 2, hkv, sk, 24)
    gqa = hq != hkv
    out = flashlab.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    assert out.shape == (2, hq, sq, 24) and out.dtype == torch.float32
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)

    def torch_sdpa(dtype):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=is_causal, enable_gqa=gqa)
        return (o,) + torch.autograd.grad(o, leaves, dout.to(dtype))

    yard, oracle = torch_sdpa(torch.float32), torch_sdpa(torch.float64)
    for name, g, y, w in zip(("out", "dq", "dk", "dv"), (out,) + got, yard, oracle):
        check_rule(name, g, y, w)


@pytest.mark.torch
def test_torch_sdpa_refuses_gqa_without_enable_gqa_as_pytorch_does(rng):
    import torch
    import torch.nn.functional as F

    q, k = torch.randn(1, 4, 10, 16), torch.randn(1, 2, 10, 16)
    with pytest.raises(RuntimeError):  # PyTorch's own refusal, for comparison
        F.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashlab.scaled_dot_product_attention(q, k, k)


@pytest.mark.torch
def test_torch_layout_hint(rng):
    import torch

    q, k = torch.randn(1, 2, 7, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=re.escape(HINT)):
        flashlab.flash_attn_func(q, k, k)


@pytest.mark.torch
def test_torch_compile_fullgraph_traces_sdpa(rng):
    import torch

    def f(q, k, v):
        return flashlab.scaled_dot_product_attention(q * 1.0, k, v, is_causal=True).sum()

    q, k, v = _leaf(rng, 1, 2, 12, 16), _leaf(rng, 1, 2, 20, 16), _leaf(rng, 1, 2, 20, 16)
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    loss.backward()
    n = lambda t: t.detach().numpy()
    assert abs(loss.item() - _sdpa_reference(n(q), n(k), n(v), True).sum()) < 1e-3
    assert torch.count_nonzero(k.grad[:, :, 12:]) == 0  # keys no query sees get no gradient
