"""The native Options of one call, built in one place for both front ends: the NumPy path
in flashlab/__init__.py and the torch custom ops in flashlab/_torch_ops.py import this
module, and it imports neither of them.

Integers are checked here against the width of the native field they fill, so that an
out-of-range value is a ValueError naming the argument instead of a binding type error.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Tuple

from . import _flashlab

# Any array with __dlpack__: torch.Tensor (autograd, torch.compile) or numpy.ndarray.
Array = Any


def is_torch(x: Any) -> bool:
    """Whether `x` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch")


def int32(name: str, value: Any) -> int:
    """`value` as an int that fits the native int32 field `name`."""
    v = int(value)
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"{name} must fit int32 (at most 2^31 - 1), got {v}")
    return v


def uint64(name: str, value: Any) -> int:
    """`value` as an int that fits the native uint64 field `name`."""
    v = int(value)
    if not 0 <= v < 2**64:
        raise ValueError(f"{name} must be in [0, 2^64), got {v}")
    return v


@functools.lru_cache(maxsize=None)
def _passes() -> dict[str, Tuple[bool, bool]]:
    return {k["name"]: (k["forward"], k["backward"]) for k in _flashlab.kernels()}


def kernel_for(kernel: str, backward: bool) -> str:
    """`kernel` for a pass it has, "auto" for the pass it lacks: naming a forward-only rung
    still trains, naming a backward-only one still runs its forward. An unknown name stays,
    to fail with the list of known kernels."""
    has = _passes().get(kernel)
    return "auto" if has is not None and not has[backward] else kernel


def window(window_size: Sequence[int]) -> Tuple[int, int]:
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be (left, right), got {window_size!r}")
    return int32("window_size[0]", window_size[0]), int32("window_size[1]", window_size[1])


def options(
    *,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    kernel: str,
    cu_seqlens_q: Optional[Array] = None,
    cu_seqlens_k: Optional[Array] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    dropout_offset: int = 0,
    check_inputs: bool = False,
) -> "_flashlab.Options":
    """The native Options of one call (the torch ops add the stream and the workspace)."""
    o = _flashlab.Options()
    o.dropout_p = float(dropout_p)
    o.dropout_seed = uint64("dropout_seed", dropout_seed)
    o.dropout_offset = uint64("dropout_offset", dropout_offset)
    o.softmax_scale = None if softmax_scale is None else float(softmax_scale)
    o.causal = bool(causal)
    o.window_left, o.window_right = window(window_size)
    o.softcap = float(softcap)
    o.kernel = str(kernel)
    o.cu_seqlens_q = cu_seqlens_q
    o.cu_seqlens_k = cu_seqlens_k
    o.max_seqlen_q = int32("max_seqlen_q", max_seqlen_q)
    o.max_seqlen_k = int32("max_seqlen_k", max_seqlen_k)
    o.check_inputs = bool(check_inputs)
    return o
