"""The tables, files and plots of `python -m flashlab.bench` (flashlab.bench runs the sweep;
this module writes what it measured): a markdown table per pass with FlashLab-over-peer ratio
columns (decode: GB/s of K+V read; an entry captured in a CUDA graph, name@graph, is compared
with peers captured alike), bench.csv and bench.json with one record per entry (its
direction fwd, bwd or train), and plots/{fwd,bwd,train}.png."""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import Dict, List, Optional

RATIO_PEERS = ("sdpa_flash", "sdpa_cudnn", "fa4", "sdpa_cpu")  # the ratio columns' denominators
DIRECTIONS = {"fwd": "forward", "bwd": "backward", "train": "training step (forward + backward)"}


def direction(p) -> str:
    """The pass a problem times: "fwd", "bwd" or "train" (a decode problem's is "fwd")."""
    return "train" if p.train else "bwd" if p.backward else "fwd"


def _fmt(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _cell(r: Optional[Result], notes: Dict[str, int]) -> str:
    if r is None:
        return ""
    if r.status in ("ok", "unchecked"):
        return _fmt(r.value())
    key = f"{r.impl}: {r.row.reason}"
    notes.setdefault(key, len(notes) + 1)
    mark = {"FAIL": "FAIL", "error": "error"}.get(r.status, "-")
    return f"{mark}<sup>{notes[key]}</sup>"


def _label(p) -> str:
    if p.lengths:  # "varlen(9 docs, 16384 tokens, max 3977)x16x128", the dtype left to the header
        return p.shape.rsplit(" ", 1)[0]
    heads = f"{p.heads_q}" if p.heads_q == p.heads_kv else f"{p.heads_q}/{p.heads_kv}"
    seq = f"{p.seqlen_q}" if p.seqlen_q == p.seqlen_k else f"{p.seqlen_q}x{p.seqlen_k}"
    cache = (f" paged({p.page_size})" if p.page_size else "") + \
        (f" append({p.seqlen_new})" if p.seqlen_new else "") if p.decode else ""
    return f"{p.batch}x{seq}x{heads}x{p.head_dim}{cache}"


def _base(impl: str) -> str:
    return impl.split("@")[0]


def markdown(results: List[Result], header: str) -> str:
    lines = [header, ""]
    notes: Dict[str, int] = {}
    groups: Dict[tuple, List[Result]] = {}
    for r in results:
        groups.setdefault((direction(r.problem), r.decode), []).append(r)
    for (pass_, decode), rs in groups.items():
        impls = list(dict.fromkeys(r.impl for r in rs))
        ours = [i for i in impls if _base(i).startswith("flashlab:") or i == "triton_fa2"]
        peers = sorted((i for i in impls if _base(i) in RATIO_PEERS),
                       key=lambda i: RATIO_PEERS.index(_base(i)))
        unit = "GB/s of K+V read" if decode else "TFLOP/s"
        lines += [f"### {'decode ' if decode else ''}{DIRECTIONS[pass_]} ({unit})", ""]
        ratios = [(o, q) for o in ours for q in peers if o.endswith("@graph") == q.endswith("@graph")]
        short = lambda i: i.replace("flashlab:", "").replace("sdpa_", "") if i != "sdpa_cpu" else i  # noqa: E731
        head = ["shape B x S x H x D", "causal"] + [i.replace("flashlab:", "") for i in impls] \
            + [f"{short(o)}/{short(q)}" for o, q in ratios]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows: Dict[tuple, Dict[str, Result]] = {}
        for r in rs:
            p = r.problem
            rows.setdefault((p.head_dim, p.seqlen_k, p.causal, _label(p)), {})[r.impl] = r
        for (_, _, causal, label), by in sorted(rows.items(), key=lambda kv: kv[0][:3]):
            cells = [label, "yes" if causal else "no"] + [_cell(by.get(i), notes) for i in impls]
            for o, q in ratios:
                a, b = by.get(o), by.get(q)
                ok = a and b and a.value() == a.value() and b.value() == b.value()
                cells.append(f"{a.value() / b.value():.2f}x" if ok else "")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if notes:
        lines += ["Notes:", ""] + [f"{n}. {key}" for key, n in notes.items()] + [""]
    return "\n".join(lines)


def records(results: List[Result]) -> List[dict]:
    out = []
    for r in results:
        p, row = r.problem, r.row
        rec = {k: getattr(p, k) for k in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv",
                                          "head_dim", "head_dim_v", "causal", "dtype")}
        rec.update(direction=direction(p), decode=r.decode, impl=r.impl,
                   status=row.status, reason=row.reason, ms=row.time_ms, runs=row.timed_runs,
                   rounds=len(row.round_ms), flops=row.flops,
                   tflops=row.tflops if r.value() == r.value() else None,
                   page_size=p.page_size, seqlen_new=p.seqlen_new, lengths=list(p.lengths),
                   gbps=r.value() if r.decode and r.value() == r.value() else None,
                   **{f"err_{n}": e for n, e in row.errors.items()})
        out.append(rec)
    return out


