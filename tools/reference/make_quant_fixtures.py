#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Quantized DiffusionGemma fixtures, written by the ecosystem's own tools, with golden logits.

Regenerate (from the repository root):

    tools/reference/setup.sh          # once: creates tools/reference/.venv (pins compressed-tensors, GPTQModel)
    tools/reference/.venv/bin/python tools/reference/make_quant_fixtures.py --out tests/fixtures/quant

What is written (every directory also gets generation_config.json from make_fixtures):

  base/             the BF16 checkpoint every variant is made from (save_pretrained; randomize_ of
                    make_fixtures, seed 21; hidden 64, 2 layers sliding+full, 4 experts).
  <variant>/        config.json (base config + the `quantization_config` the tool's config writer
                    produces), model.safetensors (fp8_channel: two shards + model.safetensors.index.json),
                    golden.safetensors (make_fixtures.backbone_cases, canvas 8, transformers fp32 on the
                    DEQUANTIZED weights) and dequantized.safetensors (F32, exact widening of the tool's
                    own dequantization of three matrices, under their checkpoint module names + ".weight":
                    layers.0.self_attn.q_proj, layers.1.mlp.down_proj, layers.0.experts.1.down_proj;
                    in int8_channel, whose experts stay fused bf16, the last is experts.down_proj[1]).

Which tool wrote what
  compressed-tensors variants (fp8_channel, fp8_tensor, int8_channel, w4a16_g32, w4a16_asym_g64,
  w8a16_channel): llm-compressor's `model_free_ptq` cannot be installed next to the pinned
  torch 2.15 / transformers 5.24 (llmcompressor 0.14.0.1 requires torch<=2.14, transformers<=5.17,
  compressed-tensors==0.19.0), so `ct_quantize` below performs model_free_ptq's steps with
  compressed-tensors' own functions: the same expert split (`experts.gate_up_proj[e]` rows [0,I) ->
  `experts.{e}.gate_proj.weight`, rows [I,2I) -> `.up_proj`, `experts.down_proj[e]` ->
  `experts.{e}.down_proj`), `match_quantizable_tensors`, `initialize_module_for_quantization` on a
  bf16 nn.Linear, llm-compressor's min/max observer reduction (amin/amax of the weight reshaped per
  strategy, in the weight dtype), compressed-tensors `calculate_qparams`, `compress_module`
  (the registered compressor: float-quantized / int-quantized / pack-quantized), and the
  config.json `quantization_config` that model_free_ptq's update_config writes
  (QuantizationConfig(status compressed).model_dump() + version, quant_method, transform_config).
  Dequantization: compressed-tensors' `CompressedTensorsDequantizer(dir, dtype=float32).process`.
  gptq_sym, gptq_asym_descact: GPTQModel 7.7.0. Per-group scales / zero points from GPTQModel's
  `Quantizer.find_params` (plain RTN per group: the GPTQ error feedback is not run, it changes the
  values but not the format), desc_act column order from a synthetic Hessian diagonal (g_idx[perm[i]]
  = i // group_size, exactly as GPTQ builds it), packed by GPTQModel's `TorchLinear.pack_block` and
  converted to the v1 checkpoint format by `convert_gptq_v2_to_v1_format_module`. Dequantization:
  GPTQModel's `convert_gptq_v1_to_v2_format_module` + `TorchLinear.dequantize_weight`, cross-checked
  against `gptq_v1_dequant_numpy` (the documented formula) bit for bit.
  gptq_dynamic: the same, with GPTQModel's per-module `dynamic` overrides (8 bits, other group sizes,
  act-order, asymmetric, and modules excluded); each module's bits/group_size/sym/desc_act come from
  GPTQModel's own `QuantizeConfig.dynamic_get`, when quantizing and when dequantizing.

