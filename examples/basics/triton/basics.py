"""What every Triton basics program shares: the import check, the CPU check in Triton's
interpreter, the no-GPU skip, the timer and the copy ceiling (the Python twin of
examples/basics/cuda/basics.cuh).

The order in each program is the CUDA siblings' order: build the inputs, run the CPU check,
then, only where a device exists, check every kernel on the GPU against a NumPy/torch
reference and time it.

The CPU check runs the Triton kernels themselves, on CPU tensors, in Triton's interpreter
(TRITON_INTERPRET=1: every program of the grid runs one after the other, each tl.* operation
evaluated with NumPy), on small shapes chosen to cut blocks unevenly, against a NumPy
reference. Triton reads TRITON_INTERPRET when a kernel is defined (at @triton.jit), so one
process cannot hold both an interpreted and a compiled copy of a kernel: a program started
without the variable runs its CPU check in a child process that has it, then goes on to the
GPU. Started with TRITON_INTERPRET=1, a program runs the CPU check in-process and skips the
GPU part.

Exit status: 0 when every check that ran passed (a GPU part skipped for a stated reason
included), 1 when a check failed, 77 when numpy, torch or triton cannot be imported (CTest's
SKIP_RETURN_CODE for these tests: nothing can run, not even the CPU check).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Callable

SKIP_NO_MODULES = 77

try:
    import numpy  # noqa: F401
    import torch
    import triton
    import triton.testing
except ImportError as err:
    print(f"skip: {err.name or 'a module'} cannot be imported ({err}); "
          "these programs need numpy, torch and triton (pip install numpy torch triton)")
    sys.exit(SKIP_NO_MODULES)


def interpreting() -> bool:
    """True when the kernels of this process run in Triton's interpreter, on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require(ok: bool, what: str) -> None:
    """A failed check ends the program with exit status 1; a passed one prints one line."""
    print(f"{what:<58} {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        sys.exit(1)


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: the CPU check and, with a GPU, a check and a timing "
                             "in a second or two (what CTest runs)")
    parser.add_argument("--sibling", metavar="PATH",
                        help="the CUDA sibling's binary (build/default/examples/basics/cuda/...), "
                             "run after this program's table so both print on one screen")
    parser.add_argument("--cpu-check-only", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def no_gpu_reason() -> str | None:
    """Why the GPU part cannot run here, or None when a CUDA device can run it."""
    if interpreting():
        return ("TRITON_INTERPRET=1 runs every kernel in the interpreter, on the CPU; "
                "unset it for the GPU check and the timing")
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        try:
            torch.cuda.init()
        except Exception as err:  # the driver's own words: no driver, driver too old...
            return f"no usable CUDA device ({str(err).split('. ')[0]})"
        return "no CUDA device (torch.cuda.device_count() is 0)"
    return None


def main(doc: str, script: str, cpu_check: Callable[[], None],
         gpu_part: Callable[[bool], None]) -> int:
    """The fixed order: the CPU check (in the interpreter), then the GPU part or its skip."""
    args = parse_args(doc)
    print(doc.splitlines()[0], flush=True)
    if interpreting():
        cpu_check()
        if args.cpu_check_only:
            return 0
    else:
        env = dict(os.environ, TRITON_INTERPRET="1")
        child = subprocess.run([sys.executable, script, "--cpu-check-only"], env=env,
                               stdout=subprocess.PIPE, text=True, check=False)
        # The child prints the title line again: drop it, keep its checks.
        sys.stdout.write("".join(child.stdout.splitlines(keepends=True)[1:]))
        if child.returncode != 0:
            print(f"the CPU check's interpreter process exited with {child.returncode}")
            return 1
    reason = no_gpu_reason()
    if reason is not None:
        print(f"skip: {reason}")
        return 0
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, sm_{props.major}{props.minor}, "
          f"{props.multi_processor_count} SMs; triton {triton.__version__}, "
          f"torch {torch.__version__}", flush=True)
    gpu_part(args.quick)
    if args.sibling:
        print(f"\nthe CUDA sibling, {args.sibling}:", flush=True)
        cmd = [args.sibling] + (["--quick"] if args.quick else [])
        return subprocess.run(cmd, check=False).returncode
    return 0


def median_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of fn() on the current stream: triton.testing.do_bench, which
    times each run with its own pair of CUDA events after warm-up runs, and clears the L2
    cache (it writes a 256 MB buffer) before every run, so each run starts cold."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def gbps(nbytes: float, ms: float) -> float:
    """GB/s (1e9 bytes per second) of nbytes moved in ms milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def copy_ceiling_gbps(nbytes: int) -> float:
    """The ceiling the memory-bound programs are compared with: a device-to-device copy of
    nbytes (torch's copy_, a cudaMemcpyAsync), counted as 2·nbytes moved."""
    src = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return gbps(2.0 * nbytes, median_ms(lambda: dst.copy_(src)))


def print_table(unit: str, last: str, rows: list[tuple[str, float, float, float]]) -> None:
    """rows: (name, ms, rate in `unit`, rate as a fraction of the reference row)."""
    print(f"\n{'kernel':<24} {'ms':>10} {unit:>10} {last:>10}")
    for name, ms, rate, frac in rows:
        print(f"{name:<24} {ms:>10.3f} {rate:>10.1f} {100 * frac:>9.0f}%")
