// SPDX-License-Identifier: Apache-2.0
// cpu::Engine<Backbone>: runs a Backbone<Attention, Experts> over a shared cpu::Model in its own
// workspace. Two modes (MODEL.md §2-§6):
//   encode():  causal pass over new tokens at positions cache.length()..; appends K/V to the cache;
//   denoise(): bidirectional pass over a canvas at positions cache.length()..; reads the cache only.
// Both return the final-normed hidden states; lm_head() and the streaming VocabPass turn them
// into logits or per-position sampling statistics. fp32 throughout; the per-element math is the
// DG_HOST_DEVICE code of core/math.hpp that the CUDA kernels share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include <Eigen/Core>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cpu/gemm.hpp>
#include <diffusion_gemma/cpu/kv_cache.hpp>
#include <diffusion_gemma/cpu/model.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/cpu/vocab_pass.hpp>
#include <diffusion_gemma/model/backbone.hpp>
#include <diffusion_gemma/model/input_checks.hpp>

namespace diffusion_gemma::cpu {

enum class VocabPrecision {
  kFloat32,   // fp32 GEMMs: the reference-exact path (replay parity)
  kBFloat16,  // bf16 inputs, fp32 accumulation on AMX tiles where available (fp32 elsewhere)
  kSentinel
};

struct EngineOptions {
  int threads = 0;                    // 0: leave the OpenMP default
  std::int64_t max_pass_tokens = 256;  // longer encoder inputs run in chunks of this size (exact: causal)
  VocabPrecision vocab_precision = VocabPrecision::kFloat32;
};

template <class Backbone_>
class Engine {
 public:
  using Backbone = Backbone_;
  using Attention = typename Backbone::Attention;
  using Experts = typename Backbone::Experts;
  using Cache = KvCache;
  static constexpr int kMaxTopK = 64;

  explicit Engine(std::shared_ptr<const Model> model, EngineOptions opts = {})
      : model_(std::move(model)), cfg_(model_->config()), opts_(opts) {
    throw_if_error(Backbone::can_implement(cfg_));
    if (cfg_.enable_moe_block && cfg_.top_k_experts > kMaxTopK) {
      throw_error(StatusCode::kUnsupported, cfg_.source, ": top_k_experts ", cfg_.top_k_experts, " exceeds ", kMaxTopK);
    }
    if (opts_.threads > 0) set_threads(opts_.threads);
    // Our own panel split decides the parallelism; Eigen's would tie results to the thread count.
    static std::once_flag eigen_single_threaded;
    std::call_once(eigen_single_threaded, [] { Eigen::setNbThreads(1); });
    pass_tokens_ = std::max<std::int64_t>(opts_.max_pass_tokens, cfg_.is_diffusion() ? cfg_.canvas_length : 1);
    if (opts_.vocab_precision == VocabPrecision::kBFloat16 && amx::available()) {
      vocab_pass_.use_bf16(&model_->packed_embedding());
    }
    reserve(pass_tokens_);
  }

  const ModelConfig& config() const { return cfg_; }
  const Model& model() const { return *model_; }
  // Whether the vocabulary pass runs in bf16 on AMX (asked for, and available on this CPU).
  bool vocab_pass_bf16() const { return vocab_pass_.bf16(); }

  KvCache make_cache(std::int64_t capacity) const { return KvCache(cfg_, capacity); }

