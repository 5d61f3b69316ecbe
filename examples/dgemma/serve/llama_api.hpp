// SPDX-License-Identifier: Apache-2.0
// llama.cpp's native completion endpoint (POST /completion, also /completions) for `dgemma serve`
// (docs/serving.md §2): the request body as llama.cpp's server reads it, and its response objects:
// a flat object with "content" and "stop" (a list of them for a list of prompts), streamed as
// `data:` events without OpenAI's [DONE]. Clients written for llama.cpp (its web UI, editor
// plug-ins, many wrappers) speak this dialect rather than OpenAI's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "api.hpp"

namespace dgemma::serve {

namespace detail {

// One prompt of llama.cpp's forms: a string, token ids, or ids and strings mixed in one list.
inline CompletionPrompt llama_prompt(const json& v, const std::string& param) {
  CompletionPrompt c;
  if (v.is_string()) {
    c.text = v.get<std::string>();
    if (c.text.empty()) bad_value(param, "must not be empty");
    return c;
  }
  if (!v.is_array()) bad_type(param, "a string or an array of token ids and strings", v);
  if (v.empty()) bad_value(param, "must not be empty");
  bool strings = false;
  for (const auto& x : v) strings = strings || x.is_string();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string q = param + "[" + std::to_string(i) + "]";
    if (v[i].is_string()) {
      CompletionPrompt part;
      part.text = v[i].get<std::string>();
      c.parts.push_back(std::move(part));
    } else if (v[i].is_number()) {
      const std::int64_t id = get_int(v[i], q, 0, INT32_MAX);
      if (!strings) {
        c.ids.push_back(id);
      } else {
        if (c.parts.empty() || !c.parts.back().is_ids) {
          c.parts.emplace_back();
          c.parts.back().is_ids = true;
        }
        c.parts.back().ids.push_back(id);
      }
    } else {
      bad_type(q, "a token id or a string", v[i]);
    }
  }
  c.is_ids = !strings;
  return c;
}

// A llama.cpp sampling control: neutral values are accepted silently; any other is named in
// X-Dgemma-Ignored, or refused under --strict (this sampler's randomness is its own schedule).
inline void llama_sampling(const json& v, const std::string& key, const ApiLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return;
  bool neutral = true;
  if (key == "top_k" || key == "mirostat") {
    neutral = get_int(v, key, INT32_MIN, INT32_MAX) <= 0;
  } else if (key == "ignore_eos") {
    neutral = !get_bool(v, key);
  } else if (key == "logit_bias") {
    if (!v.is_array() && !v.is_object()) bad_type(key, "an array of [token, bias] pairs or an object", v);
    neutral = v.empty();
  } else {
    const double x = get_number(v, key);
    static const std::set<std::string> one = {"temperature", "top_p", "typical_p", "repeat_penalty"};
    neutral = x == (one.count(key) ? 1.0 : 0.0);
  }
  if (!neutral) {
    ignore_or_refuse(key, "is not supported (got " + v.dump() + "): the temperature follows the denoising schedule; "
                               "set dgemma.t_min and dgemma.t_max instead",
                     limits, r);
  }
}

}  // namespace detail

