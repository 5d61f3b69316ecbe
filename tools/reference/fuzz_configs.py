#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Random-configuration parity fuzz: `dgemma parity` against transformers on configs no fixture has.

    tools/reference/.venv/bin/python tools/reference/fuzz_configs.py --dgemma build/examples/dgemma \\
        --seeds 100000 --minutes 60 --fast --edge --work /tmp/dg_fuzz

Each seed draws a random valid config (`draw_case`): mostly DiffusionGemma, some plain Gemma 4
(`gemma4_text` via Gemma4ForCausalLM, `gemma4` via Gemma4ForConditionalGeneration; encoder only).
Mostly tiny, one in six "medium" (wider than kernel blocking, longer prompts). Axes: hidden and
intermediate sizes (odd ones too), head counts, head_dim / global_head_dim (equal or not),
num_key_value_heads / num_global_key_value_heads, attention_k_eq_v (true / false / absent), layer
patterns (one layer, all full, mixed, alternating, all sliding but the last, which transformers
forces to full), sliding_window 2..40 (below and above prompt + canvas), experts / top-k / expert
width, the MoE block off (Gemma 4 only: DiffusionGemma always has it), RoPE per layer type (default or
proportional, theta, partial_rotary_factor, factor), final softcap (absent = 30.0 for
DiffusionGemma, a value, null for Gemma 4), rms_norm_eps, use_bidirectional_attention null /
"vision", vocab sizes (3 up), canvas 1 / odd / past the window / not canvas_length,
max_position_embeddings down to exactly prompt + canvas, checkpoint dtype (F32, BF16, F16), sharded
checkpoints, --threads 1 or 2, and how config.json spells the layer shapes: `per_layer_config` as
save_pretrained writes it, the released checkpoints' `global_head_dim` / `num_global_key_value_heads`,
or an explicit per_layer_config that also reshapes the sliding layers. Prompts: 1 token, about the
window, longer than window + canvas.

