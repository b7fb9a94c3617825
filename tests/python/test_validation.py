"""Every bad input raises ValueError or TypeError naming the argument, before any kernel
runs. NumPy arrays (and host memory labelled with another device through DLPack), so these
run wherever the package is installed; the rules themselves live in src/api/validate.cpp."""

from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
from dlpack_fake import CUDA, VULKAN, Labelled


def _qkv(b=1, sq=16, sk=16, hq=2, hkv=2, d=32, dtype=np.float32):
    z = lambda *s: np.ones(s, dtype=dtype)
    return z(b, sq, hq, d), z(b, sk, hkv, d), z(b, sk, hkv, d)


def _expect(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kw)


attn = flashlab.flash_attn_func
varlen = flashlab.flash_attn_varlen_func


# ---- shapes -------------------------------------------------------------------------------


def test_rank():
    q, k, v = _qkv()
    _expect(ValueError, r"q must have rank 4 \[batch, seqlen_q, heads_q, head_dim\], got rank 3",
            attn, q[0], k, v)
    _expect(ValueError, r"k must have rank 4", attn, q, k[0], v)
    _expect(ValueError, r"v must have rank 1 to 4, got 5", attn, q, k, v[None])


def test_batch_mismatch():
    q, k, v = _qkv()
    two = lambda x: np.ones((2,) + x.shape[1:], dtype=x.dtype)
    _expect(ValueError, r"k\.shape\[0\] \(batch\) must be 1, got 2", attn, q, two(k), v)
    _expect(ValueError, r"v\.shape\[0\] \(batch\) must be 1, got 2", attn, q, k, two(v))


def test_seqlen_k_mismatch():
    q, k, v = _qkv()
    _expect(ValueError, r"v\.shape\[1\] \(seqlen_k\) must be 16, got 8", attn, q, k, v[:, :8])


def test_heads_mismatch():
    q, k, v = _qkv(hq=4, hkv=2)
    _expect(ValueError, r"v\.shape\[2\] \(heads_kv\) must be 2, got 1", attn, q, k, v[:, :, :1])


def test_head_dim_mismatch():
    q, k, v = _qkv()
    _expect(ValueError, r"k\.shape\[3\] \(head_dim\) must be 32, got 16", attn, q,
            k[..., :16].copy(), v)


def test_heads_not_a_multiple():
    q, k, v = _qkv(hq=3, hkv=2)
    _expect(ValueError, r"heads_q \(3\) must be a multiple of heads_kv \(2\)", attn, q, k, v)


def test_head_dim_range():
    _expect(ValueError, r"head_dim must be in \[1, 1024\], got 1100", attn, *_qkv(d=1100))


# ---- layout -------------------------------------------------------------------------------


def test_last_dim_not_contiguous():
    q, k, v = _qkv(d=64)
    half = lambda x: x[..., ::2].copy()
    _expect(ValueError, r"q must be contiguous in its last dimension \(stride\[3\] = 2, "
                        r"must be 1\)", attn, q[..., ::2], half(k), half(v))
    _expect(ValueError, r"v must be contiguous in its last dimension", attn, half(q), half(k),
            v[..., ::2])


def test_negative_stride():
    q, k, v = _qkv()
    _expect(ValueError, r"k\.stride\[1\] is negative", attn, q, k[:, ::-1], v)


# ---- dtypes -------------------------------------------------------------------------------


def test_dtype_mismatch():
    q, k, v = _qkv()
    _expect(ValueError, r"k\.dtype \(fp64\) must match q\.dtype \(fp32\)", attn, q,
            k.astype(np.float64), v)
    _expect(ValueError, r"v\.dtype \(fp16\) must match q\.dtype \(fp32\)", attn, q, k,
            v.astype(np.float16))


@pytest.mark.parametrize("dtype,words", [(np.int64, "int64"), (np.complex64, "complex64"),
                                         (np.bool_, "bool"), (np.int8, "int8"),
                                         (np.uint16, "uint16")])
