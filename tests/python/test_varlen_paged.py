"""flash_attn_varlen_func(block_table=...): paged K/V caches in the varlen call.

The paged call gathers each sequence's rows out of the pages and runs the varlen forward on
them, so out and softmax_lse must be bitwise what flash_attn_varlen_func gives on the same
keys laid out contiguously, and within fp32 tolerance of the fp64 oracle. The pools hold
shuffled pages, NaN in every row no sequence uses and -1 in the table past each sequence's
last page, so a row read from the wrong place shows. Page sizes 16 and 256, GQA, causal,
windows, softcap, empty sequences; NumPy and torch CPU inputs (CUDA tensors in the test
marked cuda); forward only under autograd; every refusal with its message.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
import reference as ref
from reference import max_err

FP32_TOL = 2e-5
LENS_Q = [5, 3, 20, 0, 7]
LENS_K = [37, 0, 300, 16, 1]
varlen = flashlab.flash_attn_varlen_func


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


class Case:
    """Packed q, contiguous k/v (the reference layout) and the same keys in a paged pool."""

    def __init__(self, rng, *, page_size, lens_q=LENS_Q, lens_k=LENS_K, heads_q=4, heads_kv=2,
                 head_dim=32, head_dim_v=32, spare_pages=3):
        self.cu_q, self.cu_k = _cu(lens_q), _cu(lens_k)
        self.max_q, self.max_k = max(lens_q), max(lens_k)
        self.q = rng.standard_normal((int(self.cu_q[-1]), heads_q, head_dim)).astype(np.float32)
        total_k = int(self.cu_k[-1])
        self.k = rng.standard_normal((total_k, heads_kv, head_dim)).astype(np.float32)
        self.v = rng.standard_normal((total_k, heads_kv, head_dim_v)).astype(np.float32)
        pages = [-(-n // page_size) for n in lens_k]
        num_blocks = sum(pages) + spare_pages
        order = rng.permutation(num_blocks)
        self.block_table = np.full((len(lens_k), max(pages) + 1), -1, dtype=np.int32)
        self.k_cache = np.full((num_blocks, page_size, heads_kv, head_dim), np.nan, np.float32)
        self.v_cache = np.full((num_blocks, page_size, heads_kv, head_dim_v), np.nan, np.float32)
        used = 0
        for b, n in enumerate(lens_k):
            self.block_table[b, :pages[b]] = order[used:used + pages[b]]
            used += pages[b]
            for t in range(n):
                page, row = self.block_table[b, t // page_size], t % page_size
                self.k_cache[page, row] = self.k[self.cu_k[b] + t]
                self.v_cache[page, row] = self.v[self.cu_k[b] + t]

    def paged(self, convert=lambda x: x, **kw):
        c = convert
        return varlen(c(self.q), c(self.k_cache), c(self.v_cache), c(self.cu_q), c(self.cu_k),
                      self.max_q, self.max_k, block_table=c(self.block_table), **kw)

    def contiguous(self, convert=lambda x: x, **kw):
        c = convert
        return varlen(c(self.q), c(self.k), c(self.v), c(self.cu_q), c(self.cu_k), self.max_q,
                      self.max_k, **kw)


MASKS = {"none": {}, "causal": {"causal": True}, "window": {"window_size": (9, 3)},
         "causal_window_softcap": {"causal": True, "window_size": (12, -1), "softcap": 5.0}}


def _oracle_kw(mask):
    return {"causal": mask.get("causal", False), "window": mask.get("window_size", (-1, -1)),
            "softcap": mask.get("softcap", 0.0)}


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("mask", list(MASKS))
def test_numpy_is_varlen_on_the_contiguous_keys(rng, page_size, mask):
    c = Case(rng, page_size=page_size)
    out, lse, _ = c.paged(return_attn_probs=True, **MASKS[mask])
    same, same_lse, _ = c.contiguous(return_attn_probs=True, **MASKS[mask])
    assert np.array_equal(out, same) and np.array_equal(lse, same_lse)
    want, want_lse = ref.varlen_attention(c.q, c.k, c.v, c.cu_q, c.cu_k, **_oracle_kw(MASKS[mask]))
    assert max_err(out, want) < FP32_TOL and max_err(lse, want_lse) < FP32_TOL


def test_page_size_1_and_mqa_and_own_value_head_dim(rng):
    c = Case(rng, page_size=1, heads_q=3, heads_kv=1, head_dim=16, head_dim_v=24)
    out = c.paged(causal=True)
    assert out.shape == (c.q.shape[0], 3, 24)
    assert np.array_equal(out, c.contiguous(causal=True))


def test_every_key_sequence_empty(rng):
    c = Case(rng, page_size=16, lens_k=[0] * len(LENS_Q))
    out, lse, _ = c.paged(return_attn_probs=True)
    assert c.k_cache.shape[0] == 3 and np.all(out == 0) and np.all(lse == -np.inf)


def test_max_seqlen_k_is_checked_by_the_varlen_call(rng):
    c = Case(rng, page_size=16)
    with pytest.raises(ValueError, match=r"cu_seqlens_k: sequence 2 has length 300 > "
                                         r"max_seqlen_k = 299"):
        varlen(c.q, c.k_cache, c.v_cache, c.cu_q, c.cu_k, c.max_q, 299,
               block_table=c.block_table)


# ---- torch ------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("page_size", [16, 256])
def test_torch_cpu_is_varlen_on_the_contiguous_keys(rng, page_size):
    import torch

    c = Case(rng, page_size=page_size)
    out, lse, _ = c.paged(torch.from_numpy, causal=True, window_size=(20, 0),
                          return_attn_probs=True)
    same, same_lse, _ = c.contiguous(torch.from_numpy, causal=True, window_size=(20, 0),
                                     return_attn_probs=True)
    assert torch.equal(out, same) and torch.equal(lse, same_lse)
    want, _ = ref.varlen_attention(c.q, c.k, c.v, c.cu_q, c.cu_k, causal=True, window=(20, 0))
    assert max_err(out, want) < FP32_TOL


@pytest.mark.torch
@pytest.mark.parametrize("which", ["q", "k_cache"])
def test_torch_forward_only(rng, which):
    """Inputs that require grad: the forward runs (detached) and a backward raises."""
    import torch

    c = Case(rng, page_size=16)
    grad = lambda x: torch.from_numpy(x).requires_grad_(x is getattr(c, which))  # noqa: E731
    out = c.paged(grad)
    assert torch.equal(out.detach(), c.contiguous(torch.from_numpy))
    assert out.requires_grad
    with pytest.raises(RuntimeError, match=r"block_table=\.\.\.\) is forward only"):
        out.sum().backward()
    with torch.no_grad():
        assert not c.paged(grad).requires_grad
    out, lse, _ = c.paged(grad, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


@pytest.mark.torch
def test_mixed_array_kinds_are_a_type_error(rng):
    import torch

    c = Case(rng, page_size=16)
    with pytest.raises(TypeError, match=r"block_table is a torch\.Tensor but q is not"):
        varlen(c.q, c.k_cache, c.v_cache, c.cu_q, c.cu_k, c.max_q, c.max_k,
               block_table=torch.from_numpy(c.block_table))


@pytest.mark.cuda
@pytest.mark.parametrize("page_size", [16, 256])
def test_cuda_is_varlen_on_the_contiguous_keys(rng, page_size):
    import torch

    def bf16(x):
        t = torch.from_numpy(x).cuda()
        return t.bfloat16() if t.is_floating_point() else t

    c = Case(rng, page_size=page_size, head_dim=64, head_dim_v=64)
    out, lse, _ = c.paged(bf16, causal=True, return_attn_probs=True)
    same, same_lse, _ = c.contiguous(bf16, causal=True, return_attn_probs=True)
    assert out.is_cuda and torch.equal(out, same) and torch.equal(lse, same_lse)
    rounded = [ref.as_f64(bf16(x)) for x in (c.q, c.k, c.v)]
    want, want_lse = ref.varlen_attention(*rounded, c.cu_q, c.cu_k, causal=True)
    assert max_err(out, want) < 2e-2 and max_err(lse, want_lse) < 1e-3
    with pytest.raises(ValueError, match=r"block_table is on cpu but k is on cuda"):
        varlen(bf16(c.q), bf16(c.k_cache), bf16(c.v_cache), bf16(c.cu_q), bf16(c.cu_k),
               c.max_q, c.max_k, block_table=torch.from_numpy(c.block_table))


# ---- refusals (each names the argument and the rule) -------------------------------------


def _table(c):
    return c.block_table.copy()


REFUSALS = {
    "table_dtype": (lambda c: {"block_table": c.block_table.astype(np.int64)},
                    r"block_table\.dtype must be int32, got int64"),
    "table_rank": (lambda c: {"block_table": c.block_table.ravel()},
                   r"block_table must be int32 \[batch, max_num_blocks_per_seq\], got shape"),
    "table_batch": (lambda c: {"block_table": c.block_table[:-1]},
                    r"block_table\.shape\[0\] \(batch\) must be len\(cu_seqlens_q\) - 1 = 5, "
                    r"got 4"),
    "k_rank": (lambda c: {"k": c.k}, r"k must be a paged cache \[num_blocks, page_size"),
    "v_pages": (lambda c: {"v": c.v_cache[:, :8]}, r"v\.shape\[:3\] must equal k\.shape\[:3\]"),
    "page_size_0": (lambda c: {"k": c.k_cache[:, :0], "v": c.v_cache[:, :0]},
                    r"k\.shape\[1\] \(page_size\) must be >= 1, got 0"),
    "cu_k_dtype": (lambda c: {"cu_seqlens_k": c.cu_k.astype(np.int64)},
                   r"cu_seqlens_k\.dtype must be int32, got int64"),
    "cu_k_length": (lambda c: {"cu_seqlens_k": c.cu_k[:-1]},
                    r"cu_seqlens_k must have batch \+ 1 = 6 entries"),
    "cu_k_first": (lambda c: {"cu_seqlens_k": c.cu_k + np.int32(1)},
                   r"cu_seqlens_k\[0\] must be 0, got 1"),
    "cu_k_decreasing": (lambda c: {"cu_seqlens_k": np.array([0, 37, 30, 337, 353, 354],
                                                            dtype=np.int32)},
                        r"cu_seqlens_k must be non-decreasing: \[2\] = 30 < \[1\] = 37"),
    "too_few_pages": (lambda c: {"block_table": c.block_table[:, :3]},
                      r"block_table: sequence 2 has 300 keys, which need 19 pages of page_size "
                      r"16, but block_table\.shape\[1\] is 3"),
}


def _with(table, index, value):
    table[index] = value
    return table


REFUSALS["page_negative"] = (lambda c: {"block_table": _with(_table(c), (2, 18), -3)},
                             r"block_table\[2\]\[18\] = -3 is out of range: page indices must "
                             r"be in \[0, num_blocks = 27\)")
REFUSALS["page_past_pool"] = (lambda c: {"block_table": _with(_table(c), (0, 1), 27)},
                              r"block_table\[0\]\[1\] = 27 is out of range")


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals(rng, name):
    c = Case(rng, page_size=16)
    change, message = REFUSALS[name]
    args = {"q": c.q, "k": c.k_cache, "v": c.v_cache, "cu_seqlens_q": c.cu_q,
            "cu_seqlens_k": c.cu_k, "max_seqlen_q": c.max_q, "max_seqlen_k": c.max_k,
            "block_table": c.block_table}
    args.update(change(c))
    with pytest.raises(ValueError, match=message):
        varlen(**args)


def test_entries_past_the_last_used_page_are_not_read(rng):
    c = Case(rng, page_size=16)
    assert (c.block_table == -1).any()  # the Case pads each row with -1
    c.block_table[c.block_table == -1] = 10**6
    assert np.array_equal(c.paged(), c.contiguous())
