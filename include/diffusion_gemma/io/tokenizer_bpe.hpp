// SPDX-License-Identifier: Apache-2.0
// The BPE model of a Hugging Face tokenizer.json, as `tokenizers` (0.23) runs it: merges by rank over a
// linked list of symbols with a min-heap of candidate pairs, `byte_fallback` to `<0xNN>` pieces, `unk_token`
// with `fuse_unk`, and `ignore_merges`. Gemma's files have no splitting pre-tokenizer, so a "word" is a whole
// text segment between added tokens; the heap keeps that O(n log n) instead of quadratic.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/tokenizer_text.hpp>

namespace diffusion_gemma::io::tokenizer_detail {

// (left id, right id) -> (rank, merged id). Open addressing: this lookup is the inner loop of BPE.
class MergeTable {
 public:
  struct Value {
    std::uint32_t rank;
    int id;
  };

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    int bits = 4;
    while (cap < 2 * n + 1) {
      cap <<= 1;
      ++bits;
    }
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{0, -1});
    mask_ = cap - 1;
    shift_ = 64 - bits;
    size_ = 0;
  }

  // A repeated pair keeps the later rank, as a map built by successive inserts does.
  void insert(int a, int b, Value v) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    const std::uint64_t key = make_key(a, b);
    std::size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = key;
    values_[i] = v;
  }

  const Value* find(int a, int b) const {
    if (keys_.empty()) return nullptr;
    const std::uint64_t key = make_key(a, b);
    std::size_t i = slot(key);
    for (;;) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static std::uint64_t make_key(int a, int b) { return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b); }
  // Fibonacci hashing: the top bits of the product depend on both ids.
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
  }
  void grow() {
    std::vector<std::uint64_t> old_keys = std::move(keys_);
    std::vector<Value> old_values = std::move(values_);
    reserve(old_keys.empty() ? 8 : old_keys.size());
    for (std::size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty) insert(int(old_keys[i] >> 32), int(old_keys[i] & 0xffffffffu), old_values[i]);
    }
  }

  std::vector<std::uint64_t> keys_;
  std::vector<Value> values_;
  std::size_t mask_ = 0;
  int shift_ = 60;
  std::size_t size_ = 0;
};

// Per-call scratch, so that a const BpeModel can be shared between threads.
struct BpeScratch {
  struct Symbol {
    int id;
    int prev;
    int next;
    int len;  // bytes covered; 0 once merged into its left neighbour
  };
  struct Candidate {
    std::uint32_t rank;
    std::uint32_t pos;
    int new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class BpeModel {
 public:
  // `model` is the tokenizer.json "model" object.
  static BpeModel from_json(const JsonObject& model) {
    BpeModel m;
    m.source_ = model.where("unk_token");
    const std::string type = model.string("type");
    if (type != "BPE") {
      throw_error(StatusCode::kUnsupported, model.where("type"), ": model type '", type,
                  "' is not supported (supported: BPE)");
    }
    if (model.has_non_null("dropout") && model.number("dropout") != 0.0) {
      throw_error(StatusCode::kUnsupported, model.where("dropout"), ": BPE dropout ", model.number("dropout"),
                  " is not supported (encoding would be random)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.has_non_null(key) && !model.string(key).empty()) {
        throw_error(StatusCode::kUnsupported, model.where(key), ": '", model.string(key),
                    "' is not supported (Gemma-style BPE has none)");
      }
    }
    m.byte_fallback_ = model.boolean_or("byte_fallback", false);
    m.fuse_unk_ = model.boolean_or("fuse_unk", false);
    m.ignore_merges_ = model.boolean_or("ignore_merges", false);

    const Json& vocab = model.required("vocab");
    if (!vocab.is_object()) model.fail("vocab", "expected an object of token -> id, got ", vocab.type_name());
    m.vocab_.reserve(vocab.size());
    int max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const std::int64_t id = model.as_integer(it.value(), "vocab." + it.key());
      if (id < 0 || id >= kMaxId)
        model.fail("vocab", "token '", it.key(), "' has id ", id, ", outside [0, ", kMaxId, ")");
      m.vocab_.emplace(it.key(), static_cast<int>(id));
      max_id = std::max(max_id, static_cast<int>(id));
    }
    // Tables indexed by id are sized by the largest id; a few far-out ids in a small file would otherwise make
    // a table of gigabytes. Real vocabularies number their tokens 0..n-1 (gaps of a few tokens at most).
    const std::int64_t id_limit = 2 * static_cast<std::int64_t>(m.vocab_.size()) + kIdSlack;
    if (max_id >= id_limit) {
      model.fail("vocab", m.vocab_.size(), " tokens but the largest id is ", max_id,
                 "; ids this sparse are not supported (largest id must be below ", id_limit, ")");
    }
    m.id_to_token_.assign(static_cast<std::size_t>(max_id + 1), std::string());
    m.has_id_.assign(static_cast<std::size_t>(max_id + 1), false);
    for (const auto& [token, id] : m.vocab_) {
      if (m.has_id_[std::size_t(id)]) {
        model.fail("vocab", "id ", id, " is given to both '", m.id_to_token_[std::size_t(id)], "' and '", token, "'");
      }
      m.has_id_[std::size_t(id)] = true;
      m.id_to_token_[std::size_t(id)] = token;
    }
    m.index_characters();

    if (model.has_non_null("unk_token")) {
      const std::string unk = model.string("unk_token");
      m.unk_token_ = unk;
      const auto it = m.vocab_.find(unk);
      m.unk_id_ = it == m.vocab_.end() ? -1 : it->second;
      m.has_unk_ = true;
    }
    m.parse_merges(model);
    return m;
  }

