# SPDX-License-Identifier: Apache-2.0
"""Trains small Gemma-style tokenizers and writes the golden outputs the C++ tokenizer tests compare with.

Regenerate (from the repository root; deterministic, no network):

    tools/reference/.venv/bin/python tools/reference/make_tokenizer_fixtures.py tests/fixtures/tokenizers

Writes into that directory:
  <name>.json            tokenizer.json files (Hugging Face `tokenizers` format), see TOKENIZERS below
  golden.json            the corpus, and per tokenizer and corpus string: ids (add_special_tokens=True and False)
                         and the decoded text (skip_special_tokens=True and False); decode-only cases; component
                         variants of gemma_bpe_1000.json; chat renderings
  unsupported_*.json     tokenizer.json files with one component the C++ loader must reject

The pipeline follows Gemma's tokenizer.json (transformers' GemmaConverter / GemmaTokenizer): a BPE model with
byte_fallback and `<0xNN>` byte pieces in the model vocabulary, normalizer Replace(" " -> "▁"), pre-tokenizer
Split(" ", MergedWithPrevious) (a no-op after the normalizer, so BPE runs over whole segments), decoder
Sequence[Replace("▁" -> " "), ByteFallback, Fuse], special tokens as added tokens, and a TemplateProcessing
post-processor that adds <bos> (absent in one variant, as in Gemma 4's own file). Pieces are trained with a
whitespace-splitting pre-tokenizer (as SentencePiece splits by whitespace) and then served with Gemma's.

Invalid UTF-8: Python's `tokenizers` only accepts str, so the golden encodes
`raw_bytes.decode("utf-8", errors="replace")`; the C++ tokenizer applies the same replacement to byte strings.

Chat: transformers in this venv ships no Gemma 4 chat template, so CHAT_TEMPLATE below is a reduced, text-only
transcription of the published Gemma 4 template's behaviour (bos, system turn with <|think|>, trimmed contents,
thinking stripped from past model turns, consecutive assistant messages continuing one model turn, generation
prompt, and the variant that appends an empty thought channel). It is rendered with jinja2 under the same
environment settings transformers uses for apply_chat_template.
"""
import json
import os
import random
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SEED = 20240611

# ---- special tokens --------------------------------------------------------------------------------------------
# Ids 0-4, 50, 105 and 106 are Gemma 4's (docs/model.md §8.1); the other control tokens sit in free slots of
# the same range (their real ids are not needed by the tests) and the rest of 0..106 is <unusedN>.
GEMMA_SPECIALS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
    105: "<|turn>", 106: "<turn|>",
}
COMPACT_SPECIALS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 5: "<|turn>", 6: "<turn|>",
    7: "<|tool_response>", 8: "<|think|>", 9: "<|channel>", 10: "<channel|>",
}


def special_table(layout):
    if layout == "compact":
        return dict(COMPACT_SPECIALS)
    table = {}
    unused = 0
    for i in range(107):
        if i in GEMMA_SPECIALS:
            table[i] = GEMMA_SPECIALS[i]
        else:
            table[i] = f"<unused{unused}>"
            unused += 1
    return table


# ---- training text ---------------------------------------------------------------------------------------------
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "A diffusion language model refines a whole canvas of tokens at every step.",
    "Tokenizers turn text into integer ids, and decoders turn the ids back into text.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "In the beginning the weather was cold, but by the afternoon the sun had warmed the valley.",
    "Numbers such as 12, 345 and 6789 appear in tables, prices and dates like 2024-06-11.",
    "Please write a short poem about the ocean, the moon and the tides.",
    "What is the capital of France? The capital of France is Paris.",
    "He said: \"It's not what you look at that matters, it's what you see.\"",
    "Machine learning models are trained on large amounts of data with gradient descent.",
    "The library loads weights from safetensors files and runs the network on the CPU or the GPU.",
    "Every morning she walked to the station, bought a coffee and read the newspaper.",
    "If you want to go fast, go alone; if you want to go far, go together.",
    "The committee will meet on Tuesday to discuss the budget for the next year.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "They were running, jumping, laughing and singing until the evening came.",
    "Functions, classes and templates make the code easier to read and to test.",
    "The museum opens at nine o'clock and closes at five in the afternoon.",
    "Can you explain how attention works in a transformer network?",
    "Our results show that the new method is faster and more accurate than the baseline.",
]
ACCENTED = [
    "Le café est très chaud et la crème brûlée est délicieuse.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein, sagte der Schüler.",
    "El niño comió una manzana y bebió agua fría en la montaña.",
    "Привет, как дела? Сегодня хорошая погода.",
    "Москва является столицей России.",
    "日本語の文章です。東京は大きい都市です。",
]
SYLLABLES = ["ka", "lo", "mi", "ter", "an", "ous", "ing", "pre", "con", "ble", "str", "ight", "ed", "ly", "qu",
             "ph", "ow", "ea", "ch", "sh", "th", "ent", "ion", "al", "er", "re", "un", "dis", "ful", "ness"]