  // Bytes a request needs beyond the weights: a KV cache of `capacity` positions, plus the
  // workspace of passes of up to `pass_tokens` tokens (an upper bound, computed before allocating).
  std::size_t request_bytes(std::int64_t capacity, std::int64_t pass_tokens) const {
    const std::size_t T = static_cast<std::size_t>(std::max(pass_tokens, pass_tokens_));
    const std::size_t H = cfg_.hidden_size, I = cfg_.intermediate_size, threads = static_cast<std::size_t>(max_threads());
    std::size_t qd = 0, kd = 0;
    for (const auto& s : cfg_.layers) {
      qd = std::max<std::size_t>(qd, static_cast<std::size_t>(cfg_.num_heads) * s.head_dim);
      kd = std::max<std::size_t>(kd, static_cast<std::size_t>(s.num_kv_heads) * s.head_dim);
    }
    std::size_t floats = T * (6 * H + 2 * qd + 2 * kd + 2 * I + 2 * std::max(H, I));
    floats += threads * T * (static_cast<std::size_t>(capacity) + T);  // attention scores, one head per thread
    if (cfg_.enable_moe_block) {
      const std::size_t E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
      floats += T * (E + K * H + K) + threads * T * (2 * H + 2 * Im);
    }
    floats += T * (VocabPass::kTile + 3 * H);  // vocabulary tile, soft embedding, SC state, hidden
    return KvCache::bytes_for(cfg_, capacity) + floats * sizeof(float);
  }

  // Causal pass over `n` new tokens at positions cache.length()..; appends their K/V. Writes the
  // final-normed hidden states [n, H] when `hidden_out` is given.
  void encode(const std::int32_t* ids, std::int64_t n, KvCache& cache, float* hidden_out = nullptr) {
    check_token_ids(cfg_, ids, n, "encoder input");
    if (cache.length() + n > cache.capacity()) {
      throw_error(StatusCode::kOutOfRange, "encoder: ", n, " tokens after ", cache.length(),
                  " cached positions exceed the KV cache capacity of ", cache.capacity());
    }
    check_positions(cfg_, cache.length() + n);
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t chunk = std::min(pass_tokens_, n - done);
      run_pass(AttentionMode::kEncoder, ids + done, chunk, nullptr, cache, &cache, cache.length(),
               hidden_out ? hidden_out + done * cfg_.hidden_size : nullptr);
      cache.advance(chunk);
      done += chunk;
    }
  }

  // Bidirectional pass over a canvas of `n` tokens at positions cache.length()..; the cache is
  // read, not written. `soft_embedding` [n, H] is the self-conditioning input (nullptr on the
  // first step of a canvas: the SC MLP then contributes exactly zero and is skipped).
  void denoise(const std::int32_t* ids, std::int64_t n, const float* soft_embedding, const KvCache& cache,
               float* hidden_out) {
    if (!cfg_.is_diffusion()) {
      throw_error(StatusCode::kUnsupported, cfg_.source, ": denoising needs a DiffusionGemma checkpoint");
    }
    check_token_ids(cfg_, ids, n, "canvas");
    if (n > pass_tokens_) reserve(n);
    check_positions(cfg_, cache.length() + n);
    run_pass(AttentionMode::kDenoiser, ids, n, soft_embedding, cache, nullptr, cache.length(), hidden_out);
  }

  // Materialised LM head: logits [n, V] = hidden E^T, softcapped. For parity tools and tests; the
  // sampler uses the streaming VocabPass, which never holds [n, V].
  void lm_head(const float* hidden, std::int64_t n, float* logits) const {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    gemm_nt(hidden, H, model_->embed_tokens().data(), H, logits, V, n, V, H);
    const float cap = cfg_.final_logit_softcapping;
    if (cap > 0.0f) {
      parallel_for(n, [&](std::int64_t t) {
        float* row = logits + t * V;
        for (std::int64_t i = 0; i < V; ++i) row[i] = math::softcap(row[i], cap);
      });
    }
  }

  // The model work of one denoising step, as the Decoder drives it: the denoiser pass over the
  // canvas (fed the soft embedding of this canvas's previous step, unless `first_step`), then the
  // streaming vocabulary pass. Per-position argmax / candidate / entropy land in `stats`; hidden
  // states and the soft embedding stay inside the engine (on the GPU they never leave the device).
  void denoise_step(const std::int32_t* canvas, std::int64_t n, bool first_step, const KvCache& cache,
                    const VocabPassArgs& args, VocabPassResult& stats) {
    const std::size_t nh = static_cast<std::size_t>(n * cfg_.hidden_size);
    if (step_hidden_.size() < nh) step_hidden_.resize(nh);
    const bool use_soft = !first_step && soft_state_.size() >= nh;
    denoise(canvas, n, use_soft ? soft_state_.data() : nullptr, cache, step_hidden_.data());
    vocab_pass(step_hidden_.data(), n, args, stats);
    if (args.soft_embedding) {
      soft_state_.swap(stats.soft_embedding);
    } else {
      soft_state_.clear();
    }
  }

