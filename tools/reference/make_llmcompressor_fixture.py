#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Quantized fixtures written by llm-compressor itself (`model_free_ptq`), not re-implemented.

llmcompressor 0.14.0.1 pins torch<=2.14, transformers<=5.17 and compressed-tensors==0.19.0, so it
lives in its own virtual environment (tools/reference/requirements-llmcompressor.txt), apart from the
reference one. Regenerate (from the repository root):

    python3 -m venv tools/reference/.venv-llmcompressor
    tools/reference/.venv-llmcompressor/bin/pip install -r tools/reference/requirements-llmcompressor.txt
    tools/reference/.venv-llmcompressor/bin/python tools/reference/make_llmcompressor_fixture.py \
        --base tests/fixtures/quant/base --out tests/fixtures/quant
    # golden logits + dequantized matrices, in the reference venv (transformers 5.24, compressed-tensors 0.20.1):
    tools/reference/.venv/bin/python tools/reference/make_quant_fixtures.py --golden-for tests/fixtures/quant/llmc_w4a16
    tools/reference/.venv/bin/python tools/reference/make_quant_fixtures.py --golden-for tests/fixtures/quant/llmc_fp8_dynamic

What this script writes: the whole output directory of
`llmcompressor.model_free_ptq(base, out, scheme=..., ignore=IGNORE, device="cpu")` run on the BF16
base checkpoint (make_quant_fixtures.py's `base/`): config.json (llm-compressor's update_config adds
`quantization_config`), generation_config.json (copied), model.safetensors and
model.safetensors.index.json. Nothing is edited afterwards. model_free_ptq needs no model class:
it works on the safetensors tensors, splits the fused experts (`experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]) into `experts.{e}.{gate,up,down}_proj.weight` itself, and quantizes
every 2-D `.weight` its targets match and the ignore list does not.

  llmc_w4a16        scheme: compressed-tensors preset W4A16 (int4, symmetric, per group) with
                    group_size 32 (the preset's 128 is wider than the 64-column matrices)
  llmc_fp8_dynamic  scheme: the preset name "FP8_DYNAMIC" as a string (FP8 E4M3 weights per
                    channel; the dynamic per-token activation part is not stored)

Deterministic: a second run writes byte-identical files.
"""

import argparse
import os
import shutil

import torch

# The ignore list of make_quant_fixtures.CT_IGNORE (kept in BF16: LM head / embedding, norms,
# router, self-conditioning MLP, vision tower).
IGNORE = ["lm_head", "re:.*embed_tokens.*", "re:.*norm.*", "re:.*router.*", "re:.*self_conditioning.*",
          "re:.*vision.*"]


def schemes():
    from compressed_tensors.quantization import preset_name_to_scheme
    w4 = preset_name_to_scheme("W4A16", ["Linear"])
    w4.weights.group_size = 32
    return {"llmc_w4a16": w4, "llmc_fp8_dynamic": "FP8_DYNAMIC"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="tests/fixtures/quant/base")
    ap.add_argument("--out", default="tests/fixtures/quant")
    ap.add_argument("--only", default=None, help="write one variant")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import llmcompressor
    from llmcompressor import model_free_ptq
    for name, scheme in schemes().items():
        if args.only and name != args.only:
            continue
        out_dir = os.path.join(args.out, name)
        shutil.rmtree(out_dir, ignore_errors=True)
        model_free_ptq(args.base, out_dir, scheme=scheme, ignore=list(IGNORE), max_workers=1, device="cpu")
        print(f"wrote {out_dir} with llmcompressor {llmcompressor.__version__}")


if __name__ == "__main__":
    main()
