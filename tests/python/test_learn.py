"""The learning path: the NumPy teaching version, the worked example, the pages' twins, links.

NumPy only (no flashlab extension, no torch):
- examples/learn/attention_numpy.py: naive and tiled (FlashAttention-2) forward and backward
  against the fp64 oracle of reference.py, on shapes that cut blocks unevenly, with and
  without the bottom-right causal mask (rows that see no key included), and the backward
  against central finite differences as well;
- examples/learn/worked_example.py runs, and its output is a code block of
  docs/learn/theory.md and of docs/zh/learn/theory.md, verbatim;
- every docs/learn/**/*.md has a docs/zh/learn/ twin (same relative path) with the same
  heading levels in the same order and the same code blocks;
- every relative link in docs/ and README.md names an existing file (fragments stripped).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reference as ref

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "examples" / "learn"
sys.path.insert(0, str(LEARN))
import attention_numpy as an  # noqa: E402

# (sq, sk, d, dv, causal, block_m, block_n)
SHAPES = [
    (4, 4, 2, 2, False, 2, 2),
    (7, 5, 3, 4, False, 3, 2),
    (5, 9, 4, 3, True, 2, 4),     # sq < sk: every row sees keys
    (9, 4, 3, 3, True, 4, 3),     # sq > sk: rows 0-4 see no key (O = 0, LSE = -inf)
    (16, 16, 8, 8, True, 5, 3),
    (1, 6, 2, 2, True, 1, 4),
]


def _inputs(rng, sq, sk, d, dv):
    return (rng.standard_normal((sq, d)), rng.standard_normal((sk, d)),
            rng.standard_normal((sk, dv)), rng.standard_normal((sq, dv)))


def _oracle(q, k, v, do, causal):
    """reference.py's fp64 oracle on one head: (O, LSE, dq, dk, dv)."""
    four = lambda x: x[None, :, None, :]
    o, lse = ref.attention(four(q), four(k), four(v), causal=causal)
    dq, dk, dv = ref.attention_backward(four(q), four(k), four(v), four(do), causal=causal)
    return o[0, :, 0], lse[0, 0], dq[0, :, 0], dk[0, :, 0], dv[0, :, 0]


def _close(name, got, want, tol=1e-12):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{name}: -inf rows differ"
    fin = np.isfinite(want)
    err = np.max(np.abs(got[fin] - want[fin]), initial=0.0)
    assert err <= tol * max(1.0, np.max(np.abs(want[fin]), initial=0.0)), f"{name}: {err:.3g}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_the_oracle(rng, shape):
    sq, sk, d, dv, causal, bm, bn = shape
    q, k, v, do = _inputs(rng, sq, sk, d, dv)
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref = _oracle(q, k, v, do, causal)

    o, lse = an.naive_forward(q, k, v, causal=causal)
    _close("naive O", o, o_ref)
    _close("naive LSE", lse, lse_ref)
    o, lse = an.flash_forward(q, k, v, causal=causal, block_m=bm, block_n=bn)
    _close("flash O", o, o_ref)
    _close("flash LSE", lse, lse_ref)
    if causal and sq > sk:
        assert np.all(o[: sq - sk] == 0) and np.all(np.isneginf(lse[: sq - sk]))

    for name, grads in (
        ("naive", an.naive_backward(q, k, v, do, causal=causal)),
        ("flash", an.flash_backward(q, k, v, o, lse, do, causal=causal, block_m=bm,
                                    block_n=bn)),
    ):
        for g, want, what in zip(grads, (dq_ref, dk_ref, dv_ref), ("dq", "dk", "dv")):
            _close(f"{name} {what}", g, want)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_finite_differences(rng, causal):
    """d/dx of L = sum(O * dO) by central differences, independent of any hand-written
    gradient: the tiled backward must agree to the differences' own error (~1e-9)."""
    sq, sk, d, dv = 5, 6, 3, 2
    q, k, v, do = _inputs(rng, sq, sk, d, dv)
    o, lse = an.flash_forward(q, k, v, causal=causal, block_m=2, block_n=4)
    grads = an.flash_backward(q, k, v, o, lse, do, causal=causal, block_m=2, block_n=4)
    h = 1e-6
    for which, g in enumerate(grads):
        x = (q, k, v)[which]
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            val = []
            for sign in (1, -1):
                xs = [q.copy(), k.copy(), v.copy()]
                xs[which][idx] += sign * h
                val.append(np.sum(an.naive_forward(*xs, causal=causal)[0] * do))
            fd[idx] = (val[0] - val[1]) / (2 * h)
        _close("finite differences " + "qkv"[which], g, fd, tol=1e-7)


