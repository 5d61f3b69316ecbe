#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The same checkpoints in BF16 and quantized by `dgemma quantize` with each scheme, side by side:
denoise step (backbone and vocabulary pass separately), commit, weight bytes and peak memory, for
this library in its default precision (and W4A16 also in the exact one). Rounds alternate between the variants so that a noisy
machine slows all of them alike; the medians are reported. Writes
benchmarks/cpu/results-quantized.json and prints the table of docs/performance.md.

    python3 benchmarks/cpu/quantized_speed.py [--bench build/benchmarks/bench_cpu]
        [--dgemma build/examples/dgemma] [--configs small,medium] [--threads 2] [--rounds 3]

The BF16 checkpoints come from tools/reference/make_bench_checkpoints.py (--work, default
/tmp/dg_bench); the quantized ones are written next to them on first use. Benchmarks measure;
nothing here gates on time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
SCHEMES = {"w4a16": ["--scheme", "w4a16", "--group-size", "64"], "w8a16": ["--scheme", "w8a16"],
           "int8": ["--scheme", "int8"], "fp8": ["--scheme", "fp8"]}
KEYS = ["step_seconds", "step_denoise_seconds", "step_vocab_pass_seconds", "commit_seconds"]


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(root, "build/benchmarks/bench_cpu"))
    ap.add_argument("--dgemma", default=os.path.join(root, "build/examples/dgemma"))
    ap.add_argument("--configs", default="small,medium")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/dg_bench")
    ap.add_argument("--out", default=os.path.join(here, "results-quantized.json"))
    ap.add_argument("--markdown", action="store_true", help="print the table from --out and exit")
    args = ap.parse_args()
    if not args.markdown:
        results = {}
        for cfg in args.configs.split(","):
            base = os.path.join(args.work, cfg)
            if not os.path.isdir(base):
                raise SystemExit(f"{base} missing: tools/reference/make_bench_checkpoints.py --out {args.work} --only {cfg}")
            variants = {"bf16": base}
            for scheme, flags in SCHEMES.items():
                path = f"{base}-{scheme}"
                if not os.path.isdir(path):
                    subprocess.run([args.dgemma, "quantize", "--model", base, "--out", path] + flags, check=True,
                                   capture_output=True)
                variants[scheme] = path
            # W4A16 once more in the exact precision: on an AVX2 CPU the default (fast) one multiplies
            # 4-bit weights with int8 activations, and this row shows what that changes.
            variants["w4a16-exact"] = variants["w4a16"]
            runs = {v: [] for v in variants}
            for r in range(args.rounds):
                for v, path in variants.items():
                    extra = ["--precision", "exact"] if v.endswith("-exact") else []
                    runs[v].append(run_json([args.bench, "--model", path, "--threads", str(args.threads), "--repeats", "1",
                                             "--steps", "4", "--prompt", "256", "--only", "step,commit"] + extra))
                    print(f"{cfg} {v} round {r}: step {runs[v][-1]['step_seconds']:.3f} s", file=sys.stderr)
            results[cfg] = {}
            for v, rs in runs.items():
                row = {k: statistics.median(x[k] for x in rs) for k in KEYS}
                row["weights_bytes"] = rs[0]["weights_bytes"]
                row["peak_rss_bytes"] = max(x["peak_rss_bytes"] for x in rs)
                row["kernels"] = rs[0]["kernels"]
                row["cpu"] = rs[0]["cpu"]
                results[cfg][v] = row
        with open(args.out, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "results": results}, f, indent=1)
            f.write("\n")
    with open(args.out) as f:
        data = json.load(f)
    first = next(iter(next(iter(data["results"].values())).values()))
    print(f"CPU: {first['cpu']}, {data['threads']} threads, kernels {first['kernels']}, median of {data['rounds']} "
          "alternating rounds\n")
    print("| config | weights | weight MiB | peak RSS MiB | denoise step s (backbone + vocabulary pass) | "
          "backbone vs BF16 | commit s | commit vs BF16 |")
    print("|---|---|---|---|---|---|---|---|")
    for cfg, rows in data["results"].items():
        b = rows["bf16"]
        for v, r in rows.items():
            print(f"| {cfg} | {v} | {r['weights_bytes'] / 2**20:.0f} | {r['peak_rss_bytes'] / 2**20:.0f} | "
                  f"{r['step_seconds']:.3f} ({r['step_denoise_seconds']:.3f} + {r['step_vocab_pass_seconds']:.3f}) | "
                  f"{b['step_denoise_seconds'] / r['step_denoise_seconds']:.2f}x | {r['commit_seconds']:.3f} | "
                  f"{b['commit_seconds'] / r['commit_seconds']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
