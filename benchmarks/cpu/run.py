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
    """Grouped bars: denoise step time per configuration, ours vs transformers; AR vs diffusion tok/s."""
    names = list(results)
    w, h, pad = 720, 320, 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<text x="{w/4}" y="20" text-anchor="middle">denoise step (s), lower is better</text>',
             f'<text x="{3*w/4}" y="20" text-anchor="middle">tokens/s, diffusion vs autoregressive (ours)</text>']

    def bars(x0, series, labels, colors):
        vmax = max(max(v for v in s if v is not None) for s in series) or 1
        bw = (w / 2 - pad) / (len(names) * (len(series) + 1))
        for i, n in enumerate(names):
            for j, s in enumerate(series):
                v = s[i]
                if v is None:
                    continue
                bh = (h - 2 * pad) * v / vmax
                x = x0 + pad / 2 + (i * (len(series) + 1) + j) * bw
                parts.append(f'<rect x="{x:.1f}" y="{h - pad - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" fill="{colors[j]}"/>')
                parts.append(f'<text x="{x + bw/2:.1f}" y="{h - pad - bh - 3:.1f}" text-anchor="middle" font-size="9">{v:.3g}</text>')
            xc = x0 + pad / 2 + (i * (len(series) + 1) + len(series) / 2) * bw
            parts.append(f'<text x="{xc:.1f}" y="{h - pad + 15}" text-anchor="middle">{n}</text>')
        for j, lab in enumerate(labels):
            parts.append(f'<rect x="{x0 + pad/2}" y="{h - 25 + 0 * j}" width="10" height="10" fill="{colors[j]}" transform="translate({j*115},0)"/>')
            parts.append(f'<text x="{x0 + pad/2 + 14 + j*115}" y="{h - 16}" font-size="10">{lab}</text>')

    step_series = [[results[n]["ours"].get("step_seconds") for n in names],
                   [results[n]["transformers"].get("step_seconds") for n in names]]
    step_labels, step_colors = ["diffusion_gemma fp32", "transformers"], ["#1f77b4", "#ff7f0e"]
    if all("ours_bf16" in results[n] for n in names):
        step_series.append([results[n]["ours_bf16"].get("step_seconds") for n in names])
        step_labels.append("diffusion_gemma bf16 vocab")
        step_colors.append("#17becf")
    bars(0, step_series, step_labels, step_colors)
    bars(w / 2, [[results[n]["ours"].get("generate_tokens_per_second") for n in names],
                 [results[n]["ours"].get("ar_tokens_per_second") for n in names]],
         ["diffusion (fixed steps)", "autoregressive"], ["#2ca02c", "#9467bd"])
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
    args = ap.parse_args()
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