def write_outputs(results: List[Result], header: str, args) -> str:
    table = markdown(results, header)
    paths = {"md": None, "csv": args.csv, "json": args.json, "plots": args.plots}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for key, name in (("md", "bench.md"), ("csv", "bench.csv"), ("json", "bench.json"),
                          ("plots", "plots")):
            paths[key] = paths[key] or os.path.join(args.out, name)
    recs = records(results)
    if paths["md"]:
        with open(paths["md"], "w") as f:
            f.write(table + "\n")
    if paths["csv"]:
        with open(paths["csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for rec in recs for k in rec)))
            w.writeheader()
            w.writerows(recs)
    if paths["json"]:
        with open(paths["json"], "w") as f:
            json.dump({"header": header, "results": recs}, f, indent=1)
    line = plot(results, paths["plots"])
    if line:
        print(line, file=sys.stderr)
    return table


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def plot(results: List[Result], folder: Optional[str]) -> str:
    """One PNG per pass that has two or more seqlens: a panel per (causal, head dim), TFLOP/s
    against seqlen, one line per implementation (FlashLab and Triton solid, peers dashed).
    Returns one line for the user: the PNGs written, or why none was ("" without results)."""
    if not results:
        return ""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plots: matplotlib is not installed; no PNG written"
    if not folder:
        return "plots: no PNG written (--out or --plots names the folder)"
    said = []  # a path written, or why a pass has no PNG
    for name, title in DIRECTIONS.items():
        rs = [r for r in results if direction(r.problem) == name and not r.decode]
        seqlens = sorted({r.problem.seqlen_k for r in rs})
        if len(seqlens) < 2:
            if rs:
                said.append(f"no {name}.png (one seqlen; a plot needs two or more, --seqlens)")
            continue
        hdims = sorted({r.problem.head_dim for r in rs})
        causals = sorted({r.problem.causal for r in rs})
        impls = list(dict.fromkeys(r.impl for r in rs))
        tokens = {r.problem.batch * r.problem.seqlen_k for r in rs}
        hidden = {r.problem.heads_q * r.problem.head_dim for r in rs}
        xlabel = f"seqlen (batch x seqlen = {_k(tokens.pop())} tokens)" if len(tokens) == 1 else "seqlen"
        fig, axes = plt.subplots(len(causals), len(hdims), squeeze=False,
                                 figsize=(4.2 * len(hdims), 3.4 * len(causals)))
        for row, causal in enumerate(causals):
            for col, d in enumerate(hdims):
                ax = axes[row][col]
                for n, impl in enumerate(impls):
                    pts = sorted((r.problem.seqlen_k, r.value()) for r in rs if r.impl == impl
                                 and r.problem.head_dim == d and r.problem.causal == causal
                                 and r.value() == r.value())
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], color=f"C{n % 10}",
                                marker="os^vD<>px*"[n % 10], label=impl.replace("flashlab:", ""),
                                linestyle="-" if impl.startswith(("flashlab:", "triton")) else "--")
                ax.set(xscale="log", ylim=(0, None), title=f"head dim {d}, "
                       f"{'causal' if causal else 'non-causal'}", xlabel=xlabel, ylabel="TFLOP/s")
                ax.minorticks_off()
                ax.set_xticks(seqlens, [_k(s) for s in seqlens])
                ax.grid(alpha=0.3)
        handles = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels())}
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
                   ncol=min(len(handles), 5), fontsize=8)
        shape = f", hidden {hidden.pop()}" if len(hidden) == 1 else ""
        fig.suptitle(f"FlashLab vs peers, {title} "
                     f"({rs[0].problem.dtype}{shape})", fontsize=11)
        fig.tight_layout(rect=(0, 0.09, 1, 1))
        os.makedirs(folder, exist_ok=True)
        said.append(os.path.join(folder, f"{name}.png"))
        fig.savefig(said[-1], dpi=110)
        plt.close(fig)
    return "plots: " + ("; ".join(said) or "no PNG written (decode rows are not plotted)")
