// SPDX-License-Identifier: Apache-2.0
// The normalizer, pre-tokenizer, decoder and post-processor of a tokenizer.json, limited to the component
// types Gemma-style files use. Anything else is rejected with kUnsupported and a message that names the file,
// the JSON path of the component and its type, because silently skipping a component would mis-encode.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/tokenizer_text.hpp>

namespace diffusion_gemma::io::tokenizer_detail {

inline std::string element_path(const std::string& path, const std::string& key, std::size_t i) {
  return path + "." + key + "[" + std::to_string(i) + "]";
}

[[noreturn]] inline void unsupported_component(const std::string& file, const std::string& path, const char* what,
                                               const std::string& type, const char* supported) {
  throw_error(StatusCode::kUnsupported, file, ": ", path, ": ", what, " type '", type,
              "' is not supported (supported: ", supported, ")");
}

// Sequences are read by recursion, so a file that nests them deeply enough would overflow the stack.
// `tokenizers` itself refuses a file past 62 levels (serde_json's recursion limit), so real files stay far below.
constexpr int kMaxSequenceDepth = 64;

inline void check_sequence_depth(const JsonObject& o, int depth) {
  if (depth >= kMaxSequenceDepth) o.fail_here("Sequence nested more than ", kMaxSequenceDepth, " levels deep");
}

// {"String": "..."} patterns; the "Regex" form is rejected because this library has no regex engine that is
// guaranteed to agree with Oniguruma.
inline std::string literal_pattern(const JsonObject& owner, const std::string& file, const std::string& path,
                                   const char* what) {
  const JsonObject pattern = owner.object("pattern");
  if (pattern.has("Regex")) {
    throw_error(StatusCode::kUnsupported, file, ": ", path, ".pattern: ", what,
                " with a Regex pattern is not supported (only {\"String\": ...})");
  }
  const std::string s = pattern.string("String");
  if (s.empty()) pattern.fail("String", "an empty pattern is not supported");
  return s;
}

// ---- normalizer -------------------------------------------------------------------------------------------------

class Normalizer {
 public:
  static Normalizer from_json(const Json& j, const std::string& file, const std::string& path) {
    Normalizer n;
    if (!j.is_null()) n.add(j, file, path, 0);
    return n;
  }

  bool empty() const { return steps_.empty(); }

  std::string apply(std::string_view in) const {
    std::string cur(in);
    std::string next;
    for (const Step& s : steps_) {
      if (s.kind == Step::kPrepend) {
        if (!cur.empty()) cur.insert(0, s.content);
        continue;
      }
      next.clear();
      next.reserve(cur.size() + cur.size() / 2);
      replace_all_into(cur, s.pattern, s.content, next);
      cur.swap(next);
    }
    return cur;
  }

 private:
  struct Step {
    enum Kind { kReplace, kPrepend } kind;
    std::string pattern;
    std::string content;
  };

  void add(const Json& j, const std::string& file, const std::string& path, int depth) {
    const JsonObject o(j, file, path);
    const std::string type = o.string("type");
    if (type == "Sequence") {
      check_sequence_depth(o, depth);
      const Json& list = o.required("normalizers");
      if (!list.is_array()) o.fail("normalizers", "expected an array");
      for (std::size_t i = 0; i < list.size(); ++i) add(list[i], file, element_path(path, "normalizers", i), depth + 1);
    } else if (type == "Replace") {
      steps_.push_back({Step::kReplace, literal_pattern(o, file, path, "Replace normalizer"), o.string("content")});
    } else if (type == "Prepend") {
      steps_.push_back({Step::kPrepend, std::string(), o.string("prepend")});
    } else {
      unsupported_component(file, path, "normalizer", type, "Replace with a String pattern, Prepend, Sequence");
    }
  }

  std::vector<Step> steps_;
};

// ---- pre-tokenizer ----------------------------------------------------------------------------------------------

class PreTokenizer {
 public:
  using Piece = std::pair<std::size_t, std::size_t>;  // byte offset, length

