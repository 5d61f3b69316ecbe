// SPDX-License-Identifier: Apache-2.0
// Text helpers for the tokenizer: UTF-8 repair with Python's rules, the two whitespace definitions the
// Hugging Face stack uses (Rust's `\s` in `tokenizers`, Python's str.isspace in Jinja chat templates), and
// literal search/replace. Kept separate so the chat format can use them without the tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <diffusion_gemma/io/utf8.hpp>

namespace diffusion_gemma::io::tokenizer_detail {

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Byte length of the UTF-8 sequence that starts with `lead`, for text already known to be valid.
inline std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xe0) return 2;
  if (lead < 0xf0) return 3;
  return 4;
}

// Code point at s[i] of valid UTF-8; sets len to its byte length. On invalid UTF-8 the value is
// meaningless, but nothing past the end of `s` is read: a sequence cut by the end is one U+FFFD byte.
inline char32_t decode_utf8_at(std::string_view s, std::size_t i, std::size_t& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  len = utf8_length(p[0]);
  if (len > s.size() - i) {
    len = 1;
    return 0xfffd;
  }
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return (char32_t(p[0] & 0x1f) << 6) | (p[1] & 0x3f);
    case 3:
      return (char32_t(p[0] & 0x0f) << 12) | (char32_t(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3f) << 12) | (char32_t(p[2] & 0x3f) << 6) |
             (p[3] & 0x3f);
  }
}

// What Python's bytes.decode("utf-8", errors="replace") returns, re-encoded as UTF-8: every maximal prefix of
// a well-formed sequence that cannot be completed becomes one U+FFFD, and so does every byte that cannot
// start a sequence (the Unicode "maximal subpart" practice, which CPython follows).
inline std::string replace_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::string out;
  out.reserve(n + n / 2);
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      need = 1;
    } else if (c == 0xe0) {
      need = 2;
      lo = 0xa0;
    } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) {
      need = 2;
    } else if (c == 0xed) {
      need = 2;
      hi = 0x9f;  // no surrogates
    } else if (c == 0xf0) {
      need = 3;
      lo = 0x90;
    } else if (c >= 0xf1 && c <= 0xf3) {
      need = 3;
    } else if (c == 0xf4) {
      need = 3;
      hi = 0x8f;  // nothing above U+10FFFF
    } else {
      out += "\xef\xbf\xbd";
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    int got = 0;
    while (got < need && j < n && p[j] >= lo && p[j] <= hi) {
      lo = 0x80;
      hi = 0xbf;
      ++j;
      ++got;
    }
    if (got == need) {
      out.append(s.data() + i, j - i);
    } else {
      out += "\xef\xbf\xbd";
    }
    i = j;
  }
  return out;
}

// Rust regex `\s` (Unicode White_Space), which `tokenizers` uses for the lstrip/rstrip of added tokens.
inline bool is_unicode_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Python str.isspace(), which Jinja's `trim` filter (str.strip) uses: White_Space plus U+001C..U+001F.
inline bool is_python_space(char32_t c) { return is_unicode_white_space(c) || (c >= 0x1c && c <= 0x1f); }

// Byte offset where the run of trailing White_Space of valid UTF-8 `s` begins.
inline std::size_t trailing_white_space_start(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    std::size_t len = 0;
    if (!is_unicode_white_space(decode_utf8_at(s, start, len))) break;
    end = start;
  }
  return end;
}

// Byte length of the run of leading White_Space of valid UTF-8 `s`.
inline std::size_t leading_white_space_length(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t len = 0;
    if (!is_unicode_white_space(decode_utf8_at(s, i, len))) break;
    i += len;
  }
  return i;
}

// Python's str.strip() with no argument, on valid UTF-8.
inline std::string_view python_strip(std::string_view s) {
  std::size_t begin = 0;
  while (begin < s.size()) {
    std::size_t len = 0;
    if (!is_python_space(decode_utf8_at(s, begin, len))) break;
    begin += len;
  }
  std::size_t end = s.size();
  while (end > begin) {
    std::size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    std::size_t len = 0;
    if (!is_python_space(decode_utf8_at(s, start, len))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Replaces every non-overlapping occurrence of `pattern` (non-empty), scanning left to right, as a regex made
// of the escaped literal does.
inline void replace_all_into(std::string_view s, std::string_view pattern, std::string_view content, std::string& out) {
  std::size_t pos = 0;
  if (pattern.size() == 1) {
    const char c = pattern[0];
    for (;;) {
      const std::size_t hit = s.find(c, pos);
      if (hit == std::string_view::npos) break;
      out.append(s.data() + pos, hit - pos);
      out.append(content.data(), content.size());
      pos = hit + 1;
    }
  } else {
    for (;;) {
      const std::size_t hit = s.find(pattern, pos);
      if (hit == std::string_view::npos) break;
      out.append(s.data() + pos, hit - pos);
      out.append(content.data(), content.size());
      pos = hit + pattern.size();
    }
  }
  out.append(s.data() + pos, s.size() - pos);
}

inline std::string replace_all(std::string_view s, std::string_view pattern, std::string_view content) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  replace_all_into(s, pattern, content, out);
  return out;
}

}  // namespace diffusion_gemma::io::tokenizer_detail
