#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Random-configuration parity fuzz for QUANTIZED checkpoints: `dgemma quantize`, then `dgemma parity`
on what it wrote, against transformers on the weights compressed-tensors dequantizes from it.

    nice -n 5 tools/reference/.venv/bin/python tools/reference/fuzz_quantized.py --dgemma build/examples/dgemma \\
        --seeds 100000 --minutes 30 --work /tmp/dg_qfuzz

Each seed:
  1. draws a random DiffusionGemma config with fuzz_configs.draw_case (odd widths, layer patterns,
     RoPE, softcap, canvases, prompts, threads 1 or 2, ...) and writes a random F32, BF16 or (one
     in ten) F16 checkpoint with fuzz_configs.build (save_pretrained, reloaded in fp32);
  2. draws a quantization: scheme w4a16 / w8a16 / int8 / fp8; a group size (w4a16: the default 64,
     or 32/64/128; the others: per channel or 32/64/128); --asymmetric (w4a16, w8a16). When a group
     size is in play, four draws in five round the quantized input widths (hidden, intermediate,
     expert width, heads x head_dim of both layer types) up to a multiple of it; otherwise the odd
     widths usually make dgemma refuse, which is checked to be the documented refusal. One draw in
     25 passes a flag combination the CLI must refuse (--asymmetric with int8/fp8, --group-size 48).
     The source checkpoint is sometimes rewritten first: experts split per expert (one in four),
     text weights under `model.encoder.language_model.` (one in eight); `--shard-size` is sometimes
     tiny so that the output has several shards;
  3. runs `dgemma quantize`, then `dgemma dequantize` on the output, and dequantizes the output with
     compressed-tensors' own CompressedTensorsDequantizer (make_quant_fixtures.dequantize_dir): the
     two must be equal bit for bit (check_quantized_readback.py's contract);
  4. loads those dequantized weights into the transformers model of the same config (fp32, eager
     experts, split experts fused back) and hands it to fuzz_configs.compare_with_reference with the
     QUANTIZED checkpoint: golden logits (encoder over each prompt, denoiser over the canvas without
     and with self-conditioning logits), `dgemma parity` in exact precision (gate: --tol, 1e-3) and
     `--precision fast` (on an AVX2/AVX-512 CPU without AMX, int8 activations times 4-bit weights;
     reported next to transformers' own bf16 run of the dequantized model, a yardstick, not a gate);
  5. with --emulate-int8, for w4a16: `--precision fast` against the reference with its 4-bit products
     replaced by the int8 route (int8_route), which is a gate (fast_mismatch below). On an AMX CPU the
     fast precision takes bf16 tiles instead and this check does not apply.

Statuses (one JSON line per seed in WORK/results.jsonl, one summary line on stdout):
  ok                  every exact output within --tol; readback equal.
  fp32_noise          over --tol, but no farther from an fp64 run of the dequantized reference than
                      1.5x what fp32 runs with one-ulp weight noise reach (fuzz_configs' test).
  mismatch            exact output farther than that: a bug, unless shown otherwise.
  readback_mismatch   `dgemma dequantize` differs from compressed-tensors' dequantization of the same
                      checkpoint (what we compute with is not what the format means).
  ecosystem_rejects   compressed-tensors cannot read the checkpoint `dgemma quantize` wrote.
  refused             `dgemma quantize` refused, and the refusal is the documented one: a group size
                      that does not divide a quantized width (the message must say "does not divide"),
                      or a flag combination the CLI does not allow; or `dgemma parity` refused a named
                      unsupported feature ("supported" in its message).
  fast_mismatch       (--emulate-int8, w4a16 only) `--precision fast` differs from the reference running
                      the int8 route (emulate_int8: activations rounded to int8 per row and group, as
                      docs/quantization.md 2.1 says) by more than --tol and more than 1.5x what 32-ulp
                      jitter on the activations moves that emulation (code flips at rounding boundaries).
  quantize_error      `dgemma quantize` failed with a message but not for a documented reason, or
                      succeeded where it had to refuse.
  error / crash       `dgemma parity` failed with another message / died on a signal or without one
                      (quantize dying on a signal is `crash` too).
  reference_rejects   transformers cannot build or run the config (not our bug; recorded).
  harness_error       this script failed (a Python traceback in `message`).
Everything but ok and refused is kept under WORK/fail_<name> (base/ = source checkpoint, ckpt/ = the
quantized one, plus the failing command in the JSON line). `--only-seed N[,M]` reruns seeds.
"""

import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np
import torch
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

from fuzz_configs import (build, compare_with_reference, draw_case, fuzz_arguments, keep, start_run,  # noqa: E402
                          summarize_config)
from make_quant_fixtures import (ENCODER_LM, dequantize_dir, fuse_split_experts, load_checkpoint,  # noqa: E402
                                 save_checkpoint, split_fused_experts, to_decoder_prefix, with_prefix)

LINEAR = re.compile(r".*layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")
FUSED = re.compile(r".*layers\.\d+\.experts\.(gate_up_proj|down_proj)$")


# ----------------------------------------------------------------------------------------------
# Drawing the quantization


def round_up(x, m):
    return int(math.ceil(x / m) * m)


def fit_widths(text, g):
    """Every input width a quantized matrix has becomes a multiple of g (g a power of two)."""
    for k in ("hidden_size", "intermediate_size", "moe_intermediate_size"):
        text[k] = round_up(text[k], g)
    heads = text["num_attention_heads"]
    step = max(2, g // math.gcd(heads, g))  # heads * hd % g == 0 for hd a multiple of step (even too)
    for k in ("head_dim", "global_head_dim"):
        if k in text:
            text[k] = round_up(text[k], step)
    for entry in text.get("per_layer_config", {}).values():
        if "head_dim" in entry:
            entry["head_dim"] = round_up(entry["head_dim"], step)


def draw_qcase(seed):
    case = draw_case(seed, family="dg")
    rng = random.Random(f"quant-{seed}")  # the quantization's own stream (a str seed is hashed)
    case["name"] = f"q{seed}"
    case["dtype"] = rng.choices(["float32", "bfloat16", "float16"], weights=[45, 45, 10])[0]
    scheme = rng.choices(["w4a16", "w8a16", "int8", "fp8"], weights=[40, 20, 20, 20])[0]
    if scheme == "w4a16":
        group = rng.choice([None, 32, 64, 64, 128])  # None: the CLI's default, 64
    else:
        group = rng.choice([None, None, None, 32, 64, 128])
    asym = scheme in ("w4a16", "w8a16") and rng.random() < 0.4
    bad = None
    if rng.random() < 0.04:
        bad = rng.choice(["asym_int", "group48"])
        if bad == "asym_int":
            scheme, asym = rng.choice(["int8", "fp8"]), True
        else:
            group = 48
    eff_group = group if group is not None else (64 if scheme == "w4a16" else None)
    fit = eff_group is not None and bad is None and rng.random() < 0.8
    if fit:
        fit_widths(case["text"], eff_group)
    case["quant"] = dict(scheme=scheme, group=group, eff_group=eff_group, asym=asym, bad_flag=bad, fit=fit,
                         split_source=rng.random() < 0.25, encoder_prefix=rng.random() < 0.125,
                         source_shards=rng.choice([1, 1, 1, 2]),
                         shard_size=rng.choice([None, None, None, 0.01, 0.05]))
    return case


# ----------------------------------------------------------------------------------------------
# Source rewrite, widths, quantize, readback


def quantized_widths(tensors):
    """{module weight name: input width} of every matrix `dgemma quantize` quantizes (fused experts
    by their tensor name)."""
    out = {}
    for name, t in tensors.items():
        if LINEAR.match(name) and t.ndim == 2:
            out[name] = int(t.shape[1])
        elif FUSED.match(name) and t.ndim == 3:
            out[name] = int(t.shape[2])
    return out


def rewrite_source(ckpt, q):
    tensors = load_checkpoint(ckpt)
    widths = quantized_widths(tensors)
    if not (q["split_source"] or q["encoder_prefix"] or q["source_shards"] > 1):
        return widths
    if q["split_source"]:
        tensors = split_fused_experts(tensors)
    if q["encoder_prefix"]:
        tensors = with_prefix(tensors, ENCODER_LM)
    for f in os.listdir(ckpt):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
            os.remove(os.path.join(ckpt, f))
    save_checkpoint(ckpt, tensors, q["source_shards"])
    return widths


def expected_refusal(q, widths):
    """The documented reason `dgemma quantize` must refuse, or None."""
    if q["bad_flag"] == "asym_int":
        return "--asymmetric applies to w4a16 and w8a16 only"
    if q["bad_flag"] == "group48":
        return "--group-size must be 32, 64 or 128"
    g = q["eff_group"]
    if g:
        bad = sorted({w for w in widths.values() if w % g})
        if bad:
            return f"does not divide"  # widths {bad} are not multiples of {g}
    return None


def quantize_cmd(args, src, dst, q):
    cmd = [args.dgemma, "quantize", "--model", src, "--out", dst, "--scheme", q["scheme"]]
    if q["group"] is not None:
        cmd += ["--group-size", str(q["group"])]
    if q["asym"]:
        cmd += ["--asymmetric"]
    if q["shard_size"] is not None:
        cmd += ["--shard-size", str(q["shard_size"])]
    return cmd


def readback(args, qdir, dense, quantized, work):
    """`dgemma dequantize` against compressed-tensors' dequantization: list of problems."""
    dump = os.path.join(work, "dequantized_ours.safetensors")
    p = subprocess.run([args.dgemma, "dequantize", "--model", qdir, "--out", dump], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return [f"dgemma dequantize rc {p.returncode}: {p.stderr.strip()[-300:]}"]
    ours = load_file(dump)
    os.remove(dump)
    problems = []
    for name in sorted(set(quantized) | set(ours)):
        if name not in ours or name not in dense:
            problems.append(f"{name}: only in {'checkpoint' if name not in ours else 'dump'}")
        elif tuple(ours[name].shape) != tuple(dense[name].shape) or not torch.equal(ours[name], dense[name]):
            d = ((ours[name] - dense[name]).abs().max().item()
                 if tuple(ours[name].shape) == tuple(dense[name].shape) else float("inf"))
            problems.append(f"{name}: max |diff| {d:.3g}")
    return problems


def load_dequantized(model, dense):
    """The dequantized (and the unquantized, widened) tensors into the transformers model."""
    sd = fuse_split_experts(to_decoder_prefix(dense))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    params = model.state_dict()
    dec = "model.decoder."
    missing = [k for k in missing if not (k == "lm_head.weight" or (
        k.startswith(ENCODER_LM) and params[k].data_ptr() == params[dec + k[len(ENCODER_LM):]].data_ptr()))]
    if missing or unexpected:
        raise RuntimeError(f"dequantized state does not fit the model: missing {missing[:8]} unexpected {unexpected[:8]}")


def run_qcase(case, args):
    q = case["quant"]
    work = os.path.join(args.work, case["name"])
    base, qdir = os.path.join(work, "base"), os.path.join(work, "ckpt")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rec = {"name": case["name"], "family": case["family"], "dtype": case["dtype"], "big": case["big"],
           "threads": case["threads"], "shard": case["shard"], "pattern": case["pattern"], "spelling": case["spelling"],
           "prompts": case["prompts"], "canvases": case["canvases"], "quant": dict(q)}
    t0 = time.time()
    try:
        model, j = build(case, base)
    except Exception as e:
        rec.update(status="reference_rejects", error=f"{type(e).__name__}: {e}"[:500])
        shutil.rmtree(work, ignore_errors=True)
        return rec
    rec["config"] = summarize_config(case, j)
    widths = rewrite_source(base, q)
    want_refusal = expected_refusal(q, widths)
    rec["expected_refusal"] = want_refusal
    cmd = quantize_cmd(args, base, qdir, q)
    rec["quantize_cmd"] = " ".join(cmd)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        msg = p.stderr.strip()[-2000:]
        if p.returncode < 0 or p.returncode >= 128 or not msg:
            status = "crash"
        elif want_refusal and want_refusal in msg:
            status = "refused"
        else:
            status = "quantize_error"
        rec.update(status=status, rc=p.returncode, message=msg, cmd=rec["quantize_cmd"],
                   seconds=round(time.time() - t0, 2))
        if status == "refused":
            shutil.rmtree(work, ignore_errors=True)
        else:
            keep(work, rec, args)
            rec["quantize_cmd"] = rec["cmd"]
        return rec
    if want_refusal:
        rec.update(status="quantize_error", message=f"quantize succeeded; expected refusal: {want_refusal}",
                   cmd=rec["quantize_cmd"])
        keep(work, rec, args)
        return rec
    try:
        dense, quantized = dequantize_dir(qdir)
    except (Exception, SystemExit) as e:
        rec.update(status="ecosystem_rejects", message=f"{type(e).__name__}: {e}"[:1000], cmd=rec["quantize_cmd"])
        keep(work, rec, args)
        return rec
    rec["quantized_matrices"] = len(quantized)
    problems = readback(args, qdir, dense, quantized, work)
    load_dequantized(model, dense)
    del dense
    fast_bad = False
    if args.emulate_int8 and q["scheme"] == "w4a16":
        kernels = fast_kernels(args, qdir)
        if kernels.startswith("(int8 activations x 4-bit weights; otherwise exact"):
            rec["int8_emulation"] = emulate_int8(case, args, model, qdir, work, quantized)
            fast_bad = rec["int8_emulation"]["verdict"] in ("MISMATCH", "error")
        else:  # DG_CPU_ISA=generic (fast = exact), bf16 dot products or AMX tiles: another route
            rec["int8_emulation"] = {"verdict": "not applicable", "kernels": kernels}
    if problems or fast_bad:  # compare_with_reference deletes `work` when the logits agree: keep a copy
        shutil.copytree(work, work + "_keep")
    rec = compare_with_reference(case, args, model, qdir, work, rec, t0)
    rec["readback"] = problems[:20] if problems else "equal"
    if problems or fast_bad:
        if rec.get("kept"):
            shutil.rmtree(work + "_keep", ignore_errors=True)
        else:
            shutil.move(work + "_keep", work)
        if rec["status"] in ("ok", "fp32_noise"):
            if problems:
                rec.update(status="readback_mismatch", cmd=f"{args.dgemma} dequantize --model {qdir} --out DUMP")
            else:
                rec.update(status="fast_mismatch", cmd=rec["int8_emulation"]["cmd"])
            keep(work, rec, args)
    if rec.get("kept"):
        rec["quantize_cmd"] = rec["quantize_cmd"].replace(work, rec["kept"])
    return rec


# ----------------------------------------------------------------------------------------------
# The fast precision's int8 route, emulated in the reference (--emulate-int8)


class int8_route:
    """Within the context, every F.linear on a quantized 4-bit weight of `model` computes what
    docs/quantization.md 2.1 says the AVX2 / AVX-512 fast precision computes: activations rounded per
    row and chunk (the weight's group) to code = clamp(rint(a * (127 / max|a|)), -127, 127) times
    max|a| / 127, weights (q - zero) * scale with the scale as stored (not rounded to its dtype), the
    product in fp64. `unrounded` is compressed-tensors' dequantization with the scales widened to F32
    first, in the model's naming (fused experts)."""

    def __init__(self, model, unrounded, quantized_params, group, jitter=0.0, seed=0):
        self.by_ptr, self.group, self.jitter = {}, group, jitter
        self.gen = torch.Generator().manual_seed(seed)
        params = dict(model.named_parameters(remove_duplicate=False))
        for name in quantized_params:
            p, w = params[name], unrounded[name].to(torch.float64)
            if p.ndim == 3:  # fused experts: F.linear gets experts[e], a view at e * stride
                for e in range(p.shape[0]):
                    self.by_ptr[(p.data_ptr() + e * p.stride(0) * p.element_size(), tuple(p.shape[1:]))] = w[e]
            else:
                self.by_ptr[(p.data_ptr(), tuple(p.shape))] = w

    def __enter__(self):
        self.orig = orig = torch.nn.functional.linear
        by_ptr, g, jitter, gen = self.by_ptr, self.group, self.jitter, self.gen

        def linear(x, weight, bias=None):
            w = by_ptr.get((weight.data_ptr(), tuple(weight.shape)))
            if w is None or x.dtype != torch.float32:
                return orig(x, weight, bias)
            k = x.shape[-1]
            a = x.reshape(-1, k // g, g)
            if jitter:  # relative noise on the activations, as another summation order leaves them
                a = a * (1 + (torch.rand(a.shape, generator=gen) - 0.5) * (2 * jitter))
            absmax = a.abs().amax(dim=-1, keepdim=True)
            safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
            inv = torch.where(absmax > 0, torch.tensor(127.0, dtype=torch.float32) / safe, torch.zeros_like(absmax))
            code = torch.clamp(torch.round(a * inv), -127, 127)
            alpha = absmax / torch.tensor(127.0, dtype=torch.float32)
            xq = (code.double() * alpha.double()).reshape(x.shape)
            y = torch.matmul(xq, w.T).to(torch.float32)
            return y if bias is None else y + bias

        torch.nn.functional.linear = linear
        return self

    def __exit__(self, *exc):
        torch.nn.functional.linear = self.orig


def unrounded_dequantization(qdir):
    """compressed-tensors' dequantization with every weight_scale widened to F32 first: (q - zero) *
    scale exactly, without the rounding to the scale's dtype."""
    from make_quant_fixtures import ct_dequantize
    tensors = {k: (v.to(torch.float32) if k.endswith(".weight_scale") else v) for k, v in load_checkpoint(qdir).items()}
    return fuse_split_experts(to_decoder_prefix(ct_dequantize(qdir, tensors)))


JITTER_RUNS = 8
# 2^-18, about 32 fp32 ulps. 2^-20 was too tight for the inputs of the o projection: they come out
# of attention (exp, softmax, a sum over every key), and dgemma's differ from torch's by 1e-6
# relative or more. Seed 5016 had a code 1.9e-5 units from a rounding boundary there (15 ulps of
# that activation); the flip moved the denoiser's logits by 0.030, which 8-ulp jitter never reached
# (envelope 1.4e-6) and 32-ulp jitter did (0.032).
JITTER = 2.0 ** -18


_FAST_KERNELS = None  # the environment, and so the route, is fixed for the process


def fast_kernels(args, qdir):
    """What `--precision fast` (info's default precision) runs on this CPU under this process's
    DG_CPU_ISA, from `dgemma info`: the parenthesis after "fast" on its "cpu kernels" line. The int8
    emulation is a gate only where it reads "(int8 activations x 4-bit weights; otherwise exact...)".
    A run of `info` without that line is not remembered, so one refused checkpoint does not turn the
    gate off for the rest."""
    global _FAST_KERNELS
    if _FAST_KERNELS is None:
        p = subprocess.run([args.dgemma, "info", "--model", qdir], capture_output=True, text=True, timeout=300)
        line = next((l for l in p.stdout.splitlines() if l.startswith("cpu kernels")), "")
        if "fast" not in line:
            return f"unknown: dgemma info printed no kernels line (exit {p.returncode})"
        _FAST_KERNELS = line.split("fast", 1)[1].strip()
    return _FAST_KERNELS


def emulate_int8(case, args, model, qdir, work, quantized):
    """dgemma --precision fast against the reference with the int8 route emulated: per prompt, max
    |fast - emulation| and max |fast - fp32 reference|. An activation whose a * 127 / max|a| sits
    within a few fp32 ulps of a rounding boundary (x.5) gets the other code when its fp32 value differs
    in the last bits, as dgemma's (another summation order) does; one such flip moves that token's
    logits by up to a few 1e-2. So over --tol, the emulation is rerun JITTER_RUNS times with every
    activation entering an emulated product multiplied by 1 + u, |u| <= JITTER (2^-18, about 32 ulps), and
    the spread of those runs is the envelope. Verdict: match (within --tol), noise (within 1.5x the
    envelope), MISMATCH (farther: status fast_mismatch, kept with the command and the emulated
    logits)."""
    from fuzz_configs import golden, max_diff, run_parity
    unrounded = unrounded_dequantization(qdir)
    names = {n for n in fuse_split_experts(to_decoder_prefix({q: torch.zeros(1) for q in quantized}))}
    names = sorted(n for n in names if n in unrounded)
    gsize = case["quant"]["eff_group"]
    gen = torch.Generator().manual_seed(case.get("seed", 0) + 101)
    rows, worst_emul, worst_ref, verdict, failing_cmd = [], 0.0, 0.0, "match", None

    def outputs(gl, sc):
        return [gl["encoder_logits"], gl["denoise_sc_logits" if sc else "denoise_logits"]]

    for k in range(len(case["prompts"])):
        g = golden(case, model, k, gen)
        with int8_route(model, unrounded, names, gsize):
            ge = golden(case, model, k, None, ids=g)
        envelope_runs = None
        for sc in (False, True):
            r = run_parity(args.dgemma, qdir, g, work, "fast", sc, case.get("threads", 1))
            if r["rc"] != 0:
                return {"error": r["stderr"][-300:], "verdict": "error", "cmd": " ".join(r["cmd"])}
            ours = [r["out"]["encoder_logits"], r["out"]["denoise_logits"]]
            e = max(max_diff(a, b) for a, b in zip(ours, outputs(ge, sc)))
            row = {"P": case["prompts"][k], "sc": sc, "fast_vs_emulation": e, "fast_vs_fp32": max(r["enc"], r["den"]),
                   "emulation_vs_fp32": max(max_diff(a, b) for a, b in zip(outputs(ge, sc), outputs(g, sc)))}
            if e > args.tol:
                if envelope_runs is None:
                    envelope_runs = []
                    for i in range(JITTER_RUNS):
                        with int8_route(model, unrounded, names, gsize, jitter=JITTER, seed=i):
                            envelope_runs.append(golden(case, model, k, None, ids=g))
                env = max(max_diff(a, b) for gn in envelope_runs for a, b in zip(outputs(gn, sc), outputs(ge, sc)))
                row["jitter_envelope"] = env
                if e > 1.5 * env:
                    if verdict != "MISMATCH":
                        failing_cmd = " ".join(r["cmd"])
                        np.savez(os.path.join(work, f"int8_emulation_case{k}.npz"), **ge)
                    verdict = "MISMATCH"
                elif verdict == "match":
                    verdict = "noise"
            rows.append(row)
            worst_emul, worst_ref = max(worst_emul, e), max(worst_ref, row["fast_vs_fp32"])
    return {"worst_fast_vs_emulation": worst_emul, "worst_fast_vs_fp32": worst_ref, "verdict": verdict, "rows": rows,
            "cmd": failing_cmd}


# ----------------------------------------------------------------------------------------------
# Driver


def qlabel(q):
    g = q["group"] if q["group"] is not None else (f"{q['eff_group']}d" if q["eff_group"] else "ch")
    return f"{q['scheme']}/g{g}{'/asym' if q['asym'] else ''}"


def line(rec):
    q = rec.get("quant", {})
    s = f"{rec['name']:<8} {rec['dtype']:<8} {qlabel(q) if q else '?':<18} {rec['status']:<17}"
    if rec["status"] in ("ok", "mismatch", "fp32_noise", "readback_mismatch", "fast_mismatch") and "worst_exact" in rec:
        s += f" exact {rec['worst_exact']:.3g}"
        if rec.get("worst_exact_vs_fp64") is not None:
            s += f" (vs fp64 {rec['worst_exact_vs_fp64']:.3g})"
        if rec.get("router_min_relative_gap") is not None:
            s += f" router gap {rec['router_min_relative_gap']:.2g}"
        if rec.get("worst_fast") is not None:
            s += f"  fast {rec['worst_fast']:.3g} (transformers bf16: {rec['ref_bf16_spread']:.3g})"
        em = rec.get("int8_emulation")
        if em and "worst_fast_vs_emulation" in em:
            s += f"  fast vs int8 emulation {em['worst_fast_vs_emulation']:.3g} ({em['verdict']})"
        s += f"  {rec.get('seconds', 0):.0f}s"
    elif rec.get("message"):
        s += " " + (rec["message"].splitlines() or [""])[-1][:160]
    elif rec.get("error"):
        s += " " + rec["error"].splitlines()[0][:160]
    return s


def main():
    ap = fuzz_arguments(__doc__, "/tmp/dg_qfuzz", 30.0)
    ap.add_argument("--no-fast", dest="fast", action="store_false", help="skip --precision fast")
    ap.add_argument("--emulate-int8", action="store_true",
                    help="w4a16: also compare --precision fast with the reference running the int8 route (int8_route)")
    args = ap.parse_args()
    log, seeds, t_end = start_run(args)
    counts, recs = {}, []
    for seed in seeds:
        if time.time() > t_end:
            break
        case = None
        try:
            case = draw_qcase(seed)
            rec = run_qcase(case, args)
        except (Exception, SystemExit):
            rec = {"name": f"q{seed}", "dtype": case["dtype"] if case else "?", "quant": case["quant"] if case else {},
                   "status": "harness_error", "message": traceback.format_exc()}
            work = os.path.join(args.work, f"q{seed}")
            if os.path.isdir(work):
                keep(work, rec, args)
        rec.pop("out", None)
        if os.environ.get("DG_CPU_ISA") and isinstance(rec.get("cmd"), str):  # rerun it on the same kernels
            rec["cmd"] = f"DG_CPU_ISA={os.environ['DG_CPU_ISA']} " + rec["cmd"]
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(line(rec), flush=True)
        recs.append(rec)
    print("totals:", json.dumps(counts))
    by = {}
    for r in recs:
        if r.get("quant"):
            by.setdefault(qlabel(r["quant"]), {}).setdefault(r["status"], 0)
            by[qlabel(r["quant"])][r["status"]] += 1
    for k in sorted(by):
        print(f"  {k:<18} {json.dumps(by[k])}")
    ran = [r for r in recs if "worst_exact" in r]
    if ran:
        ex = [r["worst_exact"] for r in ran]
        print(f"exact max|diff| per case: median {statistics.median(ex):.3g}, worst {max(ex):.3g} "
              f"({max(ran, key=lambda r: r['worst_exact'])['name']})")
        fa = [r for r in ran if r.get("worst_fast") is not None]
        if fa:
            print(f"fast max|diff| per case: median {statistics.median([r['worst_fast'] for r in fa]):.3g}, worst "
                  f"{max(r['worst_fast'] for r in fa):.3g} ({max(fa, key=lambda r: r['worst_fast'])['name']}); "
                  f"transformers bf16 median {statistics.median([r['ref_bf16_spread'] for r in fa]):.3g}")
    bad = [r for r in recs if r["status"] not in ("ok", "fp32_noise", "refused", "reference_rejects")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
