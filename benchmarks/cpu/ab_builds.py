#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds of bench_cpu side by side: each round runs build A and build B on the same rows, in
alternating order (A first in even rounds, B first in odd ones), so that the machine's slow and
fast phases fall on both sides; a row's ratio (A seconds over B seconds, above 1 when B is faster)
is taken per round. Prints every row's medians, the median ratio, its range and in how many rounds
B was faster, and writes the rounds as JSON. For kernel changes that should not move the bits:
build the old commit's bench_cpu to a copy first, e.g.

    cp build/benchmarks/bench_cpu /tmp/bench_cpu_before     # then make the change and rebuild
    python3 benchmarks/cpu/ab_builds.py --a /tmp/bench_cpu_before --b build/benchmarks/bench_cpu \\
        --rows small:commit,prefill medium:commit,prefill medium:step [--rounds 5] [--out F]

Checkpoints are those run.py generates (--work, default /tmp/dg_bench). Python's standard library
only. Benchmarks measure; nothing here gates on time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from run import cpu_model


def run_once(bench, model, only, args):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    cmd = [bench, "--model", model, "--threads", str(args.threads), "--repeats", str(args.repeats), "--prompt",
           str(args.prompt), "--only", only, "--precision", args.precision]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"ab_builds: {' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="bench_cpu of the build before the change")
    ap.add_argument("--b", required=True, help="bench_cpu of the build after the change")
    ap.add_argument("--rows", nargs="+", default=["small:commit,prefill", "medium:commit,prefill"],
                    help="CONFIG:ROWS, ROWS as bench_cpu's --only takes them")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--precision", default="fast", choices=["fast", "exact"])
    ap.add_argument("--work", default="/tmp/dg_bench")
    ap.add_argument("--out", default="ab_builds.json")
    args = ap.parse_args()
    for path in (args.a, args.b):
        if not os.access(path, os.X_OK):
            sys.exit(f"ab_builds: {path} is not an executable bench_cpu")
    rows = []
    for item in args.rows:
        config, sep, only = item.partition(":")
        if not sep or not only:
            sys.exit(f"ab_builds: --rows item '{item}' is not CONFIG:ROWS")
        model = os.path.join(args.work, config)
        if not os.path.isfile(os.path.join(model, "config.json")):
            sys.exit(f"ab_builds: no checkpoint at {model} (run.py generates it)")
        rows.append((config, model, only))

    seconds = {}  # (config, key, side) -> per-round seconds
    isa = None
    for r in range(args.rounds):
        for config, model, only in rows:
            for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
                res = run_once(getattr(args, side), model, only, args)
                isa = res.get("kernels", isa)
                for key, value in res.items():
                    if key.endswith("_seconds") and key != "load_seconds":
                        seconds.setdefault((config, key, side), []).append(value)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)

    out = {"cpu": cpu_model(), "kernels": isa, "threads": args.threads, "rounds": args.rounds, "a": args.a,
           "b": args.b, "rows": {}}
    for (config, key, side), a in sorted(seconds.items()):
        if side != "a":
            continue
        b = seconds[(config, key, "b")]
        ratios = [x / y for x, y in zip(a, b)]
        row = {"a_median": statistics.median(a), "b_median": statistics.median(b),
               "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
               "rounds_b_faster": sum(x > 1.0 for x in ratios), "a": a, "b": b}
        out["rows"][f"{config}/{key}"] = row
        print(f"{config:8s} {key:26s} A {row['a_median']:.4f} s  B {row['b_median']:.4f} s  "
              f"A/B {row['ratio_median']:.3f} ({min(ratios):.3f}-{max(ratios):.3f}), B faster in "
              f"{row['rounds_b_faster']} of {len(ratios)}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
