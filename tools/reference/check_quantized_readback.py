#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads back a quantized checkpoint written by another program (e.g. `dgemma quantize`) with the
ecosystem's own code and compares its dequantization, tensor by tensor, with a dump of ours.

    tools/reference/.venv/bin/python tools/reference/check_quantized_readback.py DIR --dump DUMP.safetensors

DIR: a checkpoint directory (config.json with `quantization_config`, model.safetensors or shards +
model.safetensors.index.json). compressed-tensors checkpoints are parsed with
`QuantizationConfig.model_validate` and dequantized with compressed-tensors'
`CompressedTensorsDequantizer`; GPTQ (v1) checkpoints with GPTQModel (see make_quant_fixtures.py).
DUMP: F32 tensors named `<module>.weight` (what our C++ dequantizes). Every quantized module of DIR
must be in the dump; every dump tensor must exist in DIR; values must be equal exactly. Prints the
largest absolute difference per tensor; exits 1 on any mismatch or missing tensor.
`--self-dump OUT` writes such a dump from the Python dequantization (to test this script).
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_fixtures import dequantize_dir  # noqa: E402


def check_config(ckpt_dir):
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        qc = json.load(f).get("quantization_config")
    if qc is None:
        raise SystemExit(f"{ckpt_dir}/config.json has no quantization_config")
    if qc.get("quant_method") == "compressed-tensors":
        from compressed_tensors.quantization import QuantizationConfig
        parsed = QuantizationConfig.model_validate({k: v for k, v in qc.items() if k != "version"})
        groups = {n: (g.format, g.weights.type, g.weights.num_bits, g.weights.strategy, g.weights.symmetric,
                      g.weights.group_size) for n, g in parsed.config_groups.items()}
        print(f"compressed-tensors config parsed: format {parsed.format}, groups {groups}, "
              f"ignore {parsed.ignore}")
    elif qc.get("quant_method") == "gptq":
        for k in ("bits", "group_size", "desc_act", "sym"):
            if k not in qc:
                raise SystemExit(f"gptq quantization_config lacks {k}")
        if qc.get("checkpoint_format", "gptq") != "gptq":
            raise SystemExit(f"only checkpoint_format gptq (v1) is read, not {qc['checkpoint_format']}")
        print(f"gptq config: bits {qc['bits']} group_size {qc['group_size']} desc_act {qc['desc_act']} "
              f"sym {qc['sym']}")
    else:
        raise SystemExit(f"unknown quant_method {qc.get('quant_method')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--dump", help="F32 safetensors with our dequantized weights")
    ap.add_argument("--self-dump", help="write the Python dequantization of every quantized module here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    check_config(args.dir)
    dense, quantized = dequantize_dir(args.dir)
    if args.self_dump:
        save_file({k: dense[k].contiguous() for k in quantized}, args.self_dump)
        print(f"wrote {len(quantized)} tensors to {args.self_dump}")
    if not args.dump:
        return 0
    dump = load_file(args.dump)
    bad = 0
    for name in sorted(set(quantized) | set(dump)):
        if name not in dump:
            print(f"MISSING in dump: {name}")
            bad += 1
            continue
        if name not in dense:
            print(f"NOT in checkpoint: {name}")
            bad += 1
            continue
        ours, ref = dump[name], dense[name]
        if ours.dtype != torch.float32 or tuple(ours.shape) != tuple(ref.shape):
            print(f"BAD {name}: dump {ours.dtype} {tuple(ours.shape)}, checkpoint {tuple(ref.shape)}")
            bad += 1
            continue
        diff = (ours - ref).abs().max().item() if ours.numel() else 0.0
        same = torch.equal(ours, ref)
        print(f"{'ok ' if same else 'DIFF'} {name}: max abs diff {diff:.3g}")
        bad += 0 if same else 1
    print(f"{len(dump)} dumped tensors, {len(quantized)} quantized modules, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
