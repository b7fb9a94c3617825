"""flashlab.flash_attn_with_kvcache on NumPy arrays, torch CPU and CUDA tensors, against an expected
cache built here by hand (append at cache_seqlens[b], rotary on the new keys) and the oracle of
reference.py run per sequence on the gathered rows [0, L_b), causal aligned bottom-right:
docs/DESIGN.md's rule (check_rule) for fp16, a tight absolute bound for fp32. After an append
every cache equals the expected one byte for byte: the new rows and nothing else changed."""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
import reference as ref
from reference import check_rule, max_err

FP32_TOL = 2e-5
PAGE = 16


class Problem:
    """One call's inputs: q, the caches (contiguous or paged with shuffled pages), the new
    rows, the int32 tables, and rotary tables."""

    def __init__(self, rng, *, batch=3, seqlen_q=4, heads_q=4, heads_kv=2, head_dim=32,
                 head_dim_v=None, seqlen_new=0, capacity=48, paged=False, batch_idx=False,
                 dtype=np.float16, seqlens=None):
        dv = head_dim_v or head_dim
        self.capacity = capacity if not paged else -(-capacity // PAGE) * PAGE
        mk = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
        self.q = mk(batch, seqlen_q, heads_q, head_dim)
        self.block_table = self.batch_idx = None
        if paged:
            pages = -(-capacity // PAGE)
            num_pages = batch * pages + 3
            self.block_table = rng.permutation(num_pages)[:batch * pages].reshape(
                batch, pages).astype(np.int32)
            rows = (num_pages, PAGE)
        else:
            batch_cache = batch + 2 if batch_idx else batch
            if batch_idx:
                self.batch_idx = rng.permutation(batch_cache)[:batch].astype(np.int32)
            rows = (batch_cache, capacity)
        self.k_cache, self.v_cache = mk(*rows, heads_kv, head_dim), mk(*rows, heads_kv, dv)
        self.k = mk(batch, seqlen_new, heads_kv, head_dim) if seqlen_new else None
        self.v = mk(batch, seqlen_new, heads_kv, dv) if seqlen_new else None
        top = capacity - seqlen_new
        self.seqlens = (rng.integers(0, top + 1, size=batch).astype(np.int32) if seqlens is None
                        else np.asarray(seqlens, dtype=np.int32))
        self.seqlens[0] = top  # one sequence fills its cache to the last row,
        self.seqlens[-1] = 0  # and one starts empty (without new rows: L_b = 0, out 0, LSE -inf)
        half = head_dim // 4  # rotary_dim = head_dim / 2: channels past it pass through
        angle = rng.uniform(-np.pi, np.pi, size=(capacity, half))
        self.cos, self.sin = np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)

    def where(self, b, r):
        """(cache row, position in it) of sequence b's row r."""
        if self.block_table is not None:
            return self.block_table[b][r // PAGE], r % PAGE
        return (b if self.batch_idx is None else self.batch_idx[b]), r


def _rotary_rows(x, cos, sin, first, per_row, interleaved):
    """x [1, S, H, D] rotated at positions first + t (per_row), else all at `first`."""
    if per_row:
        return flashlab.apply_rotary_emb(x, cos, sin, interleaved=interleaved,
                                         seqlen_offsets=int(first))
    rep = lambda t: np.repeat(t[first:first + 1], x.shape[1], axis=0)  # noqa: E731
    return flashlab.apply_rotary_emb(x, rep(cos), rep(sin), interleaved=interleaved)


def expected(p, *, causal=False, window=(-1, -1), softcap=0.0, rotary=None, leftpad=None):
    """(k_cache, v_cache after the append, [(q_b, K_b, V_b) per sequence]); `rotary` is
    None or the interleaved flag; with `leftpad`, sequence b's keys start at row leftpad[b]."""
    kc, vc = p.k_cache.copy(), p.v_cache.copy()
    # FlashAttention-2's rule: q rotates per query when causal or a window bound can bind.
    local = causal or any(0 <= w < p.capacity for w in window)
    per_seq = []
    for b in range(p.q.shape[0]):
        s = int(p.seqlens[b])
        qb = p.q[b:b + 1]
        if p.k is not None:
            kb, vb = p.k[b:b + 1], p.v[b:b + 1]
            if rotary is not None:
                kb = _rotary_rows(kb, p.cos, p.sin, s, True, rotary)
                qb = _rotary_rows(qb, p.cos, p.sin, s, local, rotary)
            for t in range(kb.shape[1]):
                page, row = p.where(b, s + t)
                kc[page, row], vc[page, row] = kb[0, t], vb[0, t]
        length = s + (0 if p.k is None else p.k.shape[1])
        first = 0 if leftpad is None else int(leftpad[b])
        at = np.array([p.where(b, r) for r in range(first, length)], dtype=np.int64).reshape(-1, 2)
        kb, vb = kc[at[:, 0], at[:, 1]][None], vc[at[:, 0], at[:, 1]][None]  # L_b may be 0
        per_seq.append((qb, kb, vb))
    return kc, vc, per_seq


def check_outputs(out, lse, per_seq, *, causal=False, window=(-1, -1), softcap=0.0):
    """out and LSE of every sequence against the oracle on its gathered rows."""
    d = per_seq[0][0].shape[-1]
    mask = dict(scale=float(np.float32(1 / np.sqrt(d))), causal=causal, window=window,
                softcap=softcap)
    for b, (qb, kb, vb) in enumerate(per_seq):
        want, want_lse = ref.attention(qb, kb, vb, **mask)
        if out.dtype == np.float16:
            check_rule(f"out[{b}]", out[b:b + 1], ref.lowp_attention(qb, kb, vb, **mask), want)
        else:
            assert max_err(out[b:b + 1], want) < FP32_TOL, f"out[{b}]"
        assert max_err(lse[b:b + 1], want_lse) < FP32_TOL, f"lse[{b}]"


def run(p, **kw):
    return flashlab.flash_attn_with_kvcache(
        p.q, p.k_cache, p.v_cache, p.k, p.v, cache_seqlens=p.seqlens,
        cache_batch_idx=p.batch_idx, block_table=p.block_table, return_softmax_lse=True, **kw)


MASKS = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window_causal_softcap": dict(causal=True, window=(6, -1), softcap=4.0),
    "window_both": dict(window=(5, 3)),
}


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("seqlen_new", [0, 3], ids=["read", "append"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_against_the_oracle(rng, paged, seqlen_new, mask, dtype):
    m = MASKS[mask]
    p = Problem(rng, paged=paged, seqlen_new=seqlen_new, dtype=dtype)
    kc, vc, per_seq = expected(p, **m)
    out, lse = run(p, causal=m.get("causal", False), window_size=m.get("window", (-1, -1)),
                   softcap=m.get("softcap", 0.0))
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == p.q.shape
    assert lse.dtype == np.float32 and lse.shape == (3, 4, 4)
    assert np.array_equal(p.k_cache, kc) and np.array_equal(p.v_cache, vc)
    check_outputs(out, lse, per_seq, **m)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_rotary_append(rng, paged, interleaved, causal):
    p = Problem(rng, paged=paged, seqlen_new=5, seqlen_q=5)
    q0, k0 = p.q.copy(), p.k.copy()
    kc, vc, per_seq = expected(p, causal=causal, rotary=interleaved)
    out, lse = run(p, causal=causal, rotary_cos=p.cos, rotary_sin=p.sin,
                   rotary_interleaved=interleaved)
    assert np.array_equal(p.q, q0) and np.array_equal(p.k, k0)  # rotated copies only
    assert np.array_equal(p.k_cache, kc) and np.array_equal(p.v_cache, vc)
    b0, s0 = p.where(0, int(p.seqlens[0]))
    assert not np.array_equal(p.k_cache[b0, s0], k0[0, 0])  # the cache holds the rotated key
    check_outputs(out, lse, per_seq, causal=causal)


@pytest.mark.parametrize("window", [(8, 0), (48, -1)], ids=["local", "wider_than_cache"])
def test_rotary_local_window_rotates_q_per_position(rng, window):
    # Local (a window without causal) rotates q like causal: position cache_seqlens + i. A
    # window bound of the cache's 48 rows or more cannot bind: q then rotates as without one.
    p = Problem(rng, seqlen_new=4, seqlen_q=4, dtype=np.float32)
    kc, _, per_seq = expected(p, window=window, rotary=True)
    out, lse = run(p, window_size=window, rotary_cos=p.cos, rotary_sin=p.sin)
    assert np.array_equal(p.k_cache, kc)
    check_outputs(out, lse, per_seq, window=window)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rotary_with_leftpad_counts_positions_from_row_0(rng, interleaved):
    # FlashAttention-2: a left-padded cache's new rows and queries keep their row positions.
    p = Problem(rng, seqlen_new=2, seqlen_q=2, dtype=np.float16)
    leftpad = np.array([min(3, int(s)) for s in p.seqlens], dtype=np.int32)
    kc, _, per_seq = expected(p, causal=True, rotary=interleaved, leftpad=leftpad)
    out, lse = run(p, causal=True, cache_leftpad=leftpad, rotary_cos=p.cos, rotary_sin=p.sin,
                   rotary_interleaved=interleaved)
    assert np.array_equal(p.k_cache, kc)
    check_outputs(out, lse, per_seq, causal=True)


def test_cache_batch_idx_and_int_seqlens_and_gqa(rng):
    p = Problem(rng, batch_idx=True, seqlen_new=2, heads_q=8, heads_kv=2, head_dim_v=16,
                dtype=np.float32)
    p.seqlens[:] = 7
    kc, vc, per_seq = expected(p, causal=True)
    out, lse = flashlab.flash_attn_with_kvcache(
        p.q, p.k_cache, p.v_cache, p.k, p.v, cache_seqlens=7, cache_batch_idx=p.batch_idx,
        causal=True, return_softmax_lse=True)
    assert out.shape == (3, 4, 8, 16)
    assert np.array_equal(p.k_cache, kc) and np.array_equal(p.v_cache, vc)
    check_outputs(out, lse, per_seq, causal=True)


def test_no_seqlens_reads_full_caches_and_returns_out_only(rng):
    p = Problem(rng, capacity=20, dtype=np.float32)
    out = flashlab.flash_attn_with_kvcache(p.q, p.k_cache, p.v_cache, causal=True)
    want, _ = ref.attention(p.q, p.k_cache, p.v_cache, causal=True,
                            scale=float(np.float32(1 / np.sqrt(32))))
    assert type(out) is np.ndarray and max_err(out, want) < FP32_TOL


@pytest.mark.torch
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_torch_cpu_tensors(rng, paged):
    import torch

    p = Problem(rng, paged=paged, seqlen_new=3, seqlen_q=3, dtype=np.float32)
    kc, vc, per_seq = expected(p, causal=True, rotary=False)
    t = torch.from_numpy
    k_cache, v_cache = t(p.k_cache.copy()), t(p.v_cache.copy())
    q = t(p.q.copy()).requires_grad_()
    out, lse = flashlab.flash_attn_with_kvcache(
        q, k_cache, v_cache, t(p.k), t(p.v), rotary_cos=t(p.cos).requires_grad_(),
        rotary_sin=t(p.sin),
        cache_seqlens=t(p.seqlens), block_table=None if p.block_table is None else
        t(p.block_table), causal=True, rotary_interleaved=False, return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert np.array_equal(k_cache.numpy(), kc) and np.array_equal(v_cache.numpy(), vc)
    check_outputs(out.numpy(), lse.numpy(), per_seq, causal=True)


@pytest.mark.cuda
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_tensors_on_the_current_stream(rng, paged):
    """cute_fa2's split-KV on CUDA tensors, called on a side stream: the same caches and, under
    the rule, the same outputs as the oracle; an int cache_seqlens becomes a table on q's
    device; num_splits forced above the key tiles of the shortest sequence."""
    import torch

    p = Problem(rng, paged=paged, seqlen_new=3, seqlen_q=3, head_dim=128, dtype=np.float16)
    kc, vc, per_seq = expected(p, causal=True, rotary=False)
    cuda = lambda a: torch.from_numpy(a.copy()).cuda()  # noqa: E731
    k_cache, v_cache = cuda(p.k_cache), cuda(p.v_cache)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = flashlab.flash_attn_with_kvcache(
            cuda(p.q), k_cache, v_cache, cuda(p.k), cuda(p.v), rotary_cos=cuda(p.cos),
            rotary_sin=cuda(p.sin), cache_seqlens=cuda(p.seqlens),
            block_table=None if p.block_table is None else cuda(p.block_table), causal=True,
            rotary_interleaved=False, num_splits=5, return_softmax_lse=True)
    torch.cuda.synchronize()
    assert out.is_cuda and out.dtype == torch.float16 and lse.dtype == torch.float32
    assert np.array_equal(k_cache.cpu().numpy(), kc) and np.array_equal(v_cache.cpu().numpy(), vc)
    d = 128
    mask = dict(scale=float(np.float32(1 / np.sqrt(d))), causal=True)
    for b, (qb, kb, vb) in enumerate(per_seq):
        want, want_lse = ref.attention(qb, kb, vb, **mask)
        check_rule(f"out[{b}]", out[b:b + 1].cpu().numpy(), ref.lowp_attention(qb, kb, vb, **mask),
                   want)
        assert max_err(lse[b:b + 1].cpu().numpy(), want_lse) < 1e-3, f"lse[{b}]"
    # An int cache_seqlens is placed on q's device (no append: the caches are only read).
    q = cuda(p.q)
    full = flashlab.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=int(p.seqlens[0]),
                                           block_table=None if p.block_table is None else
                                           cuda(p.block_table))
    assert full.is_cuda and tuple(full.shape) == tuple(q.shape)


# ---- refusals ---------------------------------------------------------------------------


def _small(rng, **kw):
    p = Problem(rng, dtype=np.float32, capacity=16, **kw)
    return dict(q=p.q, k_cache=p.k_cache, v_cache=p.v_cache, k=p.k, v=p.v,
                cache_seqlens=p.seqlens), p


@pytest.mark.parametrize("arg,value,words", [
    ("alibi_slopes", np.ones((4,), np.float32), "alibi_slopes"),
])
def test_unsupported_arguments_are_refused_by_name(rng, arg, value, words):
    kw, p = _small(rng, seqlen_new=2)
    before = p.k_cache.copy()
    kw[arg] = p.seqlens if isinstance(value, str) else value
    with pytest.raises(ValueError, match=f"{words}.*not supported yet"):
        flashlab.flash_attn_with_kvcache(**kw)
    assert np.array_equal(p.k_cache, before)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_cache_leftpad_starts_each_sequence_later(rng, causal):
    """FlashAttention-2's left-padded caches: sequence b's keys are rows [leftpad[b], L_b),
    the rows before them are never read (NaN there changes nothing), masks count from the
    first key, and the new rows still go to cache_seqlens[b]."""
    p = Problem(rng, seqlen_new=3, seqlen_q=3, dtype=np.float32)
    leftpad = np.array([min(5, int(s)) for s in p.seqlens], dtype=np.int32)
    for b, pad in enumerate(leftpad):
        p.k_cache[b, :pad] = np.nan
        p.v_cache[b, :pad] = np.nan
    kc, vc, per_seq = expected(p, causal=causal, leftpad=leftpad)
    out, lse = run(p, causal=causal, cache_leftpad=leftpad)
    assert np.array_equal(p.k_cache, kc, equal_nan=True) and np.array_equal(p.v_cache, vc,
                                                                           equal_nan=True)
    assert np.isfinite(out).all()
    check_outputs(out, lse, per_seq, causal=causal)


def test_cache_leftpad_is_checked(rng):
    kw, p = _small(rng, seqlen_new=2)
    bad = np.array(p.seqlens, dtype=np.int32) + 1  # past cache_seqlens
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = .* must be in \[0, cache_seqlens"):
        flashlab.flash_attn_with_kvcache(**kw, cache_leftpad=bad)
    pp = Problem(rng, dtype=np.float32, capacity=16, paged=True, seqlen_new=2)
    with pytest.raises(ValueError, match="cache_leftpad and block_table"):
        flashlab.flash_attn_with_kvcache(pp.q, pp.k_cache, pp.v_cache, pp.k, pp.v,
                                         cache_seqlens=pp.seqlens, block_table=pp.block_table,
                                         cache_leftpad=np.zeros(3, np.int32))


def test_num_splits_must_be_non_negative(rng):
    kw, p = _small(rng, seqlen_new=2)
    before = p.k_cache.copy()
    with pytest.raises(ValueError, match="num_splits must be >= 0"):
        flashlab.flash_attn_with_kvcache(**kw, num_splits=-1)
    assert np.array_equal(p.k_cache, before)
    out = flashlab.flash_attn_with_kvcache(**kw, num_splits=3)  # the CPU path ignores it
    assert out.shape == p.q.shape


def test_rotary_is_checked_by_name(rng):
    kw, p = _small(rng)
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin need k_new and v_new"):
        flashlab.flash_attn_with_kvcache(**kw, rotary_cos=p.cos, rotary_sin=p.sin)
    kw, p = _small(rng, seqlen_new=2)
    before = p.k_cache.copy()
    with pytest.raises(ValueError, match="both be given"):
        flashlab.flash_attn_with_kvcache(**kw, rotary_cos=p.cos)
    with pytest.raises(ValueError, match=r"rotary_cos.dtype \(fp64\) must match q.dtype"):
        flashlab.flash_attn_with_kvcache(**kw, rotary_cos=p.cos.astype(np.float64),
                                         rotary_sin=p.sin.astype(np.float64))
    with pytest.raises(ValueError, match=r"seqlen_ro = 15\) must be at least the 16 rows"):
        flashlab.flash_attn_with_kvcache(**kw, rotary_cos=p.cos[:15], rotary_sin=p.sin[:15])
    wide = np.ones((16, 17), np.float32)  # rotary_dim 34 > head_dim 32
    with pytest.raises(ValueError, match=r"rotary_dim \(2·rotary_cos.shape\[1\] = 34\)"):
        flashlab.flash_attn_with_kvcache(**kw, rotary_cos=wide, rotary_sin=wide)
    assert np.array_equal(p.k_cache, before)


def test_tables_must_be_int32(rng):
    kw, p = _small(rng)
    kw["cache_seqlens"] = p.seqlens.astype(np.int64)
    with pytest.raises(TypeError, match="cache_seqlens.dtype must be int32, got int64"):
        flashlab.flash_attn_with_kvcache(**kw)


def test_overfull_cache_is_refused_before_any_write(rng):
    kw, p = _small(rng, seqlen_new=2)
    before = p.k_cache.copy()
    kw["cache_seqlens"] = np.array([15, 0, 0], np.int32)  # 15 + 2 > 16 rows
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\]"):
        flashlab.flash_attn_with_kvcache(**kw)
    assert np.array_equal(p.k_cache, before)


def test_mixed_array_kinds_are_a_type_error(rng):
    torch = pytest.importorskip("torch")
    kw, _ = _small(rng)
    kw["q"] = torch.from_numpy(kw["q"])
    with pytest.raises(TypeError, match="one kind of array"):
        flashlab.flash_attn_with_kvcache(**kw)
