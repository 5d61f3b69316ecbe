// SPDX-License-Identifier: Apache-2.0
// The OpenAI-compatible request surface of `dgemma serve` (docs/serving.md): parsing and checking
// of /v1/chat/completions and /v1/completions bodies, and OpenAI's error JSON. Free of the model
// and of HTTP so that every rule here is a plain function of the body; each error names the field
// at fault in `param` and in the message.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dgemma::serve {

using json = nlohmann::ordered_json;

// An error a client caused (or an overload): becomes an HTTP status and OpenAI's error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = {})
      : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)),
        type_(type.empty() ? default_type(status) : std::move(type)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }

  // {"error": {"message", "type", "param", "code"}}: param and code are null when empty.
  json body() const {
    json e;
    e["message"] = what();
    e["type"] = type_;
    e["param"] = param_.empty() ? json(nullptr) : json(param_);
    e["code"] = code_.empty() ? json(nullptr) : json(code_);
    return json{{"error", e}};
  }

  static std::string default_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "invalid_request_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return status == 503 ? "service_unavailable" : "server_error";
    return "invalid_request_error";
  }

 private:
  int status_;
  std::string param_, code_, type_;
};

// What the parser needs to know about the server (filled from the model and the flags).
struct ApiLimits {
  std::string model_id;
  int default_max_tokens = 256;     // generation_config.json's max_new_tokens
  int max_tokens_limit = 1 << 20;   // max_position_embeddings: a first bound; the plan checks prompt + tokens
  int max_denoising_steps_limit = 4096;
  std::size_t max_stop_sequences = 4;  // OpenAI's limit
  std::size_t max_stop_length = 256;   // bytes per stop sequence
  // /v1/completions takes a list of prompts (as vLLM and lm-evaluation-harness send batches), each
  // answered as one choice and run as its own sequence in the batch.
  std::size_t max_prompts = 64;
  // --strict: refuse unknown fields and sampling values this server cannot honour, as OpenAI's own
  // API does, instead of accepting them and naming them in the X-Dgemma-Ignored header.
  bool strict = false;
};

struct Message {
  std::string role;
  std::string content;
  std::vector<std::string> text_parts;  // content given as text parts: the chat template renders each on its own
};

// The "dgemma" extension object: sampler fields beyond OpenAI's. Empty optionals keep the
// checkpoint's generation_config.json values.
struct SamplerOverrides {
  std::optional<int> max_denoising_steps;
  std::optional<double> t_min, t_max, entropy_bound, confidence_threshold;
  std::optional<int> stability_threshold;
};

// One prompt of /v1/completions: text, or token ids (checked against the vocabulary by the server).
struct CompletionPrompt {
  std::string text;
  std::vector<std::int64_t> ids;
  bool is_ids = false;
  // llama.cpp's mixed prompt (serve/llama_api.hpp): ids and strings in one list, run in order.
  std::vector<CompletionPrompt> parts;
};

struct GenerationRequest {
  bool chat = true;
  std::vector<Message> messages;         // chat
  std::vector<CompletionPrompt> prompts;  // completions: n choices each, in order
  int n = 1;  // choices per prompt: choice j of a prompt uses seed + j
  int max_tokens = 0;
  bool max_tokens_given = false;  // false: the checkpoint's default, which the server may shorten to fit the context
  std::string max_tokens_param = "max_tokens";  // the field that gave it, as refusals name it
  std::uint64_t seed = 0;         // default 0, as `dgemma generate`: the same request gives the same answer
  bool random_seed = false;       // "seed": -1 (llama.cpp's convention): the server draws one and reports it
  bool enable_thinking = false;   // chat_template_kwargs.enable_thinking: the chat format's thinking switch
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage: an extra usage-only chunk at the end
  bool stream_drafts = false;
  SamplerOverrides sampler;
  // llama.cpp's POST /completion (serve/llama_api.hpp): its own response shape.
  bool llama = false;
  bool return_tokens = false;                // the generated ids in "tokens"
  bool prompt_list = false;                  // "prompt" was a list of prompts: the answer is a list
  std::vector<std::string> response_fields;  // only these fields of each answer ("a/b" moves b to the top)
  // Fields accepted without effect: unknown ones, and sampling values the sampler has no
  // counterpart for (the server names them in the X-Dgemma-Ignored response header).
  std::vector<std::string> ignored;
};

