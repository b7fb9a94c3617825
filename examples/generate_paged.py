"""A toy generation loop on a paged KV cache, through flashlab.flash_attn_with_kvcache.

The "model" is one attention layer with random weights: token embeddings, q/k/v projections
(GQA: fewer key/value heads than query heads), an output projection back to the vocabulary,
and greedy decoding. Each sequence gets pages of a shared pool as it grows, from a free list
(shuffled, so a sequence's pages lie anywhere in the pool), and its block-table row names
them in order:

  1. prefill: each prompt (their lengths differ) is appended to its sequence's pages and
     attended to causally, one flash_attn_with_kvcache call per sequence (k/v = the prompt's
     keys and values, cache_seqlens = 0);
  2. decode: every step appends one token per sequence (k/v of shape [batch, 1, ...]) at
     cache_seqlens[b] and attends to the whole cache, one call for the batch; a sequence that
     fills its last page first takes a new one from the free list.

It prints prefill and decode tokens per second, then checks the last step: each sequence's
cache is gathered through its block table in NumPy, its last row must be what the step
appended, and dense attention in float64 over it must give the same output (tolerance: 1e-4
in fp32 on the CPU, 2e-2 in bf16 on CUDA).

    python3 examples/generate_paged.py                 # CUDA when torch sees a GPU, else the CPU
    python3 examples/generate_paged.py --device cpu --backend numpy --steps 16

Needs the flashlab package (pip install ., or scripts/py-build.sh and PYTHONPATH) and NumPy;
torch for --backend torch and for CUDA. CUDA runs cute_fa2's split-KV kernel (head dims 64 to
256, fp16/bf16); the CPU composes forward() per sequence.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import flashlab


class Backend:
    """The few array operations the loop needs, in NumPy (CPU) or torch (CPU or CUDA)."""

    def __init__(self, name: str, device: str):
        self.name, self.device = name, device
        if name == "torch":
            import torch

            self.torch = torch
            self.dtype = torch.bfloat16 if device == "cuda" else torch.float32
        else:
            self.dtype = np.float32

    def array(self, x: np.ndarray, dtype=None):
        """A NumPy array on this backend (floats in the model's dtype, ints as given)."""
        if self.name == "numpy":
            return np.ascontiguousarray(x if dtype is None else x.astype(dtype))
        t = self.torch.from_numpy(np.ascontiguousarray(x))
        return t.to(device=self.device, dtype=self.dtype if x.dtype.kind == "f" else None)

    def zeros(self, shape):
        if self.name == "numpy":
            return np.zeros(shape, self.dtype)
        return self.torch.zeros(shape, dtype=self.dtype, device=self.device)

    def numpy(self, x) -> np.ndarray:
        return x if self.name == "numpy" else x.float().cpu().numpy()

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()


class PagedCache:
    """A pool of pages [num_pages, page_size, heads_kv, head_dim] for K and for V, a free list,
    and each sequence's block-table row and length."""

    def __init__(self, be: Backend, batch: int, num_pages: int, page_size: int, heads_kv: int,
                 head_dim: int, max_pages: int, rng: np.random.Generator):
        self.be, self.page_size = be, page_size
        self.k = be.zeros((num_pages, page_size, heads_kv, head_dim))
        self.v = be.zeros((num_pages, page_size, heads_kv, head_dim))
        self.free = list(rng.permutation(num_pages))
        self.table = np.zeros((batch, max_pages), np.int32)  # host copy; unused entries 0
        self.pages = [0] * batch
        self.lengths = np.zeros(batch, np.int32)

    def reserve(self, b: int, rows: int) -> None:
        """Pages for `rows` more rows of sequence b, taken from the free list."""
        need = -(-(int(self.lengths[b]) + rows) // self.page_size)
        while self.pages[b] < need:
            if not self.free:
                raise RuntimeError("the page pool is exhausted")
            self.table[b, self.pages[b]] = self.free.pop()
            self.pages[b] += 1

    def gathered(self, b: int):
        """Sequence b's rows [0, length) of K and V in order, as NumPy [length, Hkv, D]."""
        rows = int(self.lengths[b])
        pages = self.table[b, :self.pages[b]]
        k, v = (self.be.numpy(c)[pages].reshape(-1, *c.shape[2:])[:rows] for c in (self.k, self.v))
        return k, v


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Dense attention of one query row per head against all keys, float64: q [Hq, D],
    k/v [L, Hkv, D] -> [Hq, D]."""
    group = q.shape[0] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    s = np.einsum("hd,lhd->hl", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hl,lhd->hd", p / p.sum(-1, keepdims=True), v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto",
                    help="arrays: torch when importable (CUDA needs it), else NumPy")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=48, help="longest prompt; others are shorter")
    ap.add_argument("--steps", type=int, default=32, help="decode steps (tokens per sequence)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    name = args.backend if args.backend != "auto" else ("torch" if has_torch else "numpy")
    cuda = has_torch and name == "torch" and torch.cuda.is_available() and flashlab.cuda_available()
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and cuda) else "cpu"
    if device == "cuda" and (name != "torch" or not cuda):
        raise SystemExit("--device cuda needs torch with a CUDA device and a CUDA build of flashlab")
    be = Backend(name, device)

    rng = np.random.default_rng(args.seed)
    hq, hkv, d, batch = args.heads, args.heads_kv, args.head_dim, args.batch
    width = hq * d
    emb = be.array(rng.standard_normal((args.vocab, width)).astype(np.float32))
    wq, wk, wv = (be.array((rng.standard_normal((width, h * d)) / np.sqrt(width)).astype(np.float32))
                  for h in (hq, hkv, hkv))
    wo = be.array((rng.standard_normal((hq * d, args.vocab)) / np.sqrt(width)).astype(np.float32))

    def project(tokens):
        """tokens [B, S] -> q [B, S, Hq, D], k and v [B, S, Hkv, D]."""
        x = emb[tokens]
        b, s = tokens.shape
        return ((x @ wq).reshape(b, s, hq, d), (x @ wk).reshape(b, s, hkv, d),
                (x @ wv).reshape(b, s, hkv, d))

    def next_token(out):
        """out [B, 1, Hq, D] -> the greedy next token [B, 1]."""
        return (out.reshape(out.shape[0], -1) @ wo).argmax(-1).reshape(-1, 1)

    max_len = args.prompt + args.steps
    max_pages = -(-max_len // args.page_size)
    cache = PagedCache(be, batch, batch * max_pages, args.page_size, hkv, d, max_pages, rng)
    lengths = [max(1, args.prompt - 7 * b) for b in range(batch)]
    prompts = [rng.integers(0, args.vocab, (1, n)) for n in lengths]

    # Prefill: one call per sequence, its prompt appended at row 0, attended causally.
    be.sync()
    t0 = time.perf_counter()
    tokens = []
    for b, prompt in enumerate(prompts):
        cache.reserve(b, prompt.shape[1])
        q, k, v = project(be.array(prompt))
        out = flashlab.flash_attn_with_kvcache(
            q, cache.k, cache.v, k=k, v=v, cache_seqlens=be.array(np.zeros(1, np.int32)),
            block_table=be.array(cache.table[b:b + 1]), causal=True)
        cache.lengths[b] += prompt.shape[1]
        tokens.append(next_token(out[:, -1:]))
    tokens = be.torch.cat(tokens) if be.name == "torch" else np.concatenate(tokens)
    be.sync()
    prefill_s = time.perf_counter() - t0

    # Decode: one token per sequence per step, appended through the block table.
    t0 = time.perf_counter()
    for _ in range(args.steps):
        for b in range(batch):
            cache.reserve(b, 1)
        q, k, v = project(tokens)
        out = flashlab.flash_attn_with_kvcache(
            q, cache.k, cache.v, k=k, v=v, cache_seqlens=be.array(cache.lengths),
            block_table=be.array(cache.table))
        cache.lengths += 1
        tokens = next_token(out)
    be.sync()
    decode_s = time.perf_counter() - t0

    print(f"{device} ({be.name}, {'bf16' if device == 'cuda' else 'fp32'}): batch {batch}, "
          f"heads {hq}/{hkv}, head dim {d}, pages of {args.page_size} rows "
          f"({sum(cache.pages)} of {batch * max_pages} in use)")
    print(f"prefill: {sum(lengths)} tokens in {prefill_s * 1e3:.1f} ms "
          f"({sum(lengths) / prefill_s:.0f} tokens/s)")
    print(f"decode:  {args.steps} steps x {batch} sequences in {decode_s * 1e3:.1f} ms "
          f"({args.steps * batch / decode_s:.0f} tokens/s, {decode_s / args.steps * 1e3:.2f} ms/step)")

    # The last step against dense attention over each sequence's gathered cache, whose last
    # row must be the key and value that step appended.
    q_last, out_last, k_last, v_last = (be.numpy(x) for x in (q, out, k, v))
    err, appended = 0.0, True
    for b in range(batch):
        kb, vb = cache.gathered(b)
        appended &= bool((kb[-1] == k_last[b, 0]).all() and (vb[-1] == v_last[b, 0]).all())
        err = max(err, float(np.abs(attention_reference(q_last[b, 0], kb, vb) - out_last[b, 0]).max()))
    tol = 2e-2 if device == "cuda" else 1e-4
    ok = err <= tol and appended
    if not appended:
        print("check: a sequence's last cache row is not the key/value its last step appended")
    print(f"check: last step vs dense attention over the gathered cache (NumPy, float64): "
          f"max abs error {err:.1e} (tolerance {tol:g}) {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