def training_lines(rng, n_lines):
    words = []
    for _ in range(2500):
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.15:
            w = w.capitalize()
        words.append(w)
    lines = []
    for i in range(n_lines):
        r = rng.random()
        if r < 0.45:
            lines.append(rng.choice(ENGLISH))
        elif r < 0.55:
            lines.append(rng.choice(ACCENTED))
        else:
            n = rng.randint(4, 14)
            sent = " ".join(rng.choice(words) for _ in range(n))
            punct = rng.choice([".", ",", "!", "?", ";", ":", "", " (ok)", " - 42"])
            lines.append(sent + punct)
        if i % 37 == 0:
            lines.append("    indented line\twith a tab")
        if i % 53 == 0:
            lines.append("def f(x):\n    return x + 1\n")
        if i % 29 == 0:
            # Runs of one character teach merges like ("-", "-") whose occurrences overlap, where the
            # leftmost-first rule of BPE decides the result.
            lines.append(rng.choice(["----------", "==========", "Hmmmmmmm", "Zzzzzzzzz", "1000000", "......",
                                     "!!!!!!", "aaaaaaa", "ooooooh", "xxx"]))
    return lines


def train_pieces(lines, budget, prepend, min_frequency=2):
    """Returns (pieces in id order, merges) trained with a whitespace-splitting pre-tokenizer."""
    t = Tokenizer(models.BPE())
    replace = normalizers.Replace(" ", "▁")
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) if prepend else replace
    t.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=budget, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[])
    t.train_from_iterator(lines, trainer)
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]
    return pieces, merges


# ---- the tokenizers under test ---------------------------------------------------------------------------------
TOKENIZERS = [
    # name, target vocab, specials layout, byte pieces, options
    dict(name="gemma_bpe_300_unk", vocab=300, layout="compact", bytes=False, byte_fallback=False,
         pre="gemma", post="bos", decoder="gemma", merges_format="legacy", prepend=False, ignore_merges=False),
    dict(name="gemma_bpe_1000", vocab=1000, layout="gemma", bytes=True, byte_fallback=True,
         pre="gemma", post="bos", decoder="gemma", merges_format="tuple", prepend=False, ignore_merges=False),
    dict(name="gemma_bpe_4000", vocab=4000, layout="gemma", bytes=True, byte_fallback=True,
         pre=None, post=None, decoder="gemma", merges_format="tuple", prepend=False, ignore_merges=True,
         extra_added=True),
    dict(name="llama_style_2000", vocab=2000, layout="compact", bytes=True, byte_fallback=True,
         pre="split_metaspace", post="bos", decoder="llama", merges_format="legacy", prepend=True,
         ignore_merges=False),
]


WHITESPACE_MERGES = [("▁", "▁"), ("▁▁", "▁▁"), ("\n", "\n")]


def build_tokenizer(spec, lines):
    specials = special_table(spec["layout"])
    n_fixed = len(specials) + (256 if spec["bytes"] else 0) + len(WHITESPACE_MERGES)
    pieces, merges = train_pieces(lines, spec["vocab"] - n_fixed, spec["prepend"])
    vocab = {}
    for i in sorted(specials):
        vocab[specials[i]] = i
    next_id = max(specials) + 1
    if spec["bytes"]:
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = next_id
            next_id += 1
    for p in pieces:
        if p in vocab:
            raise SystemExit(f"trained piece {p!r} collides with a fixed token")
        vocab[p] = next_id
        next_id += 1
    # Gemma's vocabulary has whitespace runs; SentencePiece-style training by words never learns them, so they
    # are appended as the lowest-priority merges (overlapping occurrences again).
    for a, b in WHITESPACE_MERGES:
        if a in vocab and b in vocab and a + b not in vocab:
            vocab[a + b] = next_id
            next_id += 1
            merges.append((a, b))

    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                       byte_fallback=spec["byte_fallback"], ignore_merges=spec["ignore_merges"])
    tok = Tokenizer(model)
    replace = normalizers.Replace(" ", "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) if spec["prepend"] else replace
    if spec["pre"] == "gemma":
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous", invert=False)
    elif spec["pre"] == "split_metaspace":
        tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next", invert=False)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if spec["decoder"] == "llama":
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)])
    if spec.get("extra_added"):
        tok.add_tokens([
            AddedToken("<mark>", special=False, normalized=False, lstrip=True, rstrip=True),
            AddedToken("hello world", special=False, normalized=True),
            AddedToken("\t\t", special=False, normalized=False),
            AddedToken("[SEP]", special=True, normalized=True),
            AddedToken("café", special=False, normalized=False, rstrip=True),
        ])
    if spec["post"] == "bos":
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return tok


