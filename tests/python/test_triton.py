"""The Triton rung (flashlab.triton_fa2) against an fp64 reference: out, lse, dq, dk, dv.

The bar is the C++ rungs' (docs/DESIGN.md's rule, reference.check_rule): max abs error <= 2 x
the max abs error of a straightforward implementation in the input dtype (PyTorch's
math-path rounding points: scores, softmax and P V each rounded to the dtype) + 1e-5 x the
values' size, with the rule's two allowances for dq and dk (reference.gradient_slack: the
size of the terms their sums cancel, and what the rounding of a stored O moves them by; a
backward reads O as its forward rounded it). Outputs are poisoned with NaN
first, so an element the kernels never write fails. Fresh random inputs each run;
FLASHLAB_TEST_SEED=N repeats a run.

On a CUDA device every case runs. Without one, the cases run on the CPU under Triton's
interpreter when this module is imported with TRITON_INTERPRET=1 (fp16 only: the
interpreter's bf16 tl.dot is wrong); test_interpreter_on_cpu does that in a subprocess.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
DEVICE = "cuda" if HAS_CUDA else "cpu"
SEED = int(os.environ.get("FLASHLAB_TEST_SEED", random.SystemRandom().randrange(2**31)))


def _interpreter_runs_loops() -> str:
    """Why Triton's interpreter cannot run the kernels here, or "" when it can."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(x, n):
        acc = 0
        for _ in range(0, tl.maximum(n, 0), 4):
            acc += 1
        tl.store(x, acc)

    x = torch.zeros(1, dtype=torch.int32)
    try:
        probe[(1,)](x, 8)
    except Exception as e:  # the interpreter raises its own wrapper types
        return f"Triton's interpreter cannot run a loop with computed bounds here: {e!r}"
    return "" if int(x[0]) == 2 else "Triton's interpreter miscounted a loop"


if INTERPRET:
    _why = _interpreter_runs_loops()
    if _why:
        pytest.skip(_why, allow_module_level=True)

import reference  # noqa: E402
from flashlab import triton_fa2  # noqa: E402  (after the interpreter choice)

needs_device = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRET),
    reason="the Triton rung needs a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)")


# ---- the reference -----------------------------------------------------------------------


