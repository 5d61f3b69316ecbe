#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The encoder rows of run.py (commit and prefill) in alternating rounds, for ratios that sit near
their 2x target on a machine whose speed wanders: each round runs this library (default
precision), transformers in fp32 and transformers in bf16, one after the other, and the ratio of a
row is taken per round (ours against the faster transformers run of that same round). Prints every
round and the median, and writes benchmarks/cpu/encoder_rounds.json.

    tools/reference/.venv/bin/python benchmarks/cpu/encoder_rounds.py --configs small,medium \\
        [--rounds 5] [--threads 2] [--bench build/benchmarks/bench_cpu] [--torch-dtypes float32] [--isa avx2] [--out F]

Same checkpoints, environment and settings as run.py (prompt 512, canvas from the config,
OpenMP's wait policy at its default; --isa forces both sides' kernel families as run.py's does).
Odd rounds run transformers first. Benchmarks measure; nothing here gates on time.
"""
import argparse
import json
import os
import statistics
import sys

from run import benchmark_environment, cpu_model, isa_environments, root, run_json

here = os.path.dirname(os.path.abspath(__file__))
ROWS = [("commit_seconds", "commit"), ("prefill_seconds", "prefill")]
TARGET = 2.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(root, "build/benchmarks/bench_cpu"))
    ap.add_argument("--configs", default="small,medium")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/dg_bench")
    ap.add_argument("--out", default=os.path.join(here, "encoder_rounds.json"))
    ap.add_argument("--torch-dtypes", default="float32,bfloat16",
                    help="transformers runs per round (the faster one counts); torch's bf16 is slower than its fp32 "
                         "on CPUs without AVX-512 BF16 or AMX and can be left out there")
    ap.add_argument("--isa", default=None, help="force our kernel family (DG_CPU_ISA) and limit torch's the same way")
    args = ap.parse_args()
    dtypes = args.torch_dtypes.split(",")
    env = benchmark_environment(args.threads)
    ours_env, torch_env = isa_environments(args.isa, env)
    only = ",".join(key.split("_")[0] for key, _ in ROWS)
    results = {}
    for name in args.configs.split(","):
        ckpt = os.path.join(args.work, name)
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            raise SystemExit(f"{ckpt} missing: tools/reference/make_bench_checkpoints.py --out {args.work} --only {name}")
        common = ["--model", ckpt, "--threads", str(args.threads), "--repeats", str(args.repeats), "--prompt", "512",
                  "--only", only]
        torch_cmd = [sys.executable, os.path.join(here, "bench_transformers.py")] + common
        rounds = []
        for r in range(args.rounds):
            # Odd rounds run transformers first, so a drift of the machine's speed within a round
            # does not always favour the same side.
            def run_torch():
                return {f"torch_{'fp32' if d == 'float32' else 'bf16'}": run_json(torch_cmd + ["--dtype", d], torch_env)
                        for d in dtypes}
            torch = run_torch() if r % 2 else None
            ours = run_json([args.bench] + common + ["--precision", "fast"], ours_env)
            if torch is None:
                torch = run_torch()
            row = {}
            for key, label in ROWS:
                row[key] = {"ours": ours[key], **{t: res[key] for t, res in torch.items()}}
                row[key]["ratio"] = min(res[key] for res in torch.values()) / ours[key]
            rounds.append(row)
            print(f"{name} round {r + 1}: " + "; ".join(
                f"{label} ours {row[key]['ours']:.4g} s, "
                + ", ".join(f"{t.replace('_', ' ')} {row[key][t]:.4g} s" for t in torch)
                + f", ratio {row[key]['ratio']:.2f}x" for key, label in ROWS),
                flush=True)
        summary = {}
        for key, label in ROWS:
            ratios = [rd[key]["ratio"] for rd in rounds]
            summary[key] = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                            "max_ratio": max(ratios), "rounds_at_target": sum(x >= TARGET for x in ratios)}
            s = summary[key]
            print(f"{name} {label}: median {s['median_ratio']:.2f}x (range {s['min_ratio']:.2f}-{s['max_ratio']:.2f}x), "
                  f"{s['rounds_at_target']} of {len(ratios)} rounds at {TARGET:g}x or more")
        results[name] = {"rounds": rounds, "summary": summary, "kernels": ours.get("kernels"), "cpu": ours.get("cpu")}
    meta = {"machine": cpu_model(), "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
            "target": TARGET, "torch_dtypes": args.torch_dtypes, "forced_isa": args.isa}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