  static PreTokenizer from_json(const Json& j, const std::string& file, const std::string& path) {
    PreTokenizer p;
    if (!j.is_null()) p.add(j, file, path, 0);
    return p;
  }

  bool empty() const { return steps_.empty(); }

  // Splits `s` into non-empty pieces (the whole of `s` when there are no steps).
  void split(std::string_view s, std::vector<Piece>& pieces, std::vector<Piece>& scratch) const {
    pieces.clear();
    if (s.empty()) return;
    pieces.emplace_back(0, s.size());
    for (const Step& step : steps_) {
      scratch.clear();
      for (const Piece& piece : pieces) split_one(step, s.substr(piece.first, piece.second), piece.first, scratch);
      pieces.swap(scratch);
    }
  }

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    std::string pattern;
    Behavior behavior;
    bool invert;
  };
  struct Segment {
    std::size_t begin, end;
    bool is_match;
  };

  void add(const Json& j, const std::string& file, const std::string& path, int depth) {
    const JsonObject o(j, file, path);
    const std::string type = o.string("type");
    if (type == "Sequence") {
      check_sequence_depth(o, depth);
      const Json& list = o.required("pretokenizers");
      if (!list.is_array()) o.fail("pretokenizers", "expected an array");
      for (std::size_t i = 0; i < list.size(); ++i) {
        add(list[i], file, element_path(path, "pretokenizers", i), depth + 1);
      }
    } else if (type == "Split") {
      Step step{literal_pattern(o, file, path, "Split pre-tokenizer"), Behavior::kRemoved, o.boolean("invert")};
      const std::string b = o.string("behavior");
      if (b == "Removed") {
        step.behavior = Behavior::kRemoved;
      } else if (b == "Isolated") {
        step.behavior = Behavior::kIsolated;
      } else if (b == "MergedWithPrevious") {
        step.behavior = Behavior::kMergedWithPrevious;
      } else if (b == "MergedWithNext") {
        step.behavior = Behavior::kMergedWithNext;
      } else if (b == "Contiguous") {
        step.behavior = Behavior::kContiguous;
      } else {
        o.fail("behavior", "unknown split behavior '", b, "'");
      }
      steps_.push_back(std::move(step));
    } else {
      unsupported_component(file, path, "pre-tokenizer", type, "Split with a String pattern, Sequence");
    }
  }

  // `tokenizers`' NormalizedString::split: matches and the gaps between them cover the piece, then the
  // behavior decides which become pieces of their own, which merge with a neighbour and which are dropped.
  static void split_one(const Step& step, std::string_view t, std::size_t base, std::vector<Piece>& out) {
    std::vector<Segment> segs;
    std::size_t prev = 0;
    for (std::size_t hit = t.find(step.pattern); hit != std::string_view::npos;
         hit = t.find(step.pattern, hit + step.pattern.size())) {
      if (hit != prev) segs.push_back({prev, hit, false});
      segs.push_back({hit, hit + step.pattern.size(), true});
      prev = hit + step.pattern.size();
    }
    if (prev != t.size()) segs.push_back({prev, t.size(), false});
    if (step.invert) {
      for (Segment& s : segs) s.is_match = !s.is_match;
    }
    std::vector<Segment> kept;  // is_match now means "remove"
    switch (step.behavior) {
      case Behavior::kIsolated:
        for (const Segment& s : segs) kept.push_back({s.begin, s.end, false});
        break;
      case Behavior::kRemoved:
        kept = segs;
        break;
      case Behavior::kContiguous:
      case Behavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const Segment& s : segs) {
          const bool merge =
              step.behavior == Behavior::kContiguous ? s.is_match == previous_match : s.is_match && !previous_match;
          if (merge && !kept.empty()) {
            kept.back().end = s.end;
          } else {
            kept.push_back({s.begin, s.end, false});
          }
          previous_match = s.is_match;
        }
        break;
      }
      case Behavior::kMergedWithNext: {
        bool previous_match = false;
        for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
          if (it->is_match && !previous_match && !kept.empty()) {
            kept.back().begin = it->begin;
          } else {
            kept.push_back({it->begin, it->end, false});
          }
          previous_match = it->is_match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
      }
    }
    for (const Segment& s : kept) {
      if (!s.is_match && s.end > s.begin) out.emplace_back(base + s.begin, s.end - s.begin);
    }
  }

  std::vector<Step> steps_;
};

