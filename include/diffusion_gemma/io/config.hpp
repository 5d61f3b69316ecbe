// SPDX-License-Identifier: Apache-2.0
// config.json and generation_config.json of DiffusionGemma and plain Gemma 4 text checkpoints.
//
// Strict on purpose: transformers' class defaults are not the 26B values and some would switch on
// features this library does not implement, so a missing required key is an error, and a key that
// asks for an unsupported feature is rejected by name. The only defaults applied are the ones
// transformers itself applies to DiffusionGemma regardless of the class (final softcap 30.0,
// which its config class does not serialise; generation defaults).
#pragma once

#include <string>
#include <vector>

#include <unistd.h>

#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma::io {

namespace detail {

inline RopeConfig parse_rope(const JsonObject& rope_params, const std::string& layer_type_name,
                             double default_partial_rotary_factor) {
  const JsonObject r = rope_params.object(layer_type_name);
  // transformers reads these with dict.get(key, 1.0), so a written null reaches its arithmetic.
  for (const char* key : {"partial_rotary_factor", "factor"}) {
    if (r.has(key) && r.raw(key).is_null()) r.fail(key, "null is not a number transformers can compute with; give one");
  }
  RopeConfig c;
  const std::string type = r.string("rope_type");
  if (type == "default") {
    c.type = RopeConfig::Type::kDefault;
  } else if (type == "proportional") {
    c.type = RopeConfig::Type::kProportional;
  } else {
    r.fail("rope_type", "RoPE type '", type, "' is not supported (default, proportional)");
  }
  c.theta = r.number("rope_theta");
  if (!(c.theta > 0.0)) r.fail("rope_theta", "must be positive");
  // transformers' default RoPE rotates the whole head whatever factor it is handed, so the
  // text-level fallback only reaches proportional entries.
  c.partial_rotary_factor = r.number_or(
      "partial_rotary_factor", c.type == RopeConfig::Type::kDefault ? 1.0 : default_partial_rotary_factor);
  if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0)) {
    r.fail("partial_rotary_factor", "must be in (0, 1] (got ", c.partial_rotary_factor, ")");
  }
  if (c.type == RopeConfig::Type::kDefault && c.partial_rotary_factor != 1.0) {
    r.fail("partial_rotary_factor", "default RoPE with a partial factor is not supported (use proportional)");
  }
  c.factor = r.number_or("factor", 1.0);
  if (c.type == RopeConfig::Type::kDefault && r.has_non_null("factor") && c.factor != 1.0) {
    r.fail("factor", "scaling factors are only supported for proportional RoPE");
  }
  if (!(c.factor > 0.0)) r.fail("factor", "must be positive");
  return c;
}

inline std::vector<int> parse_token_ids(const JsonObject& o, const std::string& key) {
  std::vector<int> ids;
  if (!o.has_non_null(key)) return ids;
  const Json& v = o.raw(key);
  if (v.is_array()) {
    for (const auto& x : v) ids.push_back(o.as_int32(o.as_integer(x, key), key));
  } else {
    ids.push_back(o.as_int32(o.as_integer(v, key), key));
  }
  return ids;
}

inline void reject_if(const JsonObject& t, const std::string& key, bool unsupported, const std::string& why) {
  if (unsupported) throw_error(StatusCode::kUnsupported, t.where(key), ": ", why);
}

}  // namespace detail