namespace detail {

inline const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    default: return "value";
  }
}

[[noreturn]] inline void bad_type(const std::string& param, const char* want, const json& got) {
  throw ApiError(400, "'" + param + "' must be " + want + " (got " + type_name(got) + ")", param, "invalid_type");
}
[[noreturn]] inline void bad_value(const std::string& param, const std::string& why) {
  throw ApiError(400, "'" + param + "' " + why, param, "invalid_value");
}

inline std::int64_t get_int(const json& v, const std::string& param, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) bad_type(param, "an integer", v);  // nlohmann: also true for unsigned
  const bool huge = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX);
  const auto x = huge ? INT64_MAX : v.get<std::int64_t>();
  if (huge || x < lo || x > hi) {
    bad_value(param, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + v.dump() + ")");
  }
  return x;
}

inline double get_number(const json& v, const std::string& param) {
  if (!v.is_number()) bad_type(param, "a number", v);
  return v.get<double>();
}

inline bool get_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) bad_type(param, "a boolean", v);
  return v.get<bool>();
}

inline std::string get_string(const json& v, const std::string& param) {
  if (!v.is_string()) bad_type(param, "a string", v);
  return v.get<std::string>();
}

// Message content: a string, or OpenAI's array of parts of which only {"type": "text"} is served.
// A part's other keys (a client's cache_control, say) are ignored and named in `ignored`, or
// refused under --strict, as a message's unknown keys are.
inline void get_content(const json& v, const std::string& param, bool strict, std::vector<std::string>& ignored,
                        Message& msg) {
  if (v.is_string()) {
    msg.content = v.get<std::string>();
    return;
  }
  if (!v.is_array()) bad_type(param, "a string or an array of text parts", v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& part = v[i];
    if (!part.is_object()) bad_type(p, "an object", part);
    if (!part.contains("type") || get_string(part["type"], p + ".type") != "text") {
      throw ApiError(400, "'" + p + ".type' must be \"text\": this model reads text only", p + ".type", "invalid_value");
    }
    if (!part.contains("text")) throw ApiError(400, "'" + p + ".text' is missing", p + ".text", "missing_parameter");
    msg.text_parts.push_back(get_string(part["text"], p + ".text"));
    for (auto it = part.begin(); it != part.end(); ++it) {
      if (it.key() == "type" || it.key() == "text") continue;
      const std::string q = p + "." + it.key();
      if (strict) throw ApiError(400, "unknown field '" + q + "'", q, "unknown_parameter");
      ignored.push_back(q);
    }
  }
}

// A field this server has no counterpart for, at a value that would matter: ignored and named in
// the response (the behaviour of vLLM and llama.cpp, whose clients send such fields by default),
// or refused under --strict (OpenAI's own behaviour for what it does not know).
inline void ignore_or_refuse(const std::string& key, const std::string& why, const ApiLimits& limits,
                             GenerationRequest& r) {
  if (limits.strict) bad_value(key, why);
  r.ignored.push_back(key);
}

inline void check_range(const json& v, const std::string& key, double lo, double hi) {
  const double x = get_number(v, key);
  if (!(x >= lo && x <= hi)) {
    bad_value(key, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "] (got " + v.dump() + ")");
  }
}

