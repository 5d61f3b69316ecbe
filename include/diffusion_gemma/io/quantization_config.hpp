// SPDX-License-Identifier: Apache-2.0
// The `quantization_config` of a checkpoint (docs/quantization.md): compressed-tensors (what vLLM
// serves and llm-compressor writes) and GPTQ (GPTQModel). Parsing checks every field this
// library relies on and refuses, naming the key, every scheme it does not compute (NVFP4,
// block-wise scales, 2- and 3-bit integers, activation-order groups, sparsity, transforms,
// quantized KV caches), so an unsupported checkpoint fails at load, never computes wrongly.
//
// Which modules a compressed-tensors group applies to follows the package's rules: `ignore` wins;
// then a target matches a module by exact name, by a `re:` regular expression matched from the
// start of the name, or by the module's class name ("Linear", "Embedding").
#pragma once

#include <cctype>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/json_file.hpp>

namespace diffusion_gemma::io {

enum class QuantMethod { kNone, kCompressedTensors, kGptq };

// A module target or ignore entry: an exact name, a class name, or "re:" and a regular expression
// (compiled once). A config.json may come from anywhere, so a pattern is at most 512 characters
// with no counted repetition ({n}) and no backslash-digit escape (a backreference); none of the
// published configs uses either. That keeps the compiled automaton linear in the pattern, so
// libstdc++ matches it without backtracking, and keeps digit runs away from libstdc++'s parser,
// which accumulates them in a `long` that overflows (undefined behaviour) before it can refuse.
struct ModulePattern {
  static constexpr std::size_t kMaxLength = 512;
  std::string text;
  std::shared_ptr<const std::regex> re;

  // Why a regular expression (without its "re:") is outside these bounds, or nullptr.
  static const char* out_of_bounds(const std::string& body) {
    if (body.size() > kMaxLength) return "is longer than 512 characters";
    if (body.find('{') != std::string::npos) return "has a {n} repetition";
    for (std::size_t i = 0; i + 1 < body.size(); ++i) {
      if (body[i] != '\\') continue;
      if (body[i + 1] >= '0' && body[i + 1] <= '9') return "has a backreference (backslash and digit)";
      ++i;  // the escaped character is literal, even a backslash
    }
    return nullptr;
  }

  // Throws std::regex_error for a pattern it will not compile.
  explicit ModulePattern(std::string t) : text(std::move(t)) {
    if (text.compare(0, 3, "re:") != 0) return;
    const std::string body = text.substr(3);
    if (out_of_bounds(body)) throw std::regex_error(std::regex_constants::error_complexity);
    re = std::make_shared<const std::regex>(body, std::regex::ECMAScript | kLinearTime);
  }
  bool matches(const std::string& name, const std::string& cls) const {
    // Python's re.match: anchored at the start, not at the end.
    if (re) return std::regex_search(name, *re, std::regex_constants::match_continuous);
    return text == name || (!cls.empty() && text == cls);
  }

 private:
#if defined(__GLIBCXX__)
  static constexpr std::regex_constants::syntax_option_type kLinearTime = std::regex_constants::__polynomial;
#else
  static constexpr std::regex_constants::syntax_option_type kLinearTime = std::regex_constants::syntax_option_type{};
#endif
};

// The weight arguments of one compressed-tensors config group.
struct QuantWeights {
  std::string type;        // "int" or "float"
  int num_bits = 8;
  bool symmetric = true;
  std::string strategy;    // "tensor", "channel" or "group"
  std::int64_t group_size = 0;
  std::string format;      // "float-quantized", "int-quantized" or "pack-quantized"

  std::string describe() const {
    std::string s = (type == "float" ? std::string("fp8 e4m3") : "int" + std::to_string(num_bits));
    if (strategy == "group") s += " group " + std::to_string(group_size);
    else s += " per " + strategy;
    if (type == "int") s += symmetric ? " symmetric" : " asymmetric";
    return s + " (" + format + ")";
  }
};

struct QuantGroup {
  std::string name;
  std::vector<ModulePattern> targets;
  bool quantizes_weights = false;
  QuantWeights weights;
};

// What one GPTQ module is stored as: the config's bits, group_size, desc_act and sym, after the
// module's `dynamic` override if one matched.
struct GptqScheme {
  bool excluded = false;  // a "-:" entry of `dynamic` matched: the module is not quantized
  std::string rule;       // the `dynamic` key that decided, empty when none matched
  int bits = 4;
  std::int64_t group_size = 128;
  bool desc_act = false;
  bool sym = true;
  bool v1 = true;  // checkpoint_format "gptq": zero points stored minus one

