#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Puts this library's and transformers' exact-match results side by side (same prompts, same
settings, different random streams), prints the table, checks the targets (>= 90% per task with
the default sampler; this library within 2 points of transformers) and draws quality.svg.

    python3 benchmarks/quality/compare.py [--ours benchmarks/quality/dgemma_results.json]
        [--theirs benchmarks/quality/transformers_results.json] [--svg benchmarks/quality/quality.svg]
        [--exact benchmarks/quality/exact]

With --exact (a directory holding dgemma_results.json and seeds/dgemma_seed*.json of the exact
precision), it also puts the default (fast) precision next to the exact one, per task, over all
seeds, and checks the 1-point target that lets fast be the default.
"""
import argparse
import json
import os

here = os.path.dirname(os.path.abspath(__file__))


def by_steps(results):
    return {s["max_denoising_steps"]: s for s in results["settings"]}


def svg(ours, theirs, tasks, path):
    steps = sorted(ours)
    w, h, pad = 160 * len(tasks) + 60, 260, 40
    colors = {"ours": "#1f77b4", "transformers": "#ff7f0e"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w/2}" y="16" text-anchor="middle">exact match vs max denoising steps (x: {", ".join(map(str, steps))})</text>']
    for ti, task in enumerate(tasks):
        x0 = 40 + ti * 160
        out.append(f'<rect x="{x0}" y="{pad}" width="140" height="{h-2*pad}" fill="none" stroke="#ccc"/>')
        out.append(f'<text x="{x0+70}" y="{h-pad+16}" text-anchor="middle">{task}</text>')
        for name, res in (("ours", ours), ("transformers", theirs)):
            pts = []
            for i, s in enumerate(steps):
                if s not in res or task not in res[s]["tasks"]:
                    continue
                v = res[s]["tasks"][task]["exact_match"]
                pts.append(f"{x0 + 10 + i * 120 / max(1, len(steps) - 1):.1f},{h - pad - v * (h - 2 * pad):.1f}")
            if pts:
                out.append(f'<polyline fill="none" stroke="{colors[name]}" stroke-width="2" points="{" ".join(pts)}"/>')
    out.append(f'<text x="10" y="{pad+4}">1.0</text><text x="10" y="{h-pad}">0</text>')
    for i, (name, c) in enumerate(colors.items()):
        out.append(f'<rect x="{40+i*150}" y="{h-14}" width="10" height="10" fill="{c}"/><text x="{54+i*150}" y="{h-5}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def seed_means(seeds_dir, ours_default, theirs_default, tasks):
    """Prints the per-task mean exact match over seed 0 and the seed files; returns the worst gap."""
    import glob
    if not os.path.isdir(seeds_dir) or ours_default is None or theirs_default is None:
        return None
    runs = {"ours": [ours_default], "transformers": [theirs_default]}
    for side, prefix in (("ours", "dgemma_seed"), ("transformers", "transformers_seed")):
        for f in sorted(glob.glob(os.path.join(seeds_dir, prefix + "*.json"))):
            runs[side] += [r for r in json.load(open(f))["settings"]
                           if r["max_denoising_steps"] == ours_default["max_denoising_steps"]]
    print(f"\nmean over seeds, default setting ({len(runs['ours'])} runs ours, {len(runs['transformers'])} transformers)")
    worst = 0.0
    for t in tasks:
        a = [r["tasks"][t]["exact_match"] for r in runs["ours"]]
        b = [r["tasks"][t]["exact_match"] for r in runs["transformers"]]
        ma, mb = 100 * sum(a) / len(a), 100 * sum(b) / len(b)
        worst = min(worst, ma - mb)
        print(f"{t:>8} {ma:6.1f}% (min {100*min(a):.0f}, max {100*max(a):.0f})   "
              f"transformers {mb:6.1f}% (min {100*min(b):.0f}, max {100*max(b):.0f})   {ma - mb:+5.1f}")
    return worst


def precision_gap(ours_default, ours_seeds_dir, exact_dir, steps, tasks):
    """Per-task means over seeds of the fast (default) and exact precisions; returns the worst gap."""
    import glob

    def runs(first, seeds_dir):
        out = [first]
        for f in sorted(glob.glob(os.path.join(seeds_dir, "dgemma_seed*.json"))):
            out += [r for r in json.load(open(f))["settings"] if r["max_denoising_steps"] == steps]
        return out
    exact_first = by_steps(json.load(open(os.path.join(exact_dir, "dgemma_results.json")))).get(steps)
    fast, exact = runs(ours_default, ours_seeds_dir), runs(exact_first, os.path.join(exact_dir, "seeds"))
    print(f"\nfast (default) vs exact precision, {steps} steps, mean over {len(fast)} / {len(exact)} seeds")
    worst = 0.0
    for t in tasks:
        a = 100 * sum(r["tasks"][t]["exact_match"] for r in fast) / len(fast)
        b = 100 * sum(r["tasks"][t]["exact_match"] for r in exact) / len(exact)
        worst = max(worst, abs(a - b))
        print(f"{t:>8} fast {a:6.2f}%   exact {b:6.2f}%   {a - b:+5.2f}")
    print(f"largest difference {worst:.2f} points (target <= 1)")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", default=os.path.join(here, "dgemma_results.json"))
    ap.add_argument("--theirs", default=os.path.join(here, "transformers_results.json"))
    ap.add_argument("--svg", default=os.path.join(here, "quality.svg"))
    ap.add_argument("--seeds-dir", default=os.path.join(here, "seeds"),
                    help="more runs of the default setting with other seeds (dgemma_seed*.json, "
                         "transformers_seed*.json): the means over all seeds are compared too")
    ap.add_argument("--exact", default=None, help="directory of the exact precision's results (see above)")
    args = ap.parse_args()
    ours_r, theirs_r = json.load(open(args.ours)), json.load(open(args.theirs))
    ours, theirs = by_steps(ours_r), by_steps(theirs_r)
    tasks = list(ours_r["n_per_task"])
    default = theirs_r.get("generation_config", {}).get("max_denoising_steps", 48)
    print(f"{'steps':>5} {'task':>8} {'ours':>7} {'transformers':>13} {'diff':>6}   tpf ours/theirs   steps/canvas ours/theirs")
    worst_gap, below = 0.0, []
    for s in sorted(ours):
        for t in tasks + ["overall"]:
            a = ours[s]["overall"] if t == "overall" else ours[s]["tasks"][t]
            b = (theirs.get(s, {}).get("overall") if t == "overall" else theirs.get(s, {}).get("tasks", {}).get(t))
            if b is None:
                continue
            gap = 100 * (a["exact_match"] - b["exact_match"])
            print(f"{s:5d} {t:>8} {100*a['exact_match']:6.1f}% {100*b['exact_match']:12.1f}% {gap:+6.1f}   "
                  f"{a['tokens_per_forward_mean']:5.2f} / {b['tokens_per_forward_mean']:5.2f}      "
                  f"{a['steps_per_canvas_mean']:5.2f} / {b['steps_per_canvas_mean']:5.2f}")
            if s == default and t != "overall":
                worst_gap = min(worst_gap, gap)
                if a["exact_match"] < 0.9:
                    below.append(t)
    svg(ours, theirs, tasks, args.svg)
    # One seed per side differs by several points from stream noise alone (100 prompts per task), so
    # the 2-point target is checked on the mean over all seeds of each side.
    mean_gap = seed_means(args.seeds_dir, ours.get(default), theirs.get(default), tasks)
    print(f"\ndefault sampler ({default} steps): tasks below 90%: {below or 'none'}; "
          f"largest shortfall vs transformers {max(0.0, -worst_gap):.1f} points with seed 0 on both sides"
          + (f", {max(0.0, -mean_gap):.1f} points on the seed means" if mean_gap is not None else "") + " (target <= 2)")
    if args.exact:
        precision_gap(ours.get(default), args.seeds_dir, args.exact, default, tasks)
    print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