def save_tokenizer(tok, spec, path):
    j = json.loads(tok.to_str())
    if spec["merges_format"] == "legacy":
        j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
    text = json.dumps(j, ensure_ascii=False, indent=None if spec["vocab"] >= 4000 else 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return Tokenizer.from_file(path)  # what the golden is computed with: the file itself


# ---- the corpus ------------------------------------------------------------------------------------------------
FIXED_CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A diffusion language model refines a whole canvas of tokens at every step.",
    " leading space",
    "trailing space ",
    "   three leading and three trailing   ",
    "runs  of   spaces    here",
    "tabs\tand\t\ttabs",
    "new\nlines\n\nand\r\nwindows",
    " \t \n ",
    " ",
    "\n",
    "Le café est très chaud; Ça va? Ünïcödé àéîõü",
    "Привет, мир! Как дела?",
    "日本語の文章です。中文汉字测试。한국어 텍스트",
    "emoji: 😀 🎉 👍🏽 ❤️",
    "ZWJ family: 👨‍👩‍👧‍👦 and flag 🇫🇷 and 🏳️‍🌈",
    "never seen: ☃ ∑ ∫ ⊕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀",
    "combining: e\u0301 a\u0308 n\u0303 and zero width\u200bspace",
    "control chars \u0001\u0002\u007f and nbsp\u00a0here and ideographic\u3000space",
    "hi<eos>there",
    "<bos>already has bos",
    "<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
    "<|turn>system\n<|think|>\nBe brief.<turn|>\n",
    "<eos><eos><pad>",
    "<eos ><eo s> < eos> not special",
    "<0x41> looks like a byte token",
    "<|channel>thought\nhmm<channel|>answer",
    "x <mark> y <mark>z<mark>  \t<mark>",
    "<mark>\t\t x",
    "say hello world and hello  world and Hello world",
    "tab pairs \t\t\t and [SEP] and [ SEP ]",
    "café au lait, café\tnoir, cafés",
    "def f(x):\n    return x + 1\n",
    "Numbers 0123456789 3.14159 1e-9 -42",
    "Symbols !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "▁already▁has▁metaspace▁",
    "mixed ▁ and space",
    "\ufffd replacement char literal",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the the the the the the the the",
]
INVALID_UTF8 = [
    b"abc\xff def",
    b"\xe2\x82",
    b"\xe2\x82 truncated euro",
    b"\xc0\xaf overlong slash",
    b"\xe0\x80\xaf overlong three",
    b"\xed\xa0\x80 surrogate",
    b"\xf0\x9f\x98 truncated emoji \xf0\x9f\x98\x80 ok",
    b"ok\x80\x80 continuation",
    b"\xf4\x90\x80\x80 above max",
    b"\xf5\xf8\xfc\xfe\xff",
    b"<eos>\xfe<bos>",
    b"caf\xe9 latin1",
]
LONG_ENGLISH = " ".join(ENGLISH) + "\n\n" + " ".join(reversed(ENGLISH)) + "\n"

RANDOM_POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + [" "] * 12 +
               list(".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`") + ["\t", "\n", "\r", "  ", "▁"] +
               list("éèàçüößñøåæœ") + list("приветмир") + list("日本語中文字") + ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "☃", "𝔘"] +
               ["<eos>", "<bos>", "<|turn>", "<turn|>", "<pad>", "<mark>", "hello world", "\t\t", "[SEP]",
                "café", "<0x41>", "<unk>", "the ", " the", "ing ", "tion", "ka", "lo", "mi"])