// Sampling controls of OpenAI's API and of vLLM's and llama.cpp's. This sampler's randomness is
// the denoising schedule's temperature (dgemma.t_max down to dgemma.t_min) and its entropy bound;
// it has no nucleus or top-k cut and no penalties. Each value is checked for type and range; its
// neutral value is accepted silently, any other is ignored (named) or refused under --strict.
inline void check_sampling(const json& body, const std::string& key, const ApiLimits& limits, GenerationRequest& r) {
  const json& v = body[key];
  if (v.is_null()) return;
  const std::string no_counterpart =
      "is not supported (got " + v.dump() + "): the temperature follows the denoising schedule; set dgemma.t_min "
      "and dgemma.t_max instead";
  bool neutral = true;
  if (key == "temperature") {
    check_range(v, key, 0.0, 2.0);
    neutral = v.get<double>() == 1.0;
  } else if (key == "top_p" || key == "min_p") {
    check_range(v, key, 0.0, 1.0);
    neutral = v.get<double>() == (key == "top_p" ? 1.0 : 0.0);
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    check_range(v, key, -2.0, 2.0);
    neutral = v.get<double>() == 0.0;
  } else if (key == "repetition_penalty") {
    check_range(v, key, 1e-6, 1e6);
    neutral = v.get<double>() == 1.0;
  } else if (key == "top_k") {
    const std::int64_t k = get_int(v, key, -1, std::int64_t{1} << 31);
    neutral = k <= 0;  // -1 and 0 both mean "no cut"
  } else if (key == "logit_bias") {
    if (!v.is_object()) bad_type(key, "an object", v);
    neutral = v.empty();
  }
  if (!neutral) ignore_or_refuse(key, no_counterpart, limits, r);
}

// Fields that would change the answer's shape (several choices, log-probabilities, tool calls,
// JSON output) are accepted only at their neutral value: ignoring them would hand a client an
// answer it cannot read.
inline void check_shape(const json& body, const std::string& key) {
  const json& v = body[key];
  if (v.is_null()) return;
  if (key == "best_of") {
    if (!(v.is_number() && v.get<double>() == 1.0)) bad_value(key, "must be 1 (ask for several choices with 'n'; got " + v.dump() + ")");
  } else if (key == "logprobs" || key == "echo") {
    const bool off = (v.is_boolean() && !v.get<bool>()) || (v.is_number_integer() && v.get<std::int64_t>() == 0);
    if (!off) bad_value(key, "is not supported: only false is accepted (got " + v.dump() + ")");
  } else if (key == "top_logprobs") {
    if (!(v.is_number_integer() && v.get<std::int64_t>() == 0)) bad_value(key, "is not supported by this server");
  } else if (key == "suffix") {
    if (!(v.is_string() && v.get<std::string>().empty())) bad_value(key, "is not supported by this server");
  } else if (key == "tools" || key == "functions") {
    if (!((v.is_object() || v.is_array()) && v.empty())) bad_value(key, "is not supported: this server has no tool calling");
  } else if (key == "tool_choice" || key == "function_call") {
    const bool off = v.is_string() && (v.get<std::string>() == "none" || v.get<std::string>() == "auto");
    if (!off) bad_value(key, "is not supported: only \"none\" or \"auto\" without tools is accepted");
  } else if (key == "response_format") {
    if (!(v.is_object() && v.contains("type") && v["type"] == "text")) {
      bad_value(key, "is not supported: only {\"type\": \"text\"} is accepted");
    }
  } else if (key == "modalities") {
    if (!(v.is_array() && v.size() == 1 && v[0] == "text")) bad_value(key, "is not supported: only [\"text\"] is accepted");
  }
}

inline void parse_stop(const json& v, const ApiLimits& limits, std::vector<std::string>& out) {
  if (v.is_null()) return;
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) stops.push_back(get_string(v[i], "stop[" + std::to_string(i) + "]"));
  } else {
    bad_type("stop", "a string or an array of strings", v);
  }
  if (stops.size() > limits.max_stop_sequences) {
    bad_value("stop", "has " + std::to_string(stops.size()) + " sequences; at most " +
                          std::to_string(limits.max_stop_sequences) + " are allowed");
  }
  for (const auto& s : stops) {
    if (s.empty()) bad_value("stop", "must not contain an empty string");
    if (s.size() > limits.max_stop_length) {
      bad_value("stop", "sequences must be at most " + std::to_string(limits.max_stop_length) + " bytes");
    }
  }
  out = std::move(stops);
}