Each checkpoint is randomised with make_fixtures.randomize_, written with save_pretrained (config.json
possibly rewritten) and reloaded with from_pretrained in fp32 (eager experts loop), so config.json
means the same to both sides. For BF16 / F16 checkpoints the reference keeps embed_scale rounded to
that dtype, as transformers does (docs/model.md 2.2). Golden logits: make_fixtures.encoder_pass over
the prompt, make_fixtures.denoise_pass over the canvas without and with self-conditioning logits.
Then `dgemma parity` (exact precision; with --fast also `--precision fast`, reported next to
transformers' own bf16 run as the yardstick) and max |diff| per output.

Statuses: ok; fp32_noise (over --tol from transformers fp32, but no farther from an fp64 run of the
same reference than max(--tol, 1.5x) what fp32 runs with one-ulp weight noise reach: rounding in an
ill-conditioned random net, typically a near-tie in the top-k router: the smallest relative gap
between the k-th and (k+1)-th router probability in the fp64 run is recorded as
router_min_relative_gap, and a few 1e-7 there is an fp32 coin flip); mismatch (farther); refused
(dgemma names an unsupported feature); error (dgemma fails with another message); crash (signal, or
no message); reference_rejects (transformers itself cannot build or run the config; what dgemma says
is still recorded). Everything but ok is kept under WORK/fail_<name> (checkpoint and command); one JSON line
per config goes to WORK/results.jsonl.

`--edge` adds hand-picked configs (`edge_cases`), `--only-seed N[,M...]` reruns seeds. At sliding_window 1
transformers' DynamicSlidingWindowLayer keeps `keys[:, :, -1 + 1:]`, the whole prefix instead of
none of it, so the reference is patched there (`window1_fix`); random draws start at window 2.
"""

import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

from make_fixtures import TINY_VISION, denoise_pass, encoder_pass, randomize_  # noqa: E402
from transformers import (  # noqa: E402
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DynamicCache,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)
from transformers import cache_utils  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------------------
# Drawing a config


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_rope(rng):
    """A valid rope_parameters entry for one layer type. Default RoPE only exists at partial factor 1
    in transformers (a partial default RoPE does not broadcast), proportional takes any factor."""
    theta = rng.choice([100.0, 10_000.0, 1_000_000.0, round(rng.uniform(50.0, 5e5), 3)])
    if rng.random() < 0.45:
        r = {"rope_type": "default", "rope_theta": theta}
        if rng.random() < 0.2:
            r["partial_rotary_factor"] = 1.0
        return r
    r = {"rope_type": "proportional", "rope_theta": theta}
    prf = rng.choice([0.25, 0.5, 0.75, 1.0, None, round(rng.uniform(0.05, 1.0), 3), 1.0 / 3.0])
    if prf is not None:
        r["partial_rotary_factor"] = prf
    if rng.random() < 0.3:
        r["factor"] = rng.choice([1.0, 2.0, 8.0, round(rng.uniform(0.5, 10.0), 3)])
    return r


def draw_layer_types(rng, n):
    pattern = rng.choice(["single", "all_full", "mixed", "mixed", "mixed", "sliding_but_last", "alternating"])
    if pattern == "single":
        n = 1
    if n == 1 or pattern == "all_full":
        types = ["full_attention"] * n
    elif pattern == "sliding_but_last":
        types = ["sliding_attention"] * (n - 1) + ["full_attention"]
    elif pattern == "alternating":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        types[-1] = "full_attention"
    else:
        types = [rng.choice(["sliding_attention", "full_attention"]) for _ in range(n - 1)] + ["full_attention"]
    return n, types, pattern


def draw_case(seed, family=None, spelling=None):
    """A random tiny config, the prompts and canvases to run, and how to spell config.json."""
    rng = random.Random(seed)
    if family is None:
        family = rng.choices(["dg", "gemma4", "gemma4_cg"], weights=[80, 12, 8])[0]
    # Mostly tiny; one seed in six "medium" (wider than the kernels' blocking, longer prompts).
    big = rng.random() < 1 / 6
    n, types, pattern = draw_layer_types(rng, rng.randint(1, 5))
    heads = rng.randint(1, 8 if big else 6)
    kv = rng.choice(divisors(heads))
    head_dim = 2 * rng.randint(1, 48 if big else 12)
    global_head_dim = head_dim if rng.random() < 0.3 else 2 * rng.randint(1, 80 if big else 16)
    global_kv = rng.choice(divisors(heads) + [None])
    W = rng.randint(2, 40 if big else 12)  # 1: see EDGE window1
    vocab = rng.randint(300, 3000) if big else rng.choice([3, 5, 17, 31, 97, 131, 257, 301, rng.randint(3, 400)])
    hidden = rng.randint(4, 260 if big else 72)
    text = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=rng.randint(1, 400 if big else 64), num_hidden_layers=n,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, global_head_dim=global_head_dim,
        sliding_window=W, layer_types=types,
        rms_norm_eps=rng.choice([1e-6, 1e-5, 1e-3, 0.05]),
        rope_parameters={"sliding_attention": draw_rope(rng), "full_attention": draw_rope(rng)},
    )
    if global_kv is not None:
        text["num_global_key_value_heads"] = global_kv
    moe = family == "dg" or rng.random() < 0.6
    if moe:
        E = rng.randint(1, 16 if big else 8)
        text.update(num_experts=E, top_k_experts=rng.randint(1, E),
                    moe_intermediate_size=rng.randint(1, 130 if big else 32))
    k_eq_v = rng.choice([True, False, None])  # None: key absent
    if rng.random() < 0.3:
        text["use_bidirectional_attention"] = "vision"  # the released checkpoints' value; text stays causal
    if family != "dg":
        text.update(enable_moe_block=moe, hidden_size_per_layer_input=0,
                    attention_k_eq_v=bool(k_eq_v) if k_eq_v is not None else rng.choice([True, False]),
                    final_logit_softcapping=rng.choice([None, 30.0, 5.0, round(rng.uniform(2.0, 60.0), 3)]))
    else:
        if k_eq_v is not None:
            text["attention_k_eq_v"] = k_eq_v
        cap = rng.choice([None, None, 30.0, 5.0, round(rng.uniform(2.0, 60.0), 3)])
        if cap is not None:
            text["final_logit_softcapping"] = cap  # absent: DiffusionGemma's 30.0
    C = rng.choice([1, 2, 3, 5, 7, 8, rng.randint(1, 2 * W + 4), W + 1 + rng.randint(0, 4)])
    # prompt lengths: 1, below the window, past window + canvas
    prompts = sorted({1, max(1, W - rng.randint(0, 2)), W + C + rng.randint(1, 6)})
    canvases = [C] * len(prompts)
    if family == "dg" and rng.random() < 0.25:
        canvases[-1] = rng.randint(1, 2 * W + 3)  # a canvas of another length than canvas_length
    longest = max(p + (c if family == "dg" else 0) for p, c in zip(prompts, canvases))
    text["max_position_embeddings"] = longest if rng.random() < 0.3 else longest + rng.randint(1, 500)
    drawn = rng.choice(["per_layer_config", "per_layer_config", "global_keys", "explicit_per_layer"])
    spelling = spelling or drawn
    if spelling == "explicit_per_layer":
        # per_layer_config given to the constructor: full layers as usual, and the sliding layers
        # (all alike, as transformers' per-type RoPE requires) with their own head_dim / KV heads.
        sl = {}
        if rng.random() < 0.6:
            sl["num_key_value_heads"] = rng.choice(divisors(heads))
        if rng.random() < 0.5:
            sl["head_dim"] = 2 * rng.randint(1, 12)
        fl = {"head_dim": global_head_dim}
        if global_kv is not None:
            fl["num_key_value_heads"] = global_kv
        text["per_layer_config"] = {str(i): (fl if t == "full_attention" else sl) for i, t in enumerate(types)
                                    if t == "full_attention" or sl}
        text.pop("global_head_dim")
        text.pop("num_global_key_value_heads", None)
    dtype = rng.choice(["float32", "float32", "bfloat16", "float16"])
    shard = rng.choice([None, None, None, "8KB"])  # small shards: model.safetensors.index.json
    threads = rng.choice([1, 1, 2])
    return dict(name=f"seed{seed}", family=family, big=big, threads=threads, text=text, canvas_length=C,
                pattern=pattern, prompts=prompts,
                canvases=canvases if family == "dg" else [0] * len(prompts), spelling=spelling, dtype=dtype,
                shard=shard, root_extra={}, text_extra={}, seed=seed, attn=None)


def edge_cases():
    """Hand-picked cases, in draw_case's format."""
    out = []

    def base(name, **over):
        c = draw_case(10_000 + len(out), family="dg", spelling="per_layer_config")
        c["name"] = name
        c.update(over)
        return c

    # The released checkpoint's spelling with attention_k_eq_v false and global KV heads that differ:
    # transformers' DiffusionGemma text config has no attention_k_eq_v field, so it never gates.
    c = base("edge_dg_keqv_false_global_keys", spelling="global_keys", dtype="float32")
    c["text"].update(num_attention_heads=4, num_key_value_heads=4, num_global_key_value_heads=1, head_dim=8,
                     global_head_dim=16, attention_k_eq_v=False, num_hidden_layers=2,
                     layer_types=["sliding_attention", "full_attention"])
    out.append(c)
    # A hand-written config.json whose last layer is sliding: transformers forces it to full.
    c = base("edge_dg_last_layer_sliding", dtype="float32")
    c["text"].update(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"],
                     head_dim=8, global_head_dim=8, num_key_value_heads=1, num_attention_heads=2,
                     num_global_key_value_heads=1)
    c["text_extra"] = {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}
    out.append(c)
    # use_bidirectional_attention "all" (the text config accepts it; transformers' SDPA path fails on
    # it, eager runs): a refusal is expected.
    c = base("edge_dg_bidirectional_all", dtype="float32", attn="eager")
    c["text"]["use_bidirectional_attention"] = "all"
    out.append(c)
    # Untied LM head: a refusal is expected.
    c = base("edge_dg_untied", dtype="float32")
    c["root_extra"] = {"tie_word_embeddings": False}
    out.append(c)
    # Window 1 (only self), canvas 1, prompt 1 and long, huge theta, tiny eps, softcap small. The
    # reference is patched (window1_fix): unpatched, its sliding cache keeps the whole prefix.
    c = base("edge_dg_window1", dtype="float32", canvas_length=1, prompts=[1, 2, 9], canvases=[1, 1, 1])
    c["text"].update(sliding_window=1, rms_norm_eps=1e-12, final_logit_softcapping=1.0, num_hidden_layers=3,
                     layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e9},
                                      "full_attention": {"rope_type": "proportional", "rope_theta": 10.0,
                                                         "partial_rotary_factor": 0.1}},
                     max_position_embeddings=10)
    out.append(c)
    # All experts active, one expert of width 1, many heads of dim 2.
    c = base("edge_dg_topk_all", dtype="bfloat16")
    c["text"].update(num_experts=6, top_k_experts=6, moe_intermediate_size=1, num_attention_heads=8,
                     num_key_value_heads=8, head_dim=2, global_head_dim=2, num_global_key_value_heads=2)
    out.append(c)
    # A two-shard checkpoint, BF16, explicit per_layer_config with other sliding-layer shapes.
    c = draw_case(10_200, family="dg", spelling="explicit_per_layer")
    c.update(name="edge_dg_sharded_explicit_plc", dtype="bfloat16", shard="4KB", spelling="explicit_per_layer")
    c["text"].pop("global_head_dim", None)
    c["text"].pop("num_global_key_value_heads", None)
    c["text"].update(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=1,
                     layer_types=["sliding_attention", "full_attention", "full_attention"],
                     per_layer_config={"0": {"head_dim": 10, "num_key_value_heads": 3},
                                       "1": {"head_dim": 4, "num_key_value_heads": 2},
                                       "2": {"head_dim": 4, "num_key_value_heads": 2}})
    out.append(c)
    # Gemma 4 text without the MoE block, k_eq_v true, softcap null.
    c = draw_case(10_100, family="gemma4", spelling="per_layer_config")
    c["name"] = "edge_gemma4_dense_keqv_nocap"
    c["text"].update(enable_moe_block=False, attention_k_eq_v=True, final_logit_softcapping=None,
                     num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
                     num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    for k in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        c["text"].pop(k, None)
    out.append(c)
    # Features transformers runs but this library does not implement: each should be refused by name.
    two = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    FULL_ROPE = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    for name, text_over, text_extra, root_extra in [
        ("edge_dg_attention_bias", dict(attention_bias=True), {}, {}),
        ("edge_dg_gelu_exact", dict(hidden_activation="gelu"), {}, {}),
        ("edge_dg_default_rope_factor", dict(rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "factor": 4.0},
            "full_attention": FULL_ROPE}), {}, {}),
        ("edge_dg_linear_rope", dict(rope_parameters={
            "sliding_attention": {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 2.0},
            "full_attention": FULL_ROPE}), {}, {}),
        ("edge_dg_default_rope_partial", dict(rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
            "full_attention": FULL_ROPE}), {}, {}),
        # tie_word_embeddings false only inside text_config (the root one stays true)
        ("edge_dg_text_untied_root_tied", {}, {"tie_word_embeddings": False}, {}),
        ("edge_dg_pad_token_7", dict(pad_token_id=7, vocab_size=50), {}, {}),
    ]:
        c = base(name, dtype="float32")
        c["text"].update(two, **text_over)
        c["text_extra"], c["root_extra"] = text_extra, root_extra
        out.append(c)
    c = draw_case(10_300, family="gemma4", spelling="per_layer_config")
    c["name"] = "edge_gemma4_ple"
    c["text"]["hidden_size_per_layer_input"] = 8
    out.append(c)
    return out


