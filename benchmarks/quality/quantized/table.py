#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints the exact-match table of the bundled model quantized with each scheme (mean of the
seed files written by benchmarks/quality/quantized/run.sh, min-max in brackets) and checks the
targets: within 2 points of the model as shipped for int8/w8a16/fp8, within 5 for w4a16.
With --root benchmarks/quality/quantized/avx2 (written by avx2_int8.sh) it prints w4a16 in the
exact and fast precisions and also checks the fast one within 1 point of the exact one.

    python3 benchmarks/quality/quantized/table.py [--root DIR]
"""
import argparse
import glob
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
TARGET = {"w8a16": 2.0, "int8": 2.0, "fp8": 2.0, "w4a16": 5.0, "w4a16-exact": 5.0, "w4a16-fast": 5.0}


def means(root, scheme):
    runs = []
    for f in sorted(glob.glob(os.path.join(root, scheme, "seed*.json"))):
        with open(f) as fh:
            runs.append(json.load(fh)["settings"][0]["tasks"])
    tasks = list(runs[0])
    return {t: [100.0 * r[t]["exact_match"] for r in runs] for t in tasks}, len(runs)


def average(v):
    return sum(v) / len(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=here)
    root = ap.parse_args().root
    base, n = means(root, "original")
    tasks = list(base)
    print(f"| scheme | {' | '.join(tasks)} | largest drop vs shipped | target |")
    print("|---|" + "---|" * (len(tasks) + 2))
    ok = True
    for scheme in ["original", "w8a16", "int8", "fp8", "w4a16", "w4a16-exact", "w4a16-fast"]:
        if not os.path.isdir(os.path.join(root, scheme)):
            continue
        m, k = means(root, scheme)
        cells, drop = [], 0.0
        for t in tasks:
            v = m[t]
            mean = sum(v) / len(v)
            drop = max(drop, sum(base[t]) / len(base[t]) - mean)
            cells.append(f"{mean:.1f} ({min(v):.0f}-{max(v):.0f})")
        target = TARGET.get(scheme)
        verdict = "" if target is None else (f"<= {target:.0f}: {'met' if drop <= target else 'NOT met'}")
        ok = ok and (target is None or drop <= target)
        name = "as shipped" if scheme == "original" else scheme
        print(f"| {name} ({k} seeds) | {' | '.join(cells)} | {drop:+.1f} | {verdict} |".replace("+-", "-"))
    if os.path.isdir(os.path.join(root, "w4a16-fast")) and os.path.isdir(os.path.join(root, "w4a16-exact")):
        fast, exact = means(root, "w4a16-fast")[0], means(root, "w4a16-exact")[0]
        drop = max(average(exact[t]) - average(fast[t]) for t in tasks)
        print(f"\nw4a16, fast against exact: largest drop {drop:+.1f} points (<= 1: {'met' if drop <= 1.0 else 'NOT met'})")
        ok = ok and drop <= 1.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
