"""The Triton rung of the ladder: FlashAttention-2, forward and backward, in Triton.

What it adds over the CUDA rungs: the same algorithm as `fa2_mma` (rung 4), a Q block per
program, K/V streamed, online softmax in exp2 with the log2-scaled softmax scale, causal
blocks skipped rather than masked, O normalized once and LSE written once, and the
FlashAttention-2 backward (rung 5's algorithm: D = rowsum(dO∘O), then per K/V block a loop
over Q blocks recomputing P from LSE; dQ in a second kernel per Q block, no atomics), in
~200 lines of block-level Python. Triton chooses the MMA instructions, the shared-memory
layouts, swizzles and the software pipeline (`num_stages`) that rung 4 writes by hand.
Why it is here: it is the shortest path from the paper to tensor-core speed, and the
yardstick for what the hand-written and CuTe rungs must beat.

Scope: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (any strides, last dim contiguous), fp16 or
bf16, head dim 16, 32, 64, 128 or 256, any seqlen, seqlen_q ≠ seqlen_k
with bottom-right causal, GQA/MQA. No windows, softcap or varlen (the C++ rungs have them).

Measured on H100: see docs/ladder/06-triton.md (python -m flashlab.bench).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                so_b, so_s, so_h, seqlen_q, seqlen_k, heads_q, group, scale_log2,
                CAUSAL: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # program (Q block m, batch·head bh): rows [m·BLOCK_M, +BLOCK_M) of one (batch, head)
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // heads_q, bh % heads_q
    hk = h // group
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)                     # [BLOCK_M]
    cols = tl.arange(0, DP)                                        # [DP]
    keys0 = tl.arange(0, BLOCK_N)                                  # [BLOCK_N]
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_s + cols[None, :],
                mask=(rows[:, None] < seqlen_q) & (cols[None, :] < D), other=0.0)  # [M, DP]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)            # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)                          # running sum
    acc = tl.zeros([BLOCK_M, DP], tl.float32)                      # unnormalized O
    offset = seqlen_k - seqlen_q                                   # bottom-right causal
    hi = seqlen_k
    if CAUSAL:  # K/V blocks past the block's last row's diagonal are skipped, not masked
        hi = tl.minimum(seqlen_k, (m + 1) * BLOCK_M + offset)
    for start in range(0, hi, BLOCK_N):
        keys = start + keys0
        k = tl.load(K + b * sk_b + hk * sk_h + keys[None, :] * sk_s + cols[:, None],
                    mask=(keys[None, :] < seqlen_k) & (cols[:, None] < D), other=0.0)  # [DP, N]
        s = tl.dot(q, k) * scale_log2                              # [M, N] in log2 units
        ok = keys[None, :] < seqlen_k
        if CAUSAL:
            ok = ok & (keys[None, :] <= rows[:, None] + offset)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # rows that saw no key yet
        p = tl.exp2(s - m_safe[:, None])                           # [M, N]
        alpha = tl.exp2(m_i - m_safe)                              # rescale of the old state
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * sv_b + hk * sv_h + keys[:, None] * sv_s + cols[None, :],
                    mask=(keys[:, None] < seqlen_k) & (cols[None, :] < D), other=0.0)  # [N, DP]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]                 # normalized once
    tl.store(O + b * so_b + h * so_h + rows[:, None] * so_s + cols[None, :],
             out.to(O.dtype.element_ty), mask=(rows[:, None] < seqlen_q) & (cols[None, :] < D))
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / 1.4426950408889634,
                   float("-inf"))                                  # natural log, as FA2
    tl.store(LSE + bh * seqlen_q + rows, lse, mask=rows < seqlen_q)


@triton.jit
def _bwd_preprocess(O, DO, Dsum, so_b, so_s, so_h, sd_b, sd_s, sd_h, seqlen_q, heads_q,
                    D: tl.constexpr, DP: tl.constexpr, BLOCK_M: tl.constexpr):
    # Dsum[b, h, i] = rowsum(dO ∘ O), the term every dS row subtracts
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // heads_q, bh % heads_q
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, DP)
    mask = (rows[:, None] < seqlen_q) & (cols[None, :] < D)
    o = tl.load(O + b * so_b + h * so_h + rows[:, None] * so_s + cols[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b * sd_b + h * sd_h + rows[:, None] * sd_s + cols[None, :], mask=mask,
                 other=0.0)
    tl.store(Dsum + bh * seqlen_q + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1),
             mask=rows < seqlen_q)


@triton.jit
def _p_and_ds(q, k, do, v, lse, dsum, rows, keys, seqlen_q, seqlen_k, scale_log2,
              CAUSAL: tl.constexpr):
    # P = exp(S − LSE) recomputed from the forward's LSE, and dS = P ∘ (dP − D); [M, N] each
    s = tl.dot(q, tl.trans(k)) * scale_log2
    ok = (rows[:, None] < seqlen_q) & (keys[None, :] < seqlen_k)
    if CAUSAL:
        ok = ok & (keys[None, :] <= rows[:, None] + (seqlen_k - seqlen_q))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    p = tl.where(ok, tl.exp2(s - lse2[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - dsum[:, None])
    return p, ds


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, Dsum, DK, DV, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                     sv_b, sv_s, sv_h, sd_b, sd_s, sd_h, sdk_b, sdk_s, sdk_h,
                     seqlen_q, seqlen_k, heads_q, group, scale, scale_log2,
                     CAUSAL: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # program (K/V block n, batch·kv head): dK, dV of BLOCK_N keys, summed over the query
    # heads of its group and every Q block that sees them; written once
    n = tl.program_id(0)
    bhk = tl.program_id(1)
    heads_kv = heads_q // group
    b, hk = bhk // heads_kv, bhk % heads_kv
    keys = n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, DP)
    kv_mask = (keys[:, None] < seqlen_k) & (cols[None, :] < D)
    k = tl.load(K + b * sk_b + hk * sk_h + keys[:, None] * sk_s + cols[None, :], mask=kv_mask,
                other=0.0)                                         # [N, DP]
    v = tl.load(V + b * sv_b + hk * sv_h + keys[:, None] * sv_s + cols[None, :], mask=kv_mask,
                other=0.0)                                         # [N, DP]
    dk = tl.zeros([BLOCK_N, DP], tl.float32)
    dv = tl.zeros([BLOCK_N, DP], tl.float32)
    lo = 0
    if CAUSAL:  # Q blocks above this block's first key's diagonal see none of it
        lo = tl.maximum(0, n * BLOCK_N - (seqlen_k - seqlen_q)) // BLOCK_M * BLOCK_M
    for g in range(group):
        h = hk * group + g
        for start in range(lo, seqlen_q, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            q_mask = (rows[:, None] < seqlen_q) & (cols[None, :] < D)
            q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_s + cols[None, :],
                        mask=q_mask, other=0.0)                    # [M, DP]
            do = tl.load(DO + b * sd_b + h * sd_h + rows[:, None] * sd_s + cols[None, :],
                         mask=q_mask, other=0.0)                   # [M, DP]
            lse = tl.load(LSE + (b * heads_q + h) * seqlen_q + rows, mask=rows < seqlen_q,
                          other=float("-inf"))
            dsum = tl.load(Dsum + (b * heads_q + h) * seqlen_q + rows, mask=rows < seqlen_q,
                           other=0.0)
            p, ds = _p_and_ds(q, k, do, v, lse, dsum, rows, keys, seqlen_q, seqlen_k,
                              scale_log2, CAUSAL)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)             # [N, DP]
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)              # [N, DP]
    tl.store(DK + b * sdk_b + hk * sdk_h + keys[:, None] * sdk_s + cols[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * sdk_b + hk * sdk_h + keys[:, None] * sdk_s + cols[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, Dsum, DQ, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                   sv_b, sv_s, sv_h, sd_b, sd_s, sd_h, sdq_b, sdq_s, sdq_h, seqlen_q, seqlen_k,
                   heads_q, group,
                   scale, scale_log2, CAUSAL: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # program (Q block m, batch·head): dQ = Σ_keys dS K · scale, written once (no atomics)
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // heads_q, bh % heads_q
    hk = h // group
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, DP)
    q_mask = (rows[:, None] < seqlen_q) & (cols[None, :] < D)
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_s + cols[None, :], mask=q_mask,
                other=0.0)
    do = tl.load(DO + b * sd_b + h * sd_h + rows[:, None] * sd_s + cols[None, :], mask=q_mask,
                 other=0.0)
    lse = tl.load(LSE + bh * seqlen_q + rows, mask=rows < seqlen_q, other=float("-inf"))
    dsum = tl.load(Dsum + bh * seqlen_q + rows, mask=rows < seqlen_q, other=0.0)
    dq = tl.zeros([BLOCK_M, DP], tl.float32)
    hi = seqlen_k
    if CAUSAL:
        hi = tl.minimum(seqlen_k, (m + 1) * BLOCK_M + seqlen_k - seqlen_q)
    for start in range(0, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv_mask = (keys[:, None] < seqlen_k) & (cols[None, :] < D)
        k = tl.load(K + b * sk_b + hk * sk_h + keys[:, None] * sk_s + cols[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(V + b * sv_b + hk * sv_h + keys[:, None] * sv_s + cols[None, :],
                    mask=kv_mask, other=0.0)
        _, ds = _p_and_ds(q, k, do, v, lse, dsum, rows, keys, seqlen_q, seqlen_k, scale_log2,
                          CAUSAL)
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_s + cols[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


def _dp(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _fwd_config(dp: int) -> Tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by head dim, sized for ~100-200 KB of smem."""
    if dp <= 64:
        return 128, 64, 4, 3
    if dp <= 128:
        return 128, 64, 8, 3
    return 64, 32, 4, 2


