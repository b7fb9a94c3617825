# nanobind stubgen patterns for flashlab._flashlab: the element types of the lists and dicts
# the bindings build by hand (nb::list, nb::dict), which stubgen writes without arguments, and
# the plain data classes written as annotated attributes.
# The stubs in python/flashlab/_flashlab/ are made with (from a build with the module):
#   python -m nanobind.stubgen -q -r -m flashlab._flashlab -p tools/stubs/_flashlab.pat \
#       -O python/flashlab
# and tests/python/test_package.py checks that they match the module.
flashlab\._flashlab\.kernels$:
    \from typing import Any
    def kernels() -> list[dict[str, Any]]: ...

flashlab\._flashlab\.bench\.Bench\.describe$:
    def describe(self) -> dict[str, str]: ...

# Plain read-write fields (nb::def_rw) as annotated attributes, which type checkers treat as
# the property/setter pairs stubgen would write, in a third of the lines.
flashlab\._flashlab\.Options$:
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

flashlab\._flashlab\.bench\.TimingOptions$:
    class TimingOptions:
        def __init__(self) -> None: ...
        warmup: int
        warmup_ms: float
        iters: int
        budget_ms: float
        rounds: int

# Read-only fields (nb::def_ro) as Final attributes: read-only to a type checker, as the
# properties stubgen would write.
flashlab\._flashlab\.bench\.Row$:
    \from typing import Final
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

flashlab\._flashlab\.bench\.Entry$:
    class Entry:
        row: Final[Row]
        timed: Final[bool]
        call_ms: Final[float]
