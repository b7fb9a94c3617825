"""The decode mode of `python -m flashlab.bench` (--decode): what its entries call besides the
native harness's own forward_kvcache rows. An input set of a decode problem holds the caches
k and v (paged: [num_pages, page_size, Hkv, D] with a block_table), cache_seqlens, and
k_new/v_new when each call appends; the harness checks every entry against a dense forward
on the keys and values the cache holds.

- dense_kv: those keys and values as [B, L, Hkv, D], gathered through the block table, the
  appended rows last: what a peer without a KV cache attends to.
- flashlab_runner: flashlab.flash_attn_with_kvcache, the Python call, on an input set; for an
  entry named <kernel>+rotary (--rotary) with rotary tables too. An entry named
  <kernel>+cached (every --append run) is the plain decode of the same keys: the new rows
  are written into the cache once, before the entry is checked or timed, and each call then
  attends to cache_seqlens + the new rows with nothing to append. The appending entries
  write the same rows on every call, so every entry reads the same cache and is checked
  against the same dense forward; an appending entry's time over this one's is what its
  append costs.
- identity_rotary: those tables: cos 1 and sin 0 over the cache's rows and head_dim / 2
  columns. The rotation leaves q and k as they are, so the entry's outputs are checked
  against the same dense forward as the others, while the kernels do the work of any
  angles (nothing in them depends on the tables' values).
- graphed: any entry captured once per input set in a CUDA graph and replayed per call, so
  that its time is the GPU's without Python's per-call overhead (--graphs). The replay
  keeps the entry's runner, and with it every tensor the graphs read, alive.
"""

from __future__ import annotations

from typing import Callable, Dict, List

Run = Callable[[int], Dict[str, object]]
ROTARY = "+rotary"  # a FlashLab entry that appends with rotary (--rotary)
CACHED = "+cached"  # a FlashLab entry that appends nothing, its new rows already cached (--append)


def dense_kv(p, s: Dict[str, object]) -> List[object]:
    """[K, V] of input set `s`, each [B, seqlen_k, Hkv, D] (copies when paged or appending)."""
    import torch

    kept = p.seqlen_k - p.seqlen_new
    out = []
    for cache_name, new_name in (("k", "k_new"), ("v", "v_new")):
        cache = s[cache_name]
        if p.page_size:
            pages = cache[s["block_table"].long()]  # [B, pages per sequence, page_size, Hkv, D]
            cache = pages.reshape(p.batch, -1, p.heads_kv, cache.shape[-1])
        x = cache[:, :kept]
        if p.seqlen_new:
            x = torch.cat([x, s[new_name]], 1)
        out.append(x)
    return out


def identity_rotary(s: Dict[str, object]) -> List[object]:
    """[cos, sin] for input set s: [rows, head_dim / 2] of 1 and 0 in q's dtype on q's
    device, rows those of a sequence's cache (max_pages · page_size when paged)."""
    import torch

    q, k = s["q"], s["k"]
    rows = k.shape[1] * (s["block_table"].shape[1] if "block_table" in s else 1)
    shape = (rows, q.shape[-1] // 2)
    return [torch.ones(shape, dtype=q.dtype, device=q.device),
            torch.zeros(shape, dtype=q.dtype, device=q.device)]


def flashlab_runner(kernel: str, p, sets: List[Dict[str, object]]) -> Run:
    """flashlab.flash_attn_with_kvcache on input set i, appending k_new/v_new when present;
    kernel "<name>+rotary" adds identity_rotary's tables (which need k_new), and
    "<name>+cached" appends the new rows once here and none per call."""
    import flashlab

    rotary, cached = kernel.endswith(ROTARY), kernel.endswith(CACHED)
    kernel = kernel[:-len(ROTARY)] if rotary else kernel[:-len(CACHED)] if cached else kernel
    if (rotary or cached) and not p.seqlen_new:
        raise ValueError(f"{ROTARY if rotary else CACHED} needs appended rows: the problem needs --append >= 1")
    tables = [identity_rotary(s) if rotary else [None, None] for s in sets]
    lens = [s["cache_seqlens"] for s in sets]
    if cached:
        for i, s in enumerate(sets):  # the rows every appending call writes, written once
            flashlab.flash_attn_with_kvcache(s["q"], s["k"], s["v"], k=s["k_new"], v=s["v_new"],
                                             cache_seqlens=lens[i], block_table=s.get("block_table"),
                                             causal=p.causal, kernel=kernel)
        lens = [n + p.seqlen_new for n in lens]

    def run(i: int) -> Dict[str, object]:
        s = sets[i]
        new = {} if cached else {"k": s.get("k_new"), "v": s.get("v_new")}
        out = flashlab.flash_attn_with_kvcache(
            s["q"], s["k"], s["v"], **new,
            rotary_cos=tables[i][0], rotary_sin=tables[i][1], cache_seqlens=lens[i],
            block_table=s.get("block_table"), causal=p.causal, kernel=kernel)
        return {"out": out}
    return run


def graphed(run: Run, set_count: int) -> Run:
    """`run` captured in one CUDA graph per input set (after an uncaptured call, which loads
    modules and allocates); the returned run(i) replays set i's graph on the current stream
    and returns the outputs that graph writes."""
    import torch

    graphs, outputs = [], []
    for i in range(set_count):
        run(i)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outputs.append(run(i))
        graphs.append(g)

    def replay(i: int) -> Dict[str, object]:
        graphs[i].replay()
        return outputs[i]
    # A graph holds raw pointers to what `run` allocated outside it (a rotary entry's
    # tables): keeping `run` keeps them. Freed, their memory goes back to torch's allocator,
    # and a later replay reads whatever holds it then, or faults once it is returned to the
    # driver (measured: an illegal address on the second 64k problem of one sweep).
    replay.run = run  # type: ignore[attr-defined]
    return replay