# ----------------------------------------------------------------------------------------------
# Building the checkpoint and the golden logits


def build(case, out_dir):
    """Writes the checkpoint, rewrites config.json as the case says, reloads it with transformers."""
    gen = torch.Generator().manual_seed(case.get("seed", 0))
    text = dict(case["text"])
    torch.manual_seed(case.get("seed", 0))
    if case["family"] == "dg":
        cfg = DiffusionGemmaConfig(text_config=text, vision_config=TINY_VISION, canvas_length=case["canvas_length"])
        model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    elif case["family"] == "gemma4_cg":
        cfg = Gemma4Config(text_config=text, vision_config=TINY_VISION, audio_config=None)
        model = Gemma4ForConditionalGeneration(cfg).eval()
    else:
        cfg = Gemma4TextConfig(**text)
        model = Gemma4ForCausalLM(cfg).eval()
    randomize_(model, gen)
    model = model.to(DTYPES[case["dtype"]])
    shutil.rmtree(out_dir, ignore_errors=True)
    if case.get("shard"):
        model.save_pretrained(out_dir, max_shard_size=case["shard"])
    else:
        model.save_pretrained(out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        j = json.load(f)
    t = j["text_config"] if "text_config" in j else j
    if case["spelling"] == "global_keys" and "full_attention" in t["layer_types"]:
        # The released checkpoints' spelling: full-layer shapes as global_* keys, no per_layer_config.
        t.pop("per_layer_config", None)
        t["global_head_dim"] = text["global_head_dim"]
        if text.get("num_global_key_value_heads") is not None:
            t["num_global_key_value_heads"] = text["num_global_key_value_heads"]
    t.update(case.get("text_extra", {}))
    j.update(case.get("root_extra", {}))
    with open(path, "w") as f:
        json.dump(j, f, indent=2)
    cls = {"dg": DiffusionGemmaForBlockDiffusion, "gemma4": Gemma4ForCausalLM,
           "gemma4_cg": Gemma4ForConditionalGeneration}[case["family"]]
    # The eager experts loop: torch's grouped_mm (the default) rejects odd widths.
    kw = {"attn_implementation": case["attn"]} if case.get("attn") else {}
    ref = cls.from_pretrained(out_dir, dtype=torch.float32, experts_implementation="eager", **kw).eval()
    if case["dtype"] != "float32":
        # transformers keeps embed_scale = sqrt(hidden) in the weights' dtype (53.0, not 53.066, for
        # the released BF16 checkpoint; docs/model.md 2.2): the fp32 reference keeps that rounding.
        with torch.no_grad():
            for mod in ref.modules():
                if hasattr(mod, "scalar_embed_scale") and isinstance(getattr(mod, "embed_scale", None), torch.Tensor):
                    mod.embed_scale.copy_(torch.tensor(mod.scalar_embed_scale).to(DTYPES[case["dtype"]]))
    return ref, j


class window1_fix:
    """transformers' DynamicSlidingWindowLayer keeps `keys[:, :, -sliding_window + 1:]`, which at
    sliding_window 1 is `[0:]`: the whole prefix instead of none of it (the encoder's own mask is
    right, only what the denoiser then sees is wrong). Keeps W - 1 = 0 tokens instead."""

    def __enter__(self):
        self.orig = orig = cache_utils.DynamicSlidingWindowLayer.update

        def update(layer, k, v, *a, **kw):
            out = orig(layer, k, v, *a, **kw)
            if layer.sliding_window == 1 and not layer.record_past:
                layer.keys, layer.values = layer.keys[:, :, :0], layer.values[:, :, :0]
            return out

        cache_utils.DynamicSlidingWindowLayer.update = update
        return self

    def __exit__(self, *exc):
        cache_utils.DynamicSlidingWindowLayer.update = self.orig


def golden(case, model, k, gen, ids=None):
    """Reference logits for prompt k (ids drawn from `gen`, or `ids` from an earlier call)."""
    V = case["text"]["vocab_size"]
    P, C = case["prompts"][k], case["canvases"][k]
    prompt = torch.randint(0, V, (1, P), generator=gen) if ids is None else torch.from_numpy(ids["prompt_ids"])[None]
    out = {"prompt_ids": prompt[0]}
    with torch.no_grad():
        if case["family"] == "dg":
            canvas = (torch.randint(0, V, (1, C), generator=gen) if ids is None
                      else torch.from_numpy(ids["canvas_ids"])[None])
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            with window1_fix():
                out["encoder_logits"] = encoder_pass(model, prompt, cache, 0)
            den = denoise_pass(model, canvas, cache, P)
            # a temperature-scaled previous step, as the sampler feeds it
            sc = den / 0.7 if ids is None else torch.from_numpy(ids["sc_logits"])
            out.update(canvas_ids=canvas[0], denoise_logits=den, sc_logits=sc,
                       denoise_sc_logits=denoise_pass(model, canvas, cache, P, sc))
        else:
            out["encoder_logits"] = model(input_ids=prompt).logits[0].to(torch.float32)
    return {k2: (v.to(torch.float32) if v.dtype in (torch.bfloat16, torch.float16) else v).numpy()
            for k2, v in out.items()}


ULP_RUNS = 8


class router_gap:
    """Within the context, the smallest gap between the k-th and (k+1)-th router probability of any
    token in any MoE layer of `model`, relative to the k-th (`.min`; inf without a router). A gap of
    a few 1e-7 is a coin flip for fp32 rounding: either expert set is a right answer, and the two
    differ by a whole expert's output. Hooks every module whose class name ends in "Router"."""

    def __init__(self, model):
        self.model, self.min, self.handles = model, float("inf"), []

    def __enter__(self):
        for mod in self.model.modules():
            if type(mod).__name__.endswith("Router") and hasattr(mod, "config"):
                self.handles.append(mod.register_forward_hook(self.hook))
        return self

    def hook(self, mod, inputs, out):
        k, probs = mod.config.top_k_experts, out[0]
        if k < probs.shape[-1]:
            top = probs.double().topk(k + 1, dim=-1).values
            self.min = min(self.min, ((top[:, k - 1] - top[:, k]) / top[:, k - 1]).min().item())

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def ulp_perturbed(model, i):
    """A copy whose every parameter is multiplied by 1 + u, |u| <= 2^-23 (about one fp32 ulp)."""
    gen = torch.Generator().manual_seed(1000 + i)
    mp = copy.deepcopy(model)
    with torch.no_grad():
        for p in mp.parameters():
            p.mul_(1 + (torch.rand(p.shape, generator=gen) - 0.5) * 2.0 ** -22)
    return mp


def max_diff(a, b):
    if a.shape != b.shape:
        return float("inf")
    return float("inf") if not np.all(np.isfinite(a)) else float(np.abs(a.astype(np.float64) - b).max())


# ----------------------------------------------------------------------------------------------
# Running dgemma parity


def run_parity(dgemma, ckpt, g, work, precision, with_sc, threads=1):
    out = os.path.join(work, f"parity_{precision}_{int(with_sc)}.safetensors")
    if os.path.exists(out):
        os.remove(out)
    cmd = [dgemma, "parity", "--model", ckpt, "--prompt-ids", ",".join(map(str, g["prompt_ids"].tolist())),
           "--out", out, "--threads", str(threads)]
    if "canvas_ids" in g:
        cmd += ["--canvas-ids", ",".join(map(str, g["canvas_ids"].tolist()))]
    if with_sc:
        sc_path = os.path.join(work, "sc.safetensors")
        save_file({"sc_logits": g["sc_logits"].astype(np.float32)}, sc_path)
        cmd += ["--sc-logits", sc_path]
    if precision != "exact":
        cmd += ["--precision", precision]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    res = {"cmd": cmd, "rc": p.returncode, "stderr": p.stderr.strip()[-2000:]}
    if p.returncode != 0:
        return res
    o = load_file(out)
    res["out"] = o
    res["enc"] = max_diff(o["encoder_logits"], g["encoder_logits"])
    if "canvas_ids" in g:
        res["den"] = max_diff(o["denoise_logits"], g["denoise_sc_logits" if with_sc else "denoise_logits"])
    return res


def summarize_config(case, j):
    t = j["text_config"] if "text_config" in j else j
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "global_head_dim", "num_global_key_value_heads", "per_layer_config",
            "attention_k_eq_v", "layer_types", "sliding_window", "num_experts", "top_k_experts",
            "moe_intermediate_size", "enable_moe_block", "rope_parameters", "final_logit_softcapping",
            "rms_norm_eps", "max_position_embeddings", "use_bidirectional_attention"]
    s = {k: t[k] for k in keys if k in t}
    s["model_type"] = j.get("model_type")
    s["canvas_length"] = j.get("canvas_length")
    s["tie_word_embeddings"] = j.get("tie_word_embeddings")
    s["dtype"] = t.get("dtype", j.get("dtype"))
    return {k: v for k, v in s.items() if v is not None or k == "final_logit_softcapping"}