// "seed": any 64-bit integer, signed (OpenAI's type) or unsigned; -1 (llama.cpp's convention) asks
// for one the server draws. A negative seed keys the draws by its two's-complement bits, so each
// seed is its own reproducible stream. null keeps the endpoint's default.
inline void parse_seed(const json& s, GenerationRequest& r) {
  if (s.is_null()) return;
  if (s.is_number_unsigned()) {
    r.seed = s.get<std::uint64_t>();
    r.random_seed = false;
  } else if (s.is_number_integer() && s.get<std::int64_t>() == -1) {
    r.random_seed = true;
  } else if (s.is_number_integer()) {
    r.seed = static_cast<std::uint64_t>(s.get<std::int64_t>());
    r.random_seed = false;
  } else {
    bad_type("seed", "a 64-bit integer (-1: a random seed)", s);
  }
}

inline void parse_extension(const json& v, const ApiLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return;
  if (!v.is_object()) bad_type("dgemma", "an object", v);
  SamplerOverrides& s = r.sampler;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& k = it.key();
    const std::string p = "dgemma." + k;
    const json& x = it.value();
    if (x.is_null()) continue;
    if (k == "max_denoising_steps") {
      s.max_denoising_steps = static_cast<int>(get_int(x, p, 1, limits.max_denoising_steps_limit));
    } else if (k == "t_min" || k == "t_max") {
      const double t = get_number(x, p);
      if (!(t >= 0.0) || t > 1e6) bad_value(p, "must be in [0, 1e6] (got " + x.dump() + ")");
      (k == "t_min" ? s.t_min : s.t_max) = t;
    } else if (k == "entropy_bound" || k == "confidence_threshold") {
      const double g = get_number(x, p);
      if (!(g > 0.0) || g > 1e9) bad_value(p, "must be in (0, 1e9] (got " + x.dump() + ")");
      (k == "entropy_bound" ? s.entropy_bound : s.confidence_threshold) = g;
    } else if (k == "stability_threshold") {
      s.stability_threshold = static_cast<int>(get_int(x, p, 0, 1 << 20));
    } else if (k == "stream_drafts") {
      r.stream_drafts = get_bool(x, p);
    } else {
      throw ApiError(400, "unknown field '" + p + "' (known: max_denoising_steps, t_min, t_max, entropy_bound, "
                          "stability_threshold, confidence_threshold, stream_drafts)", p, "unknown_parameter");
    }
  }
  if (r.stream_drafts && !r.stream) bad_value("dgemma.stream_drafts", "needs \"stream\": true");
}

// Arrays and objects nested deeper than this are refused before the body is parsed. The JSON
// library parses and frees any depth without recursion, but printing a value recurses once per
// level, and error messages quote the value at fault: {"logprobs": [[[...]]]}, 400000 levels in
// 800 KB, overflowed an HTTP thread's stack and killed the server. No request needs a tenth of it.
constexpr std::size_t kMaxJsonDepth = 256;

inline void check_depth(const std::string& body) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw ApiError(400, "the body nests arrays and objects more than " + std::to_string(kMaxJsonDepth) + " deep", "",
                       "invalid_json");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

inline json parse_object(const std::string& body) {
  check_depth(body);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond a double
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, std::string("the body must be a JSON object (got ") + type_name(j) + ")", "", "invalid_json");
  return j;
}

[[noreturn]] inline void wrong_model(const std::string& model, const ApiLimits& limits) {
  throw ApiError(404, "the model '" + model + "' does not exist; this server serves '" + limits.model_id + "'", "model",
                 "model_not_found");
}