def random_strings(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(rng.choice(RANDOM_POOL) for _ in range(k)))
    return out


def decode_cases(tok, spec):
    """Id lists that only exercise decoding (byte runs that are invalid UTF-8, specials mixed in)."""
    v = tok.get_vocab()
    cases = []

    def add(name, ids):
        cases.append(dict(name=name, ids=ids, decoded=tok.decode(ids),
                          decoded_keep=tok.decode(ids, skip_special_tokens=False)))

    if spec["bytes"]:
        b = lambda x: v[f"<0x{x:02X}>"]  # noqa: E731
        add("euro from bytes", [b(0xE2), b(0x82), b(0xAC)])
        add("truncated euro", [b(0xE2), b(0x82)])
        add("truncated euro then text", [b(0xE2), b(0x82), v["a"], b(0x41)])
        add("lone 0xFF", [b(0xFF)])
        add("bytes around special", [b(0xE2), v["<eos>"], b(0x82), b(0xAC)])
        add("valid then invalid run", [b(0x41), b(0xC3), b(0xA9), v["▁"], b(0xC3)])
        add("emoji bytes", [b(0xF0), b(0x9F), b(0x98), b(0x80)])
    add("specials only", [v["<bos>"], v["<eos>"], v["<pad>"]])
    add("metaspace pieces", [v["<bos>"], v["▁"], v["▁"], v["a"], v["<turn|>"], v["▁"]])
    add("empty", [])
    return cases


# ---- chat ------------------------------------------------------------------------------------------------------
CHAT_TEMPLATE = r"""
{%- macro strip_thinking(text) -%}
  {%- set acc = namespace(out='') -%}
  {%- for part in text.split('<channel|>') -%}
    {%- if '<|channel>' in part -%}
      {%- set acc.out = acc.out + part.split('<|channel>')[0] -%}
    {%- else -%}
      {%- set acc.out = acc.out + part -%}
    {%- endif -%}
  {%- endfor -%}
  {{- acc.out | trim -}}
{%- endmacro -%}
{{- bos_token -}}
{%- set loop_messages = messages -%}
{%- set first_is_system = messages[0]['role'] in ['system', 'developer'] -%}
{%- if enable_thinking or first_is_system -%}
  {{- '<|turn>system\n' -}}
  {%- if enable_thinking -%}
    {{- '<|think|>\n' -}}
  {%- endif -%}
  {%- if first_is_system -%}
    {%- if messages[0]['content'] is string -%}
      {{- messages[0]['content'] | trim -}}
    {%- else -%}
      {%- for item in messages[0]['content'] -%}
        {{- item['text'] | trim + ' ' -}}
      {%- endfor -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
  {%- endif -%}
  {{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {%- set prev_role = loop_messages[loop.index0 - 1]['role'] if loop.index0 > 0 else none -%}
  {%- if not (role == 'model' and prev_role == 'assistant') -%}
    {{- '<|turn>' + role + '\n' -}}
  {%- endif -%}
  {%- if message['content'] is string -%}
    {%- if role == 'model' -%}
      {{- strip_thinking(message['content']) -}}
    {%- else -%}
      {{- message['content'] | trim -}}
    {%- endif -%}
  {%- else -%}
    {%- for item in message['content'] -%}
      {%- if role == 'model' -%}
        {{- strip_thinking(item['text']) -}}
      {%- else -%}
        {{- item['text'] | trim -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|turn>model\n' -}}
  {%- if empty_thought_channel and not enable_thinking -%}
    {{- '<|channel>thought\n<channel|>' -}}
  {%- endif -%}
{%- endif -%}
"""

