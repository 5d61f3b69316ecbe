#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How far transformers' own bf16 run lands from its fp32 golden logits, on the backbone fixtures:
the yardstick for the fast precision's tolerance (tests/model/backbone_test.cpp).

    tools/reference/.venv/bin/python tools/reference/bf16_spread.py [--fixtures tests/fixtures]

Loads each fixture in torch.bfloat16, replays the golden cases' inputs (prompt, canvas, SC logits,
commit, second canvas) exactly as make_fixtures.py does, and prints the median, 99th percentile and
largest |logit difference| to the fp32 golden logits, and the share of positions whose argmax
agrees.
"""
import argparse
import os

import torch
from safetensors.torch import load_file
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

import make_fixtures as mf


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))
    args = ap.parse_args()
    diffs, agree, rows = [], 0, 0
    for name in ("dg_small", "dg_wide"):
        path = os.path.join(args.fixtures, name)
        golden = load_file(os.path.join(path, "golden.safetensors"))
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.bfloat16,
                                                                 experts_implementation="eager").eval()
        C = model.config.canvas_length
        with torch.inference_mode():
            for k in range(3):
                c = f"case{k}."
                prompt = golden[c + "prompt_ids"].unsqueeze(0)
                P = prompt.shape[1]
                cache = DynamicCache(config=model.config.get_text_config(decoder=True))
                got = {"encoder_logits": mf.encoder_pass(model, prompt, cache, 0)}
                canvas = golden[c + "canvas_ids"].unsqueeze(0)
                got["denoise_logits"] = mf.denoise_pass(model, canvas, cache, P)
                sc = golden[c + "sc_logits"].to(torch.bfloat16)
                got["denoise_sc_logits"] = mf.denoise_pass(model, canvas, cache, P, sc)
                got["commit_logits"] = mf.encoder_pass(model, golden[c + "commit_ids"].unsqueeze(0), cache, P)
                got["denoise2_logits"] = mf.denoise_pass(model, golden[c + "canvas2_ids"].unsqueeze(0), cache, P + C)
                for key, g in got.items():
                    w = golden[c + key]
                    diffs.append((g.float() - w).abs().flatten())
                    agree += int((g.float().argmax(-1) == w.argmax(-1)).sum())
                    rows += w.shape[0]
    d = torch.cat(diffs).sort().values
    n = d.numel()
    print(f"transformers bf16 vs fp32: median {d[n // 2]:.4f}, p99 {d[n * 99 // 100]:.4f}, max {d[-1]:.4f}, "
          f"argmax agreement {agree / rows:.4f} over {rows} positions")


if __name__ == "__main__":
    main()
