"""The attention oracle of the Python tests, with FlashLab's conventions: causal aligned
bottom-right, sliding window (left, right) with -1 unbounded, softcap cap·tanh(s/cap) before
masking, GQA, and a row that sees no key giving 0 and LSE −inf.

NumPy (fp64 values and hand-written fp64 gradients) for the NumPy path; torch (any dtype,
differentiable) for the torch paths, where float64 is the oracle and the input dtype is
docs/DESIGN.md's yardstick: PyTorch's math path (S and P rounded to the input dtype, softmax in
fp32). A result passes when its max abs error <= 2 x the yardstick's + 1e-5 x the values'
size (check_rule).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np


def allowed(sq: int, sk: int, causal: bool, window: Sequence[int]) -> np.ndarray:
    """[sq, sk] mask: query i sees keys d − left … d + right, d = i + sk − sq."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    d = i + sk - sq
    ok = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        ok &= j >= d - left
    if right >= 0:
        ok &= j <= d + right
    return ok


def _scores(q, k, v, scale, causal, window, softcap):
    """The fp64 pieces both passes start from: q, K and V repeated per query head, the scaled
    scores before softcap `raw` [B, H, Sq, Sk], the masked logits `s` (−inf where hidden), the
    scale, and the GQA group."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq, d, hkv = q.shape[2], q.shape[3], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    rep = hq // hkv
    kk, vv = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    raw = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    s = np.where(allowed(q.shape[1], k.shape[1], causal, window)[None, None], s, -np.inf)
    return q, kk, vv, raw, s, scale, rep


def _softmax(s):
    """(P, row max made finite, row sum): rows that see no key get P = 0."""
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    msafe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - msafe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(l > 0, p / l, 0.0), msafe, l


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: Optional[float] = None,
              causal: bool = False, window: Sequence[int] = (-1, -1), softcap: float = 0.0
              ) -> Tuple[np.ndarray, np.ndarray]:
    """q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D*] → out [B, Sq, Hq, Dv] and lse [B, Hq, Sq], fp64."""
    _, _, vv, _, s, _, _ = _scores(q, k, v, scale, causal, window, softcap)
    p, msafe, l = _softmax(s)
    out = np.einsum("bhqk,bkhd->bhqd", p, vv)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, msafe[..., 0] + np.log(l[..., 0]), -np.inf)
    return out.transpose(0, 2, 1, 3), lse


def varlen_attention(q, k, v, cu_q, cu_k, **kw) -> Tuple[np.ndarray, np.ndarray]:
    """Packed q [Tq, Hq, D], k/v [Tk, Hkv, D*] → out [Tq, Hq, Dv], lse [Hq, Tq]."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0:
            continue
        o, l = attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **kw)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse


def lowp_attention(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """The yardstick of docs/DESIGN.md's rule for fp16 inputs: PyTorch's math path rounding points
    (S and P rounded to the input dtype, fp32 softmax), computed with NumPy float16."""
    f16 = np.float16
    q, k, v = (np.asarray(x, dtype=f16) for x in (q, k, v))
    b, sq, hq, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    rep = hq // k.shape[2]
    kk = np.repeat(k, rep, axis=2).astype(np.float32)
    vv = np.repeat(v, rep, axis=2).astype(np.float32)
    s = (np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kk) * np.float32(scale)).astype(f16)
    s = s.astype(np.float32)
    if softcap > 0:
        s = (np.float32(softcap) * np.tanh(s / np.float32(softcap))).astype(f16).astype(np.float32)
    ok = allowed(sq, k.shape[1], causal, window)
    s = np.where(ok[None, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, p / l, 0.0).astype(f16).astype(np.float32)
    out = np.einsum("bhqk,bkhd->bhqd", p, vv).astype(f16)
    return out.transpose(0, 2, 1, 3)


def attention_backward(q, k, v, dout, *, scale=None, causal=False, window=(-1, -1),
                       softcap=0.0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp64 gradients (dq, dk, dv) of sum(out ∘ dout) for the dense layout."""
    q, kk, vv, raw, s, scale, rep = _scores(q, k, v, scale, causal, window, softcap)
    dout = np.asarray(dout, dtype=np.float64)
    hkv = k.shape[2]
    p, _, _ = _softmax(s)
    do = dout.transpose(0, 2, 1, 3)  # [B, H, Sq, Dv]
    dvv = np.einsum("bhqk,bhqd->bkhd", p, do)
    dp = np.einsum("bhqd,bkhd->bhqk", do, vv)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if softcap > 0:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    ds *= scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk)
    dkk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda g: g.reshape(g.shape[0], g.shape[1], hkv, rep, g.shape[-1]).sum(axis=3)
    return dq, fold(dkk), fold(dvv)


def varlen_attention_backward(q, k, v, dout, cu_q, cu_k, **kw
                              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp64 (dq, dk, dv) for packed sequences; a sequence with no queries or no keys gets 0."""
    dq, dk, dv = (np.zeros(x.shape) for x in (q, k, v))
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        g = attention_backward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                               dout[None, q0:q1], **kw)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x[0] for x in g)
    return dq, dk, dv