def test_unsupported_dtype_is_a_type_error(dtype, words):
    q, k, v = _qkv()
    _expect(TypeError, rf"^q\.dtype must be fp16, bf16, fp32 or fp64, got {words}$",
            attn, q.astype(dtype), k, v)
    _expect(TypeError, rf"^v\.dtype must be fp16, bf16, fp32 or fp64, got {words}$",
            attn, q, k, v.astype(dtype))


def test_int32_inputs_are_refused():
    q, k, v = _qkv()
    _expect(ValueError, r"q\.dtype must be fp16, bf16, fp32 or fp64, got int32", attn,
            q.astype(np.int32), k.astype(np.int32), v.astype(np.int32))


def test_not_an_array_is_a_type_error():
    q, k, v = _qkv()
    _expect(TypeError, r"q must be an array supporting DLPack", attn, "not an array", k, v)
    _expect(TypeError, r"v must be an array supporting DLPack", attn, q, k, [[1.0]])
    _expect(TypeError, r"qkv must be an array supporting DLPack",
            flashlab.flash_attn_qkvpacked_func, None)


# ---- devices (host memory labelled through DLPack: validation must refuse it) -------------


def test_mixed_devices_are_refused_before_any_kernel():
    q, k, v = _qkv()
    _expect(ValueError, r"k is on cuda:0 but q is on cpu:0", attn, q, Labelled(k, CUDA), v)
    _expect(ValueError, r"v is on cuda:1 but q is on cpu:0", attn, q, k, Labelled(v, CUDA, 1))


def test_cu_seqlens_on_another_device():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"cu_seqlens_k must be on the device of q \(cpu\)", varlen, q, k, v,
            cu_q, Labelled(cu_k, CUDA), 5, 5)


def test_unknown_device_kind():
    q, k, v = _qkv()
    _expect(ValueError, r"q must be on the CPU or a CUDA device", attn, Labelled(q, VULKAN), k, v)


# ---- options ------------------------------------------------------------------------------


@pytest.mark.parametrize("window, pattern", [
    ((-2, -1), r"window_left must be -1 \(unbounded\) or >= 0, got -2"),
    ((-1, -3), r"window_right must be -1 \(unbounded\) or >= 0, got -3"),
    ((1, 2, 3), r"window_size must be \(left, right\), got \(1, 2, 3\)"),
    (4, r"window_size must be \(left, right\), got 4"),
])
def test_window(window, pattern):
    _expect(ValueError, pattern, attn, *_qkv(), window_size=window)


@pytest.mark.parametrize("softcap", [-1.0, float("inf"), float("nan")])
def test_softcap(softcap):
    _expect(ValueError, r"softcap must be finite and >= 0", attn, *_qkv(), softcap=softcap)


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_softmax_scale_not_finite(scale):
    _expect(ValueError, r"softmax_scale must be finite", attn, *_qkv(), softmax_scale=scale)


def test_unsupported_features_name_their_argument():
    _expect(ValueError, r"alibi_slopes: ALiBi is not supported", attn, *_qkv(),
            alibi_slopes=np.ones(2, dtype=np.float32))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_p_outside_zero_to_one(p):
    _expect(ValueError, r"dropout_p must be in \[0, 1\)", attn, *_qkv(), dropout_p=p)
    _expect(ValueError, r"dropout_p must be in \[0, 1\)", flashlab.flash_attn_qkvpacked_func,
            np.ones((1, 8, 3, 2, 16), dtype=np.float32), dropout_p=p)


def test_dropout_on_numpy_needs_a_seed():
    _expect(ValueError, r"dropout_seed: NumPy arrays need an explicit seed", attn, *_qkv(),
            dropout_p=0.1)


def test_dropout_with_a_kernel_without_it_says_why():
    _expect(ValueError, r"kernel 'cpu_flash' does not support this call: dropout_p > 0 is not "
            r"supported", attn, *_qkv(), dropout_p=0.1, dropout_seed=3, kernel="cpu_flash")