// Fields both endpoints share.
inline json parse_common(const std::string& body, const ApiLimits& limits, const std::set<std::string>& own,
                         GenerationRequest& r) {
  json j = parse_object(body);
  static const std::set<std::string> sampling = {"temperature", "top_p", "presence_penalty", "frequency_penalty",
                                                 "logit_bias", "top_k", "min_p", "repetition_penalty"};
  static const std::set<std::string> shape = {"n", "logprobs", "top_logprobs"};
  // Accepted and without effect on the answer: request bookkeeping of OpenAI's API.
  static const std::set<std::string> bookkeeping = {"user", "store", "metadata", "service_tier", "prompt_cache_key",
                                                    "safety_identifier", "parallel_tool_calls"};
  static const std::set<std::string> common = {"model", "max_tokens", "seed", "stop", "stream", "stream_options", "dgemma"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (common.count(k) || own.count(k) || sampling.count(k) || shape.count(k) || bookkeeping.count(k)) continue;
    if (limits.strict) {
      throw ApiError(400, "unknown field '" + k + "' (vendor extensions go in the \"dgemma\" object)", k,
                     "unknown_parameter");
    }
    r.ignored.push_back(k);
  }
  if (!j.contains("model") || j["model"].is_null()) throw ApiError(400, "'model' is required", "model", "missing_parameter");
  const std::string model = get_string(j["model"], "model");
  if (model != limits.model_id) wrong_model(model, limits);
  for (const auto& k : sampling) {
    if (j.contains(k)) check_sampling(j, k, limits, r);
  }
  for (const char* k : {"logprobs", "top_logprobs", "best_of", "echo", "suffix", "tools", "functions", "tool_choice",
                        "function_call", "response_format", "modalities"}) {
    if (j.contains(k)) check_shape(j, k);
  }
  if (j.contains("n") && !j["n"].is_null()) r.n = static_cast<int>(get_int(j["n"], "n", 1, static_cast<std::int64_t>(limits.max_prompts)));
  if (j.contains("user") && !j["user"].is_null()) (void)get_string(j["user"], "user");  // accepted, not used
  r.max_tokens = limits.default_max_tokens;
  std::optional<std::int64_t> max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    const std::int64_t v = get_int(j[k], k, 1, limits.max_tokens_limit);
    if (max_tokens && *max_tokens != v) {
      bad_value(k, "disagrees with 'max_tokens' (" + std::to_string(*max_tokens) + " vs " + std::to_string(v) + ")");
    }
    if (!max_tokens) r.max_tokens_param = k;
    max_tokens = v;
  }
  if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);
  r.max_tokens_given = max_tokens.has_value();
  if (j.contains("seed")) parse_seed(j["seed"], r);
  if (j.contains("stop")) parse_stop(j["stop"], limits, r.stop);
  if (j.contains("stream") && !j["stream"].is_null()) r.stream = get_bool(j["stream"], "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad_type("stream_options", "an object", so);
    if (!r.stream) bad_value("stream_options", "is only allowed with \"stream\": true");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.key() == "include_usage") {
        if (!it.value().is_null()) r.include_usage = get_bool(it.value(), "stream_options.include_usage");
      } else if (limits.strict) {
        throw ApiError(400, "unknown field 'stream_options." + it.key() + "'", "stream_options." + it.key(),
                       "unknown_parameter");
      } else {
        r.ignored.push_back("stream_options." + it.key());
      }
    }
  }
  if (j.contains("dgemma")) parse_extension(j["dgemma"], limits, r);
  return j;
}