  std::size_t vocab_size() const { return vocab_.size(); }
  std::size_t merge_count() const { return merges_.size(); }
  bool chunks_at_metaspace() const { return chunk_at_metaspace_; }
  bool byte_fallback() const { return byte_fallback_; }

  int token_to_id(std::string_view token) const {
    const auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }
  // nullptr when no token has this id.
  const std::string* id_to_token(int id) const {
    if (id < 0 || std::size_t(id) >= has_id_.size() || !has_id_[std::size_t(id)]) return nullptr;
    return &id_to_token_[std::size_t(id)];
  }
  int max_id() const { return static_cast<int>(has_id_.size()) - 1; }

  // Appends the ids of one pre-tokenized word (valid UTF-8).
  void encode_word(std::string_view word, std::vector<int>& out, BpeScratch& scratch) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      const int id = token_to_id(word);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    if (!chunk_at_metaspace_) {
      encode_chunk(word, out, scratch);
      return;
    }
    // Exact shortcut, see plan_metaspace_cuts(): cut before "▁" where no merge can span the cut.
    std::size_t begin = 0;
    for (std::size_t p = word.find(kMetaspace, 1); p != std::string_view::npos; p = word.find(kMetaspace, p + 3)) {
      if (!may_cut_after(word, p)) continue;
      encode_chunk(word.substr(begin, p - begin), out, scratch);
      begin = p;
    }
    encode_chunk(word.substr(begin), out, scratch);
  }

 private:
  static constexpr std::int64_t kMaxId = std::int64_t{1} << 28;
  static constexpr std::int64_t kIdSlack = 65536;
  static constexpr std::string_view kMetaspace = "\xe2\x96\x81";  // U+2581, Gemma's space

  void encode_chunk(std::string_view chunk, std::vector<int>& out, BpeScratch& scratch) const {
    initial_symbols(chunk, scratch.symbols);
    merge_all(scratch);
    for (const auto& s : scratch.symbols) {
      if (s.len != 0) out.push_back(s.id);
    }
  }

