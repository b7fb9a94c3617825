"""FlashLab native module (use the flashlab package, not this module)"""

from typing import Any

from flashlab._flashlab import bench as bench


class Options:
    def __init__(self) -> None: ...
    cu_seqlens_q: object
    cu_seqlens_k: object
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float | None
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    dropout_p: float
    dropout_seed: int
    dropout_offset: int
    kernel: str
    stream: int
    workspace: object
    num_threads: int
    check_inputs: bool
    num_splits: int

def forward(q: object, k: object, v: object, out: object, lse: object | None, options: Options, size_only: bool = False) -> int: ...

def backward(q: object, k: object, v: object, out: object, dout: object, lse: object, dq: object, dk: object, dv: object, deterministic: bool, options: Options, size_only: bool = False) -> int: ...

def forward_kvcache(q: object, k_cache: object, v_cache: object, k_new: object | None, v_new: object | None, cache_seqlens: object | None, cache_batch_idx: object | None, block_table: object | None, cache_leftpad: object | None, rotary_cos: object | None, rotary_sin: object | None, rotary_interleaved: bool, out: object, lse: object | None, options: Options, size_only: bool = False) -> int: ...

def kernels() -> list[dict[str, Any]]: ...

def cuda_available() -> bool: ...