inline GenerationRequest parse_llama_completion_request(const std::string& body, const ApiLimits& limits) {
  GenerationRequest r;
  r.chat = false;
  r.llama = true;
  r.random_seed = true;  // llama.cpp's default seed is -1: a new one per request, reported back
  const json j = detail::parse_object(body);
  static const std::set<std::string> sampling = {"temperature", "top_k",         "top_p",           "min_p",
                                                 "typical_p",   "repeat_penalty", "presence_penalty", "frequency_penalty",
                                                 "dry_multiplier", "xtc_probability", "mirostat",   "dynatemp_range",
                                                 "ignore_eos",  "logit_bias"};
  // Without effect whatever their value: they tune samplers this server does not have (each is
  // neutral while those are off) or llama.cpp's slots and prompt cache.
  static const std::set<std::string> inert = {
      "repeat_last_n", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "xtc_threshold",
      "mirostat_tau", "mirostat_eta", "dynatemp_exponent", "min_keep", "n_keep", "n_indent", "penalize_nl",
      "cache_prompt", "id_slot", "samplers", "timings_per_token", "t_max_predict_ms", "post_sampling_probs"};
  std::set<std::string> known = {"prompt", "n_predict", "max_tokens", "seed", "stop", "stream", "model", "dgemma",
                                 "return_tokens", "response_fields", "n_probs", "grammar", "json_schema",
                                 "image_data", "lora"};
  known.insert(sampling.begin(), sampling.end());
  known.insert(inert.begin(), inert.end());
  detail::check_utility_fields(j, known, limits, r.ignored);

  if (!j.contains("prompt") || j["prompt"].is_null()) throw ApiError(400, "'prompt' is required", "prompt", "missing_parameter");
  const json& p = j["prompt"];
  // A list of strings or of lists is several prompts (the answer is then a list); a list holding
  // a number is one prompt of ids, with strings mixed in or not.
  bool list = p.is_array() && !p.empty();
  for (std::size_t i = 0; list && i < p.size(); ++i) list = p[i].is_string() || p[i].is_array();
  if (list) {
    if (p.size() > limits.max_prompts) {
      detail::bad_value("prompt", "holds " + std::to_string(p.size()) + " prompts; at most " +
                                      std::to_string(limits.max_prompts) + " per request");
    }
    r.prompt_list = true;
    for (std::size_t i = 0; i < p.size(); ++i) r.prompts.push_back(detail::llama_prompt(p[i], "prompt[" + std::to_string(i) + "]"));
  } else {
    r.prompts.push_back(detail::llama_prompt(p, "prompt"));
  }

  // n_predict, else OpenAI's max_tokens, as llama.cpp reads them (n_predict wins, -1 included);
  // -1 (its default) is "as many as fit", which here is the checkpoint's default fitted to the
  // context. A max_tokens that n_predict overrides is still type-checked, and named as ignored.
  r.max_tokens = limits.default_max_tokens;
  std::optional<std::int64_t> n_predict;
  for (const char* k : {"n_predict", "max_tokens"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    const std::int64_t v = detail::get_int(j[k], k, -1, limits.max_tokens_limit);
    if (std::string(k) == "max_tokens" && j.contains("n_predict") && !j["n_predict"].is_null()) {
      r.ignored.push_back(k);
      continue;
    }
    if (v != -1) n_predict = v;
    r.max_tokens_param = k;
  }
  if (n_predict) r.max_tokens = static_cast<int>(*n_predict);
  r.max_tokens_given = n_predict.has_value();

  if (j.contains("seed")) detail::parse_seed(j["seed"], r);
  if (j.contains("stop")) {
    ApiLimits stops = limits;
    stops.max_stop_sequences = std::max<std::size_t>(limits.max_stop_sequences, 16);  // llama.cpp sets no limit
    detail::parse_stop(j["stop"], stops, r.stop);
  }
  r.stream = detail::get_flag(j, "stream", false);
  r.return_tokens = detail::get_flag(j, "return_tokens", false);
  if (j.contains("response_fields") && !j["response_fields"].is_null()) {
    const json& f = j["response_fields"];
    if (!f.is_array()) detail::bad_type("response_fields", "an array of strings", f);
    for (std::size_t i = 0; i < f.size(); ++i) {
      r.response_fields.push_back(detail::get_string(f[i], "response_fields[" + std::to_string(i) + "]"));
    }
  }
  for (const auto& k : sampling) {
    if (j.contains(k)) detail::llama_sampling(j[k], k, limits, r);
  }
  // What would change the answer's shape or constrain its text is refused rather than ignored.
  if (j.contains("n_probs") && !j["n_probs"].is_null() && detail::get_int(j["n_probs"], "n_probs", 0, INT32_MAX) != 0) {
    detail::bad_value("n_probs", "is not supported: only 0 is accepted");
  }
  if (j.contains("grammar") && !j["grammar"].is_null() && !detail::get_string(j["grammar"], "grammar").empty()) {
    detail::bad_value("grammar", "is not supported: this server has no constrained sampling");
  }
  if (j.contains("json_schema") && !j["json_schema"].is_null()) {
    detail::bad_value("json_schema", "is not supported: this server has no constrained sampling");
  }
  for (const char* k : {"image_data", "lora"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    if (!j[k].is_array()) detail::bad_type(k, "an array", j[k]);
    if (!j[k].empty()) {
      detail::bad_value(k, std::string("is not supported: ") + (k[0] == 'i' ? "this model reads text only" : "there are no adapters"));
    }
  }
  if (j.contains("dgemma")) detail::parse_extension(j["dgemma"], limits, r);
  return r;
}

// One prompt's answer in llama.cpp's shape.
struct LlamaResult {
  std::size_t index = 0;
  std::string content;
  std::vector<std::int32_t> tokens;  // the generated ids, when the request asked for them
  int tokens_predicted = 0;
  int tokens_evaluated = 0;  // the prompt's tokens
  std::string prompt;        // the prompt as run: its text with the special tokens
  std::string stop_type;     // "eos" (a stop id), "word" (a stop sequence) or "limit" (n_predict)
  std::string stopping_word;
  double prompt_ms = 0.0;     // arrival (queue included) to the first canvas's start
  double predicted_ms = 0.0;  // the canvases' denoising and commits
};

// llama.cpp's final object. In a stream its content and tokens came in the partial events before.
inline json llama_final(const LlamaResult& r, const json& settings, const std::string& model, bool stream) {
  const auto per_second = [](int n, double ms) { return ms > 0.0 ? 1e3 * n / ms : 0.0; };
  const auto per_token = [](int n, double ms) { return n > 0 ? ms / n : 0.0; };
  json timings{{"prompt_n", r.tokens_evaluated},
               {"prompt_ms", r.prompt_ms},
               {"prompt_per_token_ms", per_token(r.tokens_evaluated, r.prompt_ms)},
               {"prompt_per_second", per_second(r.tokens_evaluated, r.prompt_ms)},
               {"predicted_n", r.tokens_predicted},
               {"predicted_ms", r.predicted_ms},
               {"predicted_per_token_ms", per_token(r.tokens_predicted, r.predicted_ms)},
               {"predicted_per_second", per_second(r.tokens_predicted, r.predicted_ms)}};
  return json{{"index", r.index},
              {"content", stream ? std::string() : r.content},
              {"tokens", stream ? std::vector<std::int32_t>() : r.tokens},
              {"id_slot", -1},
              {"stop", true},
              {"model", model},
              {"tokens_predicted", r.tokens_predicted},
              {"tokens_evaluated", r.tokens_evaluated},
              {"generation_settings", settings},
              {"prompt", r.prompt},
              {"has_new_line", r.content.find('\n') != std::string::npos},
              {"truncated", false},
              {"stop_type", r.stop_type},
              {"stopping_word", r.stopping_word},
              {"tokens_cached", 0},
              {"timings", timings}};
}

// A streamed piece of one prompt's answer: the text and ids of a committed canvas.
inline json llama_partial(std::size_t index, const std::string& content, const std::vector<std::int32_t>& tokens,
                          int tokens_predicted, int tokens_evaluated) {
  return json{{"index", index},         {"content", content},   {"tokens", tokens},
              {"stop", false},          {"id_slot", -1},        {"tokens_predicted", tokens_predicted},
              {"tokens_evaluated", tokens_evaluated}};
}

// llama.cpp's response_fields: only the named fields; "a/b" takes b out of object a and puts it at
// the top under the name b. A field the answer does not have is left out.
inline json project_fields(const json& full, const std::vector<std::string>& fields) {
  if (fields.empty()) return full;
  json out = json::object();
  for (const auto& f : fields) {
    const json* at = &full;
    std::size_t start = 0;
    bool found = true;
    for (;;) {
      const std::size_t slash = f.find('/', start);
      const std::string name = f.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      if (!at->is_object() || !at->contains(name)) {
        found = false;
        break;
      }
      at = &(*at)[name];
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (found) out[f] = *at;  // under the whole path, as llama.cpp names it ("generation_settings/seed")
  }
  return out;
}

}  // namespace dgemma::serve