// ---- decoder ------------------------------------------------------------------------------------------------------

class Decoder {
 public:
  static Decoder from_json(const Json& j, const std::string& file, const std::string& path) {
    Decoder d;
    d.present_ = !j.is_null();
    if (d.present_) d.add(j, file, path, 0);
    return d;
  }

  // `tokenizers`' decode: each step maps the list of token strings to a new list, then the list is joined.
  // Without a decoder the tokens are joined with spaces, as there.
  std::string decode(std::vector<std::string> tokens) const {
    if (!present_) {
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (i) out.push_back(' ');
        out += tokens[i];
      }
      return out;
    }
    for (const Step& s : steps_) {
      switch (s.kind) {
        case Step::kReplace:
          for (std::string& t : tokens) {
            if (t.find(s.pattern) != std::string::npos) t = replace_all(t, s.pattern, s.content);
          }
          break;
        case Step::kByteFallback:
          tokens = byte_fallback(std::move(tokens));
          break;
        case Step::kFuse: {
          std::string all;
          for (const std::string& t : tokens) all += t;
          tokens.assign(1, std::move(all));
          break;
        }
        case Step::kStrip:
          for (std::string& t : tokens) t = strip(t, s);
          break;
      }
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

 private:
  struct Step {
    enum Kind { kReplace, kByteFallback, kFuse, kStrip } kind;
    std::string pattern;
    std::string content;
    std::size_t start = 0;
  };

  void add(const Json& j, const std::string& file, const std::string& path, int depth) {
    const JsonObject o(j, file, path);
    const std::string type = o.string("type");
    if (type == "Sequence") {
      check_sequence_depth(o, depth);
      const Json& list = o.required("decoders");
      if (!list.is_array()) o.fail("decoders", "expected an array");
      for (std::size_t i = 0; i < list.size(); ++i) add(list[i], file, element_path(path, "decoders", i), depth + 1);
    } else if (type == "Replace") {
      steps_.push_back({Step::kReplace, literal_pattern(o, file, path, "Replace decoder"), o.string("content")});
    } else if (type == "ByteFallback") {
      steps_.push_back({Step::kByteFallback, {}, {}});
    } else if (type == "Fuse") {
      steps_.push_back({Step::kFuse, {}, {}});
    } else if (type == "Strip") {
      Step s{Step::kStrip, {}, o.string("content")};
      if (s.content.empty() || utf8_length(static_cast<unsigned char>(s.content[0])) != s.content.size()) {
        o.fail("content", "expected exactly one character, got '", s.content, "'");
      }
      const std::int64_t start = o.integer("start"), stop = o.integer("stop");
      if (start < 0) o.fail("start", "must be >= 0");
      if (stop != 0) {
        // `tokenizers` panics on any token shorter than `stop` characters; Gemma and Llama files use 0.
        throw_error(StatusCode::kUnsupported, o.where("stop"), ": Strip decoder with stop=", stop,
                    " is not supported (only stop=0)");
      }
      s.start = static_cast<std::size_t>(start);
      steps_.push_back(std::move(s));
    } else {
      unsupported_component(file, path, "decoder", type,
                            "Replace with a String pattern, ByteFallback, Fuse, Strip, Sequence");
    }
  }

  // "<0xNN>" tokens collect into byte runs; a run that is valid UTF-8 becomes one token, otherwise every byte
  // of it becomes U+FFFD (per byte, not per maximal subpart: that is what `tokenizers` does).
  static std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (std::size_t i = 0; i < run.size(); ++i) out.emplace_back("\xef\xbf\xbd");
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = parse_hex_byte(t[3], t[4]);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }

