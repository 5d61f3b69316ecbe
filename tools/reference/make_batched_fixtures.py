#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Batched replay fixtures: transformers' DiffusionGemma `generate` on a left-padded batch.

Regenerate (from the repository root, after tools/reference/setup.sh and make_fixtures.py, whose
checkpoints these runs use unchanged):

    tools/reference/.venv/bin/python tools/reference/make_batched_fixtures.py --fixtures tests/fixtures

For every run it writes, under tests/fixtures/<ckpt>/replay_batch/:
  - <run>.row<i>.draws.safetensors, one per batch row, in exactly the single-run draws format
    (`io::load_draws`, `dgemma replay`): `prompt_ids` is that row's UNPADDED prompt, and
    `canvas.{b}.init` / `canvas.{b}.step.{s}.sample` / `canvas.{b}.step.{s}.renoise` are row i of
    the [B, C] tensors transformers drew for the whole batch. Only the steps the row itself ran are
    stored (s < steps[b]) and only the canvases up to the one in which it produced a stop id:
    ReplayRng reads draws by name (canvas, step), so a row that converged at step s of canvas b
    reads canvas b+1's draws next, whatever the batch drew for it while it was frozen; a replay
    that runs a row past its recorded steps fails with "ran out of recorded draws".
  - <run>.json: `settings` (the keys of the single-run fixtures), `left_pad_token_id`, `prompts`
    (unpadded), `sequences` (transformers' output [B, L], left padding included) and `rows`, one
    object per row: `tokens` (sequences[i] after the padded prompt), `steps` / `stop` (per canvas the
    row ran: denoising steps up to and including the one where its stable-and-confident stop fired,
    "converged", or all max_denoising_steps, "max_steps"), `forwards` (the denoiser passes counted
    for the row: the sum of `steps`), `tokens_per_forward` (non-PAD tokens / forwards as an exact
    double; transformers computes it in float32, and the script checks that this value rounds to
    transformers' own), `finished_canvas` (the canvas in which the row produced a stop id, -1 if
    none).

Per-row steps are measured, not inferred: `_denoising_step` is wrapped to read each row's
`finished_denoising` before and after every step, `_finalize_canvas` to read `finished_sequences`
after every canvas. The script refuses a run unless
  - the row steps it measured reproduce transformers' own `tokens_per_forward` for every row;
  - each row, run alone through transformers' single-sequence `generate` with its recorded draws
    played back (prompt unpadded, positions 0..P-1), gives the same tokens, steps and stops as in
    the batch (so the fixture asks for exactly what `Decoder::generate` does for the row alone);
  - 1e-5 noise on the self-conditioning logits does not change the outcome (as make_fixtures.py);
  - the run shows what it is meant to exercise (early convergence next to a row that goes on;
    a stop id in one or two rows while another goes on).
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg_gen

from make_fixtures import SCPerturbation  # N(0, eps^2) on the self-conditioning logits, own generator

Mixin = dg_gen.DiffusionGemmaGenerationMixin
Sampler = dg_gen.EntropyBoundSampler


class BatchRecorder:
    """Records every draw of a batched generate (whole [B, C] tensors) and, per step, which rows
    had finished denoising before and after it; per canvas, which rows have finished."""

    def __init__(self):
        self.canvases = []  # {"init": [B,C], "sample": [[B,C]...], "renoise": [...], "before": [[B]...], "after": [...]}
        self.finished = []  # per canvas: finished_sequences [B] after _finalize_canvas
        self._in_renoise = False

    def __enter__(self):
        rec = self
        self._orig = (Sampler.initialize_canvas, Sampler.renoise_canvas, torch.multinomial,
                      Mixin._denoising_step, Mixin.__dict__["_finalize_canvas"])
        o_init, o_renoise, o_mn, o_step, o_final = self._orig

        def init(self_, batch_size, device):
            out = o_init(self_, batch_size, device)
            if rec._in_renoise:
                rec.canvases[-1]["renoise"].append(out.clone())
            else:
                rec.canvases.append({"init": out.clone(), "sample": [], "renoise": [], "before": [], "after": []})
            return out

        def renoise(self_, accepted, cur_step):
            rec._in_renoise = True
            try:
                return o_renoise(self_, accepted, cur_step)
            finally:
                rec._in_renoise = False

        def multinomial(probs, num_samples, *a, **kw):
            out = o_mn(probs, num_samples, *a, **kw)
            B = rec.canvases[-1]["init"].shape[0]
            rec.canvases[-1]["sample"].append(out.view(B, -1).clone())
            return out

        def step(self_, *a, **kw):
            # `finished_denoising` is updated in place (|=): copy it before the call.
            rec.canvases[-1]["before"].append(kw["finished_denoising"].clone())
            out = o_step(self_, *a, **kw)
            rec.canvases[-1]["after"].append(out[3].clone())
            return out

        def finalize(*a, **kw):
            out = o_final.__func__(*a, **kw)
            rec.finished.append(out[1].clone())
            return out

        Sampler.initialize_canvas = init
        Sampler.renoise_canvas = renoise
        torch.multinomial = multinomial
        Mixin._denoising_step = step
        Mixin._finalize_canvas = staticmethod(finalize)
        return self

    def __exit__(self, *exc):
        (Sampler.initialize_canvas, Sampler.renoise_canvas, torch.multinomial, Mixin._denoising_step,
         Mixin._finalize_canvas) = self._orig


class RowReplay:
    """Makes transformers' single-sequence generate play back one row's recorded draws."""

    def __init__(self, row_draws):
        self.d = row_draws  # per canvas: {"init": [C], "sample": [[C]...], "renoise": [[C]...]}
        self.b = -1
        self.s = -1
        self.steps = []  # steps run per canvas
        self._in_renoise = False

    def __enter__(self):
        rr = self
        self._orig = (Sampler.initialize_canvas, Sampler.renoise_canvas, torch.multinomial)

        def init(self_, batch_size, device):
            assert batch_size == 1
            if rr._in_renoise:
                return rr.d[rr.b]["renoise"][rr.s].view(1, -1).clone()
            rr.b += 1
            rr.s = -1
            rr.steps.append(0)
            return rr.d[rr.b]["init"].view(1, -1).clone()

        def renoise(self_, accepted, cur_step):
            rr._in_renoise = True
            try:
                return rr._orig[1](self_, accepted, cur_step)
            finally:
                rr._in_renoise = False

        def multinomial(probs, num_samples, *a, **kw):
            rr.s += 1
            rr.steps[-1] += 1
            return rr.d[rr.b]["sample"][rr.s].view(-1, 1).clone()

        Sampler.initialize_canvas = init
        Sampler.renoise_canvas = renoise
        torch.multinomial = multinomial
        return self

    def __exit__(self, *exc):
        Sampler.initialize_canvas, Sampler.renoise_canvas, torch.multinomial = self._orig


def with_sampler(settings):
    s = dict(settings)
    s["sampler_config"] = dg_gen.EntropyBoundSamplerConfig(settings["sampler_config"]["entropy_bound"])
    return s


def left_pad(prompts, pad_id):
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask


def batched_generate(model, prompts, settings, left_pad_id, seed):
    ids, mask = left_pad(prompts, left_pad_id)
    torch.manual_seed(seed)
    with BatchRecorder() as rec:
        out = model.generate(ids, attention_mask=mask, **with_sampler(settings))
    return ids.shape[1], out, rec


def per_row(rec, out, P, C, N, pad_id, i):
    """Row i's own view of the batched run: canvases, steps, stops, draws."""
    seq = out.sequences[i]
    row = {"tokens": seq[P:].tolist(), "steps": [], "stop": [], "finished_canvas": -1,
           "tokens_per_forward": float(out.tokens_per_forward[i])}
    draws = []
    for b, c in enumerate(rec.canvases):
        before = [bool(x[i]) for x in c["before"]]
        after = [bool(x[i]) for x in c["after"]]
        n = before.index(True) if True in before else len(before)
        if not all(before[n:]):
            raise SystemExit(f"row {i} canvas {b}: finished_denoising went back to false: {before}")
        if n == 0:
            raise SystemExit(f"row {i} canvas {b}: no step ran for the row")
        converged = after[n - 1]
        if not converged and n != N:
            raise SystemExit(f"row {i} canvas {b}: stopped after {n} of {N} steps without converging")
        row["steps"].append(n)
        row["stop"].append("converged" if converged else "max_steps")
        draws.append({"init": c["init"][i].clone(), "sample": [x[i].clone() for x in c["sample"][:n]],
                      "renoise": [x[i].clone() for x in c["renoise"][:n]]})
        if bool(rec.finished[b][i]):
            row["finished_canvas"] = b
            break
    ran = len(row["steps"])
    # transformers' tokens_per_forward: non-PAD generated tokens / passes while the row was neither
    # frozen nor finished. Our measured steps must reproduce it exactly.
    # transformers divides in float32; the fixture stores the exact ratio (a double), which must
    # round to transformers' float32 value.
    valid, forwards = sum(1 for t in row["tokens"] if t != pad_id), sum(row["steps"])
    exact = valid / forwards
    if torch.tensor(exact, dtype=torch.float32).item() != row["tokens_per_forward"]:
        raise SystemExit(f"row {i}: measured steps {row['steps']} give {valid}/{forwards}, "
                         f"transformers says {row['tokens_per_forward']}")
    row["tokens_per_forward"] = exact
    row["forwards"] = forwards
    # Every canvas after the finishing one is PAD in sequences.
    if any(t != pad_id for t in row["tokens"][ran * C:]):
        raise SystemExit(f"row {i}: tokens after its finishing canvas are not all PAD")
    return row, draws


def single_replay(model, prompt, settings, draws):
    """transformers' generate for one unpadded prompt with the row's draws played back."""
    with RowReplay(draws) as rr:
        out = model.generate(torch.tensor([prompt], dtype=torch.long), **with_sampler(settings))
    return out.sequences[0, len(prompt):].tolist(), rr.steps


def write_draws(path, prompt, draws):
    t = {"prompt_ids": torch.tensor(prompt, dtype=torch.int64)}
    for b, d in enumerate(draws):
        t[f"canvas.{b}.init"] = d["init"].to(torch.int64).contiguous()
        for s, (smp, ren) in enumerate(zip(d["sample"], d["renoise"])):
            t[f"canvas.{b}.step.{s}.sample"] = smp.to(torch.int64).contiguous()
            t[f"canvas.{b}.step.{s}.renoise"] = ren.to(torch.int64).contiguous()
    save_file(t, path)


def record_run(model, prompts, settings, left_pad_id, seed):
    C = model.config.canvas_length
    N = settings["max_denoising_steps"]
    pad_id = settings["pad_token_id"]
    P, out, rec = batched_generate(model, prompts, settings, left_pad_id, seed)
    rows, draws = [], []
    for i in range(len(prompts)):
        r, d = per_row(rec, out, P, C, N, pad_id, i)
        rows.append(r)
        draws.append(d)
    # Robustness: fp32-level noise must not change the outcome.
    with SCPerturbation(1e-5):
        _, out2, rec2 = batched_generate(model, prompts, settings, left_pad_id, seed)
    rows2 = [per_row(rec2, out2, P, C, N, pad_id, i)[0] for i in range(len(prompts))]
    if not torch.equal(out.sequences, out2.sequences) or [(r["steps"], r["stop"]) for r in rows] != \
            [(r["steps"], r["stop"]) for r in rows2]:
        raise SystemExit("batched run is chaotic: 1e-5 noise on the SC logits changes its outcome")
    # Each row alone (no padding, positions from 0) with its draws gives the same result.
    for i, (p, r, d) in enumerate(zip(prompts, rows, draws)):
        alone, steps = single_replay(model, p, settings, d)
        ran = len(r["steps"]) * C
        if alone != r["tokens"][:ran] or steps != r["steps"]:
            raise SystemExit(f"row {i}: alone {alone} steps {steps}, in the batch {r['tokens'][:ran]} steps {r['steps']}")
    return out.sequences, rows, draws


def save_run(out_dir, run, prompts, settings, left_pad_id, sequences, rows, draws):
    os.makedirs(out_dir, exist_ok=True)
    for i, (p, d) in enumerate(zip(prompts, draws)):
        write_draws(os.path.join(out_dir, f"{run}.row{i}.draws.safetensors"), p, d)
    j = {"settings": settings, "left_pad_token_id": left_pad_id, "prompts": prompts,
         "sequences": sequences.tolist(), "rows": rows}
    with open(os.path.join(out_dir, f"{run}.json"), "w") as f:
        json.dump(j, f, indent=1)
        f.write("\n")


def describe(rows):
    return "; ".join(f"row {i}: steps {r['steps']} stop {r['stop']} finished_canvas {r['finished_canvas']}"
                     for i, r in enumerate(rows))


def load(fixtures, ckpt):
    return DiffusionGemmaForBlockDiffusion.from_pretrained(os.path.join(fixtures, ckpt), dtype=torch.float32).eval()


def base_settings(V, C, **kw):
    s = dict(max_new_tokens=3 * C, max_denoising_steps=10, t_min=0.4, t_max=0.8, stability_threshold=1,
             confidence_threshold=0.005, sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
             eos_token_id=[V + 5], pad_token_id=0)  # V + 5 never occurs: no stop id unless a run adds one
    s.update(kw)
    return s


# Each run: checkpoint, prompt lengths (prompts drawn from torch.Generator(prompt_seed)), the
# left-padding id, the settings that differ from base_settings, and `stops`: (row, canvas) pairs
# in which that row must produce a stop id. A stop id is chosen from a dry run without stop ids:
# a token in the middle of that row's canvas that occurs nowhere else in the batch before it.
RUNS = [
    # The confident checkpoint commits the same token everywhere, so a stop id there would stop
    # every row at once: this run is about rows converging at different steps (and one running
    # to max_denoising_steps) in the same canvas. Prompts cross the sliding window (6).
    dict(ckpt="dg_small_confident", run="converge_mix", lens=[3, 11, 29, 7], prompt_seed=21, seed=2000,
         left_pad=0, settings=dict(max_denoising_steps=4, confidence_threshold=0.002), stops=[]),
    # The plain checkpoint with the stability test off (stability_threshold 0) and a confidence
    # threshold its entropies cross after 5-7 steps: rows converge at different steps, row 1 stops
    # in canvas 0 and row 3 in canvas 1 while rows 0 and 2 run all three canvases. The rows are
    # left-padded with a token that is not PAD.
    dict(ckpt="dg_small", run="stop_mix", lens=[3, 11, 29, 7], prompt_seed=21, seed=2000,
         left_pad=5, settings=dict(stability_threshold=0, confidence_threshold=3.5), stops=[(1, 0), (3, 1)]),
    # dg_wide: canvas 12, sliding window 5; prompts of 2, 9 and 17 tokens (two cross the window),
    # row 2 stops in canvas 0, rows converge at different steps.
    dict(ckpt="dg_wide", run="window_stop", lens=[2, 9, 17], prompt_seed=21, seed=2000,
         left_pad=0, settings=dict(stability_threshold=0, confidence_threshold=4.0), stops=[(2, 0)]),
]


def choose_stop_ids(rows, stops, C, pad_id):
    ids = []
    for r, k in stops:
        canvas = rows[r]["tokens"][k * C:(k + 1) * C]
        seen_before = set(rows[r]["tokens"][:k * C])
        elsewhere = {t for i, row in enumerate(rows) if i != r for t in row["tokens"]}
        # middle positions first, so that both the stop id and PAD after it are exercised
        order = sorted(range(1, C - 1), key=lambda p: abs(p - C // 2))
        pick = next((canvas[p] for p in order if canvas[p] not in seen_before | elsewhere | set(canvas[:p])
                     and canvas[p] != pad_id and canvas[p] not in ids), None)
        if pick is None:
            raise SystemExit(f"no token of row {r} canvas {k} can serve as its stop id")
        ids.append(pick)
    return ids


def has_mixed_convergence(rows, N):
    """Some canvas where one row converged before step N while another row ran more steps."""
    for b in range(max(len(r["steps"]) for r in rows)):
        here = [(r["steps"][b], r["stop"][b]) for r in rows if b < len(r["steps"])]
        early = [s for s, st in here if st == "converged" and s < N]
        if early and any(s > min(early) for s, _ in here):
            return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--only", default=None, help="record one run by name")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for spec in RUNS:
        if args.only and spec["run"] != args.only:
            continue
        model = load(args.fixtures, spec["ckpt"])
        V, C = model.config.text_config.vocab_size, model.config.canvas_length
        settings = base_settings(V, C, **spec["settings"])
        N, pad_id = settings["max_denoising_steps"], settings["pad_token_id"]
        gen = torch.Generator().manual_seed(spec["prompt_seed"])
        prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in spec["lens"]]
        with torch.no_grad():
            if spec["stops"]:
                P, out, rec = batched_generate(model, prompts, settings, spec["left_pad"], spec["seed"])
                dry = [per_row(rec, out, P, C, N, pad_id, i)[0] for i in range(len(prompts))]
                settings["eos_token_id"] = [V + 5] + choose_stop_ids(dry, spec["stops"], C, pad_id)
            sequences, rows, draws = record_run(model, prompts, settings, spec["left_pad"], spec["seed"])
        what = f"{spec['ckpt']}/{spec['run']}: {describe(rows)}"
        want = {r: k for r, k in spec["stops"]}
        got = {i: r["finished_canvas"] for i, r in enumerate(rows) if r["finished_canvas"] >= 0}
        if got != want:
            raise SystemExit(f"{what}\n  rows finished in canvases {got}, the run wants {want}")
        if spec["stops"] and len(got) == len(rows):
            raise SystemExit(f"{what}\n  every row stops: nothing goes on after the stop")
        if not has_mixed_convergence(rows, N):
            raise SystemExit(f"{what}\n  no canvas where a row converges early while another goes on")
        save_run(os.path.join(args.fixtures, spec["ckpt"], "replay_batch"), spec["run"], prompts, settings,
                 spec["left_pad"], sequences, rows, draws)
        print(what)
        print(f"  eos_token_id {settings['eos_token_id']}, prompts of {spec['lens']} tokens, "
              f"tokens_per_forward {[round(r['tokens_per_forward'], 4) for r in rows]}")


if __name__ == "__main__":
    main()
