// SPDX-License-Identifier: Apache-2.0
// What a checkpoint's config.json and generation_config.json say, as plain structs. Every model
// dimension is runtime data; only policies are compile-time. Parsing lives in io/config.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

enum class ModelFamily {
  kDiffusionGemma,  // DiffusionGemmaForBlockDiffusion: encoder + denoiser, always with the MoE block
  kGemma4Text,      // a plain Gemma 4 text decoder (encoder mode only)
  kSentinel
};

enum class LayerType { kSliding, kFull, kSentinel };

// RoPE as transformers computes it: inv_freq[i] = 1 / theta^(2i / denominator) / factor for the
// first `rotated_pairs` pairs and 0 for the rest; element i pairs with i + head_dim/2 (rotate-half).
struct RopeConfig {
  enum class Type { kDefault, kProportional, kSentinel };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;  // proportional RoPE divides inv_freq by it

  int rotated_pairs(int head_dim) const {
    if (type == Type::kProportional) return static_cast<int>(partial_rotary_factor * head_dim / 2);
    return static_cast<int>(head_dim * partial_rotary_factor) / 2;
  }
  // The exponent denominator: head_dim for proportional RoPE (not the rotated width), the
  // rotated width for default RoPE (which only exists at factor 1.0 here).
  int denominator(int head_dim) const {
    return type == Type::kProportional ? head_dim : static_cast<int>(head_dim * partial_rotary_factor);
  }
};

struct LayerSpec {
  LayerType type = LayerType::kSliding;
  int head_dim = 0;
  int num_kv_heads = 0;
  bool has_v_proj = true;  // false: V is v_norm of the raw k_proj output (attention_k_eq_v)
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kDiffusionGemma;
  std::string source;  // file it came from, for messages

  std::int64_t vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;  // dense MLP and self-conditioning MLP width
  int num_heads = 0;
  std::vector<LayerSpec> layers;
  int sliding_window = 0;  // keys visible to a causal query on a sliding layer, self included
  RopeConfig rope_sliding;
  RopeConfig rope_full;

  bool enable_moe_block = false;
  int num_experts = 0;
  int top_k_experts = 0;
  int moe_intermediate_size = 0;

  float final_logit_softcapping = 0.0f;  // 0: none
  double rms_norm_eps = 1e-6;
  std::int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = true;

  int pad_token_id = 0;
  int bos_token_id = 2;
  std::vector<int> eos_token_ids;
  int canvas_length = 0;  // DiffusionGemma only
  // The model's dtype as config.json states it ("dtype" / "torch_dtype"); kSentinel when absent
  // or not a float type. The load converts a tensor stored in another dtype than a 16-bit one to
  // it and makes the embedding scale in it, as transformers does (model_dtype() in model/weights.hpp);
  // memory estimates from the config alone use it too.
  DType dtype = DType::kSentinel;

  int num_layers() const { return static_cast<int>(layers.size()); }
  const RopeConfig& rope(LayerType t) const { return t == LayerType::kFull ? rope_full : rope_sliding; }
  bool is_diffusion() const { return family == ModelFamily::kDiffusionGemma; }

  // Value checks shared by every way a config is built (parsed, hand-written in a test).
  void validate() const {
    const auto fail = [&](auto&&... parts) { throw_error(StatusCode::kInvalidArgument, source, ": ", parts...); };
    if (vocab_size <= 0) fail("vocab_size must be positive (got ", vocab_size, ")");
    if (vocab_size > (std::int64_t{1} << 31) - 1) fail("vocab_size ", vocab_size, " does not fit 32-bit token ids");
    if (hidden_size <= 0) fail("hidden_size must be positive (got ", hidden_size, ")");
    if (intermediate_size <= 0) fail("intermediate_size must be positive (got ", intermediate_size, ")");
    if (layers.empty()) fail("num_hidden_layers must be at least 1");
    if (num_heads <= 0) fail("num_attention_heads must be positive (got ", num_heads, ")");
    if (sliding_window <= 0) fail("sliding_window must be positive (got ", sliding_window, ")");
    if (max_position_embeddings <= 0) fail("max_position_embeddings must be positive");
    if (!(rms_norm_eps > 0.0)) fail("rms_norm_eps must be positive");
    if (final_logit_softcapping < 0.0f) fail("final_logit_softcapping must be positive or null");
    for (int l = 0; l < num_layers(); ++l) {
      const LayerSpec& s = layers[l];
      if (s.head_dim <= 0 || s.head_dim % 2 != 0) fail("layer ", l, ": head_dim must be positive and even (got ", s.head_dim, ")");
      if (s.num_kv_heads <= 0) fail("layer ", l, ": num_key_value_heads must be positive (got ", s.num_kv_heads, ")");
      if (num_heads % s.num_kv_heads != 0) {
        fail("layer ", l, ": num_attention_heads ", num_heads, " is not a multiple of num_key_value_heads ", s.num_kv_heads);
      }
      const RopeConfig& r = rope(s.type);
      if (r.rotated_pairs(s.head_dim) > s.head_dim / 2 || r.rotated_pairs(s.head_dim) < 0) {
        fail("layer ", l, ": partial_rotary_factor ", r.partial_rotary_factor, " is out of range");
      }
    }
    if (enable_moe_block) {
      if (num_experts <= 0) fail("num_experts must be positive (got ", num_experts, ")");
      if (top_k_experts <= 0 || top_k_experts > num_experts) {
        fail("top_k_experts must be in 1..num_experts=", num_experts, " (got ", top_k_experts, ")");
      }
      if (moe_intermediate_size <= 0) fail("moe_intermediate_size must be positive (got ", moe_intermediate_size, ")");
    }
    if (is_diffusion() && canvas_length <= 0) fail("canvas_length must be positive (got ", canvas_length, ")");
    if (pad_token_id < 0 || pad_token_id >= vocab_size) fail("pad_token_id ", pad_token_id, " is outside the vocabulary");
    if (bos_token_id < 0 || bos_token_id >= vocab_size) {
      fail("bos_token_id ", bos_token_id, " is outside the vocabulary (vocab_size ", vocab_size, ")");
    }
    // eos_token_id is not checked: generation reads its stop ids from generation_config.json
    // (GenerationConfig), and checkpoints cut down from the released config keep its [1, 106]
    // under a small vocabulary, which transformers loads.
  }
};

