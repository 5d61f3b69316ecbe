// SPDX-License-Identifier: Apache-2.0
// Committed canvases -> text deltas for a stream. Three things make this more than "decode the
// new tokens":
//   * byte-fallback tokens can split one UTF-8 character across two canvases; decoded alone, the
//     first half reads as U+FFFD. A delta therefore never ends in U+FFFD or in an incomplete UTF-8
//     sequence until the last canvas: that tail is held back and sent once the next canvas completes it;
//   * stop sequences apply to the text, and may also straddle canvases: a tail that could be the
//     start of a stop sequence is held back too, and text from the first match on is never sent;
//   * byte-fallback tokens decode in runs, and a run that turns out not to be UTF-8 becomes one
//     U+FFFD per byte, the bytes already decoded included: the text of a trailing run (which the
//     caller's `pending` predicate picks out) is held back until a token ends the run;
//   * max_tokens is a hard limit although canvases are whole: tokens past it are dropped.
// The concatenated deltas equal the text of the non-streamed answer, and neither depends on how
// the tokens were split into canvases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dgemma::serve {

// Bytes at the end of `s` that form an incomplete UTF-8 sequence (0 when it ends on a boundary).
inline std::size_t incomplete_utf8_tail(const std::string& s) {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: look further back for the lead
    const std::size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// Bytes at the end of `s` made of U+FFFD replacement characters (EF BF BD each).
inline std::size_t replacement_tail(const std::string& s) {
  static const std::string kFffd = "\xEF\xBF\xBD";
  std::size_t n = s.size();
  while (n >= 3 && s.compare(n - 3, 3, kFffd) == 0) n -= 3;
  return s.size() - n;
}

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`.
inline std::size_t stop_prefix_tail(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t best = 0;
  for (const auto& s : stops) {
    for (std::size_t k = std::min(s.size() - 1, text.size()); k > best; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

class TextAssembler {
 public:
  using Decode = std::function<std::string(const std::vector<std::int32_t>&)>;
  // Whether a token's text may still change with the tokens after it (Tokenizer::decodes_with_next).
  using Pending = std::function<bool(std::int32_t)>;

  struct Delta {
    std::string text;            // to send now (may be empty)
    bool finished = false;       // no more text will come
    const char* finish_reason = nullptr;  // "stop" or "length" when finished
  };

  TextAssembler(Decode decode, std::vector<std::string> stops, int max_tokens, Pending pending = {})
      : decode_(std::move(decode)), stops_(std::move(stops)), max_tokens_(max_tokens), pending_(std::move(pending)) {}

  // One committed canvas: its valid tokens (up to and including a stop id), whether it ended on a
  // stop id, and whether it is the request's last.
  Delta add(const std::int32_t* tokens, int valid, bool stop_token, bool last) {
    Delta d;
    if (finished_) {
      d.finished = true;
      d.finish_reason = reason_;
      return d;
    }
    int keep = valid;
    bool length_cut = false;
    if (static_cast<int>(tokens_.size()) + keep >= max_tokens_) {
      length_cut = static_cast<int>(tokens_.size()) + keep > max_tokens_ || !stop_token;
      keep = max_tokens_ - static_cast<int>(tokens_.size());
      last = true;
    }
    tokens_.insert(tokens_.end(), tokens, tokens + keep);
    const bool ended_on_stop_id = stop_token && keep == valid;
    // Until the last canvas, decisions rest on the text that later tokens cannot change.
    std::size_t settled = tokens_.size();
    if (!last && pending_) {
      while (settled > 0 && pending_(tokens_[settled - 1])) --settled;
    }
    const std::string text = settled == tokens_.size()
                                 ? decode_(tokens_)
                                 : decode_(std::vector<std::int32_t>(tokens_.begin(), tokens_.begin() + settled));
    // A decoder that rewrote already-sent text cannot be taken back: wait until it agrees again.
    const bool prefix_ok = text.compare(0, sent_.size(), sent_) == 0;

    std::size_t end = text.size();
    bool stopped = false;
    for (const auto& s : stops_) {
      const std::size_t at = text.find(s, sent_.size() >= s.size() ? sent_.size() - s.size() + 1 : 0);
      if (at != std::string::npos && at < end) {  // the earliest match wins
        end = std::max(at, sent_.size());
        stopped = true;
        stopping_word_ = s;
      }
    }
    if (!stopped && !last) {
      end -= std::max(incomplete_utf8_tail(text), replacement_tail(text));
      end = std::min(end, text.size() - stop_prefix_tail(text, stops_));
    }
    if (prefix_ok && end > sent_.size()) {
      d.text = text.substr(sent_.size(), end - sent_.size());
      sent_ += d.text;
    }
    if (stopped || last) {
      finished_ = true;
      reason_ = stopped || (ended_on_stop_id && !length_cut) ? "stop" : "length";
      d.finished = true;
      d.finish_reason = reason_;
    }
    return d;
  }

  // Generated tokens that count for usage: those kept (a stop sequence does not un-generate them).
  int completion_tokens() const { return static_cast<int>(tokens_.size()); }
  const std::string& text() const { return sent_; }
  bool finished() const { return finished_; }
  // The generated tokens kept (max_tokens cuts them; a stop sequence does not).
  const std::vector<std::int32_t>& tokens() const { return tokens_; }
  // The stop sequence that ended the text ("" when a stop id or max_tokens did).
  const std::string& stopping_word() const { return stopping_word_; }

 private:
  Decode decode_;
  std::vector<std::string> stops_;
  int max_tokens_;
  Pending pending_;
  std::vector<std::int32_t> tokens_;
  std::string sent_;
  std::string stopping_word_;
  bool finished_ = false;
  const char* reason_ = nullptr;
};

}  // namespace dgemma::serve
