"""Every bad input raises ValueError or TypeError naming the argument, before any kernel
runs (NumPy arrays, so these run wherever the package is installed)."""

from __future__ import annotations

import numpy as np
import pytest

import flashlab


def _qkv(b=1, sq=16, sk=16, hq=2, hkv=2, d=32, dtype=np.float32):
    z = lambda *s: np.ones(s, dtype=dtype)
    return z(b, sq, hq, d), z(b, sk, hkv, d), z(b, sk, hkv, d)


def _expect(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kw)


def test_rank():
    q, k, v = _qkv()
    _expect(ValueError, r"q must have rank 4", flashlab.flash_attn_func, q[0], k, v)


def test_batch_mismatch():
    q, k, v = _qkv()
    k2 = np.ones((2,) + k.shape[1:], dtype=k.dtype)
    _expect(ValueError, r"k\.shape\[0\]", flashlab.flash_attn_func, q, k2, v)


def test_head_dim_mismatch():
    q, k, v = _qkv()
    _expect(ValueError, r"k\.shape\[3\]", flashlab.flash_attn_func, q, k[..., :16].copy(), v)


def test_heads_not_a_multiple():
    q, k, v = _qkv(hq=3, hkv=2)
    _expect(ValueError, r"heads_q \(3\) must be a multiple of heads_kv \(2\)",
            flashlab.flash_attn_func, q, k, v)


def test_head_dim_range():
    q, k, v = _qkv(d=1100)
    _expect(ValueError, r"head_dim must be in \[1, 1024\]", flashlab.flash_attn_func, q, k, v)


def test_last_dim_not_contiguous():
    q, k, v = _qkv(d=64)
    _expect(ValueError, r"q must be contiguous in its last dimension",
            flashlab.flash_attn_func, q[..., ::2], k[..., ::2].copy(), v[..., ::2].copy())


def test_dtype_mismatch():
    q, k, v = _qkv()
    _expect(ValueError, r"k\.dtype \(fp64\) must match q\.dtype \(fp32\)",
            flashlab.flash_attn_func, q, k.astype(np.float64), v)


def test_unsupported_dtype_is_a_type_error():
    q, k, v = _qkv()
    _expect(TypeError, r"q: unsupported dtype", flashlab.flash_attn_func,
            q.astype(np.int64), k, v)


def test_not_an_array_is_a_type_error():
    _, k, v = _qkv()
    _expect(TypeError, r"q must be an array supporting DLPack", flashlab.flash_attn_func,
            "not an array", k, v)


@pytest.mark.parametrize("window, pattern", [((-2, -1), r"window_left must be -1"),
                                             ((-1, -3), r"window_right must be -1"),
                                             ((1, 2, 3), r"window_size must be \(left, right\)")])
def test_window(window, pattern):
    _expect(ValueError, pattern, flashlab.flash_attn_func, *_qkv(), window_size=window)


def test_softcap_negative():
    _expect(ValueError, r"softcap must be finite and >= 0", flashlab.flash_attn_func, *_qkv(),
            softcap=-1.0)


def test_softmax_scale_not_finite():
    _expect(ValueError, r"softmax_scale must be finite", flashlab.flash_attn_func, *_qkv(),
            softmax_scale=float("nan"))


def test_unsupported_features_name_their_argument():
    _expect(ValueError, r"dropout_p", flashlab.flash_attn_func, *_qkv(), dropout_p=0.1)
    _expect(ValueError, r"alibi_slopes", flashlab.flash_attn_func, *_qkv(),
            alibi_slopes=np.ones(2, dtype=np.float32))


def test_qkvpacked_shape():
    _expect(ValueError, r"qkv must have shape \[batch, seqlen, 3, heads, head_dim\]",
            flashlab.flash_attn_qkvpacked_func, np.ones((1, 8, 2, 2, 16), dtype=np.float32))


def _packed(lens_q, lens_k, hq=2, hkv=2, d=16):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = np.ones((cu_q[-1], hq, d), dtype=np.float32)
    k = np.ones((cu_k[-1], hkv, d), dtype=np.float32)
    return q, k, k.copy(), cu_q, cu_k


def test_cu_seqlens_dtype():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"maybe_cu_seqlens_q\.dtype must be int32",
            flashlab.flash_attn_varlen_func, q, k, v, cu_q.astype(np.float32), cu_k, 5, 5)


def test_cu_seqlens_first_entry():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    bad = cu_q.copy()
    bad[0] = 1
    _expect(ValueError, r"maybe_cu_seqlens_q\[0\] must be 0", flashlab.flash_attn_varlen_func,
            q, k, v, bad, cu_k, 5, 5)


def test_cu_seqlens_non_decreasing():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    bad = np.array([0, 3, 2, 9], dtype=np.int32)
    cu_k3 = np.array([0, 4, 9, 9], dtype=np.int32)
    _expect(ValueError, r"maybe_cu_seqlens_q must be non-decreasing",
            flashlab.flash_attn_varlen_func, q, k, v, bad, cu_k3, 7, 5)


def test_cu_seqlens_lengths_differ():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"must have the same length", flashlab.flash_attn_varlen_func,
            q, k, v, cu_q, np.array([0, 9], dtype=np.int32), 5, 9)


def test_block_table_is_refused():
    q, k, v, cu_q, cu_k = _packed([4], [4])
    _expect(ValueError, r"block_table", flashlab.flash_attn_varlen_func, q, k, v, cu_q, cu_k,
            4, 4, block_table=np.zeros((1, 1), dtype=np.int32))


def test_backward_lse_shape():
    q, k, v = _qkv()
    out, lse, _ = flashlab.flash_attn_func(q, k, v, return_attn_probs=True)
    _expect(ValueError, r"lse", flashlab.attention_backward, q, k, v, out, out,
            lse[:, :, :8].copy())
