"""The worked example of docs/learn/theory.md: seq_len 4, head dim 2, key blocks of 2.

Prints every intermediate value of FlashAttention-2's forward on fixed inputs (the scores S,
then for each key block and row: the running max before and after, the rescale factor alpha,
the block's exp(S - m), the running sum l and the undivided output), then O and LSE, and
checks the tiled result against the naive one. The page shows this output verbatim and
tests/python/test_learn.py checks that it still matches.

    python3 examples/learn/worked_example.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_numpy import flash_forward, naive_forward  # noqa: E402

Q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]])
K = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [-1.0, -1.0]])
V = np.array([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0], [-2.0, 0.5]])
BLOCK = 2


def fmt(x) -> str:
    """Fixed width, 4 decimals, -inf spelled out, no negative zero."""
    x = float(x)
    return f"{'-inf':>8}" if x == -np.inf else f"{x + 0.0:8.4f}"


def row(values) -> str:
    return " ".join(fmt(x) for x in values)


def main() -> int:
    scale = 1.0 / np.sqrt(Q.shape[1])
    lines = [f"seq_len 4, head dim 2, key blocks of {BLOCK}, scale = 1/sqrt(2) = {scale:.4f}"]
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        lines.append(f"{name} = " + "  ".join(f"[{a:4.1f} {b:4.1f}]" for a, b in x))
    lines.append("")
    lines.append("S = scale * Q K^T")
    lines.append("        " + "".join(f"{'k' + str(j):>9}" for j in range(len(K))))
    for i, r in enumerate(scale * (Q @ K.T)):
        lines.append(f"  q{i}    " + " " + row(r))

    def on_block(i0, j0, s, m_old, m, alpha, p, l, acc):
        lines.append("")
        lines.append(f"key block {j0 // BLOCK + 1}: keys {j0}-{j0 + BLOCK - 1}")
        lines.append("  row    m_old    m_new    alpha   p = exp(S - m_new)        l"
                     "    O~ = alpha O~ + p V")
        for r in range(len(m)):
            lines.append(f"  q{i0 + r}  " + row([m_old[r], m[r], alpha[r]]) + " "
                         + row(p[r]) + " " + fmt(l[r]) + " " + row(acc[r]))

    # One query block of all 4 rows, so each key block prints as one table.
    o, lse = flash_forward(Q, K, V, scale, block_m=len(Q), block_n=BLOCK, on_block=on_block)
    lines.append("")
    lines.append("final: O = O~ / l, LSE = m + ln(l)")
    lines.append("  row        O                 LSE")
    for i in range(len(Q)):
        lines.append(f"  q{i}  " + row(o[i]) + " " + fmt(lse[i]))

    o_ref, lse_ref = naive_forward(Q, K, V, scale)
    same = np.allclose(o, o_ref, rtol=0, atol=1e-12) and np.allclose(lse, lse_ref, rtol=0,
                                                                      atol=1e-12)
    lines.append("")
    lines.append("tiled O and LSE equal the naive softmax(S) V within 1e-12: "
                 + ("yes" if same else "NO"))
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
