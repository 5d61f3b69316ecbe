#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The same measurements as bench_cpu.cpp, through transformers (torch float32 or bfloat16 with
--dtype, inference mode, the same thread count), printed as one JSON object. The denoise step is transformers' own
`_denoising_step` (decoder forward, temperature, softmax, multinomial, argmax, entropy-bound
acceptance, renoise, stopping criteria, self-conditioning logits)."""
import argparse
import copy
import json
import resource
import statistics
import time

import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg_gen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--canvases", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="torch dtype of the model (weights and activations)")
    args = ap.parse_args()
    want = lambda what: not args.only or what in args.only
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    t = time.perf_counter()
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.model, dtype=dtype).eval()
    out = {"model": args.model, "threads": torch.get_num_threads(), "dtype": args.dtype,
           "load_seconds": time.perf_counter() - t}
    cfg = model.config
    V, C, P = cfg.text_config.vocab_size, cfg.canvas_length, args.prompt
    prompt = (torch.arange(P) * 7919 + 17).remainder(V).unsqueeze(0)
    canvas = (torch.arange(C) * 104729 + 3).remainder(V).unsqueeze(0)

    def prefill():
        cache = DynamicCache(config=cfg.get_text_config(decoder=True))
        pos = torch.arange(P, dtype=torch.int32).unsqueeze(0)
        attn = torch.ones((1, P), dtype=torch.bool)
        masks = model.model.encoder.create_masks_for_generate(
            config=cfg, inputs_embeds=torch.empty((1, P, 0)), attention_mask=attn, cache=cache, position_ids=pos)
        model.model.encoder(input_ids=prompt, attention_mask=masks, cache=cache, position_ids=pos)
        return cache

    with torch.inference_mode():
        times = []
        for _ in range(args.repeats if want("prefill") else 1):
            t = time.perf_counter()
            cache = prefill()
            times.append(time.perf_counter() - t)
        if want("prefill"):
            out["prefill_seconds"] = statistics.median(times)
        if want("step"):
            gc = model._prepare_generation_config(None, max_denoising_steps=48)[0]
            sampler = model._prepare_sampler(gc)
            processors = model._prepare_logits_processor(gc, None)
            stopping = model._prepare_diffusion_stopping_criteria(gc)
            dec_pos = torch.arange(P, P + C, dtype=torch.int32).unsqueeze(0)
            dec_mask = torch.ones((1, P + C), dtype=torch.bool)
            masks = model.model.decoder.create_diffusion_decoder_attention_mask(
                config=cfg, inputs_embeds=canvas.unsqueeze(-1), cache=cache, decoder_attention_mask=dec_mask)
            sc = torch.full((1, C, V), 0.01, dtype=dtype)
            times = []
            for r in range(args.repeats + 1):
                t = time.perf_counter()
                model._denoising_step(decoder_forward=model.forward, current_canvas=canvas, argmax_canvas=canvas,
                                      input_ids=prompt, decoder_position_ids=dec_pos, self_conditioning_logits=sc,
                                      mask_mapping=masks, cache=cache, finished_denoising=torch.zeros(1, dtype=torch.bool),
                                      cur_step=48 - r, sampler=sampler, logits_processor=processors,
                                      diffusion_stopping_criteria=stopping)
                if r:
                    times.append(time.perf_counter() - t)
            out["step_seconds"] = statistics.median(times)
        if want("commit"):
            times = []
            for _ in range(args.repeats):
                c2 = copy.deepcopy(cache)
                pos = torch.arange(P, P + C, dtype=torch.int32).unsqueeze(0)
                attn = torch.ones((1, P + C), dtype=torch.bool)
                t = time.perf_counter()
                masks = model.model.encoder.create_masks_for_generate(
                    config=cfg, inputs_embeds=torch.empty((1, C, 0)), attention_mask=attn, cache=c2, position_ids=pos)
                model.model.encoder(input_ids=canvas, attention_mask=masks, cache=c2, position_ids=pos)
                times.append(time.perf_counter() - t)
            out["commit_seconds"] = statistics.median(times)
        if want("generate"):
            t = time.perf_counter()
            res = model.generate(prompt, max_new_tokens=args.canvases * C, max_denoising_steps=args.steps,
                                 confidence_threshold=1e-30, stability_threshold=1, eos_token_id=[V + 1], pad_token_id=0)
            secs = time.perf_counter() - t
            n = res.sequences.shape[1] - P
            out["generate_steps_per_canvas"] = args.steps
            out["generate_canvases"] = args.canvases
            out["generate_seconds"] = secs
            out["generate_tokens"] = n
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
