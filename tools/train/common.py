"""Shared pieces of the tiny DiffusionGemma training pipeline: config, data encoding, forward passes."""

from __future__ import annotations

import json
import os

import torch

PAD_ID, EOS_ID, BOS_ID, EOT_ID, TOOL_RESPONSE_ID = 0, 1, 2, 106, 50
FILLER_ID = PAD_ID  # canvas positions after <turn|> are <pad>

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "data")

# ----------------------------------------------------------------------------- model config
CANVAS_LENGTH = 16
VOCAB_SIZE = 576  # smallest round size where every task word is one token (with and without ▁)

TEXT_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=384,          # dense MLP ("shared expert") and self-conditioning MLP width
    num_hidden_layers=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    num_attention_heads=4,
    num_key_value_heads=2,          # sliding layers
    head_dim=32,                    # sliding layers
    global_head_dim=64,             # full layers
    num_global_key_value_heads=1,   # full layers (k_eq_v: V = v_norm(k_proj(x)))
    attention_k_eq_v=True,
    sliding_window=32,
    max_position_embeddings=512,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=128,
    enable_moe_block=True,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=30.0,
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_size_per_layer_input=0,
    num_kv_shared_layers=0,
    use_double_wide_mlp=False,
    use_bidirectional_attention="vision",
    tie_word_embeddings=True,
    pad_token_id=PAD_ID,
    eos_token_id=EOS_ID,
    bos_token_id=BOS_ID,
    initializer_range=0.02,
)

VISION_CONFIG = dict(  # save_pretrained always writes a vision tower; make it (almost) free
    model_type="gemma4_vision",
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=16,
    patch_size=4,
    pooling_kernel_size=1,
    position_embedding_size=16,
)

GENERATION_CONFIG = dict(
    max_new_tokens=48,              # 3 canvases of 16; the longest answer + <turn|> is 20 tokens (Sudoku)
    max_denoising_steps=48,
    sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
    t_min=0.6,                      # warmer than the reference default (0.4 -> 0.8): more, smaller steps,
    t_max=1.0,                      # measured +1..7 points on add and sudoku with the 5,000-step model
    stability_threshold=1,
    confidence_threshold=0.005,
    eos_token_id=[EOS_ID, EOT_ID, TOOL_RESPONSE_ID],
    pad_token_id=PAD_ID,
    bos_token_id=BOS_ID,
)


def make_config(text_overrides: dict | None = None, canvas_length: int = CANVAS_LENGTH):
    from transformers import DiffusionGemmaConfig

    tc = dict(TEXT_CONFIG)
    tc.update(text_overrides or {})
    return DiffusionGemmaConfig(
        text_config=tc,
        vision_config=dict(VISION_CONFIG),
        canvas_length=canvas_length,
        eos_token_id=[EOS_ID, EOT_ID],
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
    )


def count_params(model) -> dict:
    seen, total, text, vision = set(), 0, 0, 0
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if "vision" in n:
            vision += p.numel()
        else:
            text += p.numel()
    return {"total": total, "text": text, "vision": vision}


# ----------------------------------------------------------------------------- data
def load_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def encode_example(tok, ex: dict) -> tuple[list[int], list[int]]:
    prompt = tok.encode(ex["prompt"], add_special_tokens=False).ids  # the prompt text already has <bos>
    answer = tok.encode(ex["answer"], add_special_tokens=False).ids
    assert prompt[0] == BOS_ID and prompt.count(BOS_ID) == 1
    return prompt, answer


