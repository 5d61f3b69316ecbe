"""Evaluate a DiffusionGemma checkpoint with transformers' own generate() on the held-out task set.

    tools/reference/.venv/bin/python tools/train/eval_transformers.py \
        --model models/dg-tiny-tasks --out benchmarks/quality/transformers_results.json

For each max_denoising_steps setting (default 48 from generation_config.json, then 1, 2, 4, 8, 16) it
runs model.generate(input_ids) one prompt at a time (batch 1, DynamicCache, every other sampler
setting from generation_config.json) and reports per task:
  * exact match: the decoded text before the first stop id (<eos>, <turn|>, <|tool_response>) equals
    the reference answer AND a stop id was generated within max_new_tokens;
  * tokens_per_forward as returned by generate (non-pad generated tokens / decoder forwards);
  * steps per canvas (decoder forwards between two encoder calls), its histogram, and how many
    canvases each answer used.
Seeds: torch.manual_seed(seed + index of the example) before each generate call.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

REPO = os.path.abspath(os.path.join(common.HERE, "..", ".."))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "dg-tiny-tasks"))
    ap.add_argument("--data", default=os.path.join(common.DATA_DIR, "test.jsonl"))
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "quality", "transformers_results.json"))
    ap.add_argument("--steps", default="48,1,2,4,8,16", help="max_denoising_steps settings")
    ap.add_argument("--n", type=int, default=0, help="examples per task (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", help="auto (= checkpoint dtype) | float32 | bfloat16")
    ap.add_argument("--show-errors", type=int, default=3)
    return ap.parse_args()


class StepCounter:
    """Counts decoder forwards per canvas inside generate()."""

    def __init__(self, model):
        self.canvases: list[int] = []
        self._orig_forward = model.forward

        def fwd(*a, **kw):
            if kw.get("input_ids") is None and kw.get("decoder_input_ids") is not None:
                self.canvases[-1] += 1
            return self._orig_forward(*a, **kw)

        model.forward = fwd
        model.model.encoder.register_forward_pre_hook(lambda *_: self.canvases.append(0))

    def reset(self):
        self.canvases = []


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer
    from transformers import DiffusionGemmaForBlockDiffusion

    kw = {} if args.dtype == "auto" else {"dtype": getattr(torch, args.dtype)}
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.model, **kw)
    model.eval()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    gc = model.generation_config
    stop_ids = set(gc.eos_token_id)
    rows = common.load_jsonl(args.data)
    if args.n:
        per = collections.defaultdict(int)
        keep = []
        for r in rows:
            if per[r["task"]] < args.n:
                per[r["task"]] += 1
                keep.append(r)
        rows = keep
    task_names = list(dict.fromkeys(r["task"] for r in rows))
    counter = StepCounter(model)

    results = {
        "model": os.path.relpath(args.model, REPO) if args.model.startswith(REPO) else args.model,
        "dtype": str(model.dtype).replace("torch.", ""),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "threads": args.threads,
        "seed": args.seed,
        "canvas_length": model.config.canvas_length,
        "generation_config": {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in gc.to_dict().items()
                              if k in ("max_new_tokens", "max_denoising_steps", "sampler_config", "t_min", "t_max",
                                       "stability_threshold", "confidence_threshold", "eos_token_id",
                                       "pad_token_id")},
        "n_per_task": {t: sum(r["task"] == t for r in rows) for t in task_names},
        "exact_match_definition": "decoded text before the first stop id == answer, and a stop id was generated",
        "settings": [],
    }
    for n_steps in [int(s) for s in args.steps.split(",")]:
        t0 = time.time()
        per_task = {t: {"correct": 0, "n": 0, "tpf": [], "steps": [], "canvases": [], "errors": []}
                    for t in task_names}
        for i, r in enumerate(rows):
            ids = tok.encode(r["prompt"], add_special_tokens=False).ids
            torch.manual_seed(args.seed + i)
            counter.reset()
            out = model.generate(torch.tensor([ids]), max_denoising_steps=n_steps)
            gen = out.sequences[0, len(ids):].tolist()
            stop_at = next((j for j, t in enumerate(gen) if t in stop_ids), None)
            text = tok.decode(gen[:stop_at] if stop_at is not None else gen, skip_special_tokens=False)
            ok = stop_at is not None and text == r["answer"]
            d = per_task[r["task"]]
            d["n"] += 1
            d["correct"] += ok
            d["tpf"].append(float(out.tokens_per_forward[0]))
            d["steps"] += counter.canvases
            d["canvases"].append(len(counter.canvases))
            if not ok and len(d["errors"]) < args.show_errors:
                d["errors"].append({"question": r["question"], "answer": r["answer"], "got": text,
                                    "stopped": stop_at is not None})
        setting = {"max_denoising_steps": n_steps, "wall_s": round(time.time() - t0, 1), "tasks": {}}
        all_steps, all_c, all_n, all_tpf = [], 0, 0, []
        for t, d in per_task.items():
            setting["tasks"][t] = {
                "exact_match": d["correct"] / d["n"],
                "correct": d["correct"], "n": d["n"],
                "tokens_per_forward_mean": statistics.mean(d["tpf"]),
                "steps_per_canvas_mean": statistics.mean(d["steps"]),
                "steps_per_canvas_median": statistics.median(d["steps"]),
                "steps_per_canvas_max": max(d["steps"]),
                "canvases_per_answer": dict(sorted(collections.Counter(d["canvases"]).items())),
                "errors": d["errors"],
            }
            all_steps += d["steps"]
            all_c += d["correct"]
            all_n += d["n"]
            all_tpf += d["tpf"]
        setting["overall"] = {
            "exact_match": all_c / all_n,
            "tokens_per_forward_mean": statistics.mean(all_tpf),
            "steps_per_canvas_mean": statistics.mean(all_steps),
            "steps_per_canvas_median": statistics.median(all_steps),
            "steps_per_canvas_histogram": dict(sorted(collections.Counter(all_steps).items())),
            "canvases_hitting_cap": sum(s == n_steps for s in all_steps),
            "canvases": len(all_steps),
        }
        results["settings"].append(setting)
        em = " ".join(f"{t}={v['exact_match']:.2f}" for t, v in setting["tasks"].items())
        o = setting["overall"]
        print(f"[eval] steps={n_steps:2d} {em} | overall {o['exact_match']:.3f} tpf {o['tokens_per_forward_mean']:.2f}"
              f" steps/canvas mean {o['steps_per_canvas_mean']:.2f} median {o['steps_per_canvas_median']}"
              f" cap-hits {o['canvases_hitting_cap']}/{o['canvases']} ({setting['wall_s']}s)", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