// Parses config.json. `source` names the file in messages.
inline ModelConfig parse_model_config(const Json& root_json, const std::string& source) {
  using detail::reject_if;
  const JsonObject root(root_json, source, "");
  ModelConfig c;
  c.source = source;
  const std::string model_type = root.string("model_type");
  bool nested = true;
  if (model_type == "diffusion_gemma") {
    c.family = ModelFamily::kDiffusionGemma;
  } else if (model_type == "gemma4") {
    c.family = ModelFamily::kGemma4Text;
  } else if (model_type == "gemma4_text") {
    c.family = ModelFamily::kGemma4Text;
    nested = false;
  } else {
    root.fail("model_type", "model type '", model_type,
              "' is not supported (diffusion_gemma, gemma4, gemma4_text)");
  }
  const JsonObject t = nested ? root.object("text_config") : root;
  const bool dg = c.is_diffusion();

  c.vocab_size = t.integer("vocab_size");
  c.hidden_size = t.int32("hidden_size");
  c.intermediate_size = t.int32("intermediate_size");
  c.num_heads = t.int32("num_attention_heads");
  const int num_kv_heads = t.int32("num_key_value_heads");
  const int head_dim = t.int32("head_dim");
  const int num_layers = t.int32("num_hidden_layers");
  if (num_layers <= 0) t.fail("num_hidden_layers", "must be at least 1 (got ", num_layers, ")");
  if (num_layers > 4096) t.fail("num_hidden_layers", "value ", num_layers, " is implausible");
  c.sliding_window = t.int32("sliding_window");
  c.rms_norm_eps = t.number("rms_norm_eps");
  c.max_position_embeddings = t.integer("max_position_embeddings");

  const std::string act = t.string("hidden_activation");
  if (act != "gelu_pytorch_tanh") {
    throw_error(StatusCode::kUnsupported, t.where("hidden_activation"), ": activation '", act,
                "' is not supported (gelu_pytorch_tanh)");
  }
  reject_if(t, "attention_bias", t.boolean_or("attention_bias", false), "attention biases are not supported");
  reject_if(t, "attn_logit_softcapping", t.has_non_null("attn_logit_softcapping"),
            "attention logit softcapping is not supported (Gemma 4 has none)");
  if (t.has_non_null("use_bidirectional_attention")) {
    const std::string b = t.string("use_bidirectional_attention");
    reject_if(t, "use_bidirectional_attention", b != "vision",
              "value '" + b + "' is not supported (null or \"vision\"; text attention is causal)");
  }

  // Layer types and per-layer head shapes.
  const Json& types = t.required("layer_types");
  if (!types.is_array() || static_cast<int>(types.size()) != num_layers) {
    t.fail("layer_types", "expected a list of num_hidden_layers=", num_layers, " entries");
  }
  c.layers.resize(num_layers);
  bool any_full = false, any_sliding = false;
  for (int l = 0; l < num_layers; ++l) {
    const Json& v = types[l];
    const std::string s = v.is_string() ? v.get<std::string>() : std::string();
    if (s == "sliding_attention") {
      c.layers[l].type = LayerType::kSliding;
      any_sliding = true;
    } else if (s == "full_attention") {
      c.layers[l].type = LayerType::kFull;
      any_full = true;
    } else {
      t.fail("layer_types", "entry ", l, " is ", v.dump(), "; expected \"sliding_attention\" or \"full_attention\"");
    }
    c.layers[l].head_dim = head_dim;
    c.layers[l].num_kv_heads = num_kv_heads;
  }
  // transformers forces the last layer to full attention (with a warning) whatever config.json
  // says, before it derives the full layers' shapes, and builds the weights that way.
  if (c.layers.back().type != LayerType::kFull) {
    c.layers.back().type = LayerType::kFull;
    any_full = true;
    any_sliding = false;
    for (int l = 0; l + 1 < num_layers; ++l) any_sliding = any_sliding || c.layers[l].type == LayerType::kSliding;
  }

  bool k_eq_v = dg;  // DiffusionGemma full layers never have v_proj
  if (!dg) k_eq_v = t.boolean("attention_k_eq_v");
  // transformers derives per_layer_config from the global keys only when the key is absent: a
  // written null means no overrides at all, so every layer keeps head_dim and num_key_value_heads.
  if (t.has("per_layer_config") && t.raw("per_layer_config").is_null()) {
    // nothing to apply
  } else if (t.has("per_layer_config")) {
    const JsonObject plc = t.object("per_layer_config");
    for (auto it = plc.raw_begin(); it != plc.raw_end(); ++it) {
      std::int64_t idx = -1;
      try {
        std::size_t used = 0;
        idx = std::stoll(it.key(), &used);
        if (used != it.key().size()) idx = -1;
      } catch (...) {
        idx = -1;
      }
      if (idx < 0 || idx >= num_layers) {
        plc.fail(it.key(), "per_layer_config keys must be layer indices 0..", num_layers - 1);
      }
      const JsonObject o(it.value(), source, "text_config.per_layer_config." + it.key());
      for (auto f = it.value().begin(); f != it.value().end(); ++f) {
        if (f.key() != "head_dim" && f.key() != "num_key_value_heads") {
          throw_error(StatusCode::kUnsupported, o.where(f.key()), ": per-layer override of '", f.key(), "' is not supported");
        }
      }
      if (o.has_non_null("head_dim")) c.layers[idx].head_dim = o.int32("head_dim");
      if (o.has_non_null("num_key_value_heads")) c.layers[idx].num_kv_heads = o.int32("num_key_value_heads");
    }
  } else if (any_full) {
    // Released checkpoints spell the full-layer shapes with these keys; transformers turns them
    // into per_layer_config. A missing global_head_dim would silently become 512 there.
    const int global_head_dim = t.int32("global_head_dim");
    int global_kv = num_kv_heads;
    // Gemma 4's attention_k_eq_v gates num_global_key_value_heads. DiffusionGemma's config class
    // does not declare that key, so transformers applies num_global_key_value_heads to its full
    // layers whatever attention_k_eq_v says (a false one included).
    const bool gate = dg ? true : k_eq_v;
    if (gate && t.has_non_null("num_global_key_value_heads")) global_kv = t.int32("num_global_key_value_heads");
    for (auto& s : c.layers) {
      if (s.type == LayerType::kFull) {
        s.head_dim = global_head_dim;
        s.num_kv_heads = global_kv;
      }
    }
  }
  for (auto& s : c.layers) s.has_v_proj = !(k_eq_v && s.type == LayerType::kFull);
  // transformers builds one RoPE and one attention shape per layer type, and refuses a type whose
  // layers differ (the forced last layer included).
  for (int l = 1; l < num_layers; ++l) {
    for (int first = 0; first < l; ++first) {
      if (c.layers[first].type != c.layers[l].type) continue;
      if (c.layers[first].head_dim != c.layers[l].head_dim || c.layers[first].num_kv_heads != c.layers[l].num_kv_heads) {
        t.fail("per_layer_config", "layer ", l, " (", c.layers[l].type == LayerType::kFull ? "full" : "sliding",
               " attention) has head_dim ", c.layers[l].head_dim, " and ", c.layers[l].num_kv_heads,
               " KV heads but layer ", first, " of the same type has ", c.layers[first].head_dim, " and ",
               c.layers[first].num_kv_heads, "; transformers requires every layer of a type to share its shape");
      }
      break;
    }
  }

  // transformers lets a rope_scaling key replace rope_parameters; refused rather than half-read.
  reject_if(t, "rope_scaling", t.has_non_null("rope_scaling"),
            "rope_scaling is not read (transformers lets it replace rope_parameters); give the values as "
            "rope_parameters");
  const JsonObject rope = t.object("rope_parameters");
  // Gemma 4's config fills a text-level partial_rotary_factor into each RoPE entry that has none.
  // DiffusionGemma's fills it into the sliding layers' default RoPE too, which narrows that RoPE's
  // frequencies but not the rotation, and transformers' forward then fails: refused.
  const double partial = t.number_or("partial_rotary_factor", 1.0);
  if (dg && any_sliding && partial != 1.0 && !rope.object("sliding_attention").has_non_null("partial_rotary_factor")) {
    t.fail("partial_rotary_factor", "DiffusionGemma applies a text-level factor (", partial,
           ") to the sliding layers' default RoPE as well, which transformers cannot run; give it in "
           "rope_parameters.full_attention instead");
  }
  if (any_sliding) c.rope_sliding = detail::parse_rope(rope, "sliding_attention", partial);
  if (any_full) c.rope_full = detail::parse_rope(rope, "full_attention", partial);

  // Features of other Gemma 4 sizes that the 26B-A4B backbone does not have.
  if (!dg) {
    const std::int64_t ple = t.integer("hidden_size_per_layer_input");
    reject_if(t, "hidden_size_per_layer_input", ple != 0,
              "per-layer input embeddings (PLE) are not supported; expected 0, got " + std::to_string(ple));
    reject_if(t, "num_kv_shared_layers", t.has("num_kv_shared_layers") && t.raw("num_kv_shared_layers").is_null(),
              "null is not a layer count (transformers refuses it); give 0");
    reject_if(t, "num_kv_shared_layers", t.integer_or("num_kv_shared_layers", 0) != 0,
              "KV sharing across layers is not supported");
    reject_if(t, "use_double_wide_mlp", t.boolean_or("use_double_wide_mlp", false),
              "the double-wide MLP of KV-shared layers is not supported");
    c.enable_moe_block = t.boolean("enable_moe_block");
    const Json& cap = t.required("final_logit_softcapping");
    c.final_logit_softcapping = cap.is_null() ? 0.0f : static_cast<float>(t.number("final_logit_softcapping"));
    reject_if(t, "final_logit_softcapping", !cap.is_null() && c.final_logit_softcapping == 0.0f,
              "0 is not a softcap (transformers divides the logits by it); give null for none");
  } else {
    for (const char* key : {"hidden_size_per_layer_input", "num_kv_shared_layers"}) {
      reject_if(t, key, t.integer_or(key, 0) != 0, "not supported by DiffusionGemma");
    }
    c.enable_moe_block = true;  // DiffusionGemma layers always carry the MoE block
    reject_if(t, "final_logit_softcapping", t.has("final_logit_softcapping") && t.raw("final_logit_softcapping").is_null(),
              "null is not a softcap DiffusionGemma can run (transformers fails on it); give a number");
    c.final_logit_softcapping = static_cast<float>(t.number_or("final_logit_softcapping", 30.0));
    reject_if(t, "final_logit_softcapping", c.final_logit_softcapping == 0.0f,
              "0 is not a softcap (transformers divides the logits by it); give a positive number");
  }
  if (c.enable_moe_block) {
    c.num_experts = t.int32("num_experts");
    c.top_k_experts = t.int32("top_k_experts");
    c.moe_intermediate_size = t.int32("moe_intermediate_size");
  }

  // DiffusionGemma's model ties its head by the top-level key alone (a text_config value is not
  // read); Gemma 4's nested config is refused when either level unties it.
  const bool root_tied = root.boolean_or("tie_word_embeddings", true);
  const bool text_tied = !nested || dg || t.boolean_or("tie_word_embeddings", true);
  c.tie_word_embeddings = root_tied && text_tied;
  if (!c.tie_word_embeddings) {
    throw_error(StatusCode::kUnsupported, (root_tied ? t : root).where("tie_word_embeddings"),
                ": an untied LM head is not supported (Gemma 4 ties it to embed_tokens)");
  }
  // The top level first: transformers makes the whole model in the top-level dtype and copies it
  // onto the sub-configs.
  for (const JsonObject* o : {&root, &t}) {
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (c.dtype != DType::kSentinel || !o->has_non_null(key) || !o->raw(key).is_string()) continue;
      const std::string d = o->raw(key).get<std::string>();
      if (d == "bfloat16") c.dtype = DType::kBF16;
      if (d == "float16") c.dtype = DType::kF16;
      if (d == "float32") c.dtype = DType::kF32;
    }
  }
  c.pad_token_id = t.as_int32(t.integer_or("pad_token_id", 0), "pad_token_id");
  c.bos_token_id = t.as_int32(t.integer_or("bos_token_id", 2), "bos_token_id");
  c.eos_token_ids = detail::parse_token_ids(t, "eos_token_id");
  if (dg) {
    c.canvas_length = root.int32("canvas_length");
  }
  c.validate();
  return c;
}