// pad_token_id value meaning "no PAD": a canvas keeps its tokens after a stop id, as transformers'
// generate does when the generation config has no pad_token_id.
inline constexpr int kNoPadToken = -1;

// Sampler and scheduler defaults of a DiffusionGemma checkpoint (generation_config.json). The
// member initialisers are what transformers uses for a key the file does not set: its global
// defaults for DiffusionGemma generation (also the released checkpoint's values) for the sampler
// and the token budget, and nothing for the stop ids, PAD and max_length. transformers does not
// fall back to config.json's eos_token_id: without generation_config.json, or without the key,
// generation runs every canvas of the budget.
struct GenerationConfig {
  // transformers' own default of max_new_tokens; only at this value does max_length set the budget.
  static constexpr int kDefaultMaxNewTokens = 256;

  std::string source;
  int max_new_tokens = kDefaultMaxNewTokens;
  int max_denoising_steps = 48;
  double entropy_bound = 0.1;
  double t_min = 0.4;
  double t_max = 0.8;
  int stability_threshold = 1;
  double confidence_threshold = 0.005;
  std::vector<int> stop_token_ids;  // eos_token_id; the released checkpoint's are {1, 106, 50}
  // Stop ids outside the vocabulary that restrict_to_vocabulary() took out of stop_token_ids.
  std::vector<int> ignored_stop_token_ids;
  int pad_token_id = kNoPadToken;  // the released checkpoint's is 0
  // max_length: prompt plus generated tokens (0: unset). With max_new_tokens at its default it sets
  // the budget to max_length - prompt length; otherwise generation also stops after the canvas that
  // reaches it (transformers' MaxLengthCriteria).
  int max_length = 0;
  // The most denoising steps per canvas a configuration may ask for (`dgemma --max-denoising-steps`
  // has the same bound): beyond it a run would not end in any useful time.
  static constexpr int kMaxDenoisingSteps = 1 << 20;

  void validate() const {
    const auto fail = [&](auto&&... parts) { throw_error(StatusCode::kInvalidArgument, source, ": ", parts...); };
    if (max_new_tokens <= 0) fail("max_new_tokens must be positive (got ", max_new_tokens, ")");
    if (max_denoising_steps <= 0 || max_denoising_steps > kMaxDenoisingSteps) {
      fail("max_denoising_steps must be in [1, ", kMaxDenoisingSteps, "] (got ", max_denoising_steps, ")");
    }
    if (!(entropy_bound > 0.0)) fail("entropy_bound must be > 0 (got ", entropy_bound, ")");
    if (!(t_min >= 0.0)) fail("t_min must be >= 0 (got ", t_min, ")");
    if (!(t_max > t_min)) fail("t_max must be > t_min (got t_min ", t_min, ", t_max ", t_max, ")");
    if (stability_threshold < 0) fail("stability_threshold must be >= 0 (got ", stability_threshold, ")");
    if (!(confidence_threshold > 0.0)) fail("confidence_threshold must be > 0 (got ", confidence_threshold, ")");
    if (pad_token_id < kNoPadToken) fail("pad_token_id must be >= 0 (got ", pad_token_id, ")");
    if (max_length < 0) fail("max_length must be positive (got ", max_length, ")");
  }

  // Binds the ids to the model's vocabulary. PAD, when there is one, must be a token: it fills a
  // canvas after a stop id and is then embedded. A stop id outside the vocabulary can never be
  // sampled, so it is dropped (and kept in ignored_stop_token_ids for `dgemma info`), not refused:
  // the released generation_config.json names 106 and 50, which a model cut down to a smaller
  // vocabulary does not have, and transformers runs such a model.
  void restrict_to_vocabulary(std::int64_t vocab_size) {
    if (pad_token_id != kNoPadToken && (pad_token_id < 0 || pad_token_id >= vocab_size)) {
      throw_error(StatusCode::kInvalidArgument, source, ": pad_token_id ", pad_token_id,
                  " is outside the vocabulary (vocab_size ", vocab_size, ")");
    }
    std::vector<int> kept;
    for (const int id : stop_token_ids) {
      (id >= 0 && id < vocab_size ? kept : ignored_stop_token_ids).push_back(id);
    }
    stop_token_ids = std::move(kept);
  }
};

}  // namespace diffusion_gemma