Checkpoints written by llm-compressor itself (llmc_w4a16, llmc_fp8_dynamic): make_llmcompressor_fixture.py
runs llmcompressor 0.14.0.1's `model_free_ptq` on base/ in its own venv; then `--golden-for DIR` here
(reference venv) adds golden.safetensors, dequantized.safetensors and generation_config.json, computed
exactly as above (CompressedTensorsDequantizer 0.20.1, transformers 5.24 fp32), without touching the
checkpoint:

    tools/reference/.venv/bin/python tools/reference/make_quant_fixtures.py --golden-for tests/fixtures/quant/llmc_w4a16
    tools/reference/.venv/bin/python tools/reference/make_quant_fixtures.py --golden-for tests/fixtures/quant/llmc_fp8_dynamic

On the same base, llm-compressor wrote byte for byte the tensors `ct_quantize` writes for W4A16 group 32
(w4a16_g32, up to the prefix) and FP8_DYNAMIC (fp8_channel); tests/io/quantization_test.cpp checks it.

Deterministic: a second run writes byte-identical files.
"""

import argparse
import json
import math
import os
import re
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import TINY_VISION, backbone_cases, randomize_, write_generation_config  # noqa: E402

from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: E402

BASE_TEXT = dict(
    vocab_size=131, hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
    top_k_experts=2, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
    num_attention_heads=2, head_dim=32, global_head_dim=64, num_key_value_heads=1,
    num_global_key_value_heads=1, sliding_window=6, max_position_embeddings=256)
CANVAS = 8
# make_fixtures' vision tower with a 16-entry position table (the default 10240 would be most of the
# bytes; the text path never reads it).
VISION = dict(TINY_VISION, position_embedding_size=16)
BASE_SEED = 21
GOLDEN_SEED = 22

DECODER = "model.decoder."
ENCODER_LM = "model.encoder.language_model."

# Kept in bf16 by every compressed-tensors variant (module-name patterns, compressed-tensors syntax).
CT_IGNORE = ["lm_head", "re:.*embed_tokens.*", "re:.*norm.*", "re:.*router.*", "re:.*self_conditioning.*",
             "re:.*vision.*"]

# GPTQ quantizes exactly these modules (everything else stays bf16).
GPTQ_TARGET = re.compile(r".*layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|"
                         r"experts\.\d+\.(gate|up|down)_proj)$")


def _int_args(bits, strategy, symmetric, group_size=None):
    from compressed_tensors.quantization import QuantizationArgs
    kw = dict(num_bits=bits, type="int", strategy=strategy, symmetric=symmetric, dynamic=False)
    if group_size:
        kw["group_size"] = group_size
    return QuantizationArgs(**kw)


def ct_schemes():
    """name -> (QuantizationScheme, options). Presets of compressed-tensors where one exists."""
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    fp8_tensor = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    fp8_tensor.weights.strategy = "tensor"
    w4 = preset_name_to_scheme("W4A16", ["Linear"])
    w4.weights.group_size = 32
    w4a = preset_name_to_scheme("W4A16_ASYM", ["Linear"])
    w4a.weights.group_size = 64
    w8 = QuantizationScheme(targets=["Linear"], weights=_int_args(8, "channel", True))
    return {
        "fp8_channel": (preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]), dict(shards=2)),
        "fp8_tensor": (fp8_tensor, {}),
        "int8_channel": (preset_name_to_scheme("W8A8", ["Linear"]), dict(split_experts=False)),
        "w4a16_g32": (w4, dict(prefix=ENCODER_LM)),
        "w4a16_asym_g64": (w4a, {}),
        "w8a16_channel": (w8, {}),
    }


GPTQ_VARIANTS = {
    "gptq_sym": dict(bits=4, group_size=32, sym=True, desc_act=False),
    "gptq_asym_descact": dict(bits=4, group_size=32, sym=False, desc_act=True),
    # GPTQModel's per-module overrides, tried in the order written; the first match decides.
    # layers.1.experts.1 matches the first rule and the last: the first one wins. The keys are
    # written in sorted order so that quantize_config.json (dumped with sort_keys) keeps it.
    "gptq_dynamic": dict(bits=4, group_size=32, sym=True, desc_act=False, dynamic={
        r"+:.*experts\.[13]\.": {"group_size": 16, "desc_act": True},
        r"+:.*layers\.0\.mlp\.": {"bits": 8, "group_size": 64},
        r"-:.*layers\.1\.self_attn\.[qk]_proj$": {},
        r".*layers\.1\.experts\.": {"sym": False, "damp_percent": 0.05},
    }),
}


# ----------------------------------------------------------------------------- checkpoint plumbing

def split_fused_experts(tensors):
    """model_free_ptq's split: experts.gate_up_proj [E,2I,H] -> experts.{e}.gate_proj/up_proj.weight,
    experts.down_proj [E,H,I] -> experts.{e}.down_proj.weight (contiguous copies)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".experts.gate_up_proj") and t.ndim == 3:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                base = name[: -len("gate_up_proj")] + f"{e}."
                out[base + "gate_proj.weight"] = t[e, :inter].contiguous()
                out[base + "up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith(".experts.down_proj") and t.ndim == 3:
            for e in range(t.shape[0]):
                out[name[: -len("down_proj")] + f"{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def fuse_split_experts(tensors):
    """Inverse of split_fused_experts (for loading dequantized weights into transformers)."""
    out, gate, up, down = {}, {}, {}, {}
    pat = re.compile(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    for name, t in tensors.items():
        m = pat.match(name)
        if not m:
            out[name] = t
            continue
        {"gate_proj": gate, "up_proj": up, "down_proj": down}[m.group(3)].setdefault(m.group(1), {})[int(m.group(2))] = t
    for base in gate:
        E = len(gate[base])
        out[base + ".gate_up_proj"] = torch.stack([torch.cat([gate[base][e], up[base][e]]) for e in range(E)])
        out[base + ".down_proj"] = torch.stack([down[base][e] for e in range(E)])
    return out


def with_prefix(tensors, prefix):
    if prefix == DECODER:
        return dict(tensors)
    out = {}
    for k, v in tensors.items():
        nk = prefix + k[len(DECODER):] if k.startswith(DECODER) else k
        if nk in out and not torch.equal(out[nk], v):
            raise SystemExit(f"prefix move collides on {nk} with a different value")
        out[nk] = v
    return out


def to_decoder_prefix(tensors):
    """Every text tensor back under model.decoder. (the encoder's layer_scalar copies stay too)."""
    out = {}
    for k, v in tensors.items():
        if k.startswith(ENCODER_LM):
            out[DECODER + k[len(ENCODER_LM):]] = v
            if not k.endswith(".layer_scalar"):
                continue
        out[k] = v
    return out


def save_checkpoint(out_dir, tensors, shards=1):
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in names}, os.path.join(out_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in names[s * per:(s + 1) * per]}
        save_file(part, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.nbytes
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")


def load_checkpoint(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        out.update(load_file(os.path.join(d, fn)))
    return out


def write_config(out_dir, base_dir, quantization_config):
    with open(os.path.join(base_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quantization_config
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ----------------------------------------------------------------------------- compressed-tensors

def observe_min_max(w, args):
    """llm-compressor's weight observer (flatten_for_calibration + amin/amax over dims (0, -1)),
    evaluated in the weight's dtype."""
    if args.strategy == "tensor":
        obs = w.reshape((1, 1, -1))
    elif args.strategy == "channel":
        obs = w.unsqueeze(-2).unsqueeze(0)
    elif args.strategy == "group":
        obs = w.unflatten(-1, (-1, args.group_size)).unsqueeze(0)
    else:
        raise ValueError(args.strategy)
    return torch.amin(obs, dim=(0, -1)), torch.amax(obs, dim=(0, -1))


def ct_quantize(tensors, scheme, ignore):
    """Quantizes and compresses every targeted, non-ignored `.weight` in place of model_free_ptq."""
    from compressed_tensors.compressors import compress_module
    from compressed_tensors.quantization.utils import calculate_qparams
    from compressed_tensors.quantization import (QuantizationStatus,
                                                 initialize_module_for_quantization)
    from compressed_tensors.utils import match_quantizable_tensors
    out = dict(tensors)
    for module_name, name in list(match_quantizable_tensors(out, ignore, scheme.targets)):
        w = out.pop(name)
        if w.ndim != 2:
            raise SystemExit(f"cannot quantize {name}: shape {tuple(w.shape)}")
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
        lin.weight.data.copy_(w)
        initialize_module_for_quantization(lin, scheme.model_copy(deep=True), force_zero_point=False)
        mn, mx = observe_min_max(lin.weight.data, lin.quantization_scheme.weights)
        scale, zp = calculate_qparams(mn, mx, lin.quantization_scheme.weights)
        lin.weight_scale.data.copy_(scale)
        if hasattr(lin, "weight_zero_point"):
            lin.weight_zero_point.data.copy_(zp)
        lin.quantization_status = QuantizationStatus.FROZEN
        compress_module(lin)
        fmt = lin.quantization_scheme.format
        for k, v in lin.state_dict(prefix=module_name + ".").items():
            out[k] = v.detach().clone()
    return out, fmt


def ct_quantization_config(scheme, fmt, ignore):
    """What model_free_ptq's update_config writes into config.json."""
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus
    s = scheme.model_copy(deep=True)
    s.format = fmt
    cfg = QuantizationConfig(config_groups={"config_group_0": s}, ignore=list(ignore),
                             quantization_status=QuantizationStatus.COMPRESSED, format=fmt.value)
    return {"version": compressed_tensors.__version__, "quant_method": "compressed-tensors",
            "transform_config": {}, **cfg.model_dump()}


def ct_dequantize(ckpt_dir, tensors):
    """compressed-tensors' own dequantizer; dtype float32 only widens its result (computed in the
    scale dtype) exactly."""
    from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer
    deq = CompressedTensorsDequantizer(ckpt_dir, dtype=torch.float32)
    return deq.process(dict(tensors))


# ----------------------------------------------------------------------------- GPTQ (GPTQModel)

def _gptq_qcfg(v):
    from gptqmodel import QuantizeConfig
    return QuantizeConfig(bits=v["bits"], group_size=v["group_size"], desc_act=v["desc_act"], sym=v["sym"],
                          act_group_aware=False, dynamic=v.get("dynamic"))


def gptq_module_args(qcfg, module):
    """bits/group_size/sym/desc_act of one module after GPTQModel's own `dynamic_get`; None when a
    "-:" rule excludes it."""
    if qcfg.dynamic_get(layer_name=module) is False:
        return None
    return {k: qcfg.dynamic_get(layer_name=module, key=k, default=getattr(qcfg, k))
            for k in ("bits", "group_size", "sym", "desc_act")}


def gptq_quantize_matrix(w, v, gen, qcfg):
    """One nn.Linear weight [out, in] (bf16) -> v1 qweight/qzeros/scales/g_idx via GPTQModel."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.quantizer import Quantizer
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module
    W = w.to(torch.float32)
    out_f, in_f = W.shape
    gs = v["group_size"]
    if v["desc_act"]:
        # GPTQ's act-order: columns sorted by decreasing Hessian diagonal (here of synthetic inputs).
        x = torch.randn((64, in_f), generator=gen) * torch.empty(in_f).uniform_(0.2, 2.0, generator=gen)
        perm = torch.argsort(torch.diag(x.T @ x), descending=True, stable=True)
    else:
        perm = torch.arange(in_f)
    G = in_f // gs
    scales = torch.empty(out_f, G)
    zeros = torch.empty(out_f, G)
    for g in range(G):
        q = Quantizer(qcfg)
        q.configure(perchannel=True)
        q.find_params(W[:, perm[g * gs:(g + 1) * gs]], weight=True)
        scales[:, g] = q.scale.view(-1)
        zeros[:, g] = q.zero.view(-1)
    g_idx = torch.empty(in_f, dtype=torch.int32)
    g_idx[perm] = (torch.arange(in_f) // gs).to(torch.int32)
    if not v["sym"] and bool((zeros == 0).any()):
        raise SystemExit("asymmetric zero point 0 would underflow the v1 (zero - 1) storage")
    lin = torch.nn.Linear(in_f, out_f, bias=False)
    lin.weight.data.copy_(W)
    mod = TorchLinear(bits=v["bits"], group_size=gs, sym=v["sym"], desc_act=v["desc_act"], in_features=in_f,
                      out_features=out_f, bias=False, pack_dtype=torch.int32)
    mod.pack_block(lin, scales, zeros, g_idx)
    convert_gptq_v2_to_v1_format_module(mod, qcfg)
    return {"qweight": mod.qweight.clone(), "qzeros": mod.qzeros.clone(), "scales": mod.scales.clone(),
            "g_idx": mod.g_idx.to(torch.int32).clone()}


def gptq_dequantize_matrix(p, bits, group_size, sym, desc_act):
    """GPTQModel's dequantization of one v1 checkpoint module -> [out, in] in the scales dtype (F16)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module
    in_f = p["g_idx"].shape[0]
    out_f = p["scales"].shape[1]
    mod = TorchLinear(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, in_features=in_f,
                      out_features=out_f, bias=False, pack_dtype=torch.int32)
    mod.qweight.copy_(p["qweight"])
    mod.qzeros.copy_(p["qzeros"])
    mod.scales.copy_(p["scales"])
    mod.g_idx.copy_(p["g_idx"])
    mod.eval()
    convert_gptq_v1_to_v2_format_module(mod, bits=bits, pack_dtype=torch.int32)
    with torch.no_grad():
        w = mod.dequantize_weight().T.contiguous()
    ref = gptq_v1_dequant_numpy(p, bits)
    if not np.array_equal(w.numpy(), ref):
        raise SystemExit("GPTQModel dequantization differs from the v1 reference formula")
    return w


def gptq_v1_dequant_numpy(p, bits):
    """The GPTQ v1 arithmetic, stated once:
      q[i, o] = (qweight[i // (32/bits), o] >> (bits * (i % (32/bits)))) & (2^bits - 1)     (in rows packed)
      z[g, o] = ((qzeros[g, o // (32/bits)] >> (bits * (o % (32/bits)))) & (2^bits - 1)) + 1  (v1 stores z - 1)
      w[o, i] = f16( scales[g_idx[i], o] * (q[i, o] - z[g_idx[i], o]) )                         (scales F16)
    (the f16 product of an f16 scale and a small integer is the correctly rounded exact product)."""
    pf = 32 // bits
    mask = (1 << bits) - 1
    qw = p["qweight"].numpy().view(np.uint32)
    qz = p["qzeros"].numpy().view(np.uint32)
    sc = p["scales"].numpy()
    gi = p["g_idx"].numpy().astype(np.int64)
    in_f, out_f = gi.shape[0], sc.shape[1]
    i = np.arange(in_f)
    o = np.arange(out_f)
    q = (qw[i // pf, :] >> (bits * (i % pf))[:, None].astype(np.uint32)) & mask
    z = ((qz[:, o // pf] >> (bits * (o % pf))[None, :].astype(np.uint32)) & mask) + 1
    diff = q.astype(np.int32) - z[gi, :].astype(np.int32)
    w = (sc[gi, :].astype(np.float32) * diff.astype(np.float32)).astype(np.float16)
    return np.ascontiguousarray(w.T)


def gptq_quantization_config(v):
    qc = _gptq_qcfg(v).to_dict()
    qc.pop("meta", None)  # GPTQModel's meta carries a temporary directory path: not reproducible
    return qc


def gptq_quantize(tensors, v):
    qcfg = _gptq_qcfg(v)
    gen = torch.Generator().manual_seed(31)
    out = {}
    for name in sorted(tensors):
        t = tensors[name]
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        args = gptq_module_args(qcfg, mod) if mod is not None and GPTQ_TARGET.match(mod) else None
        if args is not None:
            for k, val in gptq_quantize_matrix(t, args, gen, _gptq_qcfg(args)).items():
                out[f"{mod}.{k}"] = val
        else:
            out[name] = t
    return out


def gptq_dequantize(tensors, qc):
    from gptqmodel import QuantizeConfig
    qcfg = QuantizeConfig(bits=qc["bits"], group_size=qc["group_size"], desc_act=qc["desc_act"], sym=qc["sym"],
                          dynamic=qc.get("dynamic"))
    out = {}
    mods = sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))
    for m in mods:
        p = {k: tensors[f"{m}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}
        a = gptq_module_args(qcfg, m)
        if a is None:
            raise SystemExit(f"{m} is GPTQ-packed but excluded by quantize_config.json's dynamic")
        out[m + ".weight"] = gptq_dequantize_matrix(p, a["bits"], a["group_size"], a["sym"],
                                                    a["desc_act"]).to(torch.float32)
    for k, t in tensors.items():
        if k.rpartition(".")[0] not in mods:
            out[k] = t
    return out


def dequantize_dir(ckpt_dir):
    """Dense F32 tensors (dequantized by the format's own tool, others widened) + which names were
    quantized."""
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    tensors = load_checkpoint(ckpt_dir)
    if qc["quant_method"] == "compressed-tensors":
        dense = ct_dequantize(ckpt_dir, tensors)
    elif qc["quant_method"] == "gptq":
        dense = gptq_dequantize(tensors, qc)
    else:
        raise SystemExit(f"unknown quant_method {qc['quant_method']}")
    marker = ".weight_scale" if qc["quant_method"] == "compressed-tensors" else ".qweight"
    quantized = sorted(k[: -len(marker)] + ".weight" for k in tensors if k.endswith(marker))
    return {k: v.to(torch.float32) for k, v in dense.items()}, quantized


# ----------------------------------------------------------------------------- driver

def build_base(out_root):
    gen = torch.Generator().manual_seed(BASE_SEED)
    cfg = DiffusionGemmaConfig(text_config=dict(BASE_TEXT), vision_config=VISION, canvas_length=CANVAS)
    torch.manual_seed(BASE_SEED)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    randomize_(model, gen)
    model = model.to(torch.bfloat16)
    base_dir = os.path.join(out_root, "base")
    shutil.rmtree(base_dir, ignore_errors=True)
    model.save_pretrained(base_dir)
    write_generation_config(base_dir)
    return base_dir


def golden_from_dense(base_dir, dense):
    cfg = DiffusionGemmaConfig.from_pretrained(base_dir)
    model = DiffusionGemmaForBlockDiffusion(cfg).to(torch.float32).eval()
    sd = fuse_split_experts(to_decoder_prefix(dense))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # lm_head and the encoder's language model are tied to the decoder's parameters.
    params = model.state_dict()
    missing = [k for k in missing if not (k == "lm_head.weight" or (
        k.startswith(ENCODER_LM) and params[k].data_ptr() == params[DECODER + k[len(ENCODER_LM):]].data_ptr()))]
    if missing or unexpected:
        raise SystemExit(f"dequantized state does not fit the model: missing {missing} unexpected {unexpected}")
    assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        golden = backbone_cases(model, CANVAS, torch.Generator().manual_seed(GOLDEN_SEED))
    return {k: v.contiguous() for k, v in golden.items()}


def write_dequantized(out_dir, prefix, dense, fused_experts):
    names = [prefix + "layers.0.self_attn.q_proj.weight", prefix + "layers.1.mlp.down_proj.weight"]
    picked = {n: dense[n] for n in names}
    e_name = prefix + "layers.0.experts.1.down_proj.weight"
    picked[e_name] = dense[prefix + "layers.0.experts.down_proj"][1] if fused_experts else dense[e_name]
    save_file({k: v.to(torch.float32).contiguous() for k, v in picked.items()},
              os.path.join(out_dir, "dequantized.safetensors"), metadata={"format": "pt"})


def build_variant(name, out_root, base_dir, base_tensors):
    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    write_generation_config(out_dir)
    if name in GPTQ_VARIANTS:
        v = GPTQ_VARIANTS[name]
        prefix, fused, shards = DECODER, False, 1
        q = gptq_quantize(split_fused_experts(base_tensors), v)
        qc = gptq_quantization_config(v)
        with open(os.path.join(out_dir, "quantize_config.json"), "w") as f:
            json.dump(qc, f, indent=2, sort_keys=True)
            f.write("\n")
    else:
        scheme, opt = ct_schemes()[name]
        prefix = opt.get("prefix", DECODER)
        fused = not opt.get("split_experts", True)
        shards = opt.get("shards", 1)
        tensors = dict(base_tensors) if fused else split_fused_experts(base_tensors)
        tensors = with_prefix(tensors, prefix)
        ignore = list(CT_IGNORE) + ([r"re:.*\.experts$"] if fused else [])
        q, fmt = ct_quantize(tensors, scheme, ignore)
        qc = ct_quantization_config(scheme, fmt, ignore)
    write_config(out_dir, base_dir, qc)
    save_checkpoint(out_dir, q, shards)
    dense, quantized = dequantize_dir(out_dir)
    write_dequantized(out_dir, prefix, dense, fused)
    save_file(golden_from_dense(base_dir, dense), os.path.join(out_dir, "golden.safetensors"),
              metadata={"format": "pt"})
    # How far quantization moved the weights (a sanity print, not a fixture).
    base_dense = with_prefix(split_fused_experts(base_tensors), prefix)
    worst = max((dense[k] - base_dense[k].to(torch.float32)).abs().max().item() for k in quantized)
    print(f"wrote {name}: {len(quantized)} quantized matrices, max |dequantized - bf16| {worst:.4g}")


def golden_for(out_dir, base_dir):
    """golden.safetensors + dequantized.safetensors (+ generation_config.json) for a quantized
    checkpoint another program wrote from `base_dir` (make_llmcompressor_fixture.py). Its
    tensors and config.json are not touched; config.json must be the base's plus a
    quantization_config."""
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(base_dir, "config.json")) as f:
        base_cfg = json.load(f)
    cfg.pop("quantization_config")
    if cfg != base_cfg:
        raise SystemExit(f"{out_dir}/config.json differs from {base_dir}/config.json beyond quantization_config")
    tensors = load_checkpoint(out_dir)
    prefix = ENCODER_LM if any(k.startswith(ENCODER_LM + "layers.0.self_attn.") for k in tensors) else DECODER
    fused = (prefix + "layers.0.experts.down_proj") in tensors
    write_generation_config(out_dir)
    dense, quantized = dequantize_dir(out_dir)
    write_dequantized(out_dir, prefix, dense, fused)
    save_file(golden_from_dense(base_dir, dense), os.path.join(out_dir, "golden.safetensors"),
              metadata={"format": "pt"})
    base_tensors = load_checkpoint(base_dir)
    base_dense = with_prefix(base_tensors if fused else split_fused_experts(base_tensors), prefix)
    worst = max((dense[k] - base_dense[k].to(torch.float32)).abs().max().item() for k in quantized)
    print(f"golden for {out_dir}: {len(quantized)} quantized matrices, max |dequantized - bf16| {worst:.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/quant")
    ap.add_argument("--only", default=None, help="build one variant (the base is always rebuilt)")
    ap.add_argument("--golden-for", default=None, metavar="DIR",
                    help="only write golden.safetensors, dequantized.safetensors and generation_config.json "
                         "into DIR, a checkpoint another program quantized from --base (nothing else is built)")
    ap.add_argument("--base", default="tests/fixtures/quant/base", help="the BF16 checkpoint DIR was made from")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.golden_for:
        golden_for(args.golden_for, args.base)
        return
    os.makedirs(args.out, exist_ok=True)
    base_dir = build_base(args.out)
    base_tensors = load_checkpoint(base_dir)
    for name in list(ct_schemes()) + list(GPTQ_VARIANTS):
        if args.only and name != args.only:
            continue
        build_variant(name, args.out, base_dir, base_tensors)


if __name__ == "__main__":
    main()