inline ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return parse_model_config(read_json_file(path), path);
}

inline GenerationConfig parse_generation_config(const Json& j, const std::string& source) {
  const JsonObject o(j, source, "");
  GenerationConfig g;
  g.source = source;
  g.max_new_tokens = o.as_int32(o.integer_or("max_new_tokens", g.max_new_tokens), "max_new_tokens");
  g.max_denoising_steps = o.as_int32(o.integer_or("max_denoising_steps", g.max_denoising_steps), "max_denoising_steps");
  g.t_min = o.number_or("t_min", g.t_min);
  g.t_max = o.number_or("t_max", g.t_max);
  g.stability_threshold = o.as_int32(o.integer_or("stability_threshold", g.stability_threshold), "stability_threshold");
  g.confidence_threshold = o.number_or("confidence_threshold", g.confidence_threshold);
  if (o.has_non_null("sampler_config")) {
    const JsonObject s = o.object("sampler_config");
    // transformers instantiates the class `_cls_name` names with the other keys as arguments.
    if (!s.has_non_null("_cls_name")) s.fail("_cls_name", "missing; transformers needs it to build the sampler");
    for (auto it = s.raw_begin(); it != s.raw_end(); ++it) {
      if (it.key() != "_cls_name" && it.key() != "entropy_bound") {
        s.fail(it.key(), "is not an argument of EntropyBoundSamplerConfig (entropy_bound)");
      }
    }
    if (s.string("_cls_name") != "EntropyBoundSamplerConfig") {
      throw_error(StatusCode::kUnsupported, s.where("_cls_name"), ": sampler '", s.string("_cls_name"),
                  "' is not supported (EntropyBoundSamplerConfig)");
    }
    g.entropy_bound = s.number("entropy_bound");
  }
  // Absent, null or []: no stop ids; absent or null pad_token_id: no PAD (transformers' reading).
  g.stop_token_ids = detail::parse_token_ids(o, "eos_token_id");
  if (o.has_non_null("pad_token_id")) {
    g.pad_token_id = o.int32("pad_token_id");
    if (g.pad_token_id < 0) o.fail("pad_token_id", "must be >= 0 (got ", g.pad_token_id, ")");
  }
  if (o.has_non_null("max_length")) {
    g.max_length = o.int32("max_length");
    if (g.max_length <= 0) o.fail("max_length", "must be positive (got ", g.max_length, ")");
  }
  g.validate();
  return g;
}

// generation_config.json is optional: without it transformers' defaults apply, which name no stop
// id and no PAD (GenerationConfig).
inline GenerationConfig load_generation_config(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  if (::access(path.c_str(), F_OK) != 0) {
    GenerationConfig g;
    g.source = path + " (absent: defaults)";
    return g;
  }
  return parse_generation_config(read_json_file(path), path);
}

}  // namespace diffusion_gemma::io
