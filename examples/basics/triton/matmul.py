"""Triton basics 3 — matmul: tiles, tl.dot, the fp32 accumulator, the launch order.

C = A·B, row-major, A [M, K], B [K, N], C fp32. One program computes one BLOCK_M x BLOCK_N
tile of C: it walks K in steps of BLOCK_K, loads a tile of A and one of B (masked at the
edges), and accumulates their product with tl.dot into an fp32 tile held in registers.
tl.dot is where Triton picks the tensor-core instructions for the GPU (wgmma on sm_90) and
the shared-memory layouts and pipeline (num_stages tiles of A and B in flight) that feed
them. Two inputs, each with a fixed config and the cuBLAS ceiling reached through torch:
  bf16        tensor cores, fp32 accumulation; against torch.matmul in bf16 (the sibling's
              wmma_bf16 against cublasGemmEx)
  fp32 ieee   input_precision="ieee": fp32 FMAs, no TF32; against torch.matmul in fp32 with
              TF32 off (the sibling's reg_tile against cublasSgemm)
The FLOPs are 2·M·N·K whatever the kernel. CUDA sibling: examples/basics/cuda/03_matmul.cu.
Measured: docs/learn/basics/triton.md.

CPU check (Triton's interpreter, basics.py): the kernel on CPU tensors, the H100 configs and
a small one (several programs, a partial group), on shapes that are no multiple of any
block, against NumPy's int64 product exactly. The inputs are integers in -2..2, so every
partial sum is an integer that fp32 holds exactly in any order (as in the sibling). The
16-bit path is checked in fp16: the interpreter does not support bf16 in tl.dot (it
multiplies the raw bit patterns, triton-lang/triton#11584); the kernel is the same source
for both, and the GPU check runs it in bf16.
GPU check: the Triton kernels and torch's fp32 matmul equal torch's float64 product exactly;
torch's bf16 matmul (fp32 accumulation, bf16 out) within that last rounding, 2^-8 relative.
"""

from __future__ import annotations

import sys

import basics  # first: exits with "skip: ..." when numpy, torch or triton is missing
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K: tl.constexpr,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    # The launch order. Programs run roughly in pid order, and neighbours in time share L2.
    # Row-major order (pid_m = pid // tiles_n) sweeps a whole row of C tiles, re-reading all
    # of B for every row. Grouped order walks GROUP_M tile rows column by column, so a group
    # of programs that run together reuses GROUP_M tiles of A and a few tiles of B from L2.
    pid = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    # Pointers to a whole tile at once: a column of row offsets plus a row of column offsets
    # broadcast to a [BLOCK_M, BLOCK_K] block of addresses.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    # The accumulator is fp32 whatever the input type: bf16 products summed in bf16 would
    # keep 8 significant bits. It stays in registers for the whole K loop.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K bounds the loop, so it is a constexpr: one compiled kernel per K, and a plain int for
    # range() in the interpreter, which in Triton 3.6 cannot take a runtime scalar there under
    # NumPy >= 2.4 (triton-lang/triton#9171).
    for k in range(0, K, BLOCK_K):
        k_left = K - k
        # Out-of-range rows, columns and the K tail read 0, which adds nothing to the sum.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# Fixed configs for the H100 (no autotuning, so every run times the same kernel):
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages). 16-bit: a 128x256 tile with
# 8 warps (two warpgroups, each issuing wgmma m64n256k16) and 3 stages of A and B tiles in
# shared memory, 3·(128·64 + 64·256)·2 B = 144 KiB of the 227 KiB a block may use. fp32
# ieee: a 128x128 tile on the FMA units. triton.autotune would time a list of such configs
# at the first call for each shape and keep the fastest.
H100 = {2: (128, 256, 64, 8, 8, 3), 4: (128, 128, 32, 8, 8, 3)}  # by bytes per element
SMALL = (32, 32, 16, 2, 4, 2)


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config=None) -> None:
    (M, K), (_, N) = a.shape, b.shape
    bm, bn, bk, group, warps, stages = config or H100[a.element_size()]
    precision = "ieee" if a.dtype == torch.float32 else "tf32"  # "tf32" is unused for bf16
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)  # 1-D: the kernel derives (m, n)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                        GROUP_M=group, PRECISION=precision, num_warps=warps,
                        num_stages=stages)


def inputs(M: int, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Integers in -2..2 (int64), fixed by the shape."""
    rng = np.random.default_rng(M * 1_000_003 + N * 1009 + K)
    return rng.integers(-2, 3, (M, K)), rng.integers(-2, 3, (K, N))


def cpu_check() -> None:
    ok = True
    for M, N, K in ((200, 136, 100), (37, 45, 70), (1, 1, 1)):
        a, b = inputs(M, N, K)
        want = a @ b
        for dtype in (torch.float16, torch.float32):  # fp16: see the docstring
            for config in (None, SMALL):
                c = torch.full((M, N), float("nan"))
                matmul(torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype), c, config)
                ok = ok and np.array_equal(c.numpy(), want)
    basics.require(ok, "cpu check: interpreted fp16 and fp32 exact, any shape")


def gpu_part(quick: bool) -> None:
    M = N = K = 256 if quick else 4096
    print(f"matmul, M = N = K = {M}, bf16 and fp32 in, fp32 accumulate, "
          f"{2.0 * M * N * K / 1e9:.3g} GFLOP")
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's fp32 matmul: cublasSgemm's math
    # and its bf16 matmul accumulates in fp32 throughout (no bf16 split-K partial sums), as
    # the sibling's cublasGemmEx does
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    a_np, b_np = inputs(M, N, K)
    a32, b32 = torch.from_numpy(a_np).float().cuda(), torch.from_numpy(b_np).float().cuda()
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    want = (a32.double() @ b32.double()).float()  # exact: integers far below 2^24
    c = torch.empty(M, N, device="cuda")
    c16 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

    bf16 = [("triton bf16", lambda: matmul(a16, b16, c)),
            ("torch.matmul bf16", lambda: torch.matmul(a16, b16, out=c16))]
    fp32 = [("triton fp32 ieee", lambda: matmul(a32, b32, c)),
            ("torch.matmul fp32", lambda: torch.matmul(a32, b32, out=c))]
    for name, fn in (bf16[0], fp32[0], fp32[1]):
        c.fill_(float("nan"))
        fn()
        basics.require(torch.equal(c, want), f"gpu check: {name} exact")
    bf16[1][1]()
    err = (c16.float() - want).abs() <= 2.0**-8 * want.abs()
    basics.require(bool(err.all()), "gpu check: torch.matmul bf16 within 2^-8 (bf16 out)")

    flops = 2.0 * M * N * K
    for pair in (bf16, fp32):
        ms = [basics.median_ms(fn) for _, fn in pair]
        ref = ms[1]  # cuBLAS through torch
        basics.print_table("TFLOP/s", "of torch", [
            (name, t, flops / (t * 1e-3) / 1e12, ref / t) for (name, _), t in zip(pair, ms)])


if __name__ == "__main__":
    sys.exit(basics.main(__doc__, __file__, cpu_check, gpu_part))
