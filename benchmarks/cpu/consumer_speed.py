#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A consumer's build against the project's own: bench_cpu compiled through FetchContent with plain
-O2 (no -march, the way distributions and most CMake projects build) and bench_cpu from this
project's build (-march=native), run alternately on the same checkpoint. Prints each row's ratio
and writes benchmarks/cpu/consumer_speed.json. The kernels are chosen at run time from the CPU, so
the ratio should be 1 within noise.

    python3 benchmarks/cpu/consumer_speed.py [--native build/benchmarks/bench_cpu] [--model /tmp/dg_bench/small]
        [--rounds 3] [--threads 2] [--repeats 3]

The consumer is built from the repository's HEAD commit (commit first to measure local changes).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
KEYS = ["step_seconds", "commit_seconds", "prefill_seconds"]


def run_json(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--native", default=os.path.join(root, "build/benchmarks/bench_cpu"))
    ap.add_argument("--model", default="/tmp/dg_bench/small")
    ap.add_argument("--work", default="/tmp/dg_bench/consumer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each row per run (bench_cpu takes the median)")
    ap.add_argument("--out", default=os.path.join(here, "consumer_speed.json"))
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    build = os.path.join(args.work, "build")
    flags = "-O2"
    subprocess.run(["cmake", "-S", os.path.join(here, "consumer"), "-B", build, f"-DDG_SOURCE_DIR={root}",
                    f"-DDG_GIT_TAG={head}", "-DCMAKE_BUILD_TYPE=", f"-DCMAKE_CXX_FLAGS={flags}"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count())], check=True, stdout=subprocess.DEVNULL)
    consumer = os.path.join(build, "bench_cpu_consumer")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    common = ["--model", args.model, "--threads", str(args.threads), "--repeats", str(args.repeats), "--prompt", "512",
              "--only", "step,commit,prefill"]
    runs = {"native": [], "consumer": []}
    for r in range(args.rounds):  # the order alternates too: the second run of a round may find warmer caches
        order = ["native", "consumer"] if r % 2 == 0 else ["consumer", "native"]
        for side in order:
            runs[side].append(run_json([args.native if side == "native" else consumer] + common, env))
    result = {"commit": head, "consumer_flags": flags, "model": args.model, "threads": args.threads,
              "rounds": args.rounds, "repeats": args.repeats,
              "cpu": runs["native"][0].get("cpu"), "kernels": runs["consumer"][0].get("kernels"), "rows": {}}
    print(f"consumer (FetchContent, CMAKE_CXX_FLAGS={flags}) vs this project's -march=native build, "
          f"{args.rounds} alternating rounds, medians; kernels {result['kernels']}")
    for key in KEYS:
        n = statistics.median(r[key] for r in runs["native"])
        c = statistics.median(r[key] for r in runs["consumer"])
        # Each round's two runs are minutes apart at most, so their ratio is less exposed to the
        # VM's slow drifts than the ratio of the medians.
        paired = sorted(cr[key] / nr[key] for nr, cr in zip(runs["native"], runs["consumer"]))
        result["rows"][key] = {"native": n, "consumer": c, "consumer_over_native": c / n,
                               "paired_median": statistics.median(paired), "paired_range": [paired[0], paired[-1]]}
        print(f"  {key:18s} native {n:8.4f} s   consumer {c:8.4f} s   consumer/native {c / n:5.3f}   "
              f"paired median {statistics.median(paired):5.3f} ({paired[0]:.3f}-{paired[-1]:.3f})")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
