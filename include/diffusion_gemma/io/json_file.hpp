// SPDX-License-Identifier: Apache-2.0
// Reading JSON files with messages that name the file and the key path at fault.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/utf8.hpp>

namespace diffusion_gemma::io {

using Json = nlohmann::json;

// The offset of a NUL byte in `text`, or npos. JSON never holds a raw NUL (inside a string it is
// escaped), and the parser takes one for the end of its input: what followed would be dropped.
inline std::size_t find_nul(std::string_view text) { return text.find('\0'); }

inline Json parse_json_text(std::string_view text, const std::string& where) {
  const auto bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos) throw_error(StatusCode::kFormatError, where, ": not valid UTF-8 (byte ", bad, ")");
  const auto nul = find_nul(text);
  if (nul != std::string_view::npos) throw_error(StatusCode::kFormatError, where, ": not valid JSON: a NUL byte at offset ", nul);
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw_error(StatusCode::kFormatError, where, ": not valid JSON: ", e.what());
  }
}

inline std::string read_text_file(const std::string& path) {
  // Checked before opening: opening a FIFO would block until a writer comes, and a directory
  // "opens" and reads as empty.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_error(StatusCode::kNotFound, path, ": cannot open: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    throw_error(StatusCode::kIoError, path, ": not a regular file (", S_ISDIR(st.st_mode) ? "a directory" : "a special file", ")");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(StatusCode::kNotFound, path, ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw_error(StatusCode::kIoError, path, ": read failed");
  return s.str();
}

inline Json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

// A cursor into a JSON object that knows its path ("config.json: text_config.rope_parameters").
class JsonObject {
 public:
  JsonObject(const Json& j, std::string file, std::string path) : j_(j), file_(std::move(file)), path_(std::move(path)) {
    if (!j_.is_object()) fail_here("expected an object, got ", type_of(j_));
  }

  bool has(const std::string& key) const { return j_.contains(key); }
  bool has_non_null(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const Json& raw(const std::string& key) const { return j_.at(key); }
  Json::const_iterator raw_begin() const { return j_.begin(); }
  Json::const_iterator raw_end() const { return j_.end(); }
  std::string where(const std::string& key) const { return file_ + ": " + (path_.empty() ? key : path_ + "." + key); }
  const std::string& file() const { return file_; }

  const Json& required(const std::string& key) const {
    if (!j_.contains(key)) {
      throw_error(StatusCode::kFormatError, file_, ": missing required key '", path_.empty() ? key : path_ + "." + key, "'");
    }
    return j_.at(key);
  }
  JsonObject object(const std::string& key) const { return JsonObject(required(key), file_, join(key)); }

  std::int64_t integer(const std::string& key) const { return as_integer(required(key), key); }
  std::int64_t integer_or(const std::string& key, std::int64_t fallback) const {
    return has_non_null(key) ? as_integer(j_.at(key), key) : fallback;
  }
  double number(const std::string& key) const { return as_number(required(key), key); }
  double number_or(const std::string& key, double fallback) const {
    return has_non_null(key) ? as_number(j_.at(key), key) : fallback;
  }
  bool boolean(const std::string& key) const {
    const Json& v = required(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got ", type_of(v));
    return v.get<bool>();
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    if (!has_non_null(key)) return fallback;
    return boolean(key);
  }
  std::string string(const std::string& key) const {
    const Json& v = required(key);
    if (!v.is_string()) fail(key, "expected a string, got ", type_of(v));
    return v.get<std::string>();
  }
  std::int64_t as_integer(const Json& v, const std::string& key) const {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(key, "value ", v.dump(), " is out of range");
    }
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) return static_cast<std::int64_t>(d);
    }
    fail(key, "expected an integer, got ", type_of(v), " ", v.dump());
  }
  // Every number read here is computed with in fp32: one that becomes Inf or 0 there (1e300, 1e-300)
  // is refused, rather than passing a check in double and overflowing later.
  double as_number(const Json& v, const std::string& key) const {
    if (!v.is_number()) fail(key, "expected a number, got ", type_of(v));
    const double d = v.get<double>();
    const double a = std::abs(d);
    if (a > static_cast<double>(std::numeric_limits<float>::max()) ||
        (a != 0.0 && a < static_cast<double>(std::numeric_limits<float>::min()))) {
      fail(key, "value ", v.dump(), " is not representable in fp32 (magnitudes ", std::numeric_limits<float>::min(), " to ",
           std::numeric_limits<float>::max(), ")");
    }
    return d;
  }
  int as_int32(std::int64_t v, const std::string& key) const {
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) fail(key, "value ", v, " is out of range");
    return static_cast<int>(v);
  }
  int int32(const std::string& key) const { return as_int32(integer(key), key); }

  template <class... Args>
  [[noreturn]] void fail(const std::string& key, Args&&... parts) const {
    throw_error(StatusCode::kFormatError, where(key), ": ", std::forward<Args>(parts)...);
  }
  template <class... Args>
  [[noreturn]] void fail_here(Args&&... parts) const {
    throw_error(StatusCode::kFormatError, file_, ": ", path_.empty() ? "top level" : path_, ": ", std::forward<Args>(parts)...);
  }
  static const char* type_of(const Json& v) { return v.type_name(); }

 private:
  std::string join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const Json& j_;
  std::string file_;
  std::string path_;
};

}  // namespace diffusion_gemma::io