def test_unknown_kernel():
    _expect(ValueError, r"kernel 'fa9' is not in this build; known kernels: .*cpu_flash", attn,
            *_qkv(), kernel="fa9")


def test_qkvpacked_shape():
    _expect(ValueError, r"qkv must have shape \[batch, seqlen, 3, heads, head_dim\], got "
                        r"\(1, 8, 2, 2, 16\)",
            flashlab.flash_attn_qkvpacked_func, np.ones((1, 8, 2, 2, 16), dtype=np.float32))


# ---- varlen -------------------------------------------------------------------------------


def _packed(lens_q, lens_k, hq=2, hkv=2, d=16):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = np.ones((cu_q[-1], hq, d), dtype=np.float32)
    k = np.ones((cu_k[-1], hkv, d), dtype=np.float32)
    return q, k, k.copy(), cu_q, cu_k


def test_varlen_rank():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"q must have rank 3 \[total_q, heads_q, head_dim\], got rank 4", varlen,
            q[None], k, v, cu_q, cu_k, 5, 5)


def test_cu_seqlens_dtype():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"^cu_seqlens_q\.dtype must be int32, got fp32", varlen, q, k, v,
            cu_q.astype(np.float32), cu_k, 5, 5)
    _expect(TypeError, r"^cu_seqlens_k\.dtype must be int32, got int64$", varlen, q, k, v,
            cu_q, cu_k.astype(np.int64), 5, 5)
    _expect(TypeError, r"^cu_seqlens_q\.dtype must be int32, got uint32$", varlen, q, k, v,
            cu_q.astype(np.uint32), cu_k, 5, 5)


def test_cu_seqlens_rank_and_size():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"^cu_seqlens_q must have rank 1 \[batch \+ 1\]", varlen, q, k, v,
            cu_q[None], cu_k, 5, 5)
    _expect(ValueError, r"^cu_seqlens_q must have batch \+ 1 >= 1 entries, got 0", varlen, q, k,
            v, cu_q[:0], cu_k[:0], 5, 5)


def test_cu_seqlens_missing():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"cu_seqlens_q and cu_seqlens_k are required", varlen, q, k, v, None,
            cu_k, 5, 5)


def test_cu_seqlens_first_entry():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    bad = cu_q.copy()
    bad[0] = 1
    _expect(ValueError, r"^cu_seqlens_q\[0\] must be 0, got 1", varlen, q, k, v, bad, cu_k, 5, 5)


def test_cu_seqlens_non_decreasing():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"^cu_seqlens_q must be non-decreasing: \[2\] = 2 < \[1\] = 3", varlen,
            q, k, v, np.array([0, 3, 2, 9], dtype=np.int32),
            np.array([0, 4, 9, 9], dtype=np.int32), 7, 5)


def test_cu_seqlens_lengths_differ():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"^cu_seqlens_q and cu_seqlens_k must have the same length "
                        r"\(batch \+ 1\), got 3 and 2", varlen,
            q, k, v, cu_q, np.array([0, 9], dtype=np.int32), 5, 9)


def test_cu_seqlens_past_the_packed_rows():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"^cu_seqlens_k\[2\] = 10 exceeds the 9 rows of the packed tensor",
            varlen, q, k, v, cu_q, np.array([0, 4, 10], dtype=np.int32), 5, 6)