# ---- dropout ----------------------------------------------------------------------------

_M32 = np.uint64(0xFFFFFFFF)


def _philox4x32_10(c, k):
    """Philox4x32-10 (Salmon et al., SC'11) over arrays: c four uint64 arrays of 32-bit
    words, k two; returns the four output words."""
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) for x in c)
    k0, k1 = (np.asarray(x, dtype=np.uint64) for x in k)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _M32,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _M32)
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    return c0, c1, c2, c3


def dropout_keep(b: int, h: int, sq: int, sk: int, p: float, seed: int, offset: int = 0
                 ) -> np.ndarray:
    """[b, h, sq, sk] bool: the keep mask of src/common/dropout.h for batch·heads index
    bh = batch·h + head, query row i and key j (p is rounded to float32, as the API does)."""
    p32 = float(np.float32(p))
    threshold = min(int(p32 * 4294967296.0), 0xFFFFFFFF)
    bh = np.arange(b * h, dtype=np.uint64)[:, None, None]
    i = np.arange(sq, dtype=np.uint64)[None, :, None]
    j = np.arange(sk, dtype=np.uint64)[None, None, :]
    seed, offset = int(seed), int(offset)
    words = _philox4x32_10(
        (j >> np.uint64(1), (i >> np.uint64(4)) * np.uint64(8) + (i & np.uint64(7)), bh,
         np.uint64(offset & 0xFFFFFFFF)),
        (np.uint64(seed & 0xFFFFFFFF), np.uint64(((seed >> 32) ^ (offset >> 32)) & 0xFFFFFFFF)))
    word = ((i >> np.uint64(3)) & np.uint64(1)) * np.uint64(2) + (j & np.uint64(1))
    picked = np.choose(word.astype(np.int64) + np.zeros((b * h, 1, 1), dtype=np.int64),
                       [np.broadcast_to(w, (b * h, sq, sk)) for w in words])
    return (picked >= threshold).reshape(b, h, sq, sk)


# ---- torch ------------------------------------------------------------------------------


def torch_attention(q, k, v, *, causal: bool = False, window: Sequence[int] = (-1, -1),
                    softcap: float = 0.0, scale: Optional[float] = None, dtype: Any = None,
                    dropout: Optional[Tuple[float, np.ndarray]] = None):
    """(out [B, Sq, Hq, Dv], lse [B, Hq, Sq]) computed in `dtype` (default: q's) and
    differentiable: torch.float64 gives the oracle, the input dtype the yardstick.
    `dropout` = (p, keep mask [B, Hq, Sq, Sk]) applies P ∘ keep / (1 − p) (float32 p)."""
    import torch

    dtype = dtype or q.dtype
    q, k, v = (x.to(dtype) for x in (q, k, v))
    sq, hq, d = q.shape[1:]
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if dtype != torch.float64:
        s = s.float()
    ok = torch.from_numpy(allowed(sq, sk, causal, window)).to(s.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(dtype)
    if dropout is not None:
        keep = torch.from_numpy(dropout[1]).to(p.device)
        p = (p * keep / (1.0 - float(np.float32(dropout[0])))).to(dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def torch_grads(q, k, v, dout, dtype: Any, **mask):
    """(dq, dk, dv) of sum(out ∘ dout) through torch_attention in `dtype`."""
    import torch

    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out, _ = torch_attention(*leaves, **mask)
    return torch.autograd.grad(out, leaves, dout.to(dtype))


def as_f64(x) -> np.ndarray:
    """A NumPy fp64 copy of a NumPy array or a torch tensor (any device)."""
    if hasattr(x, "detach"):
        x = x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def max_err(a, b) -> float:
    """max |a − b|, with equal infinities (LSE of a fully masked row) counted as equal."""
    a, b = as_f64(a), as_f64(b)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(both_inf, 0.0, np.abs(a - b))
    return float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0))


