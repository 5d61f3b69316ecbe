#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Random-weight DiffusionGemma checkpoints for the CPU benchmarks (not committed: hundreds of MB).

    tools/reference/.venv/bin/python tools/reference/make_bench_checkpoints.py --out /tmp/dg_bench [--only small]
        [--dtype bfloat16|float32]

Configurations (docs/performance.md): "small" (hidden 512, 4 layers, 16 experts top-4,
vocabulary 262144, canvas 256) and "medium" (hidden 1024, 8 layers, 32 experts top-8, vocabulary
262144, canvas 256). Written with save_pretrained in BF16 by default, the dtype of the released
checkpoint, into OUT/NAME (OUT/NAME-f32 with --dtype float32); both implementations read the same file.
"""
import argparse
import math
import os
import shutil

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

TINY_VISION = {"model_type": "gemma4_vision", "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8,
               "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8}

# The released 26B-A4B text backbone (docs/model.md §1.1), for memory figures from the config alone
# (`--config-only real`; `dgemma info --model OUT/real`): 25 B parameters are not generated here.
REAL = dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
            num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512,
            num_global_key_value_heads=2, sliding_window=1024,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 5,
            num_experts=128, top_k_experts=8, moe_intermediate_size=704, max_position_embeddings=262144,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}})

CONFIGS = {
    "small": dict(vocab_size=262144, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, global_head_dim=128,
                  num_global_key_value_heads=2, sliding_window=1024,
                  layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                  num_experts=16, top_k_experts=4, moe_intermediate_size=256, max_position_embeddings=8192),
    "medium": dict(vocab_size=262144, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=128, global_head_dim=256,
                   num_global_key_value_heads=2, sliding_window=1024,
                   layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
                   num_experts=32, top_k_experts=8, moe_intermediate_size=512, max_position_embeddings=8192),
}


def write_config_only(name, out_root):
    cfg = DiffusionGemmaConfig(text_config=dict(REAL), vision_config=TINY_VISION, canvas_length=256)
    cfg.dtype = "bfloat16"
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    cfg.save_pretrained(out)
    print(f"wrote {out}/config.json (no weights)")


def build(name, out_root, dtype="bfloat16", seed=5):
    cfg = DiffusionGemmaConfig(text_config=dict(CONFIGS[name]), vision_config=TINY_VISION, canvas_length=256)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "vision" in n:
                continue
            if p.ndim == 1:
                p.uniform_(0.6, 1.4)
            else:
                p.normal_(0.0, (1.0 if "embed_tokens" in n else 0.5) / math.sqrt(p.shape[-1]))
    out = os.path.join(out_root, name if dtype == "bfloat16" else name + "-f32")
    shutil.rmtree(out, ignore_errors=True)
    model.to(getattr(torch, dtype)).save_pretrained(out)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/dg_bench")
    ap.add_argument("--only", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--config-only", default=None, metavar="real",
                    help="write only the config.json of the released 26B-A4B shape into OUT/real")
    args = ap.parse_args()
    if args.config_only:
        write_config_only(args.config_only, args.out)
        return
    for name in CONFIGS:
        if args.only is None or args.only == name:
            build(name, args.out, args.dtype)


if __name__ == "__main__":
    main()
