"""flashlab.apply_rotary_emb against a reference written another way: each rotated pair as a
complex number multiplied by e^(iθ), position by position in plain loops (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from flashlab import apply_rotary_emb


def _angles(rng, seqlen_ro, half):
    theta = rng.uniform(-np.pi, np.pi, size=(seqlen_ro, half))
    return np.cos(theta), np.sin(theta), theta


def _rotate_row(v, theta_row, interleaved):
    """One token's vector, its first 2·len(theta_row) channels turned as complex numbers."""
    v = v.astype(np.float64).copy()
    half = theta_row.shape[0]
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        z = complex(v[a], v[b]) * np.exp(1j * theta_row[i])
        v[a], v[b] = z.real, z.imag
    return v


def _reference(x, theta, interleaved, positions):
    """x [..., heads, dim] with positions of the same leading shape."""
    out = np.empty(x.shape, dtype=np.float64)
    for idx in np.ndindex(*positions.shape):
        for h in range(x.shape[-2]):
            out[idx + (h,)] = _rotate_row(x[idx + (h,)], theta[positions[idx]], interleaved)
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 4])
@pytest.mark.parametrize("offsets", ["zero", "int", "per_batch"])
def test_padded_matches_the_complex_reference(rng, interleaved, rotary_dim, offsets):
    batch, seqlen, heads, dim = 2, 5, 3, 8
    x = rng.standard_normal((batch, seqlen, heads, dim))
    cos, sin, theta = _angles(rng, 12, rotary_dim // 2)
    off = {"zero": 0, "int": 3, "per_batch": np.array([0, 7])}[offsets]
    pos = np.arange(seqlen)[None, :] + np.reshape(off, (-1, 1))
    pos = np.broadcast_to(pos, (batch, seqlen))
    got = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=off)
    want = _reference(x, theta, interleaved, pos)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_varlen_positions_restart_per_sequence(rng, interleaved):
    lens, heads, dim = [3, 0, 4], 2, 6
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = rng.standard_normal((int(cu[-1]), heads, dim))
    cos, sin, theta = _angles(rng, 9, 3)
    off = np.array([2, 5, 1])
    pos = np.concatenate([off[b] + np.arange(n) for b, n in enumerate(lens)])
    got = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=off, cu_seqlens=cu)
    np.testing.assert_allclose(got, _reference(x, theta, interleaved, pos), rtol=0, atol=1e-12)


def test_inplace_writes_x_and_fp32_rounds_once(rng):
    x = rng.standard_normal((1, 4, 2, 4)).astype(np.float32)
    cos, sin, theta = _angles(rng, 4, 2)
    want = _reference(x, theta, False, np.arange(4)[None, :]).astype(np.float32)
    out = apply_rotary_emb(x, cos.astype(np.float32), sin.astype(np.float32), inplace=True)
    assert out is x
    np.testing.assert_allclose(x, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seqlen_offsets": 9}, r"positions reach 12.*cos.shape\[0\] = 10"),
        ({"seqlen_offsets": np.array([0, 1, 2])}, r"seqlen_offsets must be an int or \[batch\]"),
    ],
)
def test_refusals_name_the_argument(rng, kwargs, message):
    x = rng.standard_normal((2, 4, 1, 4))
    cos, sin, _ = _angles(rng, 10, 2)
    with pytest.raises(ValueError, match=message):
        apply_rotary_emb(x, cos, sin, **kwargs)


def test_shape_refusals(rng):
    x = rng.standard_normal((2, 4, 1, 4))
    cos, sin, _ = _angles(rng, 10, 3)  # rotary_dim 6 > head_dim 4
    with pytest.raises(ValueError, match=r"rotary_dim = 2 \* cos.shape\[1\] = 6"):
        apply_rotary_emb(x, cos, sin)
    with pytest.raises(ValueError, match=r"x must be \[total, heads, head_dim\]"):
        apply_rotary_emb(x, cos[:, :2], sin[:, :2], cu_seqlens=np.array([0, 4], np.int32))


def test_torch_gradient_is_the_inverse_rotation(rng):
    torch = pytest.importorskip("torch")
    x = torch.tensor(rng.standard_normal((2, 3, 2, 8)), requires_grad=True)
    cos, sin, _ = _angles(rng, 6, 4)
    cos_t, sin_t = torch.tensor(cos), torch.tensor(sin)
    g = torch.tensor(rng.standard_normal((2, 3, 2, 8)))
    for interleaved in (False, True):
        x.grad = None
        out = apply_rotary_emb(x, cos_t, sin_t, interleaved=interleaved, seqlen_offsets=2)
        np.testing.assert_allclose(
            out.detach().numpy(),
            apply_rotary_emb(x.detach().numpy(), cos, sin, interleaved=interleaved,
                             seqlen_offsets=2), rtol=0, atol=1e-12)
        (out * g).sum().backward()
        # A rotation's transpose is the rotation by -θ.
        back = apply_rotary_emb(g.numpy(), cos, -sin, interleaved=interleaved, seqlen_offsets=2)
        np.testing.assert_allclose(x.grad.numpy(), back, rtol=0, atol=1e-12)