def check_rule(name: str, got, yardstick, oracle, terms: float = 0.0, from_out: float = 0.0) -> None:
    """docs/DESIGN.md's rule: error(got) <= 2 x error(yardstick) + 1e-5 x max(1, max |oracle|)
    + from_out, both errors against the oracle. For dq and dk (gradient_slack): the
    magnitude is that of the terms their sums cancel when larger, and from_out what the
    rounding of O can move them by; 0 elsewhere."""
    e, y = max_err(got, oracle), max_err(yardstick, oracle)
    o = as_f64(oracle)
    finite = np.abs(o[np.isfinite(o)])
    magnitude = max(1.0, float(finite.max(initial=0.0)), terms)
    bound = 2 * y + 1e-5 * magnitude + from_out
    assert e <= bound, (f"{name}: error {e:.3g} > 2 x {y:.3g} (yardstick) + 1e-5 x {magnitude:.3g}"
                        f" + {from_out:.3g} (O's rounding)")


UNIT_ROUNDOFF = {"torch.bfloat16": 2.0 ** -8, "torch.float16": 2.0 ** -11, "torch.float32": 2.0 ** -24}


def gradient_slack(q, k, v, dout, *, causal: bool = False, window: Sequence[int] = (-1, -1),
                   softcap: float = 0.0, scale: Optional[float] = None,
                   dropout: Optional[Tuple[float, np.ndarray]] = None):
    """What docs/DESIGN.md's rule allows dq and dk beyond their values' size, computed in
    fp64 from the inputs (in their own dtype, which sets O's rounding): {"dq": (terms,
    from_out), "dk": (...)}. terms: |scale| · Σ P·(|dP| + |D|) · max|k| over a row (over a
    key's rows, its group's heads included, and max|q|, for dk): what the sums cancel.
    from_out: a stored O is off by up to 2u·Σ_j P_j |v_j|, so D by δ = 2u·Σ_j P_j Σ_d |dO_d
    v_jd|, and dq by |scale|·Σ_j P_j·δ·max|k| (dk: Σ over its rows of P·δ, times max|q|)."""
    import torch

    u = UNIT_ROUNDOFF.get(str(q.dtype), 0.0)
    q, k, v, do = (x.detach().to(torch.float64) for x in (q, k, v, dout))
    sq, hq, d = q.shape[1:]
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = abs(1.0 / np.sqrt(d) if scale is None else scale)
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = torch.from_numpy(allowed(sq, sk, causal, window)).to(s.device)
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1).nan_to_num(0.0)
    if dropout is not None:  # kept entries weigh 1/(1 − p)
        p = p / (1.0 - float(np.float32(dropout[0])))
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    dsum = (do * o).sum(-1).permute(0, 2, 1)  # D [b, h, q]
    delta = 2 * u * (p * torch.einsum("bqhd,bkhd->bhqk", do.abs(), vv.abs())).sum(-1)
    terms = p * (dp.abs() + dsum.abs()[..., None])
    per_key = lambda x: x.reshape(x.shape[0], hkv, g, sk).sum(2)  # noqa: E731  [b, hkv, k]
    kmax, qmax = float(k.abs().max()), float(q.abs().max())
    return {
        "dq": (scale * float(terms.sum(-1).max()) * kmax,
               scale * float((p.sum(-1) * delta).max()) * kmax),
        "dk": (scale * float(per_key(terms.sum(2)).max()) * qmax,
               scale * float(per_key((p * delta[..., None]).sum(2)).max()) * qmax),
    }


def check_torch_call(q, k, v, out, lse, *, grads: bool = True, **mask) -> None:
    """A torch call's out and LSE, and (grads) dq/dk/dv through autograd for a random dout,
    under check_rule: the oracle is torch_attention in float64, the yardstick the same in
    q's dtype. `mask` takes torch_attention's options (dropout included)."""
    import torch

    qkv = [x.detach() for x in (q, k, v)]
    oracle = torch_attention(*qkv, dtype=torch.float64, **mask)
    yard = torch_attention(*qkv, **mask)
    check_rule("out", out, yard[0], oracle[0])
    check_rule("lse", lse, yard[1], oracle[1])
    if not grads:
        return
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch_grads(*qkv, dout, torch.float64, **mask)
    yard = torch_grads(*qkv, dout, q.dtype, **mask)
    slack = gradient_slack(q, k, v, dout, **mask)
    for name, g, y, w in zip(("dq", "dk", "dv"), got, yard, want):
        assert g.dtype == q.dtype and g.shape == w.shape, name
        check_rule(name, g, y, w, *slack.get(name, (0.0, 0.0)))