def _check(q, k, v) -> None:
    """ValueError naming the argument for what this rung does not take."""
    import os

    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise ValueError(f"{name} must be [batch, seqlen, heads, head_dim] with a contiguous "
                             f"last dim, got shape {tuple(t.shape)}")
        if not (t.is_cuda or interpret):
            raise ValueError(f"{name} must be a CUDA tensor (or run with TRITON_INTERPRET=1)")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtypes must be float16 or bfloat16 and equal, got q {q.dtype}, "
                         f"k {k.dtype}, v {v.dtype}")
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d or d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim must be 16, 32, 64, 128 or 256 and equal for q, k, v, got "
                         f"{d}, {k.shape[-1]}, {v.shape[-1]}")
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must be [batch, seqlen_k, heads_kv, head_dim] with q's batch, "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({k.shape[2]})")


def _scale(q, scale: Optional[float]) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: Optional[float] = None, causal: bool = False, *,
                      out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """out [B, Sq, Hq, D] and lse [B, Hq, Sq] (fp32, natural log); into `out`/`lse` if given."""
    _check(q, k, v)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    lse = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32) if lse is None else lse
    if q.numel() == 0:
        return out, lse
    bm, bn, warps, stages = _fwd_config(_dp(d))
    grid = (triton.cdiv(sq, bm), b * hq)
    _fwd_kernel[grid](q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                      *out.stride()[:3], sq, sk, hq, hq // hkv, _scale(q, scale) * LOG2E,
                      CAUSAL=bool(causal), D=d, DP=_dp(d), BLOCK_M=bm, BLOCK_N=bn,
                      num_warps=warps, num_stages=stages)
    return out, lse