  // Gemma has no splitting pre-tokenizer, so a "word" can be a whole document, and one heap over millions of
  // symbols is slow. A merge that spans the point between a character x and a following "▁" produces a token
  // that contains x immediately followed by "▁". So if x and "▁" are both in the vocabulary (their symbols are
  // their own tokens, and no unknown-character run straddles the point) and no merge result contains x"▁", no
  // merge or candidate pair ever crosses that point; BPE on the pieces between such points performs exactly the
  // merges of BPE on the whole, since merges in different pieces never interact and keep their relative order.
  void plan_metaspace_cuts(const std::vector<std::string>& merged) {
    chunk_at_metaspace_ = char_id_.count(0x2581) != 0;
    if (!chunk_at_metaspace_) return;
    for (const std::string& t : merged) {
      for (std::size_t p = t.find(kMetaspace, 1); p != std::string::npos; p = t.find(kMetaspace, p + 1)) {
        no_cut_after_.insert(previous_char(t, p));
      }
    }
    for (std::size_t c = 0; c < 128; ++c) cut_after_ascii_[c] = ascii_id_[c] >= 0 && !no_cut_after_.count(char32_t(c));
  }
  static char32_t previous_char(std::string_view s, std::size_t p) {
    std::size_t start = p - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    std::size_t len = 0;
    return decode_utf8_at(s, start, len);
  }
  bool may_cut_after(std::string_view word, std::size_t p) const {
    const auto last = static_cast<unsigned char>(word[p - 1]);
    if (last < 0x80) return cut_after_ascii_[last];
    const char32_t x = previous_char(word, p);
    return char_id_.count(x) != 0 && no_cut_after_.count(x) == 0;
  }

  template <std::size_t N>
  static std::array<int, N> no_ids() {
    std::array<int, N> a{};
    a.fill(-1);
    return a;
  }