// OpenAI's `messages`: roles, content as a string or text parts, the extra fields of an assistant
// message handed back as the SDK returned it.
inline std::vector<Message> parse_messages(const json& m, const ApiLimits& limits, std::vector<std::string>& ignored) {
  std::vector<Message> out;
  if (!m.is_array()) bad_type("messages", "an array", m);
  if (m.empty()) bad_value("messages", "must contain at least one message");
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) bad_type(p, "an object", m[i]);
    Message msg;
    if (!m[i].contains("role")) throw ApiError(400, "'" + p + ".role' is required", p + ".role", "missing_parameter");
    msg.role = get_string(m[i]["role"], p + ".role");
    if (msg.role == "tool" || msg.role == "function") {
      bad_value(p + ".role", "'" + msg.role + "' is not supported: this server has no tool calling");
    }
    const bool system = msg.role == "system" || msg.role == "developer";
    if (msg.role != "user" && msg.role != "assistant" && !system) {
      bad_value(p + ".role", "must be system, developer, user or assistant (got '" + msg.role + "')");
    }
    for (auto it = m[i].begin(); it != m[i].end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      const std::string q = p + "." + k;
      if (k == "role") {
        continue;
      } else if (k == "content") {
        if (!v.is_null()) get_content(v, q, limits.strict, ignored, msg);
      } else if (k == "name" || k == "refusal" || k == "reasoning_content" || k == "reasoning") {
        // accepted, not rendered: an assistant message handed back as the SDK returned it carries these
        if (!v.is_null()) (void)get_string(v, q);
      } else if (k == "annotations" || k == "audio" || k == "function_call" || k == "tool_calls") {
        // the other fields of a returned assistant message, null or empty when no tool or audio ran
        if (!(v.is_null() || ((v.is_array() || v.is_object()) && v.empty()))) {
          bad_value(q, k == "audio" ? "is not supported: this model reads text only"
                                    : "is not supported: this server has no tool calling");
        }
      } else if (limits.strict) {
        throw ApiError(400, "unknown field '" + q + "'", q, "unknown_parameter");
      } else {
        ignored.push_back(q);
      }
    }
    // A system message may come anywhere (the chat format gives it a turn of its own); a later
    // developer message is OpenAI's other name for one, and the format has no developer turn.
    if (msg.role == "developer" && i != 0) msg.role = "system";
    // Only an assistant turn may come without content (OpenAI's rule: one that made tool calls);
    // an empty user or system turn is a client's mistake, not a prompt.
    if (msg.role != "assistant" && (!m[i].contains("content") || m[i]["content"].is_null())) {
      throw ApiError(400, "'" + p + ".content' is required for a " + msg.role + " message", p + ".content",
                     "missing_parameter");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

inline bool get_flag(const json& j, const char* key, bool fallback) {
  return j.contains(key) && !j[key].is_null() ? get_bool(j[key], key) : fallback;
}

// vLLM's fields for how a conversation is rendered. The answer always starts a new model turn, so
// a request for another rendering (a prefilled reply to continue) is refused rather than answered
// as something else; `chat_template_kwargs.enable_thinking` is the chat format's thinking switch.
inline void parse_rendering_flags(const json& j, const ApiLimits& limits, bool& enable_thinking,
                                  std::vector<std::string>& ignored) {
  if (!get_flag(j, "add_generation_prompt", true)) {
    bad_value("add_generation_prompt", "must be true: the answer is always a new model turn");
  }
  if (get_flag(j, "continue_final_message", false)) {
    bad_value("continue_final_message", "must be false: the answer is always a new model turn");
  }
  if (!j.contains("chat_template_kwargs") || j["chat_template_kwargs"].is_null()) return;
  const json& kw = j["chat_template_kwargs"];
  if (!kw.is_object()) bad_type("chat_template_kwargs", "an object", kw);
  for (auto it = kw.begin(); it != kw.end(); ++it) {
    const std::string q = "chat_template_kwargs." + it.key();
    if (it.key() == "enable_thinking") {
      if (!it.value().is_null()) enable_thinking = get_bool(it.value(), q);
    } else if (limits.strict) {
      throw ApiError(400, "unknown field '" + q + "'", q, "unknown_parameter");
    } else {
      ignored.push_back(q);
    }
  }
}

}  // namespace detail

