#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Batching throughput: runs bench_batch on the bundled model (16 requests) and on the small
configuration (vocabulary 262,144, canvas 256; 4 requests), writes benchmarks/batch/results.json
and the chart benchmarks/batch/results.svg. Each configuration serves the same requests one at a
time and then through the continuous batcher at each batch size, in one run on one machine, and
checks that every batched answer equals the one-at-a-time answer. bench_batch also counts the model
arithmetic and measures the CPU's peak: the chart marks, per configuration, the speed-up that
running every pass at that peak would give (no batching can exceed it on this machine).

    python3 benchmarks/batch/run.py --bench build/benchmarks/bench_batch [--threads 2]
        [--work /tmp/dg_bench]   (where tools/reference/make_bench_checkpoints.py put `small`)

Benchmarks measure; nothing here gates on time.
"""
import argparse
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def chart(results, path):
    """Speed-up over one-at-a-time per batch size, one group of bars per configuration, with the
    arithmetic ceiling (every pass at the CPU's peak) drawn over each group when it was measured."""
    groups = [(name, r) for name, r in results.items()]
    bar_w, gap, left, top, height, char_w = 26, 30, 60, 40, 220, 6.2  # char_w: 11 px sans-serif, roughly

    def label(name, r):
        return f'{name} (V={r["vocab_size"]}, canvas {r["canvas_length"]}, {r["requests"]} requests)'

    # Each group is as wide as its bars or its label, whichever is wider, so labels never overlap.
    spans = [max(len(r["batched"]) * bar_w, len(label(name, r)) * char_w) for name, r in groups]
    title = (f'Requests served together vs one at a time ({results[groups[0][0]]["cpu"]}, '
             f'{results[groups[0][0]]["threads"]} threads)')
    width = int(max(left + 10 + sum(spans) + gap * len(groups), left + len(title) * 7.2 + 10))
    peak = max(max([b["speedup_vs_one_at_a_time"] for b in r["batched"]] + [r.get("speedup_ceiling_at_peak", 0.0)])
               for _, r in groups)
    scale = height / max(peak * 1.15, 1.0)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 70}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="13">{title}</text>']
    y0 = top + height
    svg.append(f'<line x1="{left}" y1="{y0}" x2="{width - 10}" y2="{y0}" stroke="black"/>')
    one = y0 - scale
    svg.append(f'<line x1="{left}" y1="{one}" x2="{width - 10}" y2="{one}" stroke="#999" stroke-dasharray="4"/>')
    svg.append(f'<text x="{left - 4}" y="{one + 4}" text-anchor="end">1x</text>')
    x_group = left + 10
    for (name, r), span in zip(groups, spans):
        x_start = x_group + (span - len(r["batched"]) * bar_w) / 2
        x = x_start
        for b in r["batched"]:
            s = b["speedup_vs_one_at_a_time"]
            h = s * scale
            svg.append(f'<rect x="{x}" y="{y0 - h}" width="{bar_w - 4}" height="{h}" fill="#3b7dd8"/>')
            svg.append(f'<text x="{x + (bar_w - 4) / 2}" y="{y0 - h - 3}" text-anchor="middle">{s:.1f}x</text>')
            svg.append(f'<text x="{x + (bar_w - 4) / 2}" y="{y0 + 13}" text-anchor="middle">{b["max_batch"]}</text>')
            x += bar_w
        mid = x_group + span / 2
        ceiling = r.get("speedup_ceiling_at_peak")
        if ceiling:
            yc = y0 - ceiling * scale
            svg.append(f'<line x1="{x_group}" y1="{yc}" x2="{x_group + span}" y2="{yc}" stroke="#c0392b" '
                       'stroke-dasharray="3"/>')
            svg.append(f'<text x="{mid}" y="{yc - 3}" text-anchor="middle" fill="#c0392b">every pass at the '
                       f'measured peak: {ceiling:.2f}x</text>')
        svg.append(f'<text x="{mid}" y="{y0 + 30}" text-anchor="middle">{label(name, r)}</text>')
        svg.append(f'<text x="{mid}" y="{y0 + 44}" text-anchor="middle" fill="#555">batch size</text>')
        x_group += span + gap
    svg.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(root, "build", "benchmarks", "bench_batch"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/dg_bench")
    ap.add_argument("--out", default=os.path.join(here, "results.json"))
    ap.add_argument("--configs", default="bundled,small")
    args = ap.parse_args()
    results = {}
    for name in args.configs.split(","):
        if name == "bundled":
            cmd = [args.bench, "--model", os.path.join(root, "models", "dg-tiny-tasks"), "--requests", "16",
                   "--max-batch", "1,2,4,8,16", "--prompt-tokens", "24"]
        else:
            ckpt = os.path.join(args.work, name)
            if not os.path.exists(os.path.join(ckpt, "config.json")):
                sys.exit(f"{ckpt} is missing: tools/reference/.venv/bin/python tools/reference/make_bench_checkpoints.py "
                         f"--out {args.work} --only {name}")
            cmd = [args.bench, "--model", ckpt, "--requests", "4", "--max-batch", "1,2,4", "--prompt-tokens", "64",
                   "--steps", "4", "--canvases", "1", "--fixed-steps"]
        results[name] = run(cmd + ["--threads", str(args.threads)])
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    chart(results, os.path.splitext(args.out)[0] + ".svg")
    for name, r in results.items():
        print(f"{name}: one at a time {r['sequential_seconds']:.2f} s ({r['requests']} requests, {r['tokens']} tokens)")
        if "speedup_ceiling_at_peak" in r:
            print(f"  {r['model_flops'] / 1e9:.1f} GFLOP; one at a time {r['sequential_gflops']:.0f} GFLOP/s = "
                  f"{r['sequential_fraction_of_peak']:.0%} of the measured peak {r['peak_gflops']:.0f} GFLOP/s "
                  f"({r['peak_kind']}); every pass at that peak would be {r['speedup_ceiling_at_peak']:.2f}x")
        for b in r["batched"]:
            print(f"  max_batch {b['max_batch']:2d}: {b['seconds']:.2f} s, {b['speedup_vs_one_at_a_time']:.2f}x, {b['gflops']:.0f} GFLOP/s, "
                  f"{b['mean_sequences_per_denoise_pass']:.1f} sequences per denoising pass, identical answers: "
                  f"{b['identical_answers']}")


if __name__ == "__main__":
    main()