def run_case(case, args):
    work = os.path.join(args.work, case["name"])
    ckpt = os.path.join(work, "ckpt")
    os.makedirs(work, exist_ok=True)
    rec = {"name": case["name"], "family": case["family"], "dtype": case["dtype"], "spelling": case["spelling"],
           "big": case.get("big", False), "threads": case.get("threads", 1), "shard": case.get("shard"),
           "pattern": case.get("pattern"), "prompts": case["prompts"], "canvases": case["canvases"]}
    t0 = time.time()
    try:
        model, j = build(case, ckpt)
    except Exception as e:  # the reference itself rejects the config: not our bug, but say so
        return reference_rejects(case, rec, e, ckpt, work, args)
    rec["config"] = summarize_config(case, j)
    return compare_with_reference(case, args, model, ckpt, work, rec, t0)


def compare_with_reference(case, args, model, ckpt, work, rec, t0):
    """Golden logits from `model` (fp32 transformers) for every prompt of the case, `dgemma parity` on
    `ckpt` in each precision, and the status (fuzz_quantized.py calls it with the dequantized model
    and the quantized checkpoint). Keeps `work` under WORK/fail_<name> unless ok."""
    gen = torch.Generator().manual_seed(case.get("seed", 0) + 1)
    rec["cases"], worst, worst_fast, spread, worst_vs_f64 = [], 0.0, 0.0, 0.0, 0.0
    # The yardstick for --precision fast: transformers' own bf16 run against its fp32 one.
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16) if args.fast else None
    model_f64, noisy, g64s, gnoisy, router_gaps, min_gap = None, [], {}, {}, {}, float("inf")
    status, failing_cmd = "ok", None
    for k in range(len(case["prompts"])):
        try:
            g = golden(case, model, k, gen)
        except Exception as e:
            return reference_rejects(case, rec, e, ckpt, work, args)
        runs = [("exact", False)] + ([("exact", True)] if "canvas_ids" in g else [])
        if args.fast:
            runs += [("fast", sc) for _, sc in runs]
        row = {"P": case["prompts"][k], "C": case["canvases"][k]}
        if model_bf16 is not None:
            try:
                gb = golden(case, model_bf16, k, None, ids=g)
                row["ref_bf16"] = {n: max_diff(gb[n], g[n]) for n in gb if n.endswith("_logits") and n != "sc_logits"}
                spread = max(spread, *row["ref_bf16"].values())
            except Exception as e:  # informational only
                row["ref_bf16"] = f"{type(e).__name__}: {e}"[:200]
        for precision, sc in runs:
            r = run_parity(args.dgemma, ckpt, g, work, precision, sc, case.get("threads", 1))
            tag = f"{precision}{'_sc' if sc else ''}"
            if r["rc"] != 0:
                # transformers ran this config: a refusal is only fine for a named unsupported feature
                if r["rc"] < 0 or r["rc"] >= 128 or not r["stderr"]:
                    kind = "crash"
                elif "supported" in r["stderr"]:
                    kind = "refused"
                else:
                    kind = "error"  # an error message, but not a named unsupported feature
                rec.update(status=kind, rc=r["rc"], message=r["stderr"],
                           cmd=" ".join(r["cmd"]))
                keep(work, rec, args)
                return rec
            m = max(r["enc"], r.get("den", 0.0))
            row[tag] = {"enc": r["enc"], "den": r.get("den")}
            if precision == "exact":
                worst = max(worst, m)
                if m > args.tol:
                    # Over tolerance: ask an fp64 run of the same reference who is off, and how far fp32
                    # rounding alone can land from it (fp32 runs with every weight perturbed by up to
                    # one ulp). Within 1.5x that envelope, the gap is fp32 rounding amplified by an
                    # ill-conditioned random net (often a near-tie in the top-k router), not a bug.
                    if model_f64 is None:
                        model_f64 = copy.deepcopy(model).to(torch.float64)
                        noisy = [ulp_perturbed(model, i) for i in range(ULP_RUNS)]
                    if k not in g64s:
                        with router_gap(model_f64) as gap:
                            g64s[k] = golden(case, model_f64, k, None, ids=g)
                        router_gaps[k] = gap.min
                        gnoisy[k] = [golden(case, mp, k, None, ids=g) for mp in noisy]
                    g64 = g64s[k]
                    den_key = "denoise_sc_logits" if sc else "denoise_logits"
                    pairs = [("encoder_logits", "encoder_logits")]
                    if "den" in r:
                        pairs.append((den_key, "denoise_logits"))
                    ours = max(max_diff(r["out"][o_key], g64[g_key]) for g_key, o_key in pairs)
                    theirs = max(max_diff(g[g_key], g64[g_key]) for g_key, _ in pairs)
                    envelope = max(max_diff(gn[g_key], g64[g_key]) for gn in gnoisy[k] for g_key, _ in pairs)
                    row[tag]["fp64"] = {"dgemma": ours, "transformers_fp32": theirs, "fp32_ulp_envelope": envelope,
                                        "router_min_relative_gap": router_gaps[k]}
                    min_gap = min(min_gap, router_gaps[k])
                    worst_vs_f64 = max(worst_vs_f64, ours)
                    if ours > max(args.tol, 1.5 * max(theirs, envelope)):
                        if status != "mismatch":
                            failing_cmd = " ".join(r["cmd"])
                        status = "mismatch"
                    elif status == "ok":
                        failing_cmd, status = " ".join(r["cmd"]), "fp32_noise"
            else:
                worst_fast = max(worst_fast, m)
        rec["cases"].append(row)
        if status == "mismatch":
            np.savez(os.path.join(work, f"golden_case{k}.npz"), **g)
            break
    rec.update(status=status, worst_exact=worst, worst_fast=worst_fast if args.fast else None,
               worst_exact_vs_fp64=worst_vs_f64 if model_f64 is not None else None,
               router_min_relative_gap=min_gap if min_gap != float("inf") else None,
               ref_bf16_spread=spread if args.fast else None,
               seconds=round(time.time() - t0, 2))
    if status != "ok":
        rec["cmd"] = failing_cmd
        keep(work, rec, args)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return rec


