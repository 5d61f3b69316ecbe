#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Golden fixtures for diffusion_gemma, produced by the Hugging Face transformers reference.

Regenerate everything the C++ tests read (from the repository root):

    tools/reference/setup.sh                       # once: creates tools/reference/.venv
    tools/reference/.venv/bin/python tools/reference/make_fixtures.py --out tests/fixtures

Each fixture directory holds a checkpoint written by `save_pretrained` (config.json,
generation_config.json, model.safetensors) and:
  - golden.safetensors: F32 logits and I64 ids for the backbone tests (see `backbone_cases`);
  - replay/<run>.draws.safetensors + replay/<run>.json: transformers' `generate` with every
    random draw recorded (canvas init, the multinomial sample at each step, the renoise tokens
    at each step) and the tokens / steps / stop reasons it produced (see `replay_runs`).

transformers initialises every norm weight, layer_scalar, router.scale and per_expert_scale to
exactly 1, which would hide bugs in how they are applied, so every parameter and buffer is
randomised before saving (the encoder's layer_scalar copies equal the decoder's).

`--seed N --only NAME --out DIR` builds one checkpoint with a different seed: that is how a
checkpoint the tests never saw is made for `dgemma parity` (see tools/reference/README.md).
"""

import argparse
import json
import math
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DynamicCache,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
)
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg_gen

TINY_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "intermediate_size": 8,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 8,
}

# name -> (text_config kwargs, canvas_length). Shapes cover: head dims and KV heads that differ
# between sliding and full layers, k_eq_v full layers, odd sizes, canvases longer than the
# sliding window, several experts per token.
DG_FIXTURES = {
    "dg_small": (
        dict(vocab_size=131, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=24,
             num_global_key_value_heads=1, sliding_window=6,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             num_experts=5, top_k_experts=2, moe_intermediate_size=20, max_position_embeddings=256),
        8,
    ),
    "dg_wide": (
        dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=8, num_key_value_heads=4, head_dim=16, global_head_dim=32,
             num_global_key_value_heads=2, sliding_window=5,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"],
             num_experts=8, top_k_experts=3, moe_intermediate_size=24, max_position_embeddings=512),
        12,
    ),
}

# A plain Gemma 4 text model with the MoE block off and v_proj on full layers (k_eq_v false):
# the "MoE off" backbone, run in encoder mode only.
GEMMA4_FIXTURES = {
    "gemma4_dense": dict(
        vocab_size=97, hidden_size=40, intermediate_size=72, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=10, global_head_dim=20,
        num_global_key_value_heads=2, sliding_window=4, attention_k_eq_v=False,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        enable_moe_block=False, hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
        max_position_embeddings=128),
}


# Matrices get std GAIN / sqrt(fan_in). At gain 1 these random networks are chaotic under
# self-conditioning: a 1e-5 perturbation of the SC logits changes almost every generated token
# inside transformers itself, so no fp32 implementation could replay them exactly. At 0.5 they
# are not (replay_runs checks it for every recorded run).
GAIN = 0.5


def randomize_(model, gen):
    """Every parameter and buffer gets a random value of a sensible scale."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name:
                continue
            if p.ndim == 1:  # norm weights, router.scale, per_expert_scale
                p.copy_(torch.empty_like(p).uniform_(0.6, 1.4, generator=gen))
            else:
                fan_in = p.shape[-1]
                gain = 1.0 if "embed_tokens" in name else GAIN
                p.copy_(torch.randn(p.shape, generator=gen) * (gain / math.sqrt(fan_in)))
        scalars = {}
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar") and "encoder" not in name:
                b.copy_(torch.empty_like(b).uniform_(0.5, 1.5, generator=gen))
                scalars[name.split("layers.")[1]] = b.clone()
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar") and "encoder" in name:
                b.copy_(scalars[name.split("layers.")[1]])


def softcapped(logits, cap):
    logits = logits.to(torch.float32)
    return torch.tanh(logits / cap) * cap if cap else logits