CONVERSATIONS = [
    dict(name="single user turn", messages=[{"role": "user", "content": "Hello!"}]),
    dict(name="system and user", messages=[{"role": "system", "content": "  You are terse.\n"},
                                           {"role": "user", "content": "  What is 2+2?  "}]),
    dict(name="developer role", messages=[{"role": "developer", "content": "Follow the rules."},
                                          {"role": "user", "content": "ok"}]),
    dict(name="multi turn", messages=[
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke.\n"}]),
    dict(name="thinking stripped from past model turn", messages=[
        {"role": "user", "content": "Solve x+1=3"},
        {"role": "assistant", "content": "<|channel>thought\nsubtract one<channel|>x = 2"},
        {"role": "user", "content": "and x+2=3?"}]),
    dict(name="two channels and stray close", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": " a<|channel>t1<channel|>b <|channel>t2<channel|> c<channel|>d "}]),
    dict(name="consecutive assistant messages", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "part one"},
        {"role": "assistant", "content": "part two"}]),
    dict(name="unicode whitespace trimmed", messages=[
        {"role": "user", "content": "\u3000\u00a0 héllo 日本 \u2028\x1c"}]),
    dict(name="empty contents", messages=[{"role": "system", "content": ""}, {"role": "user", "content": ""}]),
    dict(name="special strings in content", messages=[{"role": "user", "content": "say <eos> and <|turn>"}]),
    dict(name="system in the middle", messages=[
        {"role": "user", "content": "a"}, {"role": "system", "content": " b "}, {"role": "user", "content": "c"}]),
    dict(name="content as text parts", messages=[
        {"role": "system", "content": [{"type": "text", "text": " Be "}, {"type": "text", "text": "brief.\n"}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": " world"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<|channel>t<channel|> Hi "},
                                          {"type": "text", "text": "there"}]},
        {"role": "user", "content": []}]),
    dict(name="roles given as model", messages=[
        {"role": "user", "content": "q"},
        {"role": "model", "content": "one"},
        {"role": "model", "content": "two"},
        {"role": "assistant", "content": "three"},
        {"role": "model", "content": "four"}]),
]
CHAT_OPTIONS = [
    dict(add_generation_prompt=True, enable_thinking=False, empty_thought_channel=False),
    dict(add_generation_prompt=True, enable_thinking=True, empty_thought_channel=False),
    dict(add_generation_prompt=False, enable_thinking=False, empty_thought_channel=False),
    dict(add_generation_prompt=True, enable_thinking=False, empty_thought_channel=True),
]


def chat_golden(chat_tok):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    template = env.from_string(CHAT_TEMPLATE)
    out = []
    for conv in CONVERSATIONS:
        for opts in CHAT_OPTIONS:
            text = template.render(messages=conv["messages"], bos_token="<bos>", **opts)
            ids = chat_tok.encode(text, add_special_tokens=False).ids
            out.append(dict(name=conv["name"], messages=conv["messages"], options=opts, text=text, ids=ids))
    return out


# ---- component variants ----------------------------------------------------------------------------------------
# Top-level components substituted into gemma_bpe_1000.json, to pin the behaviours Gemma's own files do not use
# (every Split behavior, invert, Sequence, multi-character patterns, Strip, no decoder, a longer template).
# Strip keeps stop=0: `tokenizers` panics on tokens shorter than `stop`, and the C++ loader rejects stop > 0.
def _split(pattern, behavior, invert=False):
    return {"type": "Split", "pattern": {"String": pattern}, "behavior": behavior, "invert": invert}


def _replace(pattern, content):
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


