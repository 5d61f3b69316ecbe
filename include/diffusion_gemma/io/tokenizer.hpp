// SPDX-License-Identifier: Apache-2.0
// A Hugging Face tokenizer.json of the kind Gemma ships (BPE with byte fallback), loaded, encoded and decoded
// so that the ids and text are exactly what the Python `tokenizers` library (0.23) produces:
//   Tokenizer::encode(text)        == Tokenizer.from_file(F).encode(text).ids           (post-processor applied)
//   Tokenizer::encode(text, false) == ....encode(text, add_special_tokens=False).ids
//   Tokenizer::decode(ids)         == ....decode(ids)                                    (skip_special_tokens=True)
//   Tokenizer::decode(ids, false)  == ....decode(ids, skip_special_tokens=False)
// tests/io/tokenizer_test.cpp checks this against golden outputs of tools/reference/make_tokenizer_fixtures.py.
//
// Supported components (anything else is rejected with StatusCode::kUnsupported, naming the file, the JSON path
// of the component and its type):
//   model           BPE: vocab, merges as "a b" strings or ["a", "b"] pairs, byte_fallback, unk_token, fuse_unk,
//                   ignore_merges; dropout must be null or 0, continuing_subword_prefix / end_of_word_suffix unset
//   normalizer      null, Replace (String pattern), Prepend, Sequence of these
//   pre_tokenizer   null, Split (String pattern, any behavior, invert), Sequence of these
//   post_processor  null, TemplateProcessing (the single-sequence template)
//   decoder         null, Replace (String pattern), ByteFallback, Fuse, Strip, Sequence of these
//   added_tokens    special and non-special; lstrip, rstrip and normalized honoured; single_word rejected
//   truncation, padding must be null.
//
// Two deliberate differences from Python, where Python has no equivalent input or silently drops data:
//   * encode() takes bytes. Invalid UTF-8 is first repaired exactly as Python's
//     bytes.decode("utf-8", errors="replace") does (each maximal invalid subpart becomes U+FFFD), so the ids equal
//     Python's for the repaired str; the golden fixtures hold such inputs.
//   * decode() of an id that names no token throws Error(kOutOfRange) naming the id; Python skips it silently.
// Decoding byte pieces that do not form valid UTF-8 yields U+FFFD per byte, as `tokenizers`' ByteFallback does.
//
// A Tokenizer is immutable after loading; encode and decode are const and safe to call from several threads.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/tokenizer_bpe.hpp>
#include <diffusion_gemma/io/tokenizer_components.hpp>
#include <diffusion_gemma/io/tokenizer_text.hpp>
#include <diffusion_gemma/io/utf8.hpp>

namespace diffusion_gemma::io {

namespace tokenizer_detail {

// Byte trie over added-token patterns; longest_at() gives the leftmost-longest semantics of the Aho-Corasick
// automaton `tokenizers` uses when the caller scans start positions left to right.
class TokenTrie {
 public:
  bool empty() const { return nodes_.size() <= 1; }
  bool may_start(unsigned char c) const { return root_[c] >= 0; }

  void insert(std::string_view pattern, int value) {
    if (pattern.empty()) return;
    int node = 0;
    for (std::size_t k = 0; k < pattern.size(); ++k) {
      const auto c = static_cast<unsigned char>(pattern[k]);
      int next = child(node, c);
      if (next < 0) {
        next = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_[c] = next;
        } else {
          nodes_[std::size_t(node)].children.emplace_back(c, next);
        }
      }
      node = next;
    }
    nodes_[std::size_t(node)].value = value;
  }

  // Value of the longest pattern starting at s[i] (sets `end`), or -1.
  int longest_at(std::string_view s, std::size_t i, std::size_t& end) const {
    int node = 0, best = -1;
    for (std::size_t k = i; k < s.size(); ++k) {
      node = child(node, static_cast<unsigned char>(s[k]));
      if (node < 0) break;
      if (nodes_[std::size_t(node)].value >= 0) {
        best = nodes_[std::size_t(node)].value;
        end = k + 1;
      }
    }
    return best;
  }