def encoder_pass(model, ids, cache, pos0):
    """The encoder exactly as `generate` calls it: causal over new tokens, appends to `cache`."""
    pos = torch.arange(pos0, pos0 + ids.shape[1], dtype=torch.int32).unsqueeze(0)
    attn = torch.ones((1, pos0 + ids.shape[1]), dtype=torch.bool)
    dummy = torch.empty((1, ids.shape[1], 0), dtype=model.dtype)
    masks = model.model.encoder.create_masks_for_generate(
        config=model.config, inputs_embeds=dummy, attention_mask=attn, cache=cache, position_ids=pos)
    out = model.model.encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=pos)
    hidden = out.last_hidden_state
    return softcapped(model.lm_head(hidden), model.final_logit_softcapping)[0]


def denoise_pass(model, canvas, cache, pos0, sc_logits=None):
    pos = torch.arange(pos0, pos0 + canvas.shape[1], dtype=torch.int32).unsqueeze(0)
    out = model(decoder_input_ids=canvas, cache=cache, decoder_position_ids=pos,
                self_conditioning_logits=None if sc_logits is None else sc_logits.unsqueeze(0))
    return out.logits[0].to(torch.float32)


def backbone_cases(model, canvas_length, gen):
    """Golden logits: encoder over a prompt; denoiser with and without self-conditioning; a commit;
    a second canvas after it. One case with the prompt shorter than the sliding window, one
    longer, one of a single token."""
    V = model.config.text_config.vocab_size
    W = model.config.text_config.sliding_window
    out = {}
    for k, P in enumerate([max(1, W - 2), 2 * W + 3, 1]):
        prompt = torch.randint(0, V, (1, P), generator=gen)
        canvas = torch.randint(0, V, (1, canvas_length), generator=gen)
        commit = torch.randint(0, V, (1, canvas_length), generator=gen)
        canvas2 = torch.randint(0, V, (1, canvas_length), generator=gen)
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        enc = encoder_pass(model, prompt, cache, 0)
        den = denoise_pass(model, canvas, cache, P)
        sc = den / 0.7  # a temperature-scaled previous step, as the sampler feeds it
        den_sc = denoise_pass(model, canvas, cache, P, sc)
        commit_logits = encoder_pass(model, commit, cache, P)
        den2 = denoise_pass(model, canvas2, cache, P + canvas_length)
        c = f"case{k}."
        out.update({
            c + "prompt_ids": prompt[0], c + "encoder_logits": enc, c + "canvas_ids": canvas[0],
            c + "denoise_logits": den, c + "sc_logits": sc, c + "denoise_sc_logits": den_sc,
            c + "commit_ids": commit[0], c + "commit_logits": commit_logits, c + "canvas2_ids": canvas2[0],
            c + "denoise2_logits": den2,
        })
    return out


class DrawRecorder:
    """Records every random draw `generate` makes, by wrapping the three places it draws."""

    def __init__(self):
        self.canvases = []  # each: {"init": tensor, "samples": [...], "renoise": [...], "stops": [...]}
        self.in_renoise = False

    def install(self):
        rec = self
        self._orig = (dg_gen.EntropyBoundSampler.initialize_canvas, dg_gen.EntropyBoundSampler.renoise_canvas,
                      torch.multinomial, dg_gen.StableAndConfidentStoppingCriteria.__call__)
        orig_init, orig_renoise, orig_mn, orig_stop = self._orig

        def init(self_, batch_size, device):
            out = orig_init(self_, batch_size, device)
            if rec.in_renoise:
                rec.canvases[-1]["renoise"].append(out[0].clone())
            else:
                rec.canvases.append({"init": out[0].clone(), "samples": [], "renoise": [], "stops": []})
            return out

        def renoise(self_, accepted, cur_step):
            rec.in_renoise = True
            try:
                return orig_renoise(self_, accepted, cur_step)
            finally:
                rec.in_renoise = False

        def multinomial(probs, num_samples, *a, **kw):
            out = orig_mn(probs, num_samples, *a, **kw)
            rec.canvases[-1]["samples"].append(out.view(-1).clone())
            return out

        def stop(self_, argmax_canvas, logits, **kw):
            out = orig_stop(self_, argmax_canvas, logits, **kw)
            rec.canvases[-1]["stops"].append(bool(out[0]))
            return out

        dg_gen.EntropyBoundSampler.initialize_canvas = init
        dg_gen.EntropyBoundSampler.renoise_canvas = renoise
        torch.multinomial = multinomial
        dg_gen.StableAndConfidentStoppingCriteria.__call__ = stop

    def uninstall(self):
        (dg_gen.EntropyBoundSampler.initialize_canvas, dg_gen.EntropyBoundSampler.renoise_canvas,
         torch.multinomial, dg_gen.StableAndConfidentStoppingCriteria.__call__) = self._orig


