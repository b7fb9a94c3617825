"""One training step of a self-attention layer on the GPU, for a timeline (docs/learn/profiling.md).

x -> q, k, v projections -> flashlab.flash_attn_func -> output projection -> loss -> backward
-> optimizer step, in bf16 at batch 4, 16 heads, seqlen 4096, head dim 128 (the ladder
problem). A few warm-up steps come first; the profiled steps are marked with NVTX ranges
("step", "forward", "backward", "optimizer") so that Nsight Systems can show which kernels
each phase launches:

    nsys profile -t cuda,nvtx -o step python3 examples/learn/training_step.py
    nsys stats -r nvtx_sum,cuda_gpu_kern_sum step.nsys-rep

Without Nsight Systems, --torch-profiler prints the same per-kernel table from PyTorch's
profiler. Needs torch with CUDA and the flashlab package (scripts/py-build.sh stages it).
"""

from __future__ import annotations

import argparse

import torch

import flashlab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--kernel", default="auto", help="a registry entry, or auto")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--torch-profiler", action="store_true",
                    help="print PyTorch profiler's kernel table instead of relying on nsys")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("training_step.py needs a CUDA GPU")

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    b, s, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    hidden = h * d
    qkv_proj = torch.nn.Linear(hidden, 3 * hidden, bias=False, device=dev, dtype=dt)
    out_proj = torch.nn.Linear(hidden, hidden, bias=False, device=dev, dtype=dt)
    params = list(qkv_proj.parameters()) + list(out_proj.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(b, s, hidden, device=dev, dtype=dt)

    def step() -> torch.Tensor:
        torch.cuda.nvtx.range_push("forward")
        q, k, v = qkv_proj(x).view(b, s, 3, h, d).unbind(2)
        o = flashlab.flash_attn_func(q, k, v, causal=args.causal, kernel=args.kernel)
        loss = out_proj(o.reshape(b, s, hidden)).float().square().mean()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("backward")
        loss.backward()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.nvtx.range_pop()
        return loss

    for _ in range(3):  # warm-up: allocator, cuBLAS handles, first launches
        step()
    torch.cuda.synchronize()

    def profiled() -> None:
        for _ in range(args.steps):
            torch.cuda.nvtx.range_push("step")
            step()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()

    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            profiled()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    else:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        profiled()
        end.record()
        torch.cuda.synchronize()
        print(f"{args.steps} steps, {start.elapsed_time(end) / args.steps:.2f} ms per step "
              f"(batch {b}, seqlen {s}, heads {h}, head dim {d}, causal {args.causal}, "
              f"kernel {args.kernel})")


if __name__ == "__main__":
    main()
