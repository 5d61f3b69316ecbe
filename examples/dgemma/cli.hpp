// SPDX-License-Identifier: Apache-2.0
// A small, strict command-line parser for dgemma: `--name value`, `--name=value`, boolean
// `--flag` / `--no-flag`. Unknown flags, missing values and malformed numbers are errors that name
// the flag. Kept free of the model code so that it can be fuzzed on its own.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dgemma {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FlagSpec {
  std::string name;     // without dashes
  std::string meta;     // e.g. "DIR"; empty for a boolean flag
  std::string help;
};

class Flags {
 public:
  Flags(std::string command, std::string summary, std::vector<FlagSpec> specs)
      : command_(std::move(command)), summary_(std::move(summary)), specs_(std::move(specs)) {}

  // Parses argv-style arguments (after the subcommand). Returns false when --help was asked.
  bool parse(const std::vector<std::string>& args) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "--help" || a == "-h") return false;
      if (a.size() < 3 || a.compare(0, 2, "--") != 0) throw UsageError("unexpected argument '" + a + "' (flags start with --)");
      std::string name = a.substr(2), value;
      bool has_value = false;
      const auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      const FlagSpec* spec = find(name);
      bool negated = false;
      if (spec == nullptr && name.compare(0, 3, "no-") == 0) {
        spec = find(name.substr(3));
        negated = spec != nullptr && spec->meta.empty();
        if (!negated) spec = nullptr;
      }
      if (spec == nullptr) throw UsageError("unknown flag --" + name + " for '" + command_ + "' (see --help)");
      if (spec->meta.empty()) {
        if (has_value) throw UsageError("flag --" + spec->name + " takes no value");
        values_[spec->name] = negated ? "0" : "1";
        continue;
      }
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError("flag --" + name + " needs a value (" + spec->meta + ")");
        value = args[++i];
      }
      if (values_.count(spec->name)) throw UsageError("flag --" + name + " given twice");
      values_[spec->name] = value;
    }
    return true;
  }

  std::string usage() const {
    std::ostringstream s;
    s << "usage: dgemma " << command_ << " [flags]\n" << summary_ << "\n\nflags:\n";
    for (const auto& f : specs_) {
      std::string left = "  --" + f.name + (f.meta.empty() ? "" : " " + f.meta);
      if (left.size() < 34) left.resize(34, ' ');
      s << left << " " << f.help << "\n";
    }
    s << "  --help                             this text\n";
    return s.str();
  }

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool flag(const std::string& name, bool fallback = false) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second == "1";
  }
  std::string str(const std::string& name, const std::string& fallback = "") const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  std::string required(const std::string& name) const {
    if (!has(name)) throw UsageError("missing required flag --" + name + " for '" + command_ + "'");
    return str(name);
  }
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
    if (!has(name)) return fallback;
    return parse_int(name, str(name), lo, hi);
  }
  double number(const std::string& name, double fallback, double lo, double hi) const {
    if (!has(name)) return fallback;
    const std::string& v = str(name);
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(d)) {
      throw UsageError("flag --" + name + ": '" + v + "' is not a number");
    }
    if (d < lo || d > hi) {
      std::ostringstream s;
      s << "flag --" << name << ": " << d << " is out of range [" << lo << ", " << hi << "]";
      throw UsageError(s.str());
    }
    return d;
  }
  // A comma-separated list of integers in [lo, hi].
  std::vector<std::int64_t> integers(const std::string& name, std::int64_t lo, std::int64_t hi) const {
    std::vector<std::int64_t> out;
    const std::string v = required(name);
    std::size_t start = 0;
    while (start <= v.size()) {
      const std::size_t comma = v.find(',', start);
      const std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      out.push_back(parse_int(name, item, lo, hi));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  // An unsigned integer in [0, 2^64): a seed, which the server and batch files take over all 64 bits.
  std::uint64_t unsigned_integer(const std::string& name, std::uint64_t fallback) const {
    if (!has(name)) return fallback;
    const std::string& v = str(name);
    const std::size_t start = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
    std::uint64_t x = 0;
    if (start == 0 || v[0] == '+') {
      if (parse_digits(v, start, x)) return x;
    }
    if (!all_digits(v.substr(start))) throw UsageError("flag --" + name + ": '" + v + "' is not an integer");
    throw UsageError("flag --" + name + ": " + v + " is out of range [0, 18446744073709551615]");
  }

  static std::int64_t parse_int(const std::string& name, const std::string& v, std::int64_t lo, std::int64_t hi) {
    const bool neg = !v.empty() && v[0] == '-';
    const std::size_t start = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
    std::uint64_t acc = 0;
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!parse_digits(v, start, acc)) {
      if (!all_digits(v.substr(start))) throw UsageError("flag --" + name + ": '" + v + "' is not an integer");
      throw UsageError("flag --" + name + ": " + v + " is out of range " + range);
    }
    // Magnitudes past int64 are out of any range this parser is asked for.
    const std::uint64_t limit = neg ? std::uint64_t{1} << 63 : static_cast<std::uint64_t>(INT64_MAX);
    if (acc > limit) throw UsageError("flag --" + name + ": " + v + " is out of range " + range);
    const std::int64_t x = neg ? static_cast<std::int64_t>(0 - acc) : static_cast<std::int64_t>(acc);
    if (x < lo || x > hi) throw UsageError("flag --" + name + ": " + std::to_string(x) + " is out of range " + range);
    return x;
  }

 private:
  const FlagSpec* find(const std::string& name) const {
    for (const auto& s : specs_)
      if (s.name == name) return &s;
    return nullptr;
  }
  std::string command_, summary_;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;

  static bool all_digits(const std::string& v) {
    if (v.empty()) return false;
    for (const char c : v)
      if (c < '0' || c > '9') return false;
    return true;
  }
  // The decimal digits of v from `start` as a 64-bit count: false when there are none, when
  // another character is among them, or when the value does not fit 64 bits.
  static bool parse_digits(const std::string& v, std::size_t start, std::uint64_t& out) {
    if (start >= v.size()) return false;
    std::uint64_t acc = 0;
    for (std::size_t i = start; i < v.size(); ++i) {
      if (v[i] < '0' || v[i] > '9') return false;
      const auto d = static_cast<std::uint64_t>(v[i] - '0');
      if (acc > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
      acc = acc * 10 + d;
    }
    out = acc;
    return true;
  }
};

}  // namespace dgemma