class SCPerturbation:
    """Adds N(0, eps^2) noise (from its own generator) to the self-conditioning logits."""

    def __init__(self, eps):
        self.eps = eps
        self.gen = torch.Generator().manual_seed(5)

    def __enter__(self):
        from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg
        self.mdg = mdg
        self.orig = mdg.DiffusionGemmaDecoderModel.forward
        outer = self

        def forward(self_, *a, **kw):
            sc = kw.get("self_conditioning_logits")
            if sc is not None:
                kw["self_conditioning_logits"] = sc + outer.eps * torch.randn(sc.shape, generator=outer.gen)
            return outer.orig(self_, *a, **kw)

        mdg.DiffusionGemmaDecoderModel.forward = forward
        return self

    def __exit__(self, *exc):
        self.mdg.DiffusionGemmaDecoderModel.forward = self.orig


def run_generate(model, prompt, seed, settings, check_robust=True):
    if check_robust:
        # A run is only a parity fixture if fp32-level noise cannot change its outcome.
        with SCPerturbation(1e-5):
            perturbed = run_generate(model, prompt, seed, settings, check_robust=False)
        plain = run_generate(model, prompt, seed, settings, check_robust=False)
        if perturbed[:3] != plain[:3]:
            raise SystemExit(f"fixture run is chaotic: 1e-5 noise on the SC logits changes its outcome")
        return plain
    torch.manual_seed(seed)
    rec = DrawRecorder()
    rec.install()
    try:
        out = model.generate(prompt, **settings)
    finally:
        rec.uninstall()
    P = prompt.shape[1]
    tokens = out.sequences[0, P:].tolist()
    steps = [len(c["samples"]) for c in rec.canvases]
    stop = ["converged" if c["stops"] and c["stops"][-1] else "max_steps" for c in rec.canvases]
    return tokens, steps, stop, rec