def test_cu_seqlens_messages_from_torch():
    # A torch user's cu_seqlens: torch.tensor([...]) is int64 (torch.long) unless told, and a
    # cu_seqlens with more entries than the batch runs past the packed rows. The messages
    # name the argument as the caller does, with no field name or DLPack dtype code.
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in _packed([4, 5], [4, 5])[:3])
    good = torch.tensor([0, 4, 9], dtype=torch.int32)
    long_cu = torch.tensor([0, 4, 9, 12, 20], dtype=torch.int32)
    for pattern, exc, cu_q, cu_k in (
            (r"^cu_seqlens_q\.dtype must be int32, got int64$", TypeError,
             torch.tensor([0, 4, 9]), good),
            (r"^cu_seqlens_k\.dtype must be int32, got int64$", TypeError, good,
             good.long()),
            (r"^cu_seqlens_q\[4\] = 20 exceeds the 9 rows of the packed tensor", ValueError,
             long_cu, long_cu)):
        with pytest.raises(exc, match=pattern) as e:
            varlen(q, k, v, cu_q, cu_k, 8, 8)
        assert not re.search(r"maybe_|code \d|bits", str(e.value)), str(e.value)


def test_max_seqlen():
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    _expect(ValueError, r"cu_seqlens_q: sequence 1 has length 5 > max_seqlen_q = 4", varlen,
            q, k, v, cu_q, cu_k, 4, 5)
    _expect(ValueError, r"max_seqlen_k must be >= 0", varlen, q, k, v, cu_q, cu_k, 5, -1)


# ---- backward (NumPy) ---------------------------------------------------------------------


def _forward():
    q, k, v = _qkv()
    out, lse, _ = attn(q, k, v, return_attn_probs=True)
    return q, k, v, out, lse


def test_backward_lse_shape_and_dtype():
    q, k, v, out, lse = _forward()
    _expect(ValueError, r"lse\.shape\[2\] \(seqlen_q\) must be 16, got 8",
            flashlab.attention_backward, q, k, v, out, out, lse[:, :, :8].copy())
    _expect(ValueError, r"lse\.dtype must be fp32, got fp64", flashlab.attention_backward,
            q, k, v, out, out, lse.astype(np.float64))
    _expect(TypeError, r"^lse\.dtype must be fp32, got int64$", flashlab.attention_backward,
            q, k, v, out, out, lse.astype(np.int64))


def test_backward_dout_shape_and_dtype():
    q, k, v, out, lse = _forward()
    _expect(ValueError, r"dout \[1, 8, 2, 32\] must have the shape of out \[1, 16, 2, 32\]",
            flashlab.attention_backward, q, k, v, out, out[:, :8].copy(), lse)
    _expect(ValueError, r"dout\.dtype \(fp16\) must match q\.dtype \(fp32\)",
            flashlab.attention_backward, q, k, v, out, out.astype(np.float16), lse)


def test_backward_options_are_checked_too():
    q, k, v, out, lse = _forward()
    _expect(ValueError, r"window_left must be -1", flashlab.attention_backward, q, k, v, out,
            out, lse, window_size=(-5, 0))
    _expect(ValueError, r"kernel 'nope' is not in this build", flashlab.attention_backward,
            q, k, v, out, out, lse, kernel="nope")


# ---- integer widths, max_seqlen, check_inputs ---------------------------------------------


@pytest.mark.parametrize("arg, value", [("max_seqlen_q", 2**31), ("max_seqlen_k", -(2**31) - 1)])
def test_max_seqlen_beyond_int32_names_the_argument(arg, value):
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    kw = {"max_seqlen_q": 5, "max_seqlen_k": 5, arg: value}
    _expect(ValueError, rf"{arg} must fit int32", varlen, q, k, v, cu_q, cu_k, **kw)


def test_window_beyond_int32_names_the_argument():
    _expect(ValueError, r"window_size\[0\] must fit int32", attn, *_qkv(), window_size=(2**31, 0))


@pytest.mark.torch
def test_max_seqlen_beyond_int32_with_torch_tensors():
    import torch

    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in _packed([4, 5], [4, 5]))
    _expect(ValueError, r"max_seqlen_q must fit int32", varlen, q, k, v, cu_q, cu_k, 2**31, 5)


