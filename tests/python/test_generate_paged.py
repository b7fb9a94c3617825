"""examples/generate_paged.py, the toy generation loop on a paged KV cache: a tiny run on the
CPU with each array backend must print its tokens per second and pass its own check (the
last step against dense attention over the cache gathered through the block table)."""

from __future__ import annotations

import importlib.util
import pathlib
import runpy

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate_paged.py"


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_paged_generation_loop_runs_and_checks(backend, capsys):
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    main = runpy.run_path(str(EXAMPLE))["main"]
    rc = main(["--device", "cpu", "--backend", backend, "--batch", "3", "--prompt", "21",
               "--steps", "12", "--page-size", "8", "--heads", "4", "--heads-kv", "2",
               "--head-dim", "16", "--vocab", "64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "decode:  12 steps x 3 sequences" in out and "tokens/s" in out
    # Prompts of 21, 14 and 7 tokens plus 12 decoded: ceil(33/8) + ceil(26/8) + ceil(19/8) pages.
    assert "(12 of 15 in use)" in out
    assert out.rstrip().endswith("ok")