  std::string describe() const {
    return "gptq int" + std::to_string(bits) + (group_size > 0 ? " group " + std::to_string(group_size) : " per channel") +
           (sym ? " symmetric" : " asymmetric") + (desc_act ? ", act-order (g_idx)" : "") + (v1 ? "" : ", v2 zeros") +
           (rule.empty() ? "" : " (dynamic '" + rule + "')");
  }
};

// One entry of GPTQModel's `dynamic` object: "-:PATTERN" excludes the modules it matches,
// "+:PATTERN" or a bare PATTERN overrides some of bits, group_size, desc_act and sym for them.
// As in GPTQModel and vLLM, entries are tried in the order written and the first whose regular
// expression matches the module's name from its start decides.
struct GptqDynamicRule {
  std::string key;  // as written in the config, for messages
  bool exclude = false;
  ModulePattern pattern;
  std::optional<int> bits;
  std::optional<std::int64_t> group_size;
  std::optional<bool> desc_act, sym;
};

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  std::string source;  // file it came from, for messages
  // compressed-tensors
  std::vector<QuantGroup> groups;
  std::vector<ModulePattern> ignore;
  // GPTQ
  int bits = 4;
  std::int64_t group_size = 128;
  bool desc_act = false;
  bool sym = true;
  bool v1 = true;  // checkpoint_format "gptq": zero points stored minus one
  std::vector<GptqDynamicRule> dynamic;

  bool quantized() const { return method != QuantMethod::kNone; }
  std::string describe() const {
    if (method == QuantMethod::kNone) return "none";
    if (method == QuantMethod::kGptq) {
      std::string s = gptq_base_scheme().describe();
      if (!dynamic.empty()) s += ", " + std::to_string(dynamic.size()) + " dynamic override" + (dynamic.size() > 1 ? "s" : "");
      return s;
    }
    std::string s = "compressed-tensors";
    const char* sep = ": ";
    for (const QuantGroup& g : groups) {
      if (!g.quantizes_weights) continue;
      s += sep + g.name + " = " + g.weights.describe();
      sep = "; ";
    }
    return s;
  }

  // Index of the group that quantizes module `name` (class `cls`), or -1 when it stays in the
  // checkpoint's float dtype (ignored, or no group targets it).
  int group_of(const std::string& name, const std::string& cls) const {
    for (const ModulePattern& pattern : ignore) {
      if (pattern.matches(name, cls)) return -1;
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (!groups[i].quantizes_weights) continue;
      for (const ModulePattern& t : groups[i].targets) {
        if (t.matches(name, cls)) return static_cast<int>(i);
      }
    }
    return -1;
  }

  // How GPTQ module `name` is stored: the first `dynamic` rule that matches it, else the config.
  GptqScheme gptq_scheme_of(const std::string& name) const {
    GptqScheme s = gptq_base_scheme();
    for (const GptqDynamicRule& rule : dynamic) {
      if (!rule.pattern.matches(name, "")) continue;
      s.rule = rule.key;
      s.excluded = rule.exclude;
      if (rule.bits) s.bits = *rule.bits;
      if (rule.group_size) s.group_size = *rule.group_size;
      if (rule.desc_act) s.desc_act = *rule.desc_act;
      if (rule.sym) s.sym = *rule.sym;
      break;
    }
    return s;
  }

  // The config's own GPTQ settings, before any `dynamic` override.
  GptqScheme gptq_base_scheme() const {
    GptqScheme s;
    s.bits = bits;
    s.group_size = group_size;
    s.desc_act = desc_act;
    s.sym = sym;
    s.v1 = v1;
    return s;
  }
};

// Largest group_size read: model widths are ints, so no group is longer than this.
constexpr std::int64_t kMaxGroupSize = std::int64_t{1} << 31;