def reference_rejects(case, rec, e, ckpt, work, args):
    """transformers cannot build or run the config: record that, and what dgemma says to it."""
    rec.update(status="reference_rejects", error=f"{type(e).__name__}: {e}"[:500])
    if os.path.exists(os.path.join(ckpt, "config.json")):
        cmd = [args.dgemma, "parity", "--model", ckpt, "--prompt-ids", "0",
               "--out", os.path.join(work, "o.safetensors"), "--threads", "1"]
        if case["family"] == "dg":
            cmd += ["--canvas-ids", "0"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        rec["ours"] = {"rc": p.returncode, "message": p.stderr.strip()[-1000:]}
    shutil.rmtree(work, ignore_errors=True)
    return rec


def keep(work, rec, args):
    dst = os.path.join(args.work, "fail_" + rec["name"])
    shutil.rmtree(dst, ignore_errors=True)
    shutil.move(work, dst)
    for key in ("cmd",):
        if rec.get(key):
            rec[key] = rec[key].replace(work, dst)
    rec["kept"] = dst


def line(rec):
    s = f"{rec['name']:<36} {rec['family']:<6} {rec['dtype']:<8} {rec['status']:<18}"
    if rec["status"] in ("ok", "mismatch", "fp32_noise"):
        s += f" exact {rec['worst_exact']:.3g}"
        if rec.get("worst_exact_vs_fp64") is not None:
            s += f" (vs fp64 {rec['worst_exact_vs_fp64']:.3g})"
        if rec.get("router_min_relative_gap") is not None:
            s += f" router gap {rec['router_min_relative_gap']:.2g}"
        if rec.get("worst_fast") is not None:
            s += f"  fast {rec['worst_fast']:.3g} (transformers bf16: {rec['ref_bf16_spread']:.3g})"
    elif rec["status"] == "reference_rejects":
        s += " " + rec["error"].splitlines()[0][:120]
        if "ours" in rec:
            s += f" | dgemma rc {rec['ours']['rc']}: " + (rec["ours"]["message"].splitlines() or [""])[-1][:160]
    else:
        s += " " + rec["message"].splitlines()[-1][:160] if rec.get("message") else ""
    return s


def fuzz_arguments(doc, work, minutes):
    """The command line both fuzzers share (fuzz_quantized.py adds its own flags)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dgemma", required=True)
    ap.add_argument("--seeds", type=int, default=50, help="random configs to try (stops early at --minutes)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--only-seed", default=None, help="comma-separated seeds to rerun (ignores --seeds)")
    ap.add_argument("--minutes", type=float, default=minutes, help="wall-time budget for the random seeds")
    ap.add_argument("--tol", type=float, default=1e-3, help="max |diff| on logits (exact precision)")
    ap.add_argument("--work", default=work)
    return ap


def start_run(args):
    """Quiet single-threaded torch, WORK created; returns the results.jsonl log (appended to), the
    seeds to draw and the wall-time deadline."""
    args.dgemma = os.path.abspath(args.dgemma)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.makedirs(args.work, exist_ok=True)
    log = open(os.path.join(args.work, "results.jsonl"), "a")
    seeds = ([int(x) for x in args.only_seed.split(",")] if args.only_seed is not None
             else range(args.first_seed, args.first_seed + args.seeds))
    return log, seeds, time.time() + args.minutes * 60


def main():
    ap = fuzz_arguments(__doc__, "/tmp/dg_fuzz", 60.0)
    ap.add_argument("--fast", action="store_true", help="also run --precision fast (informational)")
    ap.add_argument("--edge", action="store_true", help="also run the hand-picked edge_cases()")
    args = ap.parse_args()
    log, seeds, t_end = start_run(args)
    cases = []
    counts = {}

    def go(case):
        try:
            rec = run_case(case, args)
        except Exception:
            rec = {"name": case["name"], "family": case["family"], "dtype": case["dtype"], "status": "harness_error",
                   "message": traceback.format_exc()}
        if os.environ.get("DG_CPU_ISA") and isinstance(rec.get("cmd"), str):  # rerun it on the same kernels
            rec["cmd"] = f"DG_CPU_ISA={os.environ['DG_CPU_ISA']} " + rec["cmd"]
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(line(rec), flush=True)
        return rec

    if args.edge:
        for case in edge_cases():
            cases.append(go(case))
    for seed in seeds:
        if time.time() > t_end:
            break
        cases.append(go(draw_case(seed)))
    print("totals:", json.dumps(counts))
    ok = [c for c in cases if c["status"] in ("ok", "mismatch", "fp32_noise")]
    if ok:
        w = max(ok, key=lambda c: c["worst_exact"])
        print(f"worst exact max|diff| {w['worst_exact']:.3g} ({w['name']})")
        if args.fast:
            wf = max(ok, key=lambda c: c["worst_fast"] or 0.0)
            print(f"worst fast max|diff| {wf['worst_fast']:.3g} ({wf['name']})")
    bad = [c for c in cases if c["status"] in ("mismatch", "crash", "error", "harness_error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
