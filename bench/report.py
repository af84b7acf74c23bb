#!/usr/bin/env python3
"""Turns benchmark JSON (tokenrace-bench --json, bench/compare.py --json) into the markdown
tables and the plot of docs/performance.md.

  python3 bench/report.py --bench bench/out/local-f32.json [--bench more.json ...]
                          [--compare bench/out/compare-16.json ...] [--plot docs/performance.png]
"""
import argparse
import json
from collections import defaultdict


def load_lines(path):
    with open(path) as f:
        text = f.read().strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def bench_table(records):
    out = ["| path | dtype | profile | rows | vocab | threads | placement | us/call | us/row | floor us/row | ratio to floor |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        out.append(f"| {r['path']} | {r['dtype']} | {r['profile']} | {r['rows']} | {r['vocab']} | {r['threads']} | "
                   f"{r['placement']} | {r['us_per_call_median']:.1f} | {r['us_per_row']:.2f} | "
                   f"{r['floor_us_per_call'] / r['rows']:.2f} | {r['ratio_to_floor']:.2f} |")
    return "\n".join(out)


def compare_table(records):
    out = ["| path | rows | threads | us/call | us/row | tokenrace us/call | peer / tokenrace |",
           "|---|---|---|---|---|---|---|"]
    for r in records:
        out.append(f"| {r['path']} | {r['rows']} | {r['threads']} | {r['us_per_call']:.1f} | {r['us_per_row']:.2f} | "
                   f"{r['tokenrace_us_per_call']:.1f} | {r['ratio']:.1f} |")
    return "\n".join(out)


def plot(bench, compare, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    series = defaultdict(list)
    floors = defaultdict(list)
    for r in bench:
        if (r["dtype"], r["placement"], r["threads"], r["profile"], r["vocab"]) == ("f32", "hot", 1, "peaked", 163840):
            series[r["path"]].append((r["rows"], r["us_per_row"]))
            floors["read floor" if not r["path"].startswith(("race-external", "race-pool")) else "two-stream floor"].append(
                (r["rows"], r["floor_us_per_call"] / r["rows"]))
    ax = axes[0]
    for name, pts in sorted(series.items()):
        pts = sorted(set(pts))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    for name, pts in floors.items():
        pts = sorted(dict(pts).items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--" if name == "read floor" else "k:", label=name)
    where = next((f"{r.get('simd', '?')}, commit {r.get('commit', '?')}" for r in bench), "")
    ax.set(xscale="log", yscale="log", xlabel="rows", ylabel="us per row",
           title=f"tokenrace, 1 thread, f32, vocab 163840, peaked, hot ({where})")
    ax.legend(fontsize=7)
    ax = axes[1]
    by = defaultdict(list)
    for r in compare:
        by[(r["path"], r["threads"])].append((r["rows"], r["us_per_row"]))
    # One colour per path, one line style per thread count (more series than a colour cycle).
    names = sorted({name for name, _ in by})
    colour = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    for (name, t), pts in sorted(by.items()):
        pts = sorted(pts)
        style = "-" if t == 1 else "--"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=colour[name], label=f"{name} ({t} thr)")
    ax.set(xscale="log", yscale="log", xlabel="rows", ylabel="us per row", title="tokenrace vs NumPy and torch (16-core host)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="append", default=[])
    ap.add_argument("--compare", action="append", default=[])
    ap.add_argument("--plot")
    a = ap.parse_args()
    bench = [r for p in a.bench for r in load_lines(p)]
    compare = [r for p in a.compare for r in load_lines(p)]
    if bench:
        print(bench_table(bench))
        print()
    if compare:
        print(compare_table(compare))
    if a.plot:
        plot(bench, compare, a.plot)


if __name__ == "__main__":
    main()