 private:
  struct Node {
    int value = -1;
    std::vector<std::pair<unsigned char, int>> children;
  };
  int child(int node, unsigned char c) const {
    if (node == 0) return root_[c];
    for (const auto& [byte, next] : nodes_[std::size_t(node)].children) {
      if (byte == c) return next;
    }
    return -1;
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<int, 256> root_ = make_root();
  static std::array<int, 256> make_root() {
    std::array<int, 256> r{};
    r.fill(-1);
    return r;
  }
};

}  // namespace tokenizer_detail

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path) { return from_json(read_json_file(path), path); }

  // `source` names the file in error messages.
  static Tokenizer from_json(const Json& j, const std::string& source) {
    Tokenizer t;
    t.source_ = source;
    const JsonObject top(j, source, "");
    if (top.has_non_null("version") && top.string("version") != "1.0") {
      top.fail("version", "unknown tokenizer.json version '", top.string("version"), "' (expected 1.0)");
    }
    for (const char* key : {"truncation", "padding"}) {
      if (top.has_non_null(key)) {
        throw_error(StatusCode::kUnsupported, source, ": ", key, ": ", key,
                    " in tokenizer.json is not supported (must be null; truncate or pad the ids instead)");
      }
    }
    const auto component = [&](const char* key) -> const Json& {
      static const Json null_json;
      return top.has(key) ? top.raw(key) : null_json;
    };
    t.model_ = tokenizer_detail::BpeModel::from_json(top.object("model"));
    t.normalizer_ = tokenizer_detail::Normalizer::from_json(component("normalizer"), source, "normalizer");
    t.pre_tokenizer_ = tokenizer_detail::PreTokenizer::from_json(component("pre_tokenizer"), source, "pre_tokenizer");
    t.post_processor_ =
        tokenizer_detail::PostProcessor::from_json(component("post_processor"), source, "post_processor");
    t.decoder_ = tokenizer_detail::Decoder::from_json(component("decoder"), source, "decoder");
    t.load_added_tokens(component("added_tokens"));
    return t;
  }

  // Ids of `text` (any bytes; see the header comment for invalid UTF-8). With add_special_tokens the
  // post-processor's template is applied (Gemma's files: <bos> first).
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const {
    std::string repaired;
    if (!is_valid_utf8(text)) {
      repaired = tokenizer_detail::replace_invalid_utf8(text);
      text = repaired;
    }
    std::vector<int> ids;
    ids.reserve(text.size() / 3 + 4);
    Scratch scratch;
    split_on_added(text, raw_trie_, [&](std::size_t begin, std::size_t end, int added) {
      if (added >= 0) {
        ids.push_back(added_[std::size_t(added)].id);
      } else if (normalizer_.empty()) {
        encode_normalized(text.substr(begin, end - begin), ids, scratch);
      } else {
        encode_normalized(normalizer_.apply(text.substr(begin, end - begin)), ids, scratch);
      }
    });
    if (add_special_tokens) post_processor_.apply(ids);
    return ids;
  }

  std::string decode(const std::vector<int>& ids, bool skip_special_tokens = true) const {
    return decode(ids.data(), ids.size(), skip_special_tokens);
  }
  std::string decode(const int* ids, std::size_t n, bool skip_special_tokens = true) const {
    std::vector<std::string> tokens;
    tokens.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const int id = ids[i];
      check_id(id);
      if (skip_special_tokens && skip_[std::size_t(id)]) continue;
      tokens.push_back(decode_form(id));
    }
    return decoder_.decode(std::move(tokens));
  }

  // Number of distinct token strings, added tokens included (Python's get_vocab_size()).
  int vocab_size() const { return vocab_size_; }
  // One past the largest id; every id below it may be passed to decode() if it names a token.
  int id_limit() const { return static_cast<int>(skip_.size()); }

  std::optional<int> find_token(std::string_view token) const {
    const auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return added_[it->second].id;
    const int id = model_.token_to_id(token);
    if (id >= 0) return id;
    return std::nullopt;
  }
  int token_id(std::string_view token) const {
    const std::optional<int> id = find_token(token);
    if (!id) throw_error(StatusCode::kNotFound, source_, ": token '", token, "' is not in the vocabulary");
    return *id;
  }
  // The token's own string (added-token content or BPE piece, e.g. "▁the" or "<0x0A>").
  std::string id_to_token(int id) const {
    check_id(id);
    const int a = added_index_by_id_[std::size_t(id)];
    return a >= 0 ? added_[std::size_t(a)].content : *model_.id_to_token(id);
  }
  // Whether the text of `id` can still change with the tokens decoded after it: a byte-fallback
  // piece ("<0xNN>") decodes together with the byte pieces next to it (a run that is not valid
  // UTF-8 becomes one U+FFFD per byte, earlier bytes included), and a token skipped in decoding
  // does not end such a run. A stream holds back the text of a trailing run of these.
  bool decodes_with_next(int id) const {
    if (is_special(id)) return true;
    if (added_index_by_id_[std::size_t(id)] >= 0) return false;
    const std::string* piece = model_.id_to_token(id);
    return piece != nullptr && piece->size() == 6 && piece->compare(0, 3, "<0x") == 0 && (*piece)[5] == '>';
  }
  bool is_special(int id) const {
    check_id(id);
    return skip_[std::size_t(id)] != 0;
  }
  bool has_id(int id) const {
    return id >= 0 && id < id_limit() &&
           (added_index_by_id_[std::size_t(id)] >= 0 || model_.id_to_token(id) != nullptr);
  }
  // What the post-processor puts before the text (Gemma: {<bos>}); empty when there is no post-processor.
  std::vector<int> special_prefix_ids() const { return post_processor_.prefix_ids(); }
  const std::string& source() const { return source_; }

 private:
  struct AddedToken {
    std::string content;
    std::string decoded;  // what decode() feeds the decoder: the normalized form for normalized tokens
    int id = -1;
    bool lstrip = false, rstrip = false, normalized = true, special = false;
  };
  struct Scratch {
    tokenizer_detail::BpeScratch bpe;
    std::vector<tokenizer_detail::PreTokenizer::Piece> pieces, pieces_tmp;
  };

  void check_id(int id) const {
    if (!has_id(id)) {
      throw_error(StatusCode::kOutOfRange, source_, ": token id ", id, " is not in the vocabulary (", vocab_size_,
                  " tokens, ids below ", id_limit(), ")");
    }
  }
  const std::string& decode_form(int id) const {
    const int a = added_index_by_id_[std::size_t(id)];
    return a >= 0 ? added_[std::size_t(a)].decoded : *model_.id_to_token(id);
  }

  void encode_normalized(std::string_view s, std::vector<int>& ids, Scratch& scratch) const {
    split_on_added(s, normalized_trie_, [&](std::size_t begin, std::size_t end, int added) {
      if (added >= 0) {
        ids.push_back(added_[std::size_t(added)].id);
        return;
      }
      const std::string_view segment = s.substr(begin, end - begin);
      if (pre_tokenizer_.empty()) {
        model_.encode_word(segment, ids, scratch.bpe);
        return;
      }
      pre_tokenizer_.split(segment, scratch.pieces, scratch.pieces_tmp);
      for (const auto& [offset, length] : scratch.pieces) {
        model_.encode_word(segment.substr(offset, length), ids, scratch.bpe);
      }
    });
  }

  // `tokenizers`' AddedVocabulary::find_matches: non-overlapping leftmost-longest matches, widened by
  // lstrip/rstrip, with the text between them. emit(begin, end, added index or -1) for non-empty pieces.
  // The arithmetic (including a start that an earlier rstrip already passed) mirrors the original on purpose.
  template <class Emit>
  void split_on_added(std::string_view s, const tokenizer_detail::TokenTrie& trie, Emit&& emit) const {
    if (s.empty()) return;
    if (trie.empty()) {
      emit(std::size_t{0}, s.size(), -1);
      return;
    }
    std::size_t start_offset = 0;
    std::size_t white_space_end = 0;  // where the last rstrip scan stopped: [its match end, here) is all White_Space
    std::size_t i = 0;
    while (i < s.size()) {
      std::size_t match_end = 0;
      const int a = trie.may_start(static_cast<unsigned char>(s[i])) ? trie.longest_at(s, i, match_end) : -1;
      if (a < 0) {
        ++i;
        continue;
      }
      const AddedToken& tok = added_[std::size_t(a)];
      std::size_t start = i, stop = match_end;
      // Both scans stop where an earlier one already looked, so that a long run of White_Space with a
      // stripping token in it stays linear; the results are the same as scanning the whole text.
      if (tok.lstrip) {
        start = start <= start_offset ? start_offset
                                      : start_offset + tokenizer_detail::trailing_white_space_start(
                                                           s.substr(start_offset, start - start_offset));
      }
      if (tok.rstrip) {
        stop = stop <= white_space_end ? white_space_end
                                       : stop + tokenizer_detail::leading_white_space_length(s.substr(stop));
        white_space_end = stop;
      }
      // An lstrip match inside White_Space that an earlier rstrip took is left empty (start == stop), which
      // `tokenizers` drops, or ends before it starts, where `tokenizers` panics ("AddedVocabulary bad split");
      // both are skipped here, so the text they matched stays with the earlier token.
      if (start >= stop) {
        i = match_end;
        continue;
      }
      if (start_offset < start) emit(start_offset, start, -1);
      emit(start, stop, a);
      start_offset = stop;
      i = match_end;
    }
    if (start_offset < s.size()) emit(start_offset, s.size(), -1);
  }

  // Mirrors AddedVocabulary::add_tokens as `tokenizers` runs it when loading: an added token takes the id its
  // content has in the model vocabulary, otherwise the next id after the model's; a repeated content updates
  // the flags of the earlier entry; the "id" field in the file is only advisory there, and so it is here.
  void load_added_tokens(const Json& list) {
    if (!list.is_null() && !list.is_array()) {
      throw_error(StatusCode::kFormatError, source_, ": added_tokens: expected an array");
    }
    std::unordered_set<std::string> special_contents;
    std::unordered_map<int, std::size_t> index_by_id;
    int next_id = static_cast<int>(model_.vocab_size());
    for (std::size_t i = 0; list.is_array() && i < list.size(); ++i) {
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      const JsonObject o(list[i], source_, path);
      AddedToken tok;
      tok.content = o.string("content");
      if (tok.content.empty()) continue;
      if (o.boolean_or("single_word", false)) {
        throw_error(StatusCode::kUnsupported, o.where("single_word"), ": added token '", tok.content,
                    "' has single_word=true, which is not supported");
      }
      tok.lstrip = o.boolean_or("lstrip", false);
      tok.rstrip = o.boolean_or("rstrip", false);
      tok.normalized = o.boolean_or("normalized", true);
      tok.special = o.boolean_or("special", false);
      const auto existing = added_by_content_.find(tok.content);
      if (existing != added_by_content_.end()) {
        // `tokenizers` keeps parts of the first entry and takes others from the later one, so
        // decoding can differ from what either entry says: a repeat must say the same thing.
        const AddedToken& first = added_[existing->second];
        if (first.lstrip != tok.lstrip || first.rstrip != tok.rstrip || first.normalized != tok.normalized ||
            first.special != tok.special) {
          throw_error(StatusCode::kUnsupported, o.where("content"), ": added token '", tok.content,
                      "' is listed again with different lstrip/rstrip/normalized/special flags");
        }
        tok.id = added_[existing->second].id;
      } else {
        const int model_id = model_.token_to_id(tok.content);
        tok.id = model_id >= 0 ? model_id : next_id++;
      }
      tok.decoded = tok.content;
      if (tok.normalized && !normalizer_.empty()) tok.decoded = normalizer_.apply(tok.content);
      if (tok.special) special_contents.insert(tok.content);
      const auto slot = index_by_id.find(tok.id);
      if (slot != index_by_id.end()) {
        added_[slot->second] = tok;
      } else {
        index_by_id.emplace(tok.id, added_.size());
        added_.push_back(tok);
      }
      added_by_content_[tok.content] = index_by_id[tok.id];
    }

    int limit = model_.max_id() + 1;
    for (const AddedToken& tok : added_) limit = std::max(limit, tok.id + 1);
    added_index_by_id_.assign(std::size_t(limit), -1);
    skip_.assign(std::size_t(limit), 0);
    for (std::size_t k = 0; k < added_.size(); ++k) {
      const AddedToken& tok = added_[k];
      added_index_by_id_[std::size_t(tok.id)] = static_cast<int>(k);
      (tok.normalized ? normalized_trie_ : raw_trie_).insert(tok.normalized ? tok.decoded : tok.content, int(k));
    }
    vocab_size_ = static_cast<int>(model_.vocab_size());
    for (const auto& [content, k] : added_by_content_) {
      if (model_.token_to_id(content) < 0) ++vocab_size_;
      (void)k;
    }
    // Python skips a token when its decode string is a special token's content, whatever its id.
    for (int id = 0; id < limit; ++id) {
      if (has_id(id) && special_contents.count(decode_form(id))) skip_[std::size_t(id)] = 1;
    }
  }

  std::string source_;
  tokenizer_detail::BpeModel model_;
  tokenizer_detail::Normalizer normalizer_;
  tokenizer_detail::PreTokenizer pre_tokenizer_;
  tokenizer_detail::PostProcessor post_processor_;
  tokenizer_detail::Decoder decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, std::size_t> added_by_content_;
  std::vector<int> added_index_by_id_;
  std::vector<char> skip_;
  tokenizer_detail::TokenTrie raw_trie_, normalized_trie_;
  int vocab_size_ = 0;
};

}  // namespace diffusion_gemma::io