def canvas_instances(prompt: list[int], answer: list[int], canvas_length: int = CANVAS_LENGTH):
    """Split one example into (prefix, target canvas) pairs, exactly as generation sees them.

    The reply is answer + <turn|> + <pad> filler up to a multiple of the canvas length. Canvas k is
    denoised against prefix = prompt + the k earlier (committed, causally re-encoded) canvases.
    """
    reply = answer + [EOT_ID]
    n = -(-len(reply) // canvas_length)
    reply = reply + [FILLER_ID] * (n * canvas_length - len(reply))
    out = []
    for k in range(n):
        out.append((prompt + reply[: k * canvas_length], reply[k * canvas_length:(k + 1) * canvas_length]))
    return out


# ----------------------------------------------------------------------------- forward passes
def corrupt(target: torch.Tensor, vocab_size: int, gen: torch.Generator, eps: float = 1e-3, t_power: float = 1.0):
    """Uniform-state corruption: each position is replaced by a uniform random id over the whole
    vocabulary with probability t, per example t = 1 - (1 - u)^t_power, u ~ U(eps, 1) (t_power = 1: t ~ U(eps, 1))."""
    b, c = target.shape
    u = eps + (1 - eps) * torch.rand(b, 1, generator=gen)
    t = 1 - (1 - u) ** t_power
    replace = torch.rand(b, c, generator=gen) < t
    noise = torch.randint(0, vocab_size, (b, c), generator=gen)
    return torch.where(replace, noise, target), t


def train_forward(model, prefix: torch.Tensor, canvas: torch.Tensor, sc_logits=None, sc_mask=None, cache=None):
    """Training forward: encode the prefix causally (HF DynamicCache, exactly as generate's prefill), then
    denoise the canvas bidirectionally against that cache. Returns (logits, cache).

    All rows of `prefix` have the same length (the trainer buckets by prefix length), so no padding masks
    are involved and the decoder sees exactly what it sees at inference: all prefix tokens on full layers
    and the last sliding_window - 1 on sliding layers (verified by check_masks.py)."""
    from transformers import DynamicCache

    if cache is None:
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=prefix, cache=cache)
    out = model(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=sc_logits,
                self_conditioning_mask=sc_mask)
    return out.logits, cache


class PaddedPrefix:
    """A left-padded batch of prefixes of different lengths plus the explicit masks that make every row see
    exactly what an unpadded batch-1 inference sees (verified by check_masks.py):

    * encoder: per-row positions 0..P_b-1 (pads get 0), causal mask over real keys only, sliding layers
      additionally q - k < sliding_window (index distance = position distance, the real tokens are
      contiguous); a pad query attends only to itself (keeps SDPA free of all-masked rows; pad outputs are
      never read by real tokens);
    * decoder: canvas positions P_b..P_b+C-1; full layers see every real prefix key, sliding layers see the
      real keys among the last sliding_window - 1 cached slots (= the last min(P_b, W-1) real tokens, what
      the DynamicCache of an unpadded run holds), plus the whole canvas.
    """

    def __init__(self, prefixes: list[list[int]], sliding_window: int, canvas_length: int):
        B = len(prefixes)
        L = max(len(p) for p in prefixes)
        lens = torch.tensor([len(p) for p in prefixes])
        self.ids = torch.full((B, L), PAD_ID, dtype=torch.long)
        for b, p in enumerate(prefixes):
            self.ids[b, L - len(p):] = torch.tensor(p)
        idx = torch.arange(L)
        start = (L - lens)[:, None]
        valid = idx[None, :] >= start                                   # (B, L)
        self.position_ids = (idx[None, :] - start).clamp(min=0)
        q, k = idx[:, None], idx[None, :]
        causal = (k <= q)[None] & valid[:, None, :]                     # (B, Lq, Lk)
        diag = (k == q)[None].expand(B, L, L)
        full = causal | diag
        sliding = (causal & (q - k < sliding_window)[None]) | diag
        self.encoder_masks = {"full_attention": full[:, None], "sliding_attention": sliding[:, None]}
        C = canvas_length
        ls = min(L, sliding_window - 1)
        canvas_keys = torch.ones(B, C, C, dtype=torch.bool)
        dec_full = torch.cat([valid[:, None, :].expand(B, C, L), canvas_keys], dim=-1)
        dec_slide = torch.cat([valid[:, None, L - ls:].expand(B, C, ls), canvas_keys], dim=-1)
        self.decoder_masks = {"full_attention": dec_full[:, None], "sliding_attention": dec_slide[:, None]}
        self.decoder_position_ids = lens[:, None] + torch.arange(C)[None, :]


def train_forward_padded(model, pp: PaddedPrefix, canvas: torch.Tensor, sc_logits=None, sc_mask=None, cache=None):
    """Like train_forward, for a left-padded batch of prefixes of different lengths (see PaddedPrefix)."""
    from transformers import DynamicCache

    if cache is None:
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=pp.ids, attention_mask=pp.encoder_masks, position_ids=pp.position_ids,
                            cache=cache)
    out = model(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=sc_logits,
                self_conditioning_mask=sc_mask, decoder_attention_mask=pp.decoder_masks,
                decoder_position_ids=pp.decoder_position_ids)
    return out.logits, cache
