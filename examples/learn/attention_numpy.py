"""FlashAttention in NumPy, written to be read next to docs/learn/theory.md.

One attention head, no batch: q is [Sq, D], k is [Sk, D], v is [Sk, Dv]. Heads and batch
entries are independent copies of this problem, which is why the CUDA kernels give each
(batch, head) its own thread blocks.

- naive_forward / naive_backward: the textbook formulas on the whole Sq x Sk score matrix.
- flash_forward: FlashAttention-2's forward. Query blocks outside, key/value blocks inside,
  the online softmax carries a running max m and a running sum l per row, and the output is
  divided by l once at the end. The score matrix never exists whole.
- flash_backward: FlashAttention-2's backward. Key/value blocks outside (each owns its dK,
  dV), query blocks inside; P is recomputed from the forward's LSE, D = rowsum(dO * O).

Conventions are FlashLab's (docs/DESIGN.md): causal is aligned bottom-right (row i sees key
j when j <= i + Sk - Sq); a row that sees no key gets O = 0 and LSE = -inf; LSE is the
natural log of the row's softmax sum. The kernels work in exp2 units (the scale folded with
log2 e); this file keeps natural exp so the formulas read as in the theory page.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np


def visible(sq: int, sk: int, causal: bool) -> np.ndarray:
    """[sq, sk] bool: which keys each query row sees (bottom-right causal, or all)."""
    if not causal:
        return np.ones((sq, sk), dtype=bool)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return j <= i + sk - sq


def _scale(q: np.ndarray, scale: Optional[float]) -> float:
    return 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale


def _finite_or_zero(m: np.ndarray) -> np.ndarray:
    """The reference point for exp: the max, or 0 for a row that has seen no key yet (its
    max is -inf, and exp(-inf - (-inf)) would be NaN)."""
    return np.where(np.isfinite(m), m, 0.0)


# ---- naive: the whole score matrix -----------------------------------------------------


def naive_forward(q, k, v, scale=None, causal=False) -> Tuple[np.ndarray, np.ndarray]:
    """(O [Sq, Dv], LSE [Sq]) through S = scale * Q K^T and P = softmax(S) held whole."""
    scale = _scale(q, scale)
    s = np.where(visible(len(q), len(k), causal), scale * (q @ k.T), -np.inf)
    m = _finite_or_zero(s.max(axis=1, initial=-np.inf))      # subtract the max: no overflow
    p = np.exp(s - m[:, None])
    l = p.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(l[:, None] > 0, (p @ v) / l[:, None], 0.0)
        lse = np.where(l > 0, m + np.log(l), -np.inf)
    return o, lse


def naive_backward(q, k, v, do, scale=None, causal=False):
    """(dq, dk, dv) of the loss sum(O * dO), from the whole P."""
    scale = _scale(q, scale)
    s = np.where(visible(len(q), len(k), causal), scale * (q @ k.T), -np.inf)
    m = _finite_or_zero(s.max(axis=1, initial=-np.inf))
    p = np.exp(s - m[:, None])
    l = p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, p / l, 0.0)
    dv = p.T @ do                                   # O = P V
    dp = do @ v.T
    ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))   # the softmax's Jacobian, row by row
    return scale * (ds @ k), scale * (ds.T @ q), dv


# ---- tiled: FlashAttention-2 -------------------------------------------------------------


def flash_forward(q, k, v, scale=None, causal=False, block_m=2, block_n=2,
                  on_block: Optional[Callable[..., None]] = None):
    """(O, LSE) by FlashAttention-2's forward, block_m query rows by block_n keys at a time.

    on_block, when given, is called after every key/value block with the block's first query
    row and first key and the state of those rows: on_block(i0, j0, s, m_old, m, alpha, p, l,
    acc), where acc is the running, not yet divided output. worked_example.py prints it.
    """
    scale = _scale(q, scale)
    sq, sk = len(q), len(k)
    vis = visible(sq, sk, causal)
    o = np.zeros((sq, v.shape[1]))
    lse = np.full(sq, -np.inf)
    for i0 in range(0, sq, block_m):                # one thread block per query block
        qi = q[i0:i0 + block_m]
        m = np.full(len(qi), -np.inf)                 # running max of the row's scores
        l = np.zeros(len(qi))                         # running sum of exp(score - m)
        acc = np.zeros((len(qi), v.shape[1]))         # running sum of exp(score - m) * v
        for j0 in range(0, sk, block_n):
            seen = vis[i0:i0 + block_m, j0:j0 + block_n]
            if not seen.any():                        # a block the mask hides: never loaded
                continue
            s = np.where(seen, scale * (qi @ k[j0:j0 + block_n].T), -np.inf)
            m_old = m
            m = np.maximum(m_old, s.max(axis=1))
            ref = _finite_or_zero(m)
            alpha = np.exp(m_old - ref)               # rescales what was summed against m_old
            p = np.exp(s - ref[:, None])              # masked scores give exactly 0
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v[j0:j0 + block_n]
            if on_block is not None:
                on_block(i0, j0, s, m_old, m, alpha, p, l, acc)
        with np.errstate(divide="ignore", invalid="ignore"):
            o[i0:i0 + block_m] = np.where(l[:, None] > 0, acc / l[:, None], 0.0)  # divide once
            lse[i0:i0 + block_m] = np.where(l > 0, m + np.log(l), -np.inf)
    return o, lse


def flash_backward(q, k, v, o, lse, do, scale=None, causal=False, block_m=2, block_n=2):
    """(dq, dk, dv) by FlashAttention-2's backward: nothing of P is stored, it is recomputed
    from the forward's LSE, P = exp(S - LSE), one block at a time."""
    scale = _scale(q, scale)
    sq, sk = len(q), len(k)
    vis = visible(sq, sk, causal)
    d = (do * o).sum(axis=1)                          # D_i = rowsum(dO * O), the preprocess
    lse_in = np.where(np.isfinite(lse), lse, np.inf)  # a row that saw no key: P = 0
    dq = np.zeros_like(q, dtype=np.float64)
    dk = np.zeros_like(k, dtype=np.float64)
    dv = np.zeros_like(v, dtype=np.float64)
    for j0 in range(0, sk, block_n):                  # one thread block per key block
        kj, vj = k[j0:j0 + block_n], v[j0:j0 + block_n]
        for i0 in range(0, sq, block_m):
            seen = vis[i0:i0 + block_m, j0:j0 + block_n]
            if not seen.any():
                continue
            qi, doi = q[i0:i0 + block_m], do[i0:i0 + block_m]
            s = np.where(seen, scale * (qi @ kj.T), -np.inf)
            p = np.exp(s - lse_in[i0:i0 + block_m, None])      # recomputed, exact
            dv[j0:j0 + block_n] += p.T @ doi
            dp = doi @ vj.T
            ds = p * (dp - d[i0:i0 + block_m, None])
            dk[j0:j0 + block_n] += scale * (ds.T @ qi)
            dq[i0:i0 + block_m] += scale * (ds @ kj)   # the kernels: fp32 atomics or a dQ pass
    return dq, dk, dv