def attention_backward(dout, q, k, v, out, lse, scale: Optional[float] = None,
                       causal: bool = False, *, dq=None, dk=None, dv=None):
    """(dq, dk, dv) from the forward's out and lse; into `dq`/`dk`/`dv` if given."""
    _check(q, k, v)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dout = dout.contiguous()
    dq = torch.empty_like(q, memory_format=torch.contiguous_format) if dq is None else dq
    dk = torch.empty_like(k, memory_format=torch.contiguous_format) if dk is None else dk
    dv = torch.empty_like(v, memory_format=torch.contiguous_format) if dv is None else dv
    if sq == 0 or sk == 0:
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    sc = _scale(q, scale)
    dp = _dp(d)
    dsum = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32)
    _bwd_preprocess[(triton.cdiv(sq, 64), b * hq)](out, dout, dsum, *out.stride()[:3],
                                                   *dout.stride()[:3], sq, hq, D=d, DP=dp,
                                                   BLOCK_M=64)
    bm, bn, warps = (64, 64, 4) if dp <= 64 else (64, 64, 8) if dp <= 128 else (32, 32, 4)
    common = dict(CAUSAL=bool(causal), D=d, DP=dp, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                  num_stages=2)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    assert dk.stride() == dv.stride(), "dk and dv share one stride set"
    _bwd_dkdv_kernel[(triton.cdiv(sk, bn), b * hkv)](
        q, k, v, dout, lse, dsum, dk, dv, *strides, *dk.stride()[:3], sq, sk, hq, hq // hkv,
        sc, sc * LOG2E, **common)
    _bwd_dq_kernel[(triton.cdiv(sq, bm), b * hq)](
        q, k, v, dout, lse, dsum, dq, *strides, *dq.stride()[:3], sq, sk, hq, hq // hkv, sc,
        sc * LOG2E, **common)
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out, lse = attention_forward(q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.causal)
        return dq, dk, dv, None, None


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, return_attn_probs: bool = False):
    """FlashAttention-2's signature (the subset this rung has): q [B, Sq, Hq, D], k/v
    [B, Sk, Hkv, D], fp16/bf16 CUDA tensors with a contiguous last dim."""
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: only 0.0 is supported by the Triton rung, got {dropout_p}")
    _check(q, k, v)
    out, lse = _Attention.apply(q, k, v, bool(causal), _scale(q, softmax_scale))
    return (out, lse, None) if return_attn_probs else out
