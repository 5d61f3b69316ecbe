#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs `dgemma parity` on a checkpoint that make_fixtures.py builds with a seed the tests never
use, and prints the largest difference from transformers' logits (the porting check of Step 2).

    tools/reference/.venv/bin/python tools/reference/check_parity.py --dgemma build/examples/dgemma --seed 777
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

here = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dgemma", required=True)
    ap.add_argument("--seed", type=int, default=777)
    ap.add_argument("--fixture", default="dg_wide")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dg_parity_")
    subprocess.run([sys.executable, os.path.join(here, "make_fixtures.py"), "--out", tmp, "--seed", str(args.seed),
                    "--only", args.fixture, "--no-replay"], check=True, capture_output=True)
    ckpt = os.path.join(tmp, args.fixture)
    g = load_file(os.path.join(ckpt, "golden.safetensors"))
    worst = 0.0
    for k in range(3):
        c = f"case{k}."
        prompt = ",".join(map(str, g[c + "prompt_ids"].tolist()))
        canvas = ",".join(map(str, g[c + "canvas_ids"].tolist()))
        sc_path = os.path.join(tmp, "sc.safetensors")
        save_file({"sc_logits": g[c + "sc_logits"].astype(np.float32)}, sc_path)
        for with_sc in (False, True):
            out = os.path.join(tmp, "parity.safetensors")
            cmd = [args.dgemma, "parity", "--model", ckpt, "--prompt-ids", prompt, "--canvas-ids", canvas, "--out", out]
            if with_sc:
                cmd += ["--sc-logits", sc_path]
            subprocess.run(cmd, check=True, capture_output=True)
            o = load_file(out)
            e_enc = float(np.abs(o["encoder_logits"] - g[c + "encoder_logits"]).max())
            e_den = float(np.abs(o["denoise_logits"] - g[c + ("denoise_sc_logits" if with_sc else "denoise_logits")]).max())
            print(f"seed {args.seed} case{k} (prompt {len(g[c + 'prompt_ids'])}) sc={with_sc}: "
                  f"encoder max|diff| {e_enc:.3g}, denoise max|diff| {e_den:.3g}")
            worst = max(worst, e_enc, e_den)
    print(f"worst max|diff| {worst:.3g}")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
