"""Triton basics 2 — fused softmax: one program per row, reductions over a block.

y = softmax(x) along each row of a [rows, cols] fp32 matrix, one program per row, two ways:
  fused   the whole row is one block of BLOCK = next_power_of_2(cols) values: one read into
          registers, tl.max and tl.sum over the block, one write (the CUDA sibling's
          `registers`); it needs the row to fit on chip
  online  the row in tiles of TILE values with a running (max, sum) pair, rescaled whenever
          a tile raises the max: one read for (m, l), a second to write y (the sibling's
          `online`); any row length, and the recurrence FlashAttention runs over key tiles
next to torch.softmax and a device-to-device copy. GB/s counts 8 bytes per element (read x,
write y) for every variant, so the second read of `online` shows in its figure.
CUDA sibling: examples/basics/cuda/04_online_softmax.cu. Measured: docs/learn/basics/triton.md.

CPU check (Triton's interpreter, basics.py): both kernels on CPU tensors, row lengths that cut
blocks and tiles unevenly (a single column included), every seventh row scaled by 100 (values
up to ~400, whose exp overflows fp32 without the max subtracted), against NumPy's float64
softmax: |y - y_ref| <= 1e-5·y_ref + 1e-9 for every element. GPU check: the same bound against
torch's float64 softmax, for both kernels and for torch.softmax in fp32.
"""

from __future__ import annotations

import sys

import basics  # first: exits with "skip: ..." when numpy, torch or triton is missing
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def softmax_fused(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)  # one program per row
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols  # BLOCK is a power of two; the lanes past the row are off
    # Lanes that are off read -inf: they cannot win the max, and exp(-inf - m) adds 0 to the sum.
    x = tl.load(x_ptr + row * stride + offsets, mask=mask, other=float("-inf"))
    m = tl.max(x, axis=0)         # a reduction over the whole block: one scalar per program
    e = tl.exp(x - m)             # every exponent <= 0: no overflow
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + offsets, y, mask=mask)


@triton.jit
def softmax_online(x_ptr, y_ptr, stride, COLS: tl.constexpr, TILE: tl.constexpr):
    # COLS bounds the loops, so it is a constexpr: one compiled kernel per row length, and a
    # plain int for range() in the interpreter, which in Triton 3.6 cannot take a runtime
    # scalar there under NumPy >= 2.4 (triton-lang/triton#9171).
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    offsets = tl.arange(0, TILE)
    # The running pair: m the max so far, l = sum of exp(x - m) over the values seen so far.
    m = float("-inf")
    l = 0.0
    for start in range(0, COLS, TILE):
        mask = start + offsets < COLS
        x = tl.load(x_row + start + offsets, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))  # finite: every tile holds a real value
        # Old terms move to the new reference point: exp(x_k - m) · exp(m - m_new). On the
        # first tile m = -inf and the factor is 0, which is what an empty sum needs.
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, COLS, TILE):
        mask = start + offsets < COLS
        x = tl.load(x_row + start + offsets, mask=mask)
        tl.store(y_row + start + offsets, tl.exp(x - m) / l, mask=mask)


def fused(x: torch.Tensor, y: torch.Tensor) -> None:
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    # 8 warps for a 4096-wide row: 16 values per thread, as the sibling's `registers` holds.
    num_warps = min(16, max(4, block // 512))
    softmax_fused[(rows,)](x, y, cols, x.stride(0), BLOCK=block, num_warps=num_warps)


def online(x: torch.Tensor, y: torch.Tensor, tile: int = 1024) -> None:
    rows, cols = x.shape
    softmax_online[(rows,)](x, y, x.stride(0), COLS=cols, TILE=tile, num_warps=4)


def inputs(rows: int, cols: int) -> np.ndarray:
    """Uniform in [-4, 4), every seventh row (r % 7 == 3) times 100, as in the sibling."""
    x = np.random.default_rng(12345).uniform(-4.0, 4.0, (rows, cols)).astype(np.float32)
    x[3::7] *= 100.0
    return x


def close(y: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.all(np.abs(y.astype(np.float64) - want) <= 1e-5 * want + 1e-9))


def softmax_f64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def cpu_check() -> None:
    ok = True
    for rows, cols in ((9, 1), (9, 300), (9, 1000), (8, 2500)):
        x = inputs(rows, cols)
        want = softmax_f64(x)
        xt = torch.from_numpy(x)
        for name, run in (("fused", fused), ("online", lambda a, b: online(a, b, tile=256))):
            y = torch.full_like(xt, float("nan"))
            run(xt, y)
            ok = ok and close(y.numpy(), want)
    basics.require(ok, "cpu check: interpreted fused and online within 1e-5·y + 1e-9")


def gpu_part(quick: bool) -> None:
    rows, cols = (64, 4000) if quick else (16384, 4096)  # 4000: a ragged last tile
    x_np = inputs(rows, cols)
    print(f"softmax, {rows} rows x {cols} cols fp32 ({x_np.nbytes / 2**20:.0f} MiB in, "
          "as much out)")
    x = torch.from_numpy(x_np).cuda()
    y = torch.empty_like(x)
    want = torch.softmax(x.double(), dim=1).cpu().numpy()
    variants = [("triton fused", lambda: fused(x, y)), ("triton online", lambda: online(x, y)),
                ("torch.softmax", lambda: torch.softmax(x, dim=1, out=y))]
    for name, fn in variants:
        y.fill_(float("nan"))
        fn()
        basics.require(close(y.cpu().numpy(), want), f"gpu check: {name} within 1e-5·y + 1e-9")

    ceiling = basics.copy_ceiling_gbps(x_np.nbytes)
    rows_out = [("copy (torch copy_)", 2.0 * x_np.nbytes / (ceiling * 1e6), ceiling, 1.0)]
    for name, fn in variants:
        ms = basics.median_ms(fn)
        rate = basics.gbps(2.0 * x_np.nbytes, ms)  # read x once, write y once
        rows_out.append((name, ms, rate, rate / ceiling))
    basics.print_table("GB/s", "of copy", rows_out)


if __name__ == "__main__":
    sys.exit(basics.main(__doc__, __file__, cpu_check, gpu_part))