  // Rust's u8::from_str_radix(s, 16) on a two-byte s: two hex digits of either case, or '+' and one digit.
  static int parse_hex_byte(char a, char b) {
    const auto digit = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (a == '+') return digit(b);
    const int hi = digit(a), lo = digit(b);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }

  // Removes up to `start` leading copies of the character.
  static std::string strip(const std::string& t, const Step& s) {
    std::size_t cut = 0;
    for (std::size_t k = 0; k < s.start && t.compare(cut, s.content.size(), s.content) == 0; ++k) {
      cut += s.content.size();
    }
    return t.substr(cut);
  }

  bool present_ = false;
  std::vector<Step> steps_;
};

// ---- post-processor -----------------------------------------------------------------------------------------------

// TemplateProcessing's single-sequence template: "<bos> $A" and the like. Pair templates are parsed by Python but
// never used here (this tokenizer encodes one sequence at a time).
class PostProcessor {
 public:
  static PostProcessor from_json(const Json& j, const std::string& file, const std::string& path) {
    PostProcessor p;
    if (j.is_null()) return p;
    const JsonObject o(j, file, path);
    const std::string type = o.string("type");
    if (type != "TemplateProcessing") unsupported_component(file, path, "post-processor", type, "TemplateProcessing");
    const JsonObject specials = o.object("special_tokens");
    // `tokenizers` reads the ids of every entry, used by the template or not, as u32 and refuses the file
    // if one is negative.
    for (auto it = specials.raw_begin(); it != specials.raw_end(); ++it) {
      const JsonObject tok = specials.object(it.key());
      const Json& ids = tok.required("ids");
      if (!ids.is_array()) tok.fail("ids", "expected an array of ids");
      for (const Json& v : ids) {
        if (tok.as_integer(v, "ids") < 0) tok.fail("ids", "id ", v.dump(), " is negative (ids must be >= 0)");
      }
    }
    const Json& single = o.required("single");
    if (!single.is_array()) o.fail("single", "expected an array of template pieces");
    p.present_ = true;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const JsonObject piece(single[i], file, element_path(path, "single", i));
      Piece out;
      if (piece.has("Sequence")) {
        const std::string id = piece.object("Sequence").string("id");
        if (id != "A") piece.fail("Sequence", "the single template can only use sequence A, got '", id, "'");
        out.sequence = true;
      } else if (piece.has("SpecialToken")) {
        const std::string id = piece.object("SpecialToken").string("id");
        if (!specials.has(id)) piece.fail("SpecialToken", "'", id, "' is not in special_tokens");
        const JsonObject tok = specials.object(id);
        const Json& ids = tok.required("ids");
        if (!ids.is_array()) tok.fail("ids", "expected an array of ids");
        for (const Json& v : ids) out.ids.push_back(tok.as_int32(tok.as_integer(v, "ids"), "ids"));
      } else {
        piece.fail_here("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      p.single_.push_back(std::move(out));
    }
    // `tokenizers` runs the single template even without special tokens, keeping only its
    // sequence pieces: a template with $A other than once would then repeat or drop the text.
    const auto sequences = std::count_if(p.single_.begin(), p.single_.end(), [](const Piece& x) { return x.sequence; });
    if (sequences != 1) {
      o.fail("single", "the template uses the text (sequence A) ", sequences,
             " times; only templates that use it exactly once are supported");
    }
    return p;
  }

  void apply(std::vector<int>& ids) const {
    if (!present_) return;
    std::vector<int> out;
    for (const Piece& piece : single_) {
      if (piece.sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), piece.ids.begin(), piece.ids.end());
      }
    }
    ids.swap(out);
  }

  // The special ids the template adds around the text, for callers that assemble ids themselves.
  std::vector<int> prefix_ids() const {
    std::vector<int> out;
    for (const Piece& piece : single_) {
      if (piece.sequence) break;
      out.insert(out.end(), piece.ids.begin(), piece.ids.end());
    }
    return out;
  }

 private:
  struct Piece {
    bool sequence = false;
    std::vector<int> ids;
  };
  bool present_ = false;
  std::vector<Piece> single_;
};

}  // namespace diffusion_gemma::io::tokenizer_detail