def attention_ref(q, k, v, causal, scale, dout):
    """out, lse, dq, dk, dv of textbook attention in q's dtype (fp64 for the oracle).
    A row that sees no key gets out 0, lse -inf and no gradient, as the kernels."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, kk)  # (B, Hq, Sq, Sk)
    sq, sk = q.shape[1], k.shape[1]
    if causal:  # bottom-right: query i sees key j when j <= i + sk - sq
        hidden = torch.arange(sk, device=q.device)[None, :] > (
            torch.arange(sq, device=q.device)[:, None] + sk - sq)
        s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.to(out.dtype))
    return out.detach(), lse.detach(), dq, dk, dv


def max_err(x, ref, name):
    x, ref = x.double(), ref.double()
    hidden = torch.isinf(ref)
    if hidden.any():  # an LSE of -inf must be exactly -inf
        assert torch.equal(x[hidden], ref[hidden]), f"{name}: rows that see no key"
    diff = (x[~hidden] - ref[~hidden]).abs()
    if diff.numel() == 0:
        return 0.0
    assert not torch.isnan(diff).any(), f"{name}: NaN (an element was not written?)"
    return diff.max().item()


def run_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype):
    gen = torch.Generator(device=DEVICE).manual_seed(
        SEED ^ hash((batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal)) % 2**31)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)

    q = rand(batch, seqlen_q, heads_q, head_dim)
    k = rand(batch, seqlen_k, heads_kv, head_dim)
    v = rand(batch, seqlen_k, heads_kv, head_dim)
    dout = rand(batch, seqlen_q, heads_q, head_dim)
    scale = 1.0 / math.sqrt(head_dim)

    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads_q, seqlen_q), float("nan"), device=DEVICE)
    triton_fa2.attention_forward(q, k, v, scale, causal, out=out, lse=lse)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    triton_fa2.attention_backward(dout, q, k, v, out, lse, scale, causal, dq=dq, dk=dk, dv=dv)
    got = (out, lse, dq, dk, dv)

    oracle = attention_ref(*(x.double() for x in (q, k, v)), causal, scale, dout.double())
    plain = attention_ref(q, k, v, causal, scale, dout)
    where = (f"seed {SEED}: B{batch} Sq{seqlen_q} Sk{seqlen_k} H{heads_q}/{heads_kv} "
             f"D{head_dim} {'causal' if causal else 'full'} {dtype}")
    slack = reference.gradient_slack(q, k, v, dout, causal=causal, scale=scale)
    for name, x, ref, base in zip(("out", "lse", "dq", "dk", "dv"), got, oracle, plain):
        max_err(x, ref, name)  # every element written, and a row that sees no key exactly -inf
        try:
            reference.check_rule(name, x, base, ref, *slack.get(name, (0.0, 0.0)))
        except AssertionError as e:
            raise AssertionError(f"{where}: {e}") from None


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): random and nasty shapes.
SHAPES = [
    (2, 128, 128, 4, 4, 64),
    (1, 1, 1, 2, 2, 64),  # one query, one key
    (2, 17, 17, 3, 3, 128),  # shorter than any tile
    (1, 127, 127, 2, 1, 64),  # one short of a tile; GQA 2:1
    (1, 1000, 1000, 2, 2, 128),  # ragged last tile
    (2, 113, 300, 8, 1, 128),  # sq < sk (decode-like causal); GQA 8:1
    (1, 300, 113, 2, 2, 64),  # sq > sk: causal rows that see no key
    (1, 1, 513, 8, 1, 64),  # one query token, GQA 8:1
    (1, 200, 200, 2, 2, 256),
]
SMALL = {(1, 1, 1, 2, 2, 64), (2, 17, 17, 3, 3, 128), (1, 300, 113, 2, 2, 64),
         (1, 1, 513, 8, 1, 64)}  # the subset the CPU interpreter runs


def _case_id(shape):
    return "B{}_Sq{}_Sk{}_H{}x{}_D{}".format(*shape) + ("_small" if shape in SMALL else "")


@needs_device
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=_case_id)
def test_matches_fp64_reference(shape, causal, dtype):
    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter computes bf16 tl.dot wrongly")
    run_case(*shape, causal, dtype)


@needs_device
def test_autograd_and_signature():
    q, k, v = (torch.randn(1, 64, 4, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    out, lse, none = triton_fa2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert none is None and lse.shape == (1, 4, 64) and lse.dtype == torch.float32
    out.float().square().sum().backward()
    dq, dk, dv = triton_fa2.attention_backward(2 * out.detach(), q, k, v, out.detach(), lse,
                                               causal=True)
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert torch.equal(got, want)  # no atomics: the gradients are deterministic


@needs_device
def test_refusals_name_the_argument():
    q = torch.randn(1, 8, 2, 96, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim"):
        triton_fa2.attention_forward(q, q, q)
    q = torch.randn(1, 8, 3, 64, device=DEVICE, dtype=torch.float16)
    k = torch.randn(1, 8, 2, 64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="heads_q"):
        triton_fa2.attention_forward(q, k, k)
    with pytest.raises(ValueError, match="dtypes"):
        triton_fa2.attention_forward(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="dropout_p"):
        triton_fa2.flash_attn_func(q, q, q, dropout_p=0.1)


@pytest.mark.skipif(INTERPRET or HAS_CUDA, reason="runs only on a machine without CUDA")
def test_interpreter_on_cpu():
    """The small cases under TRITON_INTERPRET=1, in a fresh process (the interpreter is
    chosen when the kernels are defined)."""
    env = dict(os.environ, TRITON_INTERPRET="1", FLASHLAB_TEST_SEED=str(SEED))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-rs", "-p", "no:cacheprovider",
         "-k", "small and fp16"],
        env=env, capture_output=True, text=True, timeout=900)
    tail = (run.stdout + run.stderr)[-3000:]
    if run.returncode == 0 and " passed" in run.stdout:
        return
    reasons = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    if run.returncode in (0, 5) and reasons:
        pytest.skip("interpreter: " + reasons[0][:300])
    pytest.fail(f"the interpreter run failed:\n{tail}")