def test_max_seqlen_may_over_estimate(rng):
    # FlashAttention accepts an over-estimate; even the O(seqlen_q·seqlen_k) reference sizes
    # its workspace by the real lengths, bounded by the packed totals.
    q, k, v, cu_q, cu_k = _packed([4, 5], [3, 6])
    q, k, v = (rng.standard_normal(x.shape).astype(np.float32) for x in (q, k, v))
    want = varlen(q, k, v, cu_q, cu_k, 5, 6, kernel="cpu_reference")
    got = varlen(q, k, v, cu_q, cu_k, 2**31 - 1, 2**31 - 1, kernel="cpu_reference")
    np.testing.assert_array_equal(got, want)


def test_check_inputs_on_host_cu_seqlens():
    # Host cu_seqlens are checked either way; check_inputs only adds device ones.
    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    assert varlen(q, k, v, cu_q, cu_k, 5, 5, check_inputs=True).shape == q.shape
    _expect(ValueError, r"^cu_seqlens_q\[0\] must be 0", varlen, q, k, v,
            np.array([1, 4, 9], dtype=np.int32), cu_k, 5, 5, check_inputs=True)
    out, lse, _ = varlen(q, k, v, cu_q, cu_k, 5, 5, return_attn_probs=True)
    dq, _, _ = flashlab.attention_backward(q, k, v, out, out, lse, cu_seqlens_q=cu_q,
                                           cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=5,
                                           check_inputs=True)
    assert dq.shape == q.shape


@pytest.mark.skipif(flashlab.cuda_available(), reason="labelled host memory must not reach a GPU")
def test_check_inputs_needs_the_cuda_runtime():
    # Through the native module: the NumPy path would allocate out on the host.
    from flashlab import _flashlab

    q, k, v, cu_q, cu_k = _packed([4, 5], [4, 5])
    out, lse = np.empty_like(q), np.empty((2, 9), dtype=np.float32)
    o = _flashlab.Options()
    o.cu_seqlens_q, o.cu_seqlens_k = Labelled(cu_q, CUDA), Labelled(cu_k, CUDA)
    o.max_seqlen_q = o.max_seqlen_k = 5
    o.kernel = "cpu_reference"
    args = [Labelled(x, CUDA) for x in (q, k, v, out, lse)]
    _expect(ValueError, r"kernel 'cpu_reference' does not support this call", _flashlab.forward,
            *args, o, True)
    o.check_inputs = True
    _expect((ValueError, RuntimeError), r"check_inputs", _flashlab.forward, *args, o, True)


@pytest.mark.cuda
def test_check_inputs_reads_device_cu_seqlens():
    import torch

    q, k, v, _, _ = (torch.from_numpy(x).cuda() for x in _packed([4, 5], [4, 5]))
    q, k, v = (x.half() for x in (q, k, v))
    good = torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda")
    bad = torch.tensor([0, 6, 4], dtype=torch.int32, device="cuda")
    # Unchecked, the kernels clamp the bad offsets and run; checked, the call is refused.
    varlen(q, k, v, bad, good, 6, 5)
    _expect(ValueError, r"^cu_seqlens_q must be non-decreasing: \[2\] = 4 < \[1\] = 6", varlen,
            q, k, v, bad, good, 6, 5, check_inputs=True)
    torch.testing.assert_close(varlen(q, k, v, good, good, 5, 5, check_inputs=True),
                               varlen(q, k, v, good, good, 5, 5))


# ---- the native Options at exit -------------------------------------------------------------


def test_options_in_a_reference_cycle_is_collected():
    # An Options reachable only through a cycle (here a list that refers back to it; in
    # practice a traceback's frame) must be collected, not reported by nanobind at exit.
    import subprocess
    import sys

    code = ("import numpy as np, flashlab\n"
            "from flashlab import _flashlab\n"
            "o = _flashlab.Options(); o.workspace = [o]; del o\n"
            "q = np.ones((9, 2, 16), np.float32); cu = np.array([0, 4, 9], np.int32)\n"
            "flashlab.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "leaked" not in r.stderr, r.stderr