  // The streaming vocabulary pass over final-normed hidden states [n, H] (see cpu/vocab_pass.hpp).
  void vocab_pass(const float* hidden, std::int64_t n, const VocabPassArgs& args, VocabPassResult& out) {
    vocab_pass_.run(model_->embed_tokens().data(), cfg_.vocab_size, cfg_.hidden_size, cfg_.final_logit_softcapping,
                    model_->embed_scale(), hidden, n, args, out);
  }

  // The self-conditioning soft embedding softmax(l) E * embed_scale from materialised
  // temperature-scaled logits [n, V] (the reference path; VocabPass fuses it).
  void soft_embedding_from_logits(const float* logits, std::int64_t n, float* out) const {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    std::vector<float> probs(static_cast<std::size_t>(n * V));
    parallel_for(n, [&](std::int64_t t) {
      const float* l = logits + t * V;
      float* p = probs.data() + t * V;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t i = 0; i < V; ++i) m = std::max(m, l[i]);
      double s = 0.0;
      for (std::int64_t i = 0; i < V; ++i) {
        p[i] = std::exp(l[i] - m);
        s += p[i];
      }
      const float inv = static_cast<float>(1.0 / s);
      for (std::int64_t i = 0; i < V; ++i) p[i] *= inv;
    });
    gemm_nn(probs.data(), V, model_->embed_tokens().data(), H, out, H, n, H, V);
    const float scale = model_->embed_scale();
    for (std::int64_t i = 0; i < n * H; ++i) out[i] *= scale;
  }

 private:
  struct Workspace {
    std::vector<float> x, h, a, o, q, k, v, attn, d, g, u, s;  // [T, ...] activations
    std::vector<float> router, sc;                               // router logits/probs; SC scratch
    std::vector<float> scores;                                   // per thread: T x (prefix + T)
    std::vector<float> expert_in, expert_mid, expert_out;        // per thread: [T, H], [T, 2I], [T, H]
    std::vector<float> slots;                                    // [T, K, H] weighted expert outputs
    std::vector<float> topk_w;
    std::vector<int> topk_i;
    std::vector<std::int32_t> rows_of_expert;                    // token index per routed slot
    std::vector<std::int32_t> slot_of_row;
    std::vector<std::int64_t> expert_begin;
  };

  static void grow(std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  void reserve(std::int64_t T) {
    const std::size_t t = static_cast<std::size_t>(T);
    const std::size_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    std::size_t qd = 0, kd = 0;
    for (const auto& s : cfg_.layers) {
      qd = std::max<std::size_t>(qd, static_cast<std::size_t>(cfg_.num_heads) * s.head_dim);
      kd = std::max<std::size_t>(kd, static_cast<std::size_t>(s.num_kv_heads) * s.head_dim);
    }
    for (auto* b : {&ws_.x, &ws_.h, &ws_.a, &ws_.o, &ws_.s}) grow(*b, t * H);
    grow(ws_.q, t * qd);
    grow(ws_.attn, t * qd);
    grow(ws_.k, t * kd);
    grow(ws_.v, t * kd);
    grow(ws_.d, t * H);
    grow(ws_.g, t * I);
    grow(ws_.u, t * I);
    grow(ws_.sc, t * std::max(H, I) * 2);
    if (cfg_.enable_moe_block) {
      const std::size_t E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
      const std::size_t threads = static_cast<std::size_t>(max_threads());
      grow(ws_.router, t * E);
      grow(ws_.slots, t * K * H);
      grow(ws_.topk_w, t * K);
      if (ws_.topk_i.size() < t * K) ws_.topk_i.resize(t * K);
      grow(ws_.expert_in, threads * t * H);
      grow(ws_.expert_mid, threads * t * 2 * Im);
      grow(ws_.expert_out, threads * t * H);
    }
    reserved_ = std::max(reserved_, T);
  }

  // One pass of T tokens at positions p0..p0+T-1 through every layer.
  // Encoder passes write their K/V to `write_to`; denoiser passes have none to write.
  void run_pass(AttentionMode mode, const std::int32_t* ids, std::int64_t T, const float* soft_embedding,
                const KvCache& cache, KvCache* write_to, std::int64_t p0, float* hidden_out) {
    if (T > reserved_) reserve(T);
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    float* x = ws_.x.data();
    embed(ids, T, x);
    if (mode == AttentionMode::kDenoiser) {
      if (soft_embedding != nullptr) add_self_conditioning(soft_embedding, T, x);
      // post_norm (weightless) runs on every step, also when the SC signal is zero.
      parallel_for(T, [&](std::int64_t t) { math::rms_norm_row(x + t * H, nullptr, H, eps, x + t * H); });
    }
    for (int l = 0; l < cfg_.num_layers(); ++l) layer(l, mode, T, cache, write_to, p0);
    if (hidden_out != nullptr) {
      const float* w = model_->final_norm().data();
      parallel_for(T, [&](std::int64_t t) { math::rms_norm_row(x + t * H, w, H, eps, hidden_out + t * H); });
    }
  }

  void embed(const std::int32_t* ids, std::int64_t T, float* x) const {
    const int H = cfg_.hidden_size;
    const float scale = model_->embed_scale();
    const float* E = model_->embed_tokens().data();
    for (std::int64_t t = 0; t < T; ++t) {
      const float* row = E + static_cast<std::int64_t>(ids[t]) * H;
      for (int i = 0; i < H; ++i) x[t * H + i] = row[i] * scale;
    }
  }

  // x += down(gelu(gate(n)) * up(n)), n = RMSNorm(soft_embedding; pre_norm).
  void add_self_conditioning(const float* soft, std::int64_t T, float* x) {
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    float* n = ws_.h.data();
    const float* w = model_->sc_pre_norm().data();
    parallel_for(T, [&](std::int64_t t) { math::rms_norm_row(soft + t * H, w, H, eps, n + t * H); });
    gated_mlp(n, T, model_->sc_gate().data(), model_->sc_up().data(), model_->sc_down().data(), I, ws_.o.data());
    for (std::int64_t i = 0; i < T * H; ++i) x[i] += ws_.o[i];
  }

  // out [T, H] = down(gelu_tanh(in Wg^T) * (in Wu^T)), width I.
  void gated_mlp(const float* in, std::int64_t T, const float* Wg, const float* Wu, const float* Wd, int I,
                 float* out) {
    const int H = cfg_.hidden_size;
    float* g = ws_.g.data();
    float* u = ws_.u.data();
    gemm_nt(in, H, Wg, H, g, I, T, I, H);
    gemm_nt(in, H, Wu, H, u, I, T, I, H);
    for (std::int64_t i = 0; i < T * I; ++i) g[i] = math::gelu_tanh(g[i]) * u[i];
    gemm_nt(g, I, Wd, I, out, H, T, H, I);
  }

  void norm_rows(const float* in, const FloatTensor& w, std::int64_t T, float* out) const {
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const float* wd = w.data();
    parallel_for(T, [&](std::int64_t t) { math::rms_norm_row(in + t * H, wd, H, eps, out + t * H); });
  }

  void layer(int l, AttentionMode mode, std::int64_t T, const KvCache& cache, KvCache* write_to, std::int64_t p0) {
    const LayerParams& P = model_->layer(l);
    const int H = cfg_.hidden_size;
    float* x = ws_.x.data();
    float* h = ws_.h.data();
    float* a = ws_.a.data();
    // Attention block: x = x + post_attn(o_proj(attn(input_ln(x)))).
    norm_rows(x, P.input_layernorm, T, h);
    attention(l, mode, T, cache, write_to, p0, h, a);
    norm_rows(a, P.post_attention_layernorm, T, a);
    for (std::int64_t i = 0; i < T * H; ++i) x[i] += a[i];
    // Feed-forward block on the post-attention residual r = x.
    float* d = ws_.d.data();
    float* s = ws_.s.data();
    norm_rows(x, P.pre_feedforward_layernorm, T, h);
    gated_mlp(h, T, P.mlp_gate.data(), P.mlp_up.data(), P.mlp_down.data(), cfg_.intermediate_size, d);
    if constexpr (Experts::kMixtureOfExperts) {
      norm_rows(d, P.post_feedforward_layernorm_1, T, d);
      mixture_of_experts(P, T, x, s);  // routed on x (= r) itself
      norm_rows(s, P.post_feedforward_layernorm_2, T, s);
      for (std::int64_t i = 0; i < T * H; ++i) s[i] += d[i];
      norm_rows(s, P.post_feedforward_layernorm, T, s);
    } else {
      norm_rows(d, P.post_feedforward_layernorm, T, s);
    }
    const float scalar = P.layer_scalar;
    for (std::int64_t i = 0; i < T * H; ++i) x[i] = (x[i] + s[i]) * scalar;
  }

  // Self-attention of layer l; `h` is the normed input [T, H], the result [T, H] goes to `out`.
  void attention(int l, AttentionMode mode, std::int64_t T, const KvCache& cache, KvCache* write_to, std::int64_t p0,
                 const float* h, float* out) {
    const LayerSpec& spec = cfg_.layers[l];
    const LayerParams& P = model_->layer(l);
    const int H = cfg_.hidden_size, D = spec.head_dim, Hq = cfg_.num_heads, Hkv = spec.num_kv_heads;
    const int group = Hq / Hkv;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    float* q = ws_.q.data();
    float* k = ws_.k.data();
    float* v = ws_.v.data();
    gemm_nt(h, H, P.q_proj.data(), H, q, Hq * D, T, Hq * D, H);
    gemm_nt(h, H, P.k_proj.data(), H, k, Hkv * D, T, Hkv * D, H);
    if (spec.has_v_proj) {
      gemm_nt(h, H, P.v_proj.data(), H, v, Hkv * D, T, Hkv * D, H);
    } else {
      std::copy(k, k + T * Hkv * D, v);  // k_eq_v: V comes from the raw k projection
    }
    // Per-head norms, then RoPE on q and k (never on v).
    const RopeConfig& rope = cfg_.rope(spec.type);
    const int pairs = rope.rotated_pairs(D), denom = rope.denominator(D);
    std::vector<float>& inv = inv_freq_scratch_;
    inv.resize(static_cast<std::size_t>(D / 2));
    for (int i = 0; i < D / 2; ++i) {
      inv[i] = math::rope_inv_freq(i, pairs, denom, static_cast<float>(rope.theta), static_cast<float>(rope.factor));
    }
    const float* qn = P.q_norm.data();
    const float* kn = P.k_norm.data();
    parallel_for(T, [&](std::int64_t t) {
      const float pos = static_cast<float>(p0 + t);
      const auto rotate = [&](float* vec) {
        for (int i = 0; i < D / 2; ++i) {
          const float angle = pos * inv[i];
          math::rope_rotate_pair(vec[i], vec[i + D / 2], std::cos(angle), std::sin(angle));
        }
      };
      for (int hh = 0; hh < Hq; ++hh) {
        float* row = q + (t * Hq + hh) * D;
        math::rms_norm_row(row, qn, D, eps, row);
        rotate(row);
      }
      for (int g = 0; g < Hkv; ++g) {
        float* kr = k + (t * Hkv + g) * D;
        math::rms_norm_row(kr, kn, D, eps, kr);
        rotate(kr);
        float* vr = v + (t * Hkv + g) * D;
        math::rms_norm_row(vr, nullptr, D, eps, vr);
      }
    });

    const int W = cfg_.sliding_window;
    const std::int64_t lo = std::min(p0, Attention::first_visible_cached(mode, spec.type, W, p0));
    const std::int64_t Np = p0 - lo;  // cached keys any query may see
    const std::int64_t Nk = Np + T;
    const std::size_t per_thread = static_cast<std::size_t>(T * Nk);
    grow(ws_.scores, per_thread * static_cast<std::size_t>(max_threads()));
    float* attn = ws_.attn.data();
    parallel_for(Hq, [&](std::int64_t hh) {
      const int g = static_cast<int>(hh) / group;
      float* S = ws_.scores.data() + per_thread * static_cast<std::size_t>(thread_index());
      const float* qh = q + hh * D;
      // Scores against the visible cached keys, then against the new keys (scale 1.0).
      if (Np > 0) gemm_nt(qh, Hq * D, cache.keys(l, g) + lo * D, D, S, Nk, T, Np, D);
      gemm_nt(qh, Hq * D, k + g * D, Hkv * D, S + Np, Nk, T, T, D);
      for (std::int64_t i = 0; i < T; ++i) {
        float* row = S + i * Nk;
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < Nk; ++j) {
          const std::int64_t key_pos = j < Np ? lo + j : p0 + (j - Np);
          if (!Attention::visible(mode, spec.type, W, p0 + i, key_pos, p0)) {
            row[j] = -std::numeric_limits<float>::infinity();
          } else {
            m = std::max(m, row[j]);
          }
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j < Nk; ++j) {
          row[j] = std::exp(row[j] - m);
          sum += row[j];
        }
        const float inv_sum = 1.0f / sum;
        for (std::int64_t j = 0; j < Nk; ++j) row[j] *= inv_sum;
      }
      float* oh = attn + hh * D;
      if (Np > 0) gemm_nn(S, Nk, cache.values(l, g) + lo * D, D, oh, Hq * D, T, D, Np);
      gemm_nn(S + Np, Nk, v + g * D, Hkv * D, oh, Hq * D, T, D, T, /*accumulate=*/Np > 0);
    });
    if (write_to != nullptr) {
      for (int g = 0; g < Hkv; ++g) {
        float* kc = write_to->keys(l, g) + p0 * D;
        float* vc = write_to->values(l, g) + p0 * D;
        for (std::int64_t t = 0; t < T; ++t) {
          std::copy(k + (t * Hkv + g) * D, k + (t * Hkv + g + 1) * D, kc + t * D);
          std::copy(v + (t * Hkv + g) * D, v + (t * Hkv + g + 1) * D, vc + t * D);
        }
      }
    }
    gemm_nt(attn, Hq * D, P.o_proj.data(), Hq * D, out, H, T, H, Hq * D);
  }

  // Router (on the residual r) and experts (on pre_ff_2(r)); writes the combined output [T, H].
  void mixture_of_experts(const LayerParams& P, std::int64_t T, const float* r, float* out) {
    const int H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    // Router input: rms_noscale(r) * scale * hidden^-0.5, in that order (transformers').
    float* z = ws_.h.data();
    const float* scale = P.router_scale.data();
    const float root = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
    parallel_for(T, [&](std::int64_t t) {
      float* row = z + t * H;
      math::rms_norm_row(r + t * H, nullptr, H, eps, row);
      for (int i = 0; i < H; ++i) row[i] = (row[i] * scale[i]) * root;
    });
    float* logits = ws_.router.data();
    gemm_nt(z, H, P.router_proj.data(), H, logits, E, T, E, H);
    const float* per_expert = P.router_per_expert_scale.data();
    for (std::int64_t t = 0; t < T; ++t) {
      float* row = logits + t * E;
      float m = row[0];
      for (int e = 1; e < E; ++e) m = std::max(m, row[e]);
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) {
        row[e] = std::exp(row[e] - m);
        sum += row[e];
      }
      for (int e = 0; e < E; ++e) row[e] /= sum;
      math::router_top_k(row, per_expert, E, K, ws_.topk_w.data() + t * K, ws_.topk_i.data() + t * K);
    }
    // Group the routed (token, slot) pairs by expert: each expert's weights are read once.
    ws_.expert_begin.assign(static_cast<std::size_t>(E) + 1, 0);
    for (std::int64_t i = 0; i < T * K; ++i) ++ws_.expert_begin[ws_.topk_i[i] + 1];
    for (int e = 0; e < E; ++e) ws_.expert_begin[e + 1] += ws_.expert_begin[e];
    ws_.rows_of_expert.resize(static_cast<std::size_t>(T * K));
    ws_.slot_of_row.resize(static_cast<std::size_t>(T * K));
    {
      std::vector<std::int64_t> fill(ws_.expert_begin.begin(), ws_.expert_begin.end() - 1);
      for (std::int64_t i = 0; i < T * K; ++i) {
        const std::int64_t at = fill[ws_.topk_i[i]]++;
        ws_.rows_of_expert[at] = static_cast<std::int32_t>(i / K);
        ws_.slot_of_row[at] = static_cast<std::int32_t>(i);
      }
    }
    float* x2 = ws_.a.data();  // pre_feedforward_layernorm_2(r)
    norm_rows(r, P.pre_feedforward_layernorm_2, T, x2);
    const float* Wgu = P.experts_gate_up.data();
    const float* Wd = P.experts_down.data();
    float* slots = ws_.slots.data();
    parallel_for(E, [&](std::int64_t e) {
      const std::int64_t b = ws_.expert_begin[e], n = ws_.expert_begin[e + 1] - b;
      if (n == 0) return;
      const std::size_t th = static_cast<std::size_t>(thread_index());
      float* in = ws_.expert_in.data() + th * static_cast<std::size_t>(reserved_) * H;
      float* mid = ws_.expert_mid.data() + th * static_cast<std::size_t>(reserved_) * 2 * Im;
      float* y = ws_.expert_out.data() + th * static_cast<std::size_t>(reserved_) * H;
      for (std::int64_t j = 0; j < n; ++j) {
        const float* src = x2 + static_cast<std::int64_t>(ws_.rows_of_expert[b + j]) * H;
        std::copy(src, src + H, in + j * H);
      }
      gemm_nt(in, H, Wgu + e * 2 * Im * H, H, mid, 2 * Im, n, 2 * Im, H);
      for (std::int64_t j = 0; j < n; ++j) {
        float* row = mid + j * 2 * Im;  // gate rows first, then up rows: [gate | up]
        for (int i = 0; i < Im; ++i) row[i] = math::gelu_tanh(row[i]) * row[Im + i];
      }
      gemm_nt(mid, 2 * Im, Wd + e * H * Im, Im, y, H, n, H, Im);
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int32_t slot = ws_.slot_of_row[b + j];
        const float w = ws_.topk_w[slot];
        float* dst = slots + static_cast<std::int64_t>(slot) * H;
        for (int i = 0; i < H; ++i) dst[i] = y[j * H + i] * w;
      }
    });
    // Sum each token's K contributions in ascending expert order, as transformers' index_add.
    parallel_for(T, [&](std::int64_t t) {
      int order[kMaxTopK];
      const int* idx = ws_.topk_i.data() + t * K;
      for (int j = 0; j < K; ++j) order[j] = j;
      std::sort(order, order + K, [&](int a, int b) { return idx[a] < idx[b]; });
      float* o = out + t * H;
      std::fill(o, o + H, 0.0f);
      for (int j = 0; j < K; ++j) {
        const float* src = slots + (t * K + order[j]) * H;
        for (int i = 0; i < H; ++i) o[i] += src[i];
      }
    });
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& cfg_;
  EngineOptions opts_;
  std::int64_t pass_tokens_ = 0;
  std::int64_t reserved_ = 0;
  Workspace ws_;
  std::vector<float> inv_freq_scratch_;
  VocabPass vocab_pass_;
  std::vector<float> step_hidden_, soft_state_;  // denoise_step's hidden states and SC state
};

}  // namespace diffusion_gemma::cpu