  void index_characters() {
    for (const auto& [token, id] : vocab_) {
      const auto* p = reinterpret_cast<const unsigned char*>(token.data());
      if (token.size() == 1 && p[0] < 0x80) {
        ascii_id_[p[0]] = id;
      } else if (!token.empty() && utf8_length(p[0]) == token.size()) {
        std::size_t len = 0;
        char_id_.emplace(decode_utf8_at(token, 0, len), id);
      }
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        // Only the upper-case spelling is looked up: `tokenizers` formats the piece as "<{b:#04X}>".
        const int hi = hex_digit(token[3]), lo = hex_digit(token[4]);
        if (hi >= 0 && lo >= 0 && !is_lower_hex(token[3]) && !is_lower_hex(token[4])) {
          byte_id_[std::size_t(hi * 16 + lo)] = id;
        }
      }
    }
  }
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static bool is_lower_hex(char c) { return c >= 'a' && c <= 'f'; }

  void parse_merges(const JsonObject& model) {
    const Json& merges = model.required("merges");
    if (!merges.is_array()) model.fail("merges", "expected an array, got ", merges.type_name());
    merges_.reserve(merges.size());
    std::vector<std::string> merged;
    merged.reserve(merges.size());
    std::uint32_t rank = 0;
    std::string joined;
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const Json& m = merges[i];
      std::string a, b;
      if (m.is_string()) {
        // "a b" lines; like `tokenizers`, "#version" lines are skipped and do not take a rank.
        const std::string& line = m.get_ref<const std::string&>();
        if (line.rfind("#version", 0) == 0) continue;
        const std::size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
          model.fail("merges", "merge ", i, " ('", line, "') is not two tokens separated by one space");
        }
        a = line.substr(0, sp);
        b = line.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        model.fail("merges", "merge ", i, " is neither \"a b\" nor [\"a\", \"b\"]: ", m.dump());
      }
      const int ia = token_to_id(a), ib = token_to_id(b);
      joined = a + b;
      const int ij = token_to_id(joined);
      if (ia < 0 || ib < 0 || ij < 0) {
        model.fail("merges", "merge ", i, " ('", a, "' + '", b, "') uses a token that is not in the vocabulary ('",
                   ia < 0   ? a
                   : ib < 0 ? b
                            : joined,
                   "')");
      }
      merges_.insert(ia, ib, MergeTable::Value{rank, ij});
      merged.push_back(joined);
      ++rank;
    }
    plan_metaspace_cuts(merged);
  }

  // One symbol per character; unknown characters become byte pieces or the unknown token, in the same order
  // of checks as `tokenizers` (a pending fused unknown is not flushed before byte pieces, as there).
  void initial_symbols(std::string_view word, std::vector<BpeScratch::Symbol>& symbols) const {
    symbols.clear();
    symbols.reserve(word.size());
    const auto add = [&](int id, int len) {
      const int n = static_cast<int>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, len});
    };
    int unk_id = -1, unk_len = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(word.data());
    std::size_t i = 0;
    while (i < word.size()) {
      std::size_t len = 1;
      int id;
      if (p[i] < 0x80) {
        id = ascii_id_[p[i]];
      } else {
        const char32_t cp = decode_utf8_at(word, i, len);
        const auto it = char_id_.find(cp);
        id = it == char_id_.end() ? -1 : it->second;
      }
      if (id >= 0) {
        if (unk_len > 0) {
          add(unk_id, unk_len);
          unk_len = 0;
        }
        add(id, static_cast<int>(len));
      } else {
        bool done = false;
        if (byte_fallback_) {
          done = true;
          for (std::size_t k = 0; k < len; ++k) done = done && byte_id_[p[i + k]] >= 0;
          if (done) {
            for (std::size_t k = 0; k < len; ++k) add(byte_id_[p[i + k]], 1);
          }
        }
        if (!done && has_unk_) {
          if (unk_id_ < 0) {
            throw_error(StatusCode::kFormatError, source_, ": BPE unk_token '", unk_token_,
                        "' is not in the vocabulary");
          }
          if (unk_len > 0 && !fuse_unk_) {
            add(unk_id, unk_len);
            unk_len = 0;
          }
          unk_id = unk_id_;
          unk_len += static_cast<int>(len);
        }
      }
      i += len;
    }
    if (unk_len > 0) add(unk_id, unk_len);
    if (!symbols.empty()) symbols.back().next = -1;
  }

  // Repeatedly applies the lowest-ranked merge, leftmost first. Stale heap entries are skipped with the same
  // test `tokenizers` uses (the pair now at that position must still produce the entry's merged id).
  void merge_all(BpeScratch& scratch) const {
    auto& sym = scratch.symbols;
    auto& heap = scratch.heap;
    const auto later = [](const BpeScratch::Candidate& x, const BpeScratch::Candidate& y) {
      return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
    };
    heap.clear();
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      if (const MergeTable::Value* v = merges_.find(sym[i].id, sym[i + 1].id)) {
        heap.push_back({v->rank, static_cast<std::uint32_t>(i), v->id});
      }
    }
    std::make_heap(heap.begin(), heap.end(), later);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const BpeScratch::Candidate top = heap.back();
      heap.pop_back();
      BpeScratch::Symbol& left = sym[top.pos];
      if (left.len == 0 || left.next < 0) continue;
      const BpeScratch::Symbol right = sym[std::size_t(left.next)];
      const MergeTable::Value* now = merges_.find(left.id, right.id);
      if (now == nullptr || now->id != top.new_id) continue;

      sym[std::size_t(left.next)].len = 0;
      left.id = top.new_id;
      left.len += right.len;
      left.next = right.next;
      if (right.next >= 0) sym[std::size_t(right.next)].prev = static_cast<int>(top.pos);

      if (left.prev >= 0) {
        if (const MergeTable::Value* v = merges_.find(sym[std::size_t(left.prev)].id, left.id)) {
          heap.push_back({v->rank, static_cast<std::uint32_t>(left.prev), v->id});
          std::push_heap(heap.begin(), heap.end(), later);
        }
      }
      if (left.next >= 0) {
        if (const MergeTable::Value* v = merges_.find(left.id, sym[std::size_t(left.next)].id)) {
          heap.push_back({v->rank, top.pos, v->id});
          std::push_heap(heap.begin(), heap.end(), later);
        }
      }
    }
  }

  std::unordered_map<std::string, int> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  // -1: no such token (also in a default-constructed model, which then encodes nothing).
  std::array<int, 128> ascii_id_ = no_ids<128>();
  std::array<int, 256> byte_id_ = no_ids<256>();
  std::unordered_map<char32_t, int> char_id_;
  MergeTable merges_;
  std::string source_;  // for messages raised while encoding
  std::string unk_token_;
  int unk_id_ = -1;
  bool has_unk_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool chunk_at_metaspace_ = false;
  std::array<bool, 128> cut_after_ascii_{};
  std::unordered_set<char32_t> no_cut_after_;  // x such that some merge result contains x followed by "▁"
};

}  // namespace diffusion_gemma::io::tokenizer_detail
