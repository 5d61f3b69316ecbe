"""Train the tiny DiffusionGemma (models/dg-tiny-tasks) from scratch: ONE command does everything.

    tools/reference/.venv/bin/python tools/train/train.py            # data + tokenizer + training + save

Steps (all seeded, deterministic on a given machine/thread count):
  1. task data  -> tools/train/data/{train,test}.jsonl          (tasks.py, seed 1234)
  2. tokenizer  -> <out>/tokenizer.json                           (build_tokenizer.py, BPE, 576 ids)
  3. training   (recipe below)
  4. save       -> <out>/{config.json, generation_config.json, model.safetensors (bf16), tokenizer*.json}
                   and tools/train/logs/train_log.json (loss curve, timings)

Recipe (DiffusionGemma's published block-diffusion recipe, scaled down):
  * every example is split into canvases of 16 tokens: target = answer, <turn|>, <pad>...; canvas k is
    denoised against prefix = prompt + the k committed earlier canvases (encoded causally into a HF
    DynamicCache exactly as generate() does; the decoder reads that cache), see common.canvas_instances;
  * uniform-state corruption: each canvas position is replaced by a uniform random id over the whole
    vocabulary with probability t, t ~ U(1e-3, 1) per example;
  * loss: cross-entropy against the clean canvas over all 16 positions (answer, <turn|> and the filler);
  * self-conditioning, two-pass (Analog Bits), p = 0.5 per example: a first decoder pass without SC under
    no_grad, then the trained pass gets the first pass's logits divided by a temperature T ~ U(t_min, t_max)
    (per example) as `self_conditioning_logits`; rows not selected get `self_conditioning_mask=False`
    (zero SC signal, like step 1 of every canvas at inference). Dividing by T makes the training SC input
    match inference, where the SC input is the previous step's temperature-scaled logits (T from t_max down
    to t_min of common.GENERATION_CONFIG, 1.0 -> 0.6);
  * batches mix tasks and canvas indices: 8 batches' worth of random instances are drawn, sorted by prefix
    length and cut into batches (little padding); prefixes are left-padded and explicit 4-D masks and
    per-row position ids make every row see exactly what batch-1 inference sees (common.PaddedPrefix;
    check_masks.py verifies that these training logits equal generate()'s logits);
  * q_norm / k_norm weights start at head_dim^-1/4 (attention scale is 1.0 in Gemma 4, so unit weights
    would start with saturated softmaxes); everything else uses the transformers initialisation;
  * AdamW (0.9, 0.98), weight decay 0.01, linear warmup then cosine decay to 10 %, grad-norm clip 1.0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_tokenizer  # noqa: E402
import common  # noqa: E402
import tasks  # noqa: E402

REPO = os.path.abspath(os.path.join(common.HERE, "..", ".."))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "models", "dg-tiny-tasks"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=50000, help="train examples per task")
    ap.add_argument("--n-test", type=int, default=100, help="held-out examples per task")
    ap.add_argument("--steps", type=int, default=4500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--sc-prob", type=float, default=0.5)
    ap.add_argument("--t-power", type=float, default=1.0,
                    help="noise level t = 1 - (1 - u)^k, u ~ U(eps, 1); k = 1 is uniform, k > 1 favours high noise")
    ap.add_argument("--data-dir", default=common.DATA_DIR)
    ap.add_argument("--qk-norm-init", default="scaled", choices=["ones", "scaled"])
    ap.add_argument("--task-weights", default="sort=0.36,add=0.34,reverse=0.08,sudoku=0.22",
                    help="sampling probability of each task's canvas instances (the hard tasks get more)")
    ap.add_argument("--noise-samples", type=int, default=1, help="noisy canvases per encoded prefix")
    ap.add_argument("--pool", type=int, default=8, help="batches drawn at once and grouped by prefix length")
    ap.add_argument("--text-config", default="{}", help="JSON overrides of common.TEXT_CONFIG")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--log", default=os.path.join(common.HERE, "logs", "train_log.json"))
    return ap.parse_args()


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    args = parse_args()
    t_start = time.time()
    cpu_start = time.process_time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.data_dir, exist_ok=True)
    os.makedirs(os.path.dirname(args.log), exist_ok=True)

    # 1. data
    train_ex, test_ex = tasks.make_splits(args.n_train, args.n_test)
    common.write_jsonl(os.path.join(args.data_dir, "train.jsonl"), train_ex)
    common.write_jsonl(os.path.join(args.data_dir, "test.jsonl"), test_ex)
    t_data = time.time() - t_start
    print(f"[data] {len(train_ex)} train / {len(test_ex)} test examples ({t_data:.1f}s)", flush=True)

    # 2. tokenizer (trained on the train split only)
    tok = build_tokenizer.build([e["prompt"] + e["answer"] + "<turn|>" for e in train_ex], common.VOCAB_SIZE,
                                os.path.join(args.out, "tokenizer.json"))
    for w in tasks.WORDS:  # keeps the reverse task's canvas alignment simple
        assert len(tok.encode(w, add_special_tokens=False).ids) == 1, w
        assert len(tok.encode(" " + w, add_special_tokens=False).ids) == 1, w
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "add_bos_token": True,
                   "add_eos_token": False, "padding_side": "left", "model_max_length": 512}, f, indent=2)
        f.write("\n")

    # 3. training instances (prefix, target canvas)
    C = common.CANVAS_LENGTH
    by_task: dict[str, list] = {t: [] for t in tasks.TASKS}
    for e in train_ex:
        prompt, answer = common.encode_example(tok, e)
        by_task[e["task"]] += common.canvas_instances(prompt, answer, C)
    instances = [it for t in tasks.TASKS for it in by_task[t]]
    task_w = {t: 1.0 for t in tasks.TASKS}
    for kv in filter(None, args.task_weights.split(",")):
        k, v = kv.split("=")
        task_w[k] = float(v)
    task_names = list(tasks.TASKS)
    task_probs = [task_w[t] for t in task_names]
    plen = sorted({len(p) for p, _ in instances})
    t_prep = time.time() - t_start
    print(f"[prep] tokenizer + {len(instances)} canvas instances, prefix lengths {plen[0]}..{plen[-1]} "
          f"({t_prep:.1f}s)", flush=True)

    # 4. model
    from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    cfg = common.make_config(json.loads(args.text_config))
    torch.manual_seed(args.seed)
    model = DiffusionGemmaForBlockDiffusion(cfg)
    model.set_experts_implementation("eager")  # fastest on CPU for these sizes (grouped_mm loops tiny GEMMs)
    if args.qk_norm_init == "scaled":
        # Gemma 4 attention has scale 1.0 and RMS-normalised q, k: with norm weights 1 the logits start with
        # std sqrt(head_dim) (saturated softmax). Start the q/k norm weights at head_dim^-1/4 instead, so
        # the initial logits have std ~1 (the weights stay trainable; encoder and decoder share them).
        with torch.no_grad():
            for layer in model.model.decoder.layers:
                a = layer.self_attn
                a.q_norm.weight.fill_(a.head_dim ** -0.25)
                a.k_norm.weight.fill_(a.head_dim ** -0.25)
    model.train()
    params = common.count_params(model)
    print(f"[model] params {params}", flush=True)
    V = cfg.text_config.vocab_size

    decay, no_decay = [], []
    seen = set()
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98), eps=1e-8)

    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    W = cfg.text_config.sliding_window
    t_lo, t_hi = common.GENERATION_CONFIG["t_min"], common.GENERATION_CONFIG["t_max"]
    log = {"args": vars(args), "params": params, "curve": []}
    run_loss, run_acc, run_n = 0.0, 0.0, 0
    queue: list = []
    t_train0 = time.time()
    for step in range(args.steps):
        if not queue:  # draw pool * batch random instances, sort by prefix length, cut into batches
            draw = []
            for t in rng.choices(task_names, task_probs, k=args.pool * args.batch):
                draw.append(by_task[t][rng.randrange(len(by_task[t]))])
            draw.sort(key=lambda it: len(it[0]))
            queue = [draw[i:i + args.batch] for i in range(0, len(draw), args.batch)]
            rng.shuffle(queue)
        batch = queue.pop()
        pp = common.PaddedPrefix([b[0] for b in batch], W, C)
        target = torch.tensor([b[1] for b in batch])
        B = len(batch)

        cache = DynamicCache(config=cfg.get_text_config(decoder=True))
        model.model.encoder(input_ids=pp.ids, attention_mask=pp.encoder_masks, position_ids=pp.position_ids,
                            cache=cache)
        losses, accs = [], []
        for _ in range(args.noise_samples):  # several noisy canvases share one encoded prefix
            noisy, _ = common.corrupt(target, V, gen, t_power=args.t_power)
            sc_mask = torch.rand(B, generator=gen) < args.sc_prob
            sc_logits = None
            if sc_mask.any():
                with torch.no_grad():
                    first, _ = common.train_forward_padded(model, pp, noisy, cache=cache)
                    temp = t_lo + (t_hi - t_lo) * torch.rand(B, 1, 1, generator=gen)
                    sc_logits = first / temp
            logits, _ = common.train_forward_padded(model, pp, noisy, sc_logits=sc_logits,
                                                    sc_mask=sc_mask if sc_logits is not None else None, cache=cache)
            losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1)))
            accs.append((logits.argmax(-1) == target).float().mean().item())
        loss = torch.stack(losses).mean()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

        run_loss += loss.item()
        run_acc += sum(accs) / len(accs)
        run_n += 1
        if (step + 1) % args.log_every == 0 or step == args.steps - 1:
            el = time.time() - t_train0
            rec = {"step": step + 1, "loss": run_loss / run_n, "tok_acc": run_acc / run_n,
                   "lr": lr_at(step, args), "gnorm": float(gnorm), "elapsed_s": round(el, 1)}
            log["curve"].append(rec)
            print(f"[train] step {step + 1:5d} loss {rec['loss']:.4f} acc {rec['tok_acc']:.4f} "
                  f"lr {rec['lr']:.2e} gnorm {rec['gnorm']:.2f} {el:.0f}s ({el / (step + 1):.3f}s/step)",
                  flush=True)
            run_loss, run_acc, run_n = 0.0, 0.0, 0
    t_train = time.time() - t_train0

    # 5. save (bf16 by default) + generation config
    model.eval()
    save_dtype = getattr(torch, args.save_dtype)
    model.to(save_dtype)
    model.config.dtype = args.save_dtype
    model.generation_config = DiffusionGemmaGenerationConfig(**common.GENERATION_CONFIG)
    model.save_pretrained(args.out)
    os.chmod(os.path.join(args.out, "model.safetensors"), 0o644)
    total = time.time() - t_start
    log.update({"time_data_s": t_data, "time_prep_s": t_prep, "time_train_s": t_train, "time_total_s": total,
                "cpu_time_total_s": time.process_time() - cpu_start, "load_avg_at_end": os.getloadavg(),
                "steps_per_s": args.steps / t_train, "threads": args.threads, "torch": torch.__version__})
    with open(args.log, "w") as f:
        json.dump(log, f, indent=1)
    print(f"[done] saved {args.out} ({args.save_dtype}); train {t_train:.0f}s, total wall {total:.0f}s, "
          f"process CPU time {log['cpu_time_total_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
