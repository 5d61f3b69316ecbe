#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Entropy-bound acceptance on rows with equal entropies, decided by transformers.

transformers' EntropyBoundSampler.accept_canvas sorts the entropies with torch.sort (not stable),
so which of several equally certain positions is accepted at the bound depends on that sort's
order. Each row here has C positions whose logits are copies of a few template rows (so their
entropies are exactly equal in groups), and a bound placed inside a group, so that the order among
ties decides the result. The fixture stores transformers' own entropies (float32) and accepted
mask; tests/runtime/acceptance_test.cpp feeds the entropies to EntropyBound::accept.

    tools/reference/.venv/bin/python tools/reference/make_acceptance_fixtures.py --out tests/fixtures/sampler
"""

import argparse
import json
import os
import struct

import torch
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg_gen


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/sampler")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(41)
    V = 32
    rows = []
    for C, templates in [(8, 2), (16, 3), (17, 3), (64, 4), (256, 3), (256, 5), (256, 8)]:
        for trial in range(3):
            t = torch.randn((templates, V), generator=gen) * 2.0
            pick = torch.randint(0, templates, (C,), generator=gen)
            logits = t[pick].unsqueeze(0)  # [1, C, V]
            entropy = torch.distributions.Categorical(logits=logits).entropy()[0]
            s, _ = torch.sort(entropy, stable=True)
            # A bound inside a group of ties: the running sum just past its first member.
            groups = torch.unique(s)
            g = groups[min(trial, len(groups) - 1)]
            first = int((s == g).nonzero()[0])
            if int((s == g).sum()) < 2:
                continue
            bound = float(torch.cumsum(s.double(), 0)[first].item()) + 1e-6
            sampler = dg_gen.EntropyBoundSampler(dg_gen.EntropyBoundSamplerConfig(bound), C, V, 10)
            current = torch.zeros((1, C), dtype=torch.long)
            denoised = torch.ones((1, C), dtype=torch.long)
            sampler.accept_canvas(current, denoised, logits, 0)
            mask = sampler.accepted_token_mask[0].tolist()
            rows.append({"canvas_length": C, "entropy_bound": bound,
                         "entropy_f32_bits": [f32_bits(x) for x in entropy.tolist()],
                         "accepted": [int(m) for m in mask]})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "acceptance_ties.json"), "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f)
        f.write("\n")
    print(f"wrote {len(rows)} rows, torch {torch.__version__}")


if __name__ == "__main__":
    main()