_GEMMA_DECODERS = [_replace("▁", " "), {"type": "ByteFallback"}, {"type": "Fuse"}]
VARIANTS = [
    dict(name="split isolated", override={"pre_tokenizer": _split("▁", "Isolated")}),
    dict(name="split removed", override={"pre_tokenizer": _split("▁", "Removed")}),
    dict(name="split removed inverted", override={"pre_tokenizer": _split("▁", "Removed", True)}),
    dict(name="split contiguous", override={"pre_tokenizer": _split("▁", "Contiguous")}),
    dict(name="split merged with previous", override={"pre_tokenizer": _split("▁", "MergedWithPrevious")}),
    dict(name="split merged with next inverted", override={"pre_tokenizer": _split("e", "MergedWithNext", True)}),
    dict(name="split sequence", override={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split("e", "MergedWithNext"), _split("▁▁", "Isolated"), _split("\n", "Contiguous")]}}),
    dict(name="normalizer sequence", override={"normalizer": {"type": "Sequence", "normalizers": [
        _replace("  ", "\t"), {"type": "Prepend", "prepend": "▁"}, _replace(" ", "▁"), _replace("th", "T")]}}),
    dict(name="no decoder, bos and eos template", override={"decoder": None, "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]},
                           "<eos>": {"id": "<eos>", "ids": [1], "tokens": ["<eos>"]}}}}),
    dict(name="strip after fuse", override={"post_processor": None, "decoder": {
        "type": "Sequence", "decoders": _GEMMA_DECODERS + [{"type": "Strip", "content": " ", "start": 2, "stop": 0}]}}),
    dict(name="strip per token", override={"decoder": {"type": "Sequence", "decoders": [
        _replace("▁", " "), {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}),
    dict(name="decoder replace only", override={"decoder": _replace("▁", "_")}),
    # Highest-priority merges that join a character or a byte piece with the following "▁":
    # the C++ encoder may then no longer cut the text before "▁" after 'e' or '.', only elsewhere.
    dict(name="merges across metaspace", override={}, model_patch={
        "vocab": {"e▁": 1000, ".▁": 1001, "e▁t": 1002, "<0xF0>a": 1003, "<0x80>▁": 1004},
        "merges_prepend": [["e", "▁"], [".", "▁"], ["e▁", "t"], ["<0xF0>", "a"], ["<0x80>", "▁"]]}),
]


def variant_golden(base_path, corpus, indices):
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    out = []
    for v in VARIANTS:
        j = json.loads(json.dumps(base))
        j.update(v["override"])
        patch = v.get("model_patch")
        if patch:
            j["model"]["vocab"].update(patch["vocab"])
            j["model"]["merges"] = patch["merges_prepend"] + j["model"]["merges"]
        tok = Tokenizer.from_str(json.dumps(j))
        entry = dict(name=v["name"], base="gemma_bpe_1000.json", override=v["override"], corpus_indices=indices,
                     results=[result(tok, corpus[i]["text"]) for i in indices])
        if patch:
            entry["model_patch"] = patch
        out.append(entry)
    return out


# ---- unsupported components ------------------------------------------------------------------------------------
def unsupported_variants(base_path, out_dir):
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    variants = {
        "unsupported_pre_tokenizer.json": ("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": False,
                                                             "trim_offsets": True, "use_regex": True}),
        "unsupported_nested_normalizer.json": ("normalizer", {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, {"type": "NFKC"}]}),
    }
    written = []
    for name, (key, value) in variants.items():
        j = dict(base)
        j[key] = value
        # Python must accept these files too: they are valid tokenizers this library does not implement.
        Tokenizer.from_str(json.dumps(j))
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
            f.write("\n")
        written.append(name)
    return written


def result(tok, text):
    ids = tok.encode(text).ids
    return dict(ids=ids, ids_no_special=tok.encode(text, add_special_tokens=False).ids,
                decoded=tok.decode(ids), decoded_keep=tok.decode(ids, skip_special_tokens=False))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(SEED)
    lines = training_lines(rng, 6000)
    random_corpus = random_strings(random.Random(SEED + 1), 80)

    # One corpus shared by every tokenizer; results are aligned with it by index.
    corpus = [dict(text=t) for t in FIXED_CORPUS + [LONG_ENGLISH] + random_corpus]
    corpus += [dict(bytes_hex=raw.hex(), text=raw.decode("utf-8", errors="replace")) for raw in INVALID_UTF8]
    golden = {"generator": "tools/reference/make_tokenizer_fixtures.py", "corpus": corpus, "tokenizers": []}
    loaded = {}
    for spec in TOKENIZERS:
        path = os.path.join(out_dir, spec["name"] + ".json")
        tok = save_tokenizer(build_tokenizer(spec, lines), spec, path)
        loaded[spec["name"]] = tok
        golden["tokenizers"].append(dict(file=spec["name"] + ".json", vocab_size=tok.get_vocab_size(),
                                         results=[result(tok, c["text"]) for c in corpus],
                                         decode=decode_cases(tok, spec)))
        size = os.path.getsize(path)
        if size >= 300_000:
            raise SystemExit(f"{path} is {size} bytes; keep fixtures under 300 KB")
    variant_indices = list(range(len(FIXED_CORPUS))) + list(range(len(FIXED_CORPUS) + 1, len(FIXED_CORPUS) + 9))
    golden["variants"] = variant_golden(os.path.join(out_dir, "gemma_bpe_1000.json"), corpus, variant_indices)
    golden["chat"] = dict(tokenizer="gemma_bpe_1000.json", cases=chat_golden(loaded["gemma_bpe_1000"]))
    golden["unsupported"] = unsupported_variants(os.path.join(out_dir, "gemma_bpe_1000.json"), out_dir)
    with open(os.path.join(out_dir, "golden.json"), "w", encoding="ascii") as f:
        json.dump(golden, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", out_dir, "jinja2", jinja2.__version__)


if __name__ == "__main__":
    main()