namespace detail {

// Compiles `text` (an exact name, or "re:" and a regular expression) read from `o[key]`, where the
// file wrote it as `written`; a pattern outside ModulePattern's bounds is refused with its reason.
inline ModulePattern config_pattern(const JsonObject& o, const std::string& key, const std::string& written,
                                    const std::string& text) {
  const std::string shown = written.size() > 80 ? written.substr(0, 80) + "..." : written;
  if (text.compare(0, 3, "re:") == 0) {
    if (const char* why = ModulePattern::out_of_bounds(text.substr(3))) {
      o.fail(key, "pattern '", shown, "' ", why, ", which this library does not match (a config.json may come "
             "from anywhere; these bounds keep matching linear in the pattern)");
    }
  }
  try {
    return ModulePattern(text);
  } catch (const std::regex_error& e) {
    o.fail(key, "pattern '", shown, "' is not a regular expression this library compiles (", e.what(), ")");
  }
}

inline std::vector<ModulePattern> pattern_list(const JsonObject& o, const std::string& key) {
  std::vector<ModulePattern> out;
  if (!o.has_non_null(key)) return out;
  const Json& v = o.raw(key);
  if (!v.is_array()) o.fail(key, "expected a list of strings, got ", JsonObject::type_of(v));
  for (const Json& s : v) {
    if (!s.is_string()) o.fail(key, "expected a list of strings, found ", JsonObject::type_of(s));
    const std::string& text = s.get_ref<const std::string&>();
    out.push_back(config_pattern(o, key, text, text));
  }
  return out;
}

template <class... Args>
[[noreturn]] void refuse(const JsonObject& o, const std::string& key, Args&&... why) {
  throw_error(StatusCode::kUnsupported, o.where(key), ": ", std::forward<Args>(why)...);
}

inline bool empty_or_null(const JsonObject& o, const std::string& key) {
  if (!o.has_non_null(key)) return true;
  const Json& v = o.raw(key);
  return (v.is_object() || v.is_array()) && v.empty();
}

inline QuantWeights parse_quant_weights(const JsonObject& w, const std::string& format) {
  QuantWeights q;
  q.type = w.string("type");
  q.num_bits = w.int32("num_bits");
  q.symmetric = w.boolean_or("symmetric", true);
  if (w.has_non_null("strategy")) {
    q.strategy = w.string("strategy");
  } else {
    // compressed-tensors infers it from group_size: absent -> tensor, > 0 -> group, -1 -> channel.
    const std::int64_t gs = w.has_non_null("group_size") ? w.integer("group_size") : 0;
    if (w.has_non_null("group_size") && gs != -1 && gs <= 0) {
      w.fail("group_size", "must be positive (strategy 'group') or -1 (strategy 'channel'), got ", gs);
    }
    q.strategy = !w.has_non_null("group_size") ? "tensor" : gs == -1 ? "channel" : "group";
  }
  if (w.has_non_null("dynamic")) {
    const Json& d = w.raw("dynamic");
    if (!(d.is_boolean() && !d.get<bool>())) refuse(w, "dynamic", "dynamically quantized weights are not supported");
  }
  if (w.has_non_null("block_structure") || q.strategy == "block") {
    refuse(w, "strategy", "block-wise weight scales (strategy 'block') are not supported");
  }
  if (q.strategy == "tensor_group") refuse(w, "strategy", "strategy 'tensor_group' (NVFP4) is not supported");
  if (q.strategy != "tensor" && q.strategy != "channel" && q.strategy != "group") {
    refuse(w, "strategy", "weight strategy '", q.strategy, "' is not supported (tensor, channel, group)");
  }
  if (w.has_non_null("actorder")) {
    const Json& a = w.raw("actorder");
    std::string order = a.is_string() ? a.get<std::string>() : a.is_boolean() ? (a.get<bool>() ? "group" : "") : a.dump();
    for (char& ch : order) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    // "weight"/"static" only reorder the quantisation itself; "group"/"dynamic" (and true, the old
    // spelling of "group") store g_idx. false is no ordering, as compressed-tensors reads it.
    if (!order.empty() && order != "weight" && order != "static") {
      refuse(w, "actorder", "activation-order groups (actorder '", order, "', weight_g_idx) are not supported");
    }
  }
  if (q.strategy == "group") {
    q.group_size = w.integer("group_size");
    if (q.group_size <= 0) w.fail("group_size", "must be positive for strategy 'group' (got ", q.group_size, ")");
    // No row is that long; bounding it keeps every group count's arithmetic far from overflow.
    if (q.group_size > kMaxGroupSize) w.fail("group_size", "is larger than any row can be (got ", q.group_size, ")");
  }
  if (q.type == "float") {
    if (q.num_bits != 8) refuse(w, "num_bits", "float weights of ", q.num_bits, " bits are not supported (FP8 E4M3 only)");
    if (!q.symmetric) refuse(w, "symmetric", "asymmetric FP8 weights are not supported");
  } else if (q.type == "int") {
    if (q.num_bits != 4 && q.num_bits != 8) {
      refuse(w, "num_bits", "int", q.num_bits, " weights are not supported (4 and 8 bits)");
    }
  } else {
    w.fail("type", "unknown weight type '", q.type, "' (int, float)");
  }
  q.format = format;
  if (format == "float-quantized") {
    if (q.type != "float") refuse(w, "type", "format float-quantized with ", q.type, " weights");
  } else if (format == "int-quantized") {
    if (q.type != "int" || q.num_bits != 8) refuse(w, "num_bits", "format int-quantized needs int8 weights");
    if (!q.symmetric) refuse(w, "symmetric", "asymmetric int-quantized weights are not supported");
  } else if (format == "pack-quantized") {
    if (q.type != "int") refuse(w, "type", "format pack-quantized with ", q.type, " weights");
  } else if (format.find("nvfp4") != std::string::npos) {
    refuse(w, "type", "format '", format, "' (NVFP4) is not supported");
  } else {
    refuse(w, "type", "compressed-tensors format '", format,
           "' is not supported (float-quantized, int-quantized, pack-quantized, mixed-precision)");
  }
  return q;
}

inline QuantizationConfig parse_compressed_tensors(const JsonObject& qc) {
  QuantizationConfig c;
  c.method = QuantMethod::kCompressedTensors;
  c.source = qc.file();
  const std::string status = qc.has_non_null("quantization_status") ? qc.string("quantization_status") : "compressed";
  if (status != "compressed") {
    refuse(qc, "quantization_status", "status '", status, "': only compressed checkpoints are read");
  }
  for (const char* key : {"sparsity_config", "transform_config", "kv_cache_scheme"}) {
    if (!empty_or_null(qc, key)) {
      refuse(qc, key, "is set; sparse, transformed (rotated) and KV-cache-quantized checkpoints are not supported");
    }
  }
  const std::string format = qc.has_non_null("format") ? qc.string("format") : std::string("mixed-precision");
  c.ignore = pattern_list(qc, "ignore");
  const JsonObject groups = qc.object("config_groups");
  for (auto it = groups.raw_begin(); it != groups.raw_end(); ++it) {
    const JsonObject g(it.value(), qc.file(), "quantization_config.config_groups." + it.key());
    QuantGroup group;
    group.name = it.key();
    group.targets = pattern_list(g, "targets");
    std::string group_format = g.has_non_null("format") ? g.string("format") : format;
    if (g.has_non_null("weights")) {
      if (group_format == "mixed-precision") g.fail("format", "a mixed-precision checkpoint needs a format per group");
      group.quantizes_weights = true;
      group.weights = parse_quant_weights(g.object("weights"), group_format);
    }
    c.groups.push_back(std::move(group));
  }
  return c;
}

inline int gptq_bits(const JsonObject& o) {
  const int bits = o.int32("bits");
  if (bits != 4 && bits != 8) refuse(o, "bits", "GPTQ with ", bits, " bits is not supported (4 and 8)");
  return bits;
}

inline std::int64_t gptq_group_size(const JsonObject& o, std::int64_t fallback) {
  const std::int64_t g = o.integer_or("group_size", fallback);
  if (g == 0 || g < -1) o.fail("group_size", "must be -1 or positive (got ", g, ")");
  if (g > kMaxGroupSize) o.fail("group_size", "is larger than any row can be (got ", g, ")");
  return g;
}

// GPTQModel's `dynamic`: {"-:PATTERN": {}, "+:PATTERN": {"bits": 8, "group_size": 64}, ...}.
// The keys that decide how a module is stored are read; one that would add to the computation
// (a LoRA adapter) or change the packing is refused; the rest (damp_percent, mse, ...) only
// steered the quantization itself and are ignored.
// `order` lists the keys as the file writes them (Json sorts an object's keys, and the first
// matching rule wins); empty, the sorted order stands.
inline std::vector<GptqDynamicRule> parse_gptq_dynamic(const JsonObject& qc, const std::vector<std::string>& order) {
  std::vector<GptqDynamicRule> rules;
  if (!qc.has_non_null("dynamic")) return rules;
  const JsonObject d = qc.object("dynamic");
  std::vector<std::string> keys;
  for (auto it = d.raw_begin(); it != d.raw_end(); ++it) keys.push_back(it.key());
  if (order.size() == keys.size() && std::is_permutation(order.begin(), order.end(), keys.begin())) keys = order;
  for (const std::string& key : keys) {
    const Json& value = d.raw(key);
    const bool exclude = key.compare(0, 2, "-:") == 0;
    const std::string body = exclude || key.compare(0, 2, "+:") == 0 ? key.substr(2) : key;
    ModulePattern pattern = config_pattern(d, key, key, "re:" + body);
    if (!value.is_object()) d.fail(key, "expected an object of overrides, got ", JsonObject::type_of(value));
    const JsonObject o = d.object(key);
    GptqDynamicRule rule{key, exclude, std::move(pattern), {}, {}, {}, {}};
    for (auto kv = o.raw_begin(); kv != o.raw_end(); ++kv) {
      const std::string& k = kv.key();
      if (k == "adapter" || k == "pack_dtype" || k == "format" || k == "checkpoint_format" || k == "quant_method") {
        refuse(o, k, "a per-module '", k, "' in GPTQ's dynamic overrides is not supported");
      }
    }
    if (!exclude) {
      if (o.has_non_null("bits")) rule.bits = gptq_bits(o);
      if (o.has_non_null("group_size")) rule.group_size = gptq_group_size(o, 0);
      if (o.has_non_null("desc_act")) rule.desc_act = o.boolean("desc_act");
      if (o.has_non_null("sym")) rule.sym = o.boolean("sym");
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

inline QuantizationConfig parse_gptq(const JsonObject& qc, const std::vector<std::string>& dynamic_order) {
  QuantizationConfig c;
  c.method = QuantMethod::kGptq;
  c.source = qc.file();
  c.bits = gptq_bits(qc);
  c.group_size = gptq_group_size(qc, 128);
  c.desc_act = qc.boolean_or("desc_act", false);
  c.sym = qc.boolean_or("sym", true);
  c.dynamic = parse_gptq_dynamic(qc, dynamic_order);
  std::string fmt = "gptq";
  for (const char* key : {"checkpoint_format", "format"}) {
    if (qc.has_non_null(key)) fmt = qc.string(key);
  }
  if (fmt == "gptq") c.v1 = true;
  else if (fmt == "gptq_v2") c.v1 = false;
  else refuse(qc, "checkpoint_format", "GPTQ checkpoint format '", fmt, "' is not supported (gptq, gptq_v2)");
  return c;
}


// The keys of `dynamic` inside `quantization_config` (nested) or at the top (quantize_config.json)
// in the order `text` writes them; empty when there are none or the text does not parse.
inline std::vector<std::string> dynamic_key_order(const std::string& text, bool nested) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  const nlohmann::ordered_json* q = &j;
  if (nested) {
    if (!j.is_object() || !j.contains("quantization_config")) return {};
    q = &j["quantization_config"];
  }
  if (!q->is_object() || !q->contains("dynamic") || !(*q)["dynamic"].is_object()) return {};
  std::vector<std::string> keys;
  for (auto it = (*q)["dynamic"].begin(); it != (*q)["dynamic"].end(); ++it) keys.push_back(it.key());
  return keys;
}

}  // namespace detail

// Parses `quantization_config` out of a config.json root (absent: not quantized). `source` names
// the file in messages. `dynamic_order`: GPTQ's `dynamic` keys in the file's order (a parsed Json
// has lost it; load_quantization_config reads it from the text), else their sorted order is used.
inline QuantizationConfig parse_quantization_config(const Json& root_json, const std::string& source,
                                                    const std::vector<std::string>& dynamic_order = {}) {
  const JsonObject root(root_json, source, "");
  if (!root.has_non_null("quantization_config")) return {};
  const JsonObject qc = root.object("quantization_config");
  const std::string method = qc.string("quant_method");
  if (method == "compressed-tensors") return detail::parse_compressed_tensors(qc);
  if (method == "gptq") return detail::parse_gptq(qc, dynamic_order);
  detail::refuse(qc, "quant_method", "quantization method '", method,
                 "' is not supported (compressed-tensors, gptq; GGUF files are not read)");
}

// From config.json, or else from GPTQModel's quantize_config.json beside it.
inline QuantizationConfig load_quantization_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const std::string text = read_text_file(path);
  QuantizationConfig c = parse_quantization_config(parse_json_text(text, path), path, detail::dynamic_key_order(text, true));
  if (c.quantized()) return c;
  const std::string gptq = dir + "/quantize_config.json";
  if (std::FILE* f = std::fopen(gptq.c_str(), "rb")) {
    std::fclose(f);
    const std::string gptq_text = read_text_file(gptq);
    Json wrapped = Json::object();
    wrapped["quantization_config"] = parse_json_text(gptq_text, gptq);
    if (!wrapped["quantization_config"].contains("quant_method")) wrapped["quantization_config"]["quant_method"] = "gptq";
    return parse_quantization_config(wrapped, gptq, detail::dynamic_key_order(gptq_text, false));
  }
  return c;
}

}  // namespace diffusion_gemma::io
