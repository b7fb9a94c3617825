"""A user's script with type annotations, checked with `mypy --strict` against the installed
package (CI does) and run by tests/python/test_package.py: every public function once, on
small NumPy CPU arrays, with the result types a typed caller relies on."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

import flashlab


def arrays(*shape: int) -> Any:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def main() -> Dict[str, Tuple[int, ...]]:
    b, s, h, d = 2, 16, 2, 32
    q, k, v = arrays(b, s, h, d), arrays(b, s, h, d), arrays(b, s, h, d)
    shapes: Dict[str, Tuple[int, ...]] = {}

    out = flashlab.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), softcap=30.0)
    shapes["flash_attn_func"] = tuple(out.shape)
    out, lse, probs = flashlab.flash_attn_func(q, k, v, return_attn_probs=True, kernel="cpu_flash")
    assert probs is None
    shapes["softmax_lse"] = tuple(lse.shape)
    dq, dk, dv = flashlab.attention_backward(q, k, v, out, arrays(b, s, h, d), lse)
    shapes["dq"] = tuple(dq.shape)

    qkv = arrays(b, s, 3, h, d)
    shapes["qkvpacked"] = tuple(flashlab.flash_attn_qkvpacked_func(qkv, causal=True).shape)
    kv = arrays(b, s, 2, h, d)
    shapes["kvpacked"] = tuple(flashlab.flash_attn_kvpacked_func(q, kv).shape)

    cu = np.array([0, 5, 16], dtype=np.int32)
    flat = q.reshape(b * s, h, d)
    shapes["varlen"] = tuple(
        flashlab.flash_attn_varlen_func(flat, flat, flat, cu, cu, 11, 11, causal=True).shape)
    shapes["varlen_qkvpacked"] = tuple(flashlab.flash_attn_varlen_qkvpacked_func(
        qkv.reshape(b * s, 3, h, d), cu, 11).shape)
    shapes["varlen_kvpacked"] = tuple(flashlab.flash_attn_varlen_kvpacked_func(
        flat, kv.reshape(b * s, 2, h, d), cu, cu, 11, 11).shape)

    sdpa = flashlab.scaled_dot_product_attention(q.swapaxes(1, 2), k.swapaxes(1, 2),
                                                 v.swapaxes(1, 2), is_causal=True)
    shapes["sdpa"] = tuple(sdpa.shape)

    cos, sin = np.cos(arrays(2 * s, d // 2)), np.sin(arrays(2 * s, d // 2))
    shapes["rotary"] = tuple(flashlab.apply_rotary_emb(q, cos, sin, seqlen_offsets=3).shape)

    k_cache, v_cache = arrays(b, 2 * s, h, d), arrays(b, 2 * s, h, d)
    cache_seqlens = np.array([3, 7], dtype=np.int32)
    decoded = flashlab.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, k[:, :1], v[:, :1],
                                               cache_seqlens=cache_seqlens, causal=True)
    shapes["kvcache"] = tuple(decoded.shape)

    names: List[str] = [str(kernel["name"]) for kernel in flashlab.kernels()]
    assert "cpu_flash" in names and isinstance(flashlab.cuda_available(), bool)
    assert flashlab.__version__.count(".") == 2
    return shapes


if __name__ == "__main__":
    for name, shape in main().items():
        print(f"{name}: {shape}")
