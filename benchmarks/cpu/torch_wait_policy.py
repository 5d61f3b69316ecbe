#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""transformers' commit and prefill (fp32, prompt 512, 2 threads) with OMP_WAIT_POLICY=PASSIVE and
with it unset, in alternating pairs: how much the setting the benchmarks used until 2026-12-07
slowed torch (docs/performance.md, "The benchmark itself, reviewed"). Needs the small and medium
checkpoints of tools/reference/make_bench_checkpoints.py in /tmp/dg_bench. Writes /tmp/ab_wait.json.

    tools/reference/.venv/bin/python benchmarks/cpu/torch_wait_policy.py
"""
import json, os, subprocess, sys, statistics
py = "tools/reference/.venv/bin/python"
out = {}
for name in ["small", "medium"]:
    rows = {"PASSIVE": [], "default": []}
    for r in range(3):
        order = ["PASSIVE", "default"] if r % 2 == 0 else ["default", "PASSIVE"]
        for pol in order:
            env = dict(os.environ, OMP_NUM_THREADS="2")
            env.pop("OMP_WAIT_POLICY", None)
            if pol == "PASSIVE": env["OMP_WAIT_POLICY"] = "PASSIVE"
            res = json.loads(subprocess.run([py, "benchmarks/cpu/bench_transformers.py", "--model", f"/tmp/dg_bench/{name}", "--threads", "2",
                                 "--repeats", "3", "--prompt", "512", "--only", "commit,prefill", "--dtype", "float32"],
                                env=env, check=True, stdout=subprocess.PIPE, text=True).stdout)
            rows[pol].append({k: res[k] for k in ("commit_seconds", "prefill_seconds")})
            print(name, r, pol, rows[pol][-1], flush=True)
    out[name] = rows
    for k in ("commit_seconds", "prefill_seconds"):
        ratios = [p[k] / d[k] for p, d in zip(rows["PASSIVE"], rows["default"])]
        print(name, k, "PASSIVE/default per pair:", [round(x, 2) for x in ratios], "median", round(statistics.median(ratios), 2), flush=True)
json.dump({"cpu": "AMD EPYC (Zen 3, family 25 model 1; avx2 fma f16c)", "threads": 2, "torch_dtype": "float32",
           "what": "transformers' commit and prefill (prompt 512) with OMP_WAIT_POLICY=PASSIVE and unset, alternating pairs",
           "results": out}, open("/tmp/ab_wait.json", "w"), indent=1)
