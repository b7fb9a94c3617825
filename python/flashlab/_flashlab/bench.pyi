"""The benchmark harness (include/flashlab/bench.h)"""

from collections.abc import Sequence
from typing import Final


class Problem:
    def __init__(self) -> None: ...

    @property
    def batch(self) -> int: ...

    @batch.setter
    def batch(self, arg: int, /) -> None: ...

    @property
    def heads_q(self) -> int: ...

    @heads_q.setter
    def heads_q(self, arg: int, /) -> None: ...

    @property
    def heads_kv(self) -> int: ...

    @heads_kv.setter
    def heads_kv(self, arg: int, /) -> None: ...

    @property
    def seqlen_q(self) -> int: ...

    @seqlen_q.setter
    def seqlen_q(self, arg: int, /) -> None: ...

    @property
    def seqlen_k(self) -> int: ...

    @seqlen_k.setter
    def seqlen_k(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def head_dim_v(self) -> int: ...

    @head_dim_v.setter
    def head_dim_v(self, arg: int, /) -> None: ...

    @property
    def dtype(self) -> str: ...

    @dtype.setter
    def dtype(self, arg: str, /) -> None: ...

    @property
    def device(self) -> str: ...

    @device.setter
    def device(self, arg: str, /) -> None: ...

    @property
    def causal(self) -> bool: ...

    @causal.setter
    def causal(self, arg: bool, /) -> None: ...

    @property
    def window_left(self) -> int: ...

    @window_left.setter
    def window_left(self, arg: int, /) -> None: ...

    @property
    def window_right(self) -> int: ...

    @window_right.setter
    def window_right(self, arg: int, /) -> None: ...

    @property
    def softcap(self) -> float: ...

    @softcap.setter
    def softcap(self, arg: float, /) -> None: ...

    @property
    def backward(self) -> bool: ...

    @backward.setter
    def backward(self, arg: bool, /) -> None: ...

    @property
    def train(self) -> bool:
        """a training step per call: forward then backward (backward ignored)"""

    @train.setter
    def train(self, arg: bool, /) -> None: ...

    @property
    def decode(self) -> bool: ...

    @decode.setter
    def decode(self, arg: bool, /) -> None: ...

    @property
    def page_size(self) -> int: ...

    @page_size.setter
    def page_size(self, arg: int, /) -> None: ...

    @property
    def seqlen_new(self) -> int: ...

    @seqlen_new.setter
    def seqlen_new(self, arg: int, /) -> None: ...

    @property
    def quadratic_workspace_limit(self) -> int: ...

    @quadratic_workspace_limit.setter
    def quadratic_workspace_limit(self, arg: int, /) -> None: ...

    @property
    def lengths(self) -> list[int]:
        """
        varlen: the documents' lengths (batch and seqlen_q/seqlen_k follow); [] padded
        """

    @lengths.setter
    def lengths(self, arg: Sequence[int], /) -> None: ...

    def __copy__(self) -> Problem: ...

    @property
    def flops(self) -> float: ...

    @property
    def kv_bytes(self) -> float: ...

    @property
    def shape(self) -> str: ...

    @property
    def mask(self) -> str: ...

def sweep_problems(head_dims: Sequence[int], seqlens: Sequence[int], causal: Sequence[bool], forward: bool, backward: bool, dtype: str, device: str, train: bool = False) -> list[Problem]: ...

def decode_problems(seqlens: Sequence[int], batch: int, dtype: str, device: str, heads_q: int = 32, heads_kv: int = 8, head_dim: int = 128, seqlen_q: int = 1, page_size: int = 0, seqlen_new: int = 0) -> list[Problem]:
    """KV-cache problems (Problem.decode), one per cache length in `seqlens`"""

def document_lengths(tokens: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    """
    Lengths drawn uniformly from [lo, hi] (seeded) until they fill `tokens`, the last cut to fit
    """

def varlen_problems(head_dims: Sequence[int], causal: Sequence[bool], forward: bool, backward: bool, dtype: str, device: str, lengths: Sequence[int], train: bool = False) -> list[Problem]:
    """
    The sweep as one varlen problem per (head dim, causal, pass), heads = hidden / head dim
    """

def sweep_tokens() -> int:
    """The sweep's token count"""

class TimingOptions:
    def __init__(self) -> None: ...
    warmup: int
    warmup_ms: float
    iters: int
    budget_ms: float
    rounds: int

def plan_runs(arg0: float, arg1: TimingOptions, /) -> tuple[int, int]: ...

def median(arg: Sequence[float], /) -> float: ...

class Row:
    kernel: Final[str]
    problem: Final[Problem]
    status: Final[str]
    reason: Final[str]
    time_ms: Final[float]
    warmup_runs: Final[int]
    timed_runs: Final[int]
    round_ms: Final[list[float]]
    flops: Final[float]
    tflops: Final[float]
    kv_bytes: Final[float]
    gbps: Final[float]
    workspace_bytes: Final[int]
    errors: Final[dict[str, float]]

class Entry:
    row: Final[Row]
    timed: Final[bool]
    call_ms: Final[float]

class Progress:
    def __init__(self, enabled: bool, total: int) -> None: ...

    def step(self, arg: str, /) -> None: ...

class Bench:
    def __init__(self, problem: Problem, timing: TimingOptions, seed: int, threads: int = 0, check: bool = True, check_gflops: float = 80.0, stream: int = 0, progress: bool = False) -> None: ...

    @property
    def set_count(self) -> int: ...

    def input(self, set: int, name: str, framework: str = 'torch') -> object:
        """
        A view of one operand of input set `set` as a torch tensor (or framework='numpy'); None when the pass has no such operand. Decode: k and v are the caches, with k_new, v_new, cache_seqlens and block_table; varlen: cu_seqlens
        """

    def add_kernel(self, arg: str, /) -> Entry: ...

    def add(self, name: str, run: object) -> Entry: ...

    def refused(self, name: str, reason: str, error: bool = False) -> Entry: ...

    def time(self, arg: Sequence[Entry], /) -> None: ...

    def describe(self) -> dict[str, str]: ...
