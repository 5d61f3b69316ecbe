#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Side-by-side CPU benchmark: this library (bench_cpu) and transformers (bench_transformers.py)
on the same random-weight checkpoints, the same thread count, interleaved in one run. Prints the
ratio per row, writes benchmarks/cpu/results.json and benchmarks/cpu/results.svg. With --bf16 (the
default) ours also runs with the bf16 vocabulary pass (AMX tiles where the CPU has them; the same fp32
path elsewhere), as a third column.

    tools/reference/.venv/bin/python benchmarks/cpu/run.py --bench build/benchmarks/bench_cpu \
        [--configs bundled,small,medium] [--threads 2]

Checkpoints are generated on first use into --work (tools/reference/make_bench_checkpoints.py).
Benchmarks measure; nothing here gates a build on time.
"""
import argparse
import json
import os
import platform
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))

ROWS = [("step_seconds", "denoise step (s)"), ("commit_seconds", "commit, encoder over a canvas (s)"),
        ("prefill_seconds", "prefill (s)"), ("generate_seconds", "whole generation (s)"),
        ("peak_rss_bytes", "peak RSS (MiB)")]


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def svg_chart(results, path):
    """Left: denoise step time per configuration (log scale), ours fp32 / transformers / ours bf16.
    Right: diffusion tokens/s (16 steps per canvas) over autoregressive tokens/s, same backbone."""
    import math
    names = list(results)
    w, h, top, bottom = 760, 340, 40, 80
    plot_h = h - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w/4}" y="20" text-anchor="middle">denoise step (s, log scale), lower is better</text>',
             f'<text x="{3*w/4}" y="20" text-anchor="middle">diffusion (16 steps) / autoregressive tokens/s</text>']

    def legend(x0, labels, colors):
        for j, (lab, col) in enumerate(zip(labels, colors)):
            y = h - 50 + 15 * j
            parts.append(f'<rect x="{x0 + 20}" y="{y - 9}" width="10" height="10" fill="{col}"/>')
            parts.append(f'<text x="{x0 + 34}" y="{y}" font-size="11">{lab}</text>')

    def bars(x0, series, colors, scale, fmt):
        bw = (w / 2 - 40) / (len(names) * (len(series) + 1))
        for i, n in enumerate(names):
            for j, s in enumerate(series):
                v = s[i]
                if v is None:
                    continue
                bh = max(1.0, plot_h * scale(v))
                x = x0 + 20 + (i * (len(series) + 1) + j) * bw
                parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" fill="{colors[j]}"/>')
                parts.append(f'<text x="{x + bw/2:.1f}" y="{top + plot_h - bh - 3:.1f}" text-anchor="middle" font-size="9">{fmt(v)}</text>')
            xc = x0 + 20 + (i * (len(series) + 1) + len(series) / 2) * bw
            parts.append(f'<text x="{xc:.1f}" y="{top + plot_h + 15}" text-anchor="middle">{n}</text>')

    steps = [[results[n]["ours"].get("step_seconds") for n in names],
             [results[n]["transformers"].get("step_seconds") for n in names]]
    labels, colors = ["diffusion_gemma, fp32", "transformers (torch fp32)"], ["#1f77b4", "#ff7f0e"]
    if all("ours_bf16" in results[n] for n in names):
        steps.append([results[n]["ours_bf16"].get("step_seconds") for n in names])
        labels.append("diffusion_gemma, bf16 vocabulary pass")
        colors.append("#17becf")
    vals = [v for s in steps for v in s if v]
    lo, hi = math.log10(min(vals)) - 0.3, math.log10(max(vals)) + 0.1
    bars(0, steps, colors, lambda v: (math.log10(v) - lo) / (hi - lo), lambda v: f"{v:.3g}")
    legend(0, labels, colors)

    ratios = [[results[n]["ours"]["generate_tokens_per_second"] / results[n]["ours"]["ar_tokens_per_second"]
               for n in names]]
    rlabels, rcolors = ["fp32"], ["#2ca02c"]
    if all("ours_bf16" in results[n] for n in names):
        ratios.append([results[n]["ours_bf16"]["generate_tokens_per_second"] /
                       results[n]["ours_bf16"]["ar_tokens_per_second"] for n in names])
        rlabels.append("bf16 vocabulary pass")
        rcolors.append("#9467bd")
    rmax = max(1.2, max(v for s in ratios for v in s) * 1.15)
    bars(w / 2, ratios, rcolors, lambda v: v / rmax, lambda v: f"{v:.2f}x")
    y1 = top + plot_h - plot_h / rmax
    parts.append(f'<line x1="{w/2 + 10}" x2="{w - 10}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#888" stroke-dasharray="4,3"/>')
    parts.append(f'<text x="{w - 12}" y="{y1 - 4:.1f}" text-anchor="end" font-size="10">1.0 = as fast as autoregressive</text>')
    legend(w / 2, rlabels, rcolors)
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(root, "build/benchmarks/bench_cpu"))
    ap.add_argument("--configs", default="bundled,small,medium")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--work", default="/tmp/dg_bench")
    ap.add_argument("--out", default=os.path.join(here, "results.json"))
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="also run ours with --vocab-precision bf16")
    ap.add_argument("--chart-only", action="store_true", help="redraw the chart from --out and exit")
    args = ap.parse_args()
    if args.chart_only:
        svg_chart(json.load(open(args.out))["results"], os.path.splitext(args.out)[0] + ".svg")
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    results = {}
    for name in args.configs.split(","):
        if name == "bundled":
            ckpt = os.path.join(root, "models", "dg-tiny-tasks")
            prompt = "64"
        else:
            ckpt = os.path.join(args.work, name)
            prompt = "512"
            if not os.path.exists(os.path.join(ckpt, "config.json")):
                subprocess.run([sys.executable, os.path.join(root, "tools/reference/make_bench_checkpoints.py"),
                                "--out", args.work, "--only", name], check=True)
        common = ["--model", ckpt, "--threads", str(args.threads), "--repeats", str(args.repeats),
                  "--prompt", prompt, "--steps", str(args.steps)]
        # Interleaved: ours, transformers, in one run on the same machine state.
        ours = run_json([args.bench] + common, env)
        theirs = run_json([sys.executable, os.path.join(here, "bench_transformers.py")] + common, env)
        ours_bf16 = run_json([args.bench] + common + ["--vocab-precision", "bf16"], env) if args.bf16 else None
        results[name] = {"ours": ours, "transformers": theirs}
        if ours_bf16 is not None:
            results[name]["ours_bf16"] = ours_bf16
        print(f"\n== {name} ({args.threads} threads) ==")
        print(f"{'':38s} {'ours':>10s} {'transformers':>13s} {'ratio':>7s}" +
              (f" {'ours bf16':>10s} {'ratio':>7s}" if ours_bf16 else ""))
        for key, label in ROWS:
            a, b = ours.get(key), theirs.get(key)
            if a is None or b is None:
                continue
            c = ours_bf16.get(key) if ours_bf16 else None
            if key == "peak_rss_bytes":
                a, b = a / 2**20, b / 2**20
                c = c / 2**20 if c is not None else None
            line = f"{label:38s} {a:10.4g} {b:13.4g} {b / a:6.2f}x"
            if c is not None:
                line += f" {c:10.4g} {b / c:6.2f}x"
            print(line)
        print(f"{'diffusion tokens/s (fixed steps)':38s} {ours['generate_tokens_per_second']:10.4g}")
        print(f"{'autoregressive tokens/s (ours)':38s} {ours['ar_tokens_per_second']:10.4g}   "
              f"diffusion/AR {ours['generate_tokens_per_second'] / ours['ar_tokens_per_second']:.2f}x")
        for label, res in (("fp32", ours), ("bf16", ours_bf16)):
            if res is None or "generate_peak_rss_bytes" not in res:
                continue
            budget = res["weights_bytes"] + res["generate_kv_cache_bytes"] + 64 * 2**20
            print(f"{'generation peak RSS, ' + label:38s} {res['generate_peak_rss_bytes'] / 2**20:10.1f} MiB; "
                  f"weights + KV cache + 64 MiB = {budget / 2**20:.1f} MiB")
    meta = {"machine": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
            "steps_per_canvas": args.steps}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
        f.write("\n")
    svg_chart(results, os.path.splitext(args.out)[0] + ".svg")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