inline GenerationRequest parse_chat_request(const std::string& body, const ApiLimits& limits) {
  GenerationRequest r;
  r.chat = true;
  static const std::set<std::string> own = {"messages", "max_completion_tokens", "tools", "tool_choice",
                                            "response_format", "functions", "function_call", "modalities",
                                            "add_generation_prompt", "continue_final_message", "chat_template_kwargs"};
  const json j = detail::parse_common(body, limits, own, r);
  if (!j.contains("messages") || j["messages"].is_null()) {
    throw ApiError(400, "'messages' is required", "messages", "missing_parameter");
  }
  r.messages = detail::parse_messages(j["messages"], limits, r.ignored);
  detail::parse_rendering_flags(j, limits, r.enable_thinking, r.ignored);
  return r;
}

inline GenerationRequest parse_completion_request(const std::string& body, const ApiLimits& limits) {
  GenerationRequest r;
  r.chat = false;
  static const std::set<std::string> own = {"prompt", "best_of", "echo", "suffix"};
  const json j = detail::parse_common(body, limits, own, r);
  if (!j.contains("prompt") || j["prompt"].is_null()) throw ApiError(400, "'prompt' is required", "prompt", "missing_parameter");
  const json& p = j["prompt"];
  // OpenAI's four forms: a string, token ids, or a list of either (one choice per prompt).
  const auto one = [&](const json& v, const std::string& param) {
    CompletionPrompt c;
    if (v.is_string()) {
      c.text = v.get<std::string>();
      if (c.text.empty()) detail::bad_value(param, "must not be empty");
    } else if (v.is_array() && v.empty()) {
      detail::bad_value(param, "must not be empty");
    } else if (v.is_array() && !v[0].is_string() && !v[0].is_array()) {
      // Token ids: each element is checked, and named (prompt[1][3]) when it is not one.
      c.is_ids = true;
      for (std::size_t i = 0; i < v.size(); ++i) {
        c.ids.push_back(detail::get_int(v[i], param + "[" + std::to_string(i) + "]", 0, INT32_MAX));
      }
    } else if (v.is_array()) {  // a list inside a list of prompts: only token ids
      detail::bad_type(param + "[0]", "an integer token id", v[0]);
    } else {
      detail::bad_type(param, "a string or an array of token ids", v);
    }
    r.prompts.push_back(std::move(c));
  };
  if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    if (p.size() > limits.max_prompts) {
      detail::bad_value("prompt", "holds " + std::to_string(p.size()) + " prompts; at most " +
                                      std::to_string(limits.max_prompts) + " per request");
    }
    for (std::size_t i = 0; i < p.size(); ++i) one(p[i], "prompt[" + std::to_string(i) + "]");
  } else {
    one(p, "prompt");
  }
  if (r.prompts.size() * static_cast<std::size_t>(r.n) > limits.max_prompts) {
    detail::bad_value("n", std::to_string(r.prompts.size()) + " prompts x n " + std::to_string(r.n) + " choices exceed " +
                               std::to_string(limits.max_prompts) + " per request");
  }
  return r;
}

// POST /tokenize, in vLLM's and llama.cpp's shapes: text (vLLM's "prompt" or llama.cpp's
// "content") or a conversation ("messages") to the token ids the generation endpoints would run.
struct TokenizeRequest {
  bool chat = false;
  std::vector<Message> messages;
  std::string text;
  // <bos> first, as /v1/completions always does. Defaults follow the client's dialect: true for
  // "prompt" (vLLM's add_special_tokens), false for "content" (llama.cpp's add_special). A
  // conversation is rendered by the chat format, which writes its own <bos>.
  bool add_special = true;
  bool with_pieces = false;       // llama.cpp: tokens as {"id", "piece"}
  bool return_token_strs = false;  // vLLM: "token_strs", the vocabulary's strings
  bool enable_thinking = false;    // chat_template_kwargs.enable_thinking, as /v1/chat/completions
  std::vector<std::string> ignored;
};