def write_replay(path_base, prompt, settings, tokens, steps, stop, rec):
    tensors = {"prompt_ids": prompt[0].to(torch.int64).contiguous()}
    for b, c in enumerate(rec.canvases):
        tensors[f"canvas.{b}.init"] = c["init"].to(torch.int64).contiguous()
        for s, (smp, ren) in enumerate(zip(c["samples"], c["renoise"])):
            tensors[f"canvas.{b}.step.{s}.sample"] = smp.to(torch.int64).contiguous()
            tensors[f"canvas.{b}.step.{s}.renoise"] = ren.to(torch.int64).contiguous()
    save_file(tensors, path_base + ".draws.safetensors")
    expected = {"settings": settings, "tokens": tokens, "steps": steps, "stop": stop}
    with open(path_base + ".json", "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


def replay_runs(model, out_dir, gen, confident):
    """transformers' generate with every draw recorded. On the plain checkpoint (high entropy, the
    stop rule never fires with default thresholds): several canvases, a prompt longer than the
    window, other sampler settings, a stop id inside a canvas. On the confident checkpoint: the
    stable-and-confident stop really fires, after a varying number of steps."""
    V = model.config.text_config.vocab_size
    C = model.config.canvas_length
    W = model.config.text_config.sliding_window
    os.makedirs(os.path.join(out_dir, "replay"), exist_ok=True)
    base = dict(max_denoising_steps=10, t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.005,
                sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
                eos_token_id=[V + 5], pad_token_id=0)  # an id that never occurs: no stop by default
    if confident:
        runs = [("converge", 3, dict(base, max_new_tokens=2 * C, max_denoising_steps=24)),
                ("converge_long_prompt", 2 * W + 1, dict(base, max_new_tokens=C, max_denoising_steps=24)),
                ("converge_stab2", 4, dict(base, max_new_tokens=2 * C, max_denoising_steps=24, stability_threshold=2)),
                ("stab0_bound", 4, dict(base, max_new_tokens=C, max_denoising_steps=24, stability_threshold=0,
                                        confidence_threshold=0.05,
                                        sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.7}))]
    else:
        runs = [("default_short", 3, dict(base, max_new_tokens=2 * C)),
                ("long_prompt", 3 * W, dict(base, max_new_tokens=3 * C - 1, max_denoising_steps=6, t_min=0.5, t_max=1.1)),
                ("wide_bound", 4, dict(base, max_new_tokens=C, confidence_threshold=0.5,
                                       sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 2.5}))]
    results = []
    for i, (run, P, settings) in enumerate(runs):
        prompt = torch.randint(0, V, (1, P), generator=gen)
        seed = 1000 + i
        tokens, steps, stop, rec = run_generate(model, prompt, seed, with_sampler(settings))
        write_replay(os.path.join(out_dir, "replay", run), prompt, settings, tokens, steps, stop, rec)
        results.append((run, steps, stop, tokens))
        if run == "default_short":
            # Rerun with a stop id that the first canvas produces mid-way (not at position 0), so
            # the stop rule and the PAD fill are exercised on real output.
            stop_token = next(t for t in tokens[C // 2:C] if t not in tokens[:C // 2])
            stop_settings = dict(settings, eos_token_id=[V + 5, stop_token])
            t2, s2, st2, rec2 = run_generate(model, prompt, seed, with_sampler(stop_settings))
            write_replay(os.path.join(out_dir, "replay", "stop_id"), prompt, stop_settings, t2, s2, st2, rec2)
            results.append(("stop_id", s2, st2, t2))
            if not confident:
                results += generation_config_runs(model, out_dir, prompt, seed, settings, stop_settings)
    return results


def generation_config_runs(model, out_dir, prompt, seed, settings, stop_settings):
    """default_short's prompt and seed under the generation-config keys whose absence or presence
    changes the output (no draw from `gen`, so the other runs are unchanged):
      no_pad: a stop id mid-canvas without pad_token_id: the tokens after it stay;
      no_eos: no eos_token_id (and no PAD), as without generation_config.json: nothing stops;
      max_length_budget: max_length with max_new_tokens at its default 256: the budget is
        max_length - prompt length (C + 3 tokens: two canvases);
      max_length_stop: max_length with an explicit max_new_tokens of 4 canvases: generation stops
        after the canvas that reaches max_length (the second)."""
    C = model.config.canvas_length
    P = prompt.shape[1]
    runs = [("no_pad", dict(stop_settings, pad_token_id=None)),
            ("no_eos", dict(settings, eos_token_id=None, pad_token_id=None)),
            ("max_length_budget", dict(settings, max_new_tokens=256, max_length=P + C + 3)),
            ("max_length_stop", dict(settings, max_new_tokens=4 * C, max_length=P + C + 1))]
    results = []
    for run, run_settings in runs:
        tokens, steps, stop, rec = run_generate(model, prompt, seed, with_sampler(run_settings))
        write_replay(os.path.join(out_dir, "replay", run), prompt, run_settings, tokens, steps, stop, rec)
        results.append((run, steps, stop, tokens))
    return results


def with_sampler(settings):
    s = dict(settings)
    s["sampler_config"] = dg_gen.EntropyBoundSamplerConfig(settings["sampler_config"]["entropy_bound"])
    return s


CONFIDENT_TOP = float(os.environ.get("DG_CONFIDENT_TOP", "3.5"))


def make_confident(model, gen):
    """A checkpoint whose denoiser becomes confident within a few steps, so that the stop rule
    fires: embedding coordinate 0 is large for every token (it dominates the residual stream, so
    the output barely depends on the canvas) and largest for one token, and the final norm keeps
    mostly that coordinate. Entropy then falls step by step as the temperature anneals."""
    with torch.no_grad():
        E = model.model.decoder.embed_tokens.weight
        V = E.shape[0]
        E[:, 0] = torch.empty(V).uniform_(0.9, 1.1, generator=gen)
        E[int(torch.randint(0, V, (1,), generator=gen)), 0] = CONFIDENT_TOP
        w = model.model.decoder.norm.weight
        w.mul_(0.05)
        w[0] = 1.0


def build_dg(name, seed, out_root, with_replay=True):
    text_kwargs, canvas = DG_FIXTURES[name]
    gen = torch.Generator().manual_seed(seed)
    cfg = DiffusionGemmaConfig(text_config=dict(text_kwargs), vision_config=TINY_VISION, canvas_length=canvas)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    randomize_(model, gen)
    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    write_generation_config(out_dir)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(out_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        golden = backbone_cases(model, canvas, gen)
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(out_dir, "golden.safetensors"))
    summary = {"name": name, "seed": seed}
    if with_replay:
        with torch.no_grad():
            summary["replay_plain"] = replay_runs(model, out_dir, gen, confident=False)
        # A confident sibling checkpoint, so that early stopping is exercised.
        conf_dir = out_dir + "_confident"
        make_confident(model, gen)
        shutil.rmtree(conf_dir, ignore_errors=True)
        model.save_pretrained(conf_dir)
        write_generation_config(conf_dir)
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(conf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            summary["replay"] = replay_runs(model, conf_dir, gen, confident=True)
    return summary


def write_generation_config(out_dir):
    # Explicit values, so that a reader never depends on anybody's defaults.
    g = {"max_new_tokens": 256, "max_denoising_steps": 48,
         "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
         "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
         "eos_token_id": [1, 106, 50], "pad_token_id": 0, "return_dict_in_generate": True}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(g, f, indent=2)
        f.write("\n")


def build_gemma4(name, seed, out_root):
    gen = torch.Generator().manual_seed(seed)
    cfg = Gemma4TextConfig(**GEMMA4_FIXTURES[name])
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(cfg).eval()
    randomize_(model, gen)
    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    model = Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    V, W = cfg.vocab_size, cfg.sliding_window
    golden = {}
    with torch.no_grad():
        for k, (P1, P2) in enumerate([(3, 0), (2 * W + 1, W + 2)]):
            ids = torch.randint(0, V, (1, P1 + P2), generator=gen)
            full = model(input_ids=ids).logits[0].to(torch.float32)
            golden[f"case{k}.prompt_ids"] = ids[0]
            golden[f"case{k}.encoder_logits"] = full
            if P2:
                # The same tokens in two encoder calls through a cache must give the same logits.
                cache = DynamicCache(config=cfg)
                a = model(input_ids=ids[:, :P1], cache=cache, use_cache=True).logits[0]
                b = model(input_ids=ids[:, P1:], cache=cache, use_cache=True).logits[0]
                golden[f"case{k}.split"] = torch.tensor([P1], dtype=torch.int64)
                golden[f"case{k}.chunked_logits"] = torch.cat([a, b]).to(torch.float32)
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(out_dir, "golden.safetensors"))
    return {"name": name, "seed": seed}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--seed", type=int, default=None, help="override every fixture's seed")
    ap.add_argument("--only", default=None, help="build one fixture by name")
    ap.add_argument("--no-replay", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seeds = {"dg_small": 11, "dg_wide": 12, "gemma4_dense": 13}
    for name in list(DG_FIXTURES) + list(GEMMA4_FIXTURES):
        if args.only and name != args.only:
            continue
        seed = args.seed if args.seed is not None else seeds[name]
        if name in DG_FIXTURES:
            s = build_dg(name, seed, args.out, with_replay=not args.no_replay)
        else:
            s = build_gemma4(name, seed, args.out)
        for key in ("replay", "replay_plain"):
            for run, steps, stop, tokens in s.get(key, []):
                print(f"{name} {key} {run}: steps {steps} stop {stop} first tokens {tokens[:8]}")
        print(f"wrote {name} (seed {seed})")


if __name__ == "__main__":
    main()
