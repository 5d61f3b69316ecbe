"""Train a small Gemma-style tokenizer.json for the task data with the `tokenizers` library.

Layout (same conventions as Gemma's tokenizer.json):
  * model: BPE, byte_fallback=True, unk_token "<unk>", fuse_unk=True, no pre-tokenizer;
  * normalizer: Replace(" " -> "▁");  decoder: Replace("▁" -> " "), ByteFallback, Fuse;
  * post-processor: TemplateProcessing that prepends <bos> (ids only; use add_special_tokens=False for
    chat-templated text, which already starts with the literal "<bos>").
Ids:
  0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <mask>, 50 <|tool_response>, 105 <|turn>, 106 <turn|>,
  every other id < 107 is a placeholder special token <unusedN>; 107..362 are the byte-fallback
  tokens <0x00>..<0xFF>; 363.. are the learned BPE pieces (single characters first, then merges).
During training only, a pre-tokenizer splits words at "▁" and every digit and "\n" into its own piece,
so no learned merge contains a digit, punctuation or a newline or crosses a word boundary; the final tokenizer.json
has no pre-tokenizer (like Gemma), and `build` asserts that it tokenizes the corpus exactly like the
training-time pipeline (on every k-th text, 20k texts).
"""

from __future__ import annotations

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

NAMED_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 50: "<|tool_response>",
                  105: "<|turn>", 106: "<turn|>"}
NUM_SPECIAL_IDS = 107
BYTE_OFFSET = NUM_SPECIAL_IDS
FIRST_PIECE_ID = BYTE_OFFSET + 256


def special_tokens() -> list[str]:
    out, unused = [], 0
    for i in range(NUM_SPECIAL_IDS):
        if i in NAMED_SPECIALS:
            out.append(NAMED_SPECIALS[i])
        else:
            out.append(f"<unused{unused}>")
            unused += 1
    return out


def _train_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("▁"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])


def build(texts: list[str], vocab_size: int, path: str) -> Tokenizer:
    specials = special_tokens()
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    n_pieces = vocab_size - FIRST_PIECE_ID
    assert n_pieces > 50, "vocab_size too small"

    # 1. learn pieces/merges with a throw-away tokenizer (specials are stripped from the corpus)
    strip = [s for s in specials if s in NAMED_SPECIALS.values()]
    corpus = []
    for t in texts:
        for s in strip:
            t = t.replace(s, "\n")
        corpus.append(t)
    tmp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tmp.normalizer = normalizers.Replace(" ", "▁")
    tmp.pre_tokenizer = _train_pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=n_pieces, special_tokens=[], show_progress=False,
                                  initial_alphabet=list("0123456789▁\n"))
    tmp.train_from_iterator(corpus, trainer)
    learned = json.loads(tmp.to_str())["model"]
    pieces = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    merges = learned["merges"]

    # 2. final vocab with Gemma's special ids
    vocab = {}
    for i, s in enumerate(specials):
        vocab[s] = i
    for i, s in enumerate(bytes_):
        vocab[s] = BYTE_OFFSET + i
    for p, _ in pieces:
        assert p not in vocab, p
        vocab[p] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    for i, s in NAMED_SPECIALS.items():
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))

    # 3. the final tokenizer (no pre-tokenizer) must agree with the training-time pipeline
    ref = Tokenizer.from_str(tok.to_str())
    ref.pre_tokenizer = _train_pre_tokenizer()
    for t in texts[:: max(1, len(texts) // 20000)]:
        a = tok.encode(t, add_special_tokens=False)
        b = ref.encode(t, add_special_tokens=False)
        assert a.ids == b.ids, (t, a.tokens, b.tokens)
        assert tok.decode(a.ids, skip_special_tokens=False) == t, (t, tok.decode(a.ids, skip_special_tokens=False))
    tok.save(path)
    return tok