def test_online_softmax_survives_scores_that_overflow_exp(rng):
    """Scores of ~1e4 overflow exp() in fp64 unless the running max is subtracted."""
    q, k, v, _ = _inputs(rng, 6, 8, 4, 4)
    o, lse = an.flash_forward(q * 100, k * 100, v, block_m=3, block_n=3)
    o_ref, lse_ref, *_ = _oracle(q * 100, k * 100, v, np.zeros((6, 4)), False)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse))
    _close("O at large scores", o, o_ref, tol=1e-9)
    _close("LSE at large scores", lse, lse_ref, tol=1e-12)


# ---- the pages ----------------------------------------------------------------------------

FENCE = re.compile(r"^(```+|~~~+)")


def _parse(text):
    """(headings as [(level, line)], code blocks as [(info, body)], prose lines)."""
    headings, blocks, prose = [], [], []
    fence, info, body = None, "", []
    for line in text.splitlines():
        m = FENCE.match(line.lstrip())
        if fence is None and m:
            fence, info, body = m.group(1), line.lstrip()[len(m.group(1)):].strip(), []
        elif fence is not None and re.fullmatch(re.escape(fence[0]) + "{%d,}" % len(fence),
                                                line.strip()):
            blocks.append((info, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
            h = re.match(r"^(#{1,6})\s", line)
            if h:
                headings.append((len(h.group(1)), line))
    return headings, blocks, prose


def test_worked_example_output_is_on_the_page():
    run = subprocess.run([sys.executable, str(LEARN / "worked_example.py")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    printed = run.stdout.strip("\n")
    for page in ("docs/learn/theory.md", "docs/zh/learn/theory.md"):
        bodies = [b.strip("\n") for _, b in _parse((ROOT / page).read_text("utf-8"))[1]]
        if printed in bodies:
            continue
        first = printed.splitlines()[0]
        near = [b for b in bodies if b.startswith(first)]
        shown = near[0] if near else "(no code block starts with that line)"
        pytest.fail(f"{page}: worked_example.py printed\n{printed}\n\nthe page has\n{shown}")


def test_every_learn_page_has_a_chinese_twin():
    learn = ROOT / "docs" / "learn"
    pages = sorted(learn.rglob("*.md"))  # subfolders too (docs/learn/basics/)
    assert pages, "docs/learn/ holds no page"
    for en in pages:
        zh = ROOT / "docs" / "zh" / "learn" / en.relative_to(learn)
        assert zh.is_file(), f"{en.relative_to(ROOT)} has no twin {zh.relative_to(ROOT)}"
        h_en, c_en, _ = _parse(en.read_text("utf-8"))
        h_zh, c_zh, _ = _parse(zh.read_text("utf-8"))
        lv_en, lv_zh = [lv for lv, _ in h_en], [lv for lv, _ in h_zh]
        assert lv_en == lv_zh, (f"{en.name}: heading levels differ\n en {h_en}\n zh {h_zh}")
        assert len(c_en) == len(c_zh), f"{en.name}: {len(c_en)} code blocks against {len(c_zh)}"
        for n, (a, b) in enumerate(zip(c_en, c_zh)):
            assert a == b, f"{en.name}: code block {n + 1} differs\n--- en\n{a[1]}\n--- zh\n{b[1]}"


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _relative_links(path: Path):
    _, _, prose = _parse(path.read_text("utf-8"))
    for line in prose:
        line = re.sub(r"`[^`]*`", "", line)          # inline code is not a link
        for target in LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue                               # http:, https:, mailto:, in-page anchors
            yield target


def test_every_relative_link_in_the_docs_resolves():
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    broken = []
    for page in pages:
        for target in _relative_links(page):
            file = target.split("#", 1)[0]
            if not (page.parent / file).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)