// POST /detokenize: token ids to text, special tokens included (as vLLM and llama.cpp decode).
struct DetokenizeRequest {
  std::vector<std::int64_t> tokens;
  std::vector<std::string> ignored;
};

namespace detail {

// "model" is optional on these endpoints (vLLM and llama.cpp do not require it); given, it must
// name the served model. Unknown fields are ignored and named, or refused under --strict.
inline void check_utility_fields(const json& j, const std::set<std::string>& known, const ApiLimits& limits,
                                 std::vector<std::string>& ignored) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (known.count(it.key())) continue;
    if (limits.strict) throw ApiError(400, "unknown field '" + it.key() + "'", it.key(), "unknown_parameter");
    ignored.push_back(it.key());
  }
  if (j.contains("model") && !j["model"].is_null()) {
    const std::string model = get_string(j["model"], "model");
    if (model != limits.model_id) wrong_model(model, limits);
  }
}

}  // namespace detail

inline TokenizeRequest parse_tokenize_request(const std::string& body, const ApiLimits& limits) {
  TokenizeRequest r;
  const json j = detail::parse_object(body);
  static const std::set<std::string> known = {"model", "prompt", "content", "messages", "add_special_tokens",
                                              "add_special", "with_pieces", "return_token_strs", "parse_special",
                                              "add_generation_prompt", "continue_final_message",
                                              "chat_template_kwargs"};
  detail::check_utility_fields(j, known, limits, r.ignored);
  std::vector<const char*> given;
  for (const char* k : {"prompt", "content", "messages"}) {
    if (j.contains(k) && !j[k].is_null()) given.push_back(k);
  }
  if (given.size() != 1) {
    throw ApiError(400, given.empty() ? "one of 'prompt', 'content' or 'messages' is required"
                                      : std::string("give only one of 'prompt', 'content' and 'messages' (got '") +
                                            given[0] + "' and '" + given[1] + "')",
                   given.empty() ? "prompt" : given[1], given.empty() ? "missing_parameter" : "invalid_value");
  }
  const std::string form = given[0];
  if (form == "messages") {
    r.chat = true;
    r.messages = detail::parse_messages(j["messages"], limits, r.ignored);
    // Rendered as /v1/chat/completions renders the same conversation.
    detail::parse_rendering_flags(j, limits, r.enable_thinking, r.ignored);
  } else {
    r.text = detail::get_string(j[form], form);
  }
  r.add_special = form == "prompt";
  for (const char* k : {"add_special_tokens", "add_special"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    const bool v = detail::get_bool(j[k], k);
    if (r.chat) {
      // The rendering starts with <bos> whatever is asked; a request for a second one is named.
      if (v) r.ignored.push_back(k);
    } else {
      r.add_special = v;
    }
  }
  if (!detail::get_flag(j, "parse_special", true)) {
    detail::bad_value("parse_special", "must be true: special tokens written in the text are always read as such");
  }
  r.with_pieces = detail::get_flag(j, "with_pieces", false);
  r.return_token_strs = detail::get_flag(j, "return_token_strs", false);
  return r;
}

inline DetokenizeRequest parse_detokenize_request(const std::string& body, const ApiLimits& limits) {
  DetokenizeRequest r;
  const json j = detail::parse_object(body);
  detail::check_utility_fields(j, {"model", "tokens"}, limits, r.ignored);
  if (!j.contains("tokens") || j["tokens"].is_null()) throw ApiError(400, "'tokens' is required", "tokens", "missing_parameter");
  const json& t = j["tokens"];
  if (!t.is_array()) detail::bad_type("tokens", "an array of token ids", t);
  for (std::size_t i = 0; i < t.size(); ++i) {
    r.tokens.push_back(detail::get_int(t[i], "tokens[" + std::to_string(i) + "]", 0, INT32_MAX));
  }
  return r;
}

}  // namespace dgemma::serve
