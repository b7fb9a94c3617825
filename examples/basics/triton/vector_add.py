"""Triton basics 1 — vector add: programs, blocks of elements, masks.

c[i] = a[i] + b[i] over n floats. A Triton kernel is written for one *program* (one CUDA
block, its warps chosen by num_warps), and the program handles a whole block of BLOCK
elements as one value: the compiler decides which thread holds which element, vectorizes
the loads and coalesces them. Three block sizes are timed, next to torch's own add and a
device-to-device copy (the ceiling: each byte read once, written once). The add moves 12
bytes per element (read a, read b, write c) for one FLOP.
CUDA sibling: examples/basics/cuda/01_vector_add.cu. Measured: docs/learn/basics/triton.md.

CPU check (Triton's interpreter, basics.py): the kernel on CPU tensors for several n and
block sizes, n not a multiple of the block included, into an output longer than n that is
filled with NaN first: every c[i], i < n, must equal a[i] + b[i] exactly (small integers),
and the tail past n must still be NaN (the mask kept the last program inside the array).
GPU check: the same exact equality at the timed size, against NumPy.
"""

from __future__ import annotations

import sys

import basics  # first: exits with "skip: ..." when numpy, torch or triton is missing
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    # Program `pid` of the 1-D grid owns elements [pid·BLOCK, pid·BLOCK + BLOCK). program_id
    # is 32-bit: widen it before the multiply so that offsets past 2^31 do not wrap.
    pid = tl.program_id(axis=0).to(tl.int64)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # a block of BLOCK indices (BLOCK: 2^k)
    # The last program runs past n unless n % BLOCK == 0: the mask switches those lanes off,
    # for the loads (nothing is read) and for the store (nothing is written).
    mask = offsets < n
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(c_ptr + offsets, a + b, mask=mask)


def add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, n: int, block: int) -> None:
    grid = (triton.cdiv(n, block),)  # one program per block of elements, as many as needed
    # num_warps: 4 warps (128 threads) per program; with BLOCK = 1024 each thread holds 8
    # floats of each array. Triton specializes a launch on which integer arguments and
    # pointers are multiples of 16: when n is, every group of 4 lanes is wholly in or out of
    # the mask and the compiler loads them as 16-byte vectors (ld.global.v4), two per array.
    add_kernel[grid](a, b, c, n, BLOCK=block, num_warps=4)


def inputs(n: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA sibling's data: a[i] = i mod 1000, b[i] = 7i mod 1001 (small integers)."""
    i = torch.arange(n, dtype=torch.int64)
    return (i % 1000).float().to(device), ((i * 7) % 1001).float().to(device)


BLOCKS = (256, 1024, 4096)


def cpu_check() -> None:
    ok = True
    for n in (1, 31, 1000, 1024, 4096, 12345):
        a, b = inputs(n, "cpu")
        want = a.numpy() + b.numpy()
        for block in BLOCKS:
            c = torch.full((n + block,), float("nan"))  # room for a wild store past n
            add(a, b, c, n, block)
            ok = ok and np.array_equal(c[:n].numpy(), want) and bool(c[n:].isnan().all())
    basics.require(ok, "cpu check: interpreted add exact, nothing written past n")


def gpu_part(quick: bool) -> None:
    n = 1 << 20 if quick else 1 << 26  # 4 MiB or 256 MiB per array
    print(f"vector add, n = {n} floats ({n * 4 / 2**20:.0f} MiB per array)")
    a, b = inputs(n, "cuda")
    c = torch.empty_like(a)
    want = a.cpu().numpy() + b.cpu().numpy()
    for block in BLOCKS:
        c.fill_(float("nan"))
        add(a, b, c, n, block)
        basics.require(np.array_equal(c.cpu().numpy(), want),
                       f"gpu check: triton BLOCK={block} equals NumPy exactly")
    c.fill_(float("nan"))
    torch.add(a, b, out=c)
    basics.require(np.array_equal(c.cpu().numpy(), want), "gpu check: torch.add equals NumPy")

    moved = 3.0 * n * 4  # read a, read b, write c
    ceiling = basics.copy_ceiling_gbps(n * 4)
    rows = [("copy (torch copy_)", 2.0 * n * 4 / (ceiling * 1e6), ceiling, 1.0)]
    timed = [(f"triton BLOCK={blk}", lambda blk=blk: add(a, b, c, n, blk)) for blk in BLOCKS]
    timed.append(("torch.add", lambda: torch.add(a, b, out=c)))
    for name, fn in timed:
        ms = basics.median_ms(fn)
        rate = basics.gbps(moved, ms)
        rows.append((name, ms, rate, rate / ceiling))
    basics.print_table("GB/s", "of copy", rows)


if __name__ == "__main__":
    sys.exit(basics.main(__doc__, __file__, cpu_check, gpu_part))
