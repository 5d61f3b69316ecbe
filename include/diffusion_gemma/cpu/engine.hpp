// SPDX-License-Identifier: Apache-2.0
// cpu::Engine<Backbone>: runs a Backbone<Attention, Experts> over a shared cpu::Model in its own
// workspace. Two modes (docs/model.md §2-§6):
//   encode():  causal pass over new tokens at positions cache.length()..; appends K/V to the cache;
//   denoise(): bidirectional pass over a canvas at positions cache.length()..; reads the cache only.
// Both return the final-normed hidden states; lm_head() and the streaming VocabPass turn them
// into logits or per-position sampling statistics. An encoder pass asked for no hidden states (a
// prefill or a commit during generation) stops its last layer once that layer's K/V are cached:
// the rest of the layer would only feed hidden states nobody reads.
//
// Every product with a weight goes through cpu/linear.hpp with the engine's KernelContext
// (instruction set found at run time, precision chosen by EngineOptions); activations, norms and
// softmax statistics are fp32. The per-element math is core/math.hpp's, shared with CUDA.
// An engine changes no process-wide state: its thread count travels with each parallel region.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <tuple>
#include <vector>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kv_cache.hpp>
#include <diffusion_gemma/cpu/linear.hpp>
#include <diffusion_gemma/cpu/model.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/cpu/vmath.hpp>
#include <diffusion_gemma/cpu/vocab_pass.hpp>
#include <diffusion_gemma/model/backbone.hpp>
#include <diffusion_gemma/model/input_checks.hpp>
#include <diffusion_gemma/model/kv_layout.hpp>
#include <diffusion_gemma/model/pass_plan.hpp>
#include <diffusion_gemma/model/rope_table.hpp>
#include <diffusion_gemma/sampler/batch_item_checks.hpp>
#include <diffusion_gemma/sampler/batch_items.hpp>

namespace diffusion_gemma::cpu {

struct EngineOptions {
  int threads = 0;                     // 0: OMP_NUM_THREADS if set, else the core count
  std::int64_t max_pass_tokens = 256;  // longer encoder inputs run in chunks of this size (exact: causal)
  // fast: bf16 products on AMX tiles where the CPU has them (the same as exact elsewhere); its
  // measured quality on the bundled model is within 1 point of exact on every task
  // (docs/performance.md). exact: what the parity tests hold to.
  Precision precision = Precision::kFast;
  // Kernel family; kSentinel: DG_CPU_ISA if set, else the best this CPU runs.
  Isa isa = Isa::kSentinel;
  // A sequence computes the same bits alone or next to others (KernelContext::row_invariant).
  // false: passes of at most 4 rows (autoregressive decoding) stream weights through fp32 dot
  // products, and a row's result may then depend on how many rows share its pass.
  bool batch_invariant = true;
  // Bytes for the experts' inputs and gate|up rows of a pass. A pass whose routed rows (tokens x
  // top-k) need more runs its experts in runs that fit (but never fewer rows than the pass has
  // tokens, one expert's most): the same bits, and a workspace that grows by less per token.
  std::size_t expert_run_bytes = std::size_t{16} << 20;
};

template <class Backbone_>
class Engine {
 public:
  using Backbone = Backbone_;
  using Attention = typename Backbone::Attention;
  using Experts = typename Backbone::Experts;
  using Cache = KvCache;
  // A sequence's self-conditioning input for its next denoising step [n, H] (empty: none yet).
  using DenoiseState = std::vector<float>;
  static constexpr int kMaxTopK = 64;
  static constexpr std::int64_t kQueryBlock = 64;     // attention rows per task
  static constexpr std::int64_t kMinTileQueries = 16;  // fewer queries: fp32 attention
  // At most this many floats of keys and values laid out as panels per layer (64 MiB; PanelOperand).
  static constexpr std::size_t kMaxPanelFloats = std::size_t{1} << 24;

  // Whether this engine can run a configuration, from the config alone: what the constructor
  // checks first, so tools that only read config.json (`dgemma info`) refuse exactly what it does.
  static Status can_run(const ModelConfig& cfg) {
    if (Status s = Backbone::can_implement(cfg); !s.ok()) return s;
    if (cfg.enable_moe_block && cfg.top_k_experts > kMaxTopK) {
      return make_status(StatusCode::kUnsupported, cfg.source, ": top_k_experts ", cfg.top_k_experts, " exceeds ",
                         kMaxTopK);
    }
    return {};
  }

  explicit Engine(std::shared_ptr<const Model> model, EngineOptions opts = {})
      : model_(std::move(model)), cfg_(model_->config()), opts_(opts) {
    throw_if_error(can_run(cfg_));
    if (!enum_valid(opts_.precision)) throw_error(StatusCode::kInvalidArgument, "EngineOptions::precision is invalid");
    ctx_.isa = opts_.isa == Isa::kSentinel ? default_isa() : opts_.isa;
    if (static_cast<int>(ctx_.isa) > static_cast<int>(cpu_features().best())) {
      throw_error(StatusCode::kUnsupported, "EngineOptions::isa ", isa_name(ctx_.isa),
                  " asks for kernels this CPU cannot run (best: ", isa_name(cpu_features().best()), ")");
    }
    ctx_.precision = opts_.precision;
    ctx_.row_invariant = opts_.batch_invariant;
    if (opts_.threads > kMaxThreads) {
      throw_error(StatusCode::kInvalidArgument, "cpu::EngineOptions::threads = ", opts_.threads, " is more than ",
                  kMaxThreads);
    }
    ctx_.threads = resolve_threads(opts_.threads);
    attention_scratch_.resize(static_cast<std::size_t>(std::max(1, ctx_.threads)));
    weights_ = ctx_.bf16_tiles() || ctx_.bf16_dots() ? &model_->tiled_weights(ctx_.threads)
               : ctx_.isa == Isa::kAvx2 || ctx_.isa == Isa::kAvx512 ? &model_->paired_weights(ctx_.threads)
                                        : &model_->weights();
    check_max_pass_tokens(opts_.max_pass_tokens, "cpu::EngineOptions::max_pass_tokens");
    // Encoder passes run max_pass_tokens at a time; the workspace also holds a whole canvas.
    base_rows_ = std::max<std::int64_t>(opts_.max_pass_tokens, cfg_.is_diffusion() ? cfg_.canvas_length : 1);
    try {
      reserve(base_rows_);
    } catch (const std::bad_alloc&) {
      throw_error(StatusCode::kOutOfMemory, cfg_.source, ": the workspace for passes of ", base_rows_,
                  " tokens (canvas_length ", cfg_.canvas_length, ", max_pass_tokens ", opts_.max_pass_tokens,
                  ") does not fit in memory (about ", request_bytes(cfg_, 0, base_rows_, ctx_.threads, opts_.expert_run_bytes) / 1048576.0, " MiB)");
    }
  }

  const ModelConfig& config() const { return cfg_; }
  const Model& model() const { return *model_; }
  const KernelContext& kernels() const { return ctx_; }
  // Tokens per encoder pass (EngineOptions::max_pass_tokens), and the encoder passes run so far.
  std::int64_t encode_pass_tokens() const { return opts_.max_pass_tokens; }
  std::int64_t encoder_passes() const { return encoder_passes_; }
  // The RoPE inverse frequencies every layer reads (the same bits the CUDA engine uploads).
  const RopeTables& rope_tables() const { return rope_; }

  KvCache make_cache(std::int64_t capacity) const { return KvCache(cfg_, capacity); }

  // Rows of one run of experts (mixture_of_experts) in a pass of T tokens: all T x K routed rows
  // while their inputs and gate|up rows fit in `run_bytes` (EngineOptions::expert_run_bytes), else
  // as many as do, but at least T (the most one expert can have).
  static std::int64_t expert_rows(const ModelConfig& cfg, std::int64_t T, std::size_t run_bytes) {
    const std::int64_t per_row =
        static_cast<std::int64_t>(sizeof(float)) * (cfg.hidden_size + 2 * static_cast<std::int64_t>(cfg.moe_intermediate_size));
    const std::int64_t fit = static_cast<std::int64_t>(std::min<std::size_t>(run_bytes, std::size_t{1} << 62)) /
                             std::max<std::int64_t>(1, per_row);
    return std::max(T, std::min(T * cfg.top_k_experts, fit));
  }

  // Bytes a request needs beyond the weights: a KV cache of `capacity` positions, plus the
  // workspace of its largest pass: an encoder chunk of the `prompt_tokens` or a canvas of
  // `canvas_tokens` (an upper bound, computed before allocating). Longer prompts only grow the cache.
  std::size_t request_bytes(std::int64_t capacity, std::int64_t prompt_tokens, std::int64_t canvas_tokens) const {
    const std::int64_t rows = request_pass_rows(prompt_tokens, canvas_tokens, opts_.max_pass_tokens);
    return request_bytes(cfg_, capacity, std::max(rows, base_rows_), ctx_.threads, opts_.expert_run_bytes);
  }
  // The same from a config alone for passes of up to `pass_rows` tokens (no weights needed:
  // `dgemma info`).
  static std::size_t request_bytes(const ModelConfig& cfg, std::int64_t capacity, std::int64_t pass_rows,
                                   int threads, std::size_t expert_run_bytes = EngineOptions{}.expert_run_bytes) {
    const std::size_t T = static_cast<std::size_t>(pass_rows), H = cfg.hidden_size, I = cfg.intermediate_size;
    const std::size_t th = static_cast<std::size_t>(resolve_threads(threads));
    std::size_t qd = 0, kd = 0, dmax = 0;
    for (const auto& s : cfg.layers) {
      qd = std::max<std::size_t>(qd, static_cast<std::size_t>(cfg.num_heads) * s.head_dim);
      kd = std::max<std::size_t>(kd, static_cast<std::size_t>(s.num_kv_heads) * s.head_dim);
      dmax = std::max<std::size_t>(dmax, static_cast<std::size_t>(s.head_dim));
    }
    std::size_t floats = T * (6 * H + 2 * qd + 2 * kd + 2 * I + dmax);
    // attention scores, one query block per thread (its keys rounded up to a panel)
    floats += th * kQueryBlock * (static_cast<std::size_t>(capacity) + T + kernels::kPairPanelWidth);
    floats += 2 * T * (static_cast<std::size_t>(capacity) + T) / 4;  // visibility masks, two layer types (bytes)
    if (cfg.enable_moe_block) {
      const std::size_t E = cfg.num_experts, K = cfg.top_k_experts, Im = cfg.moe_intermediate_size;
      const std::size_t run = static_cast<std::size_t>(expert_rows(cfg, static_cast<std::int64_t>(T), expert_run_bytes));
      // Per row: router probabilities, top-k weights and ids, the routing indices (two int32 and one
      // int64 per slot, each token's slot order, its next slot); one run of experts' inputs (then
      // outputs) and gate|up rows.
      floats += T * (E + 7 * K + 1) + run * (H + 2 * Im);
    }
    floats += 2 * T * H;  // the hidden states and the SC state of denoise_step
    std::size_t bytes = floats * sizeof(float) + 2 * T * std::max(H, I) * 2;  // bf16 packed activations
    // Every KV head's visible keys and values laid out once per layer: in bf16 tile layouts for
    // attention on AMX tiles (fast), or as fp32 panels on AVX2 (up to kMaxPanelFloats; past it the
    // products run without them). The kernels are chosen at run time, so the larger of the two;
    // plus one head's fp32 rows per thread while they are converted.
    std::size_t kv_layout = 0;
    const std::size_t keys = static_cast<std::size_t>(capacity) + T + 32;
    for (const auto& s : cfg.layers) {
      const std::size_t d = static_cast<std::size_t>(s.head_dim), hkv = static_cast<std::size_t>(s.num_kv_heads);
      const std::size_t tiles = hkv * keys * ((d + 31) / 32 * 32 + (d + 15) / 16 * 16) * 2;
      const std::size_t panels =
          std::min(kMaxPanelFloats, hkv * (PanelOperand::floats(static_cast<std::int64_t>(keys), static_cast<std::int64_t>(d)) +
                                           PanelOperand::floats(static_cast<std::int64_t>(d), static_cast<std::int64_t>(keys))));
      kv_layout = std::max({kv_layout, tiles, panels * sizeof(float)});
    }
    bytes += kv_layout + th * keys * dmax * sizeof(float);
    if (cfg.is_diffusion()) bytes += VocabPass::workspace_bytes(static_cast<std::int64_t>(T), cfg.hidden_size);
    return KvCache::bytes_for(cfg, capacity) + bytes;
  }

  // Causal pass over `n` new tokens at positions cache.length()..; appends their K/V. Writes the
  // final-normed hidden states [n, H] when `hidden_out` is given; without it the last layer stops
  // after its K/V (the cache is the same, bit for bit).
  void encode(const std::int32_t* ids, std::int64_t n, KvCache& cache, float* hidden_out = nullptr) {
    check_token_ids(cfg_, ids, n, "encoder input");
    check_cache(cache);
    if (cache.length() + n > cache.capacity()) {
      throw_error(StatusCode::kOutOfRange, "encoder: ", n, " tokens after ", cache.length(),
                  " cached positions exceed the KV cache capacity of ", cache.capacity());
    }
    check_positions(cfg_, cache.length() + n);
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t chunk = encoder_pass_tokens(n, done, opts_.max_pass_tokens);
      const Segment seg{ids + done, chunk, cache.length(), &cache, &cache, nullptr};
      run_pass(AttentionMode::kEncoder, &seg, 1, hidden_out ? hidden_out + done * cfg_.hidden_size : nullptr);
      cache.advance(chunk);
      ++encoder_passes_;
      done += chunk;
    }
  }

  // Causal passes for several sequences at once, each appending to its own cache. Each item is
  // cut into encoder chunks exactly as encode() cuts it alone; a pass takes the next chunk of
  // every item that has one, so every weight is read once per pass for all of them. All items
  // are checked before any work.
  void encode_batch(const EncodeItem<KvCache>* items, std::size_t count) {
    check_encode_items(cfg_, items, count, [this](const KvCache& c) { check_cache(c); });
    std::vector<std::int64_t> done(count, 0);
    std::vector<Segment> segs;
    for (;;) {
      segs.clear();
      for (std::size_t i = 0; i < count; ++i) {
        const EncodeItem<KvCache>& it = items[i];
        if (done[i] >= it.n) continue;
        const std::int64_t chunk = encoder_pass_tokens(it.n, done[i], opts_.max_pass_tokens);
        segs.push_back(Segment{it.ids + done[i], chunk, it.cache->length(), it.cache, it.cache, nullptr});
        done[i] += chunk;
      }
      if (segs.empty()) break;
      run_pass(AttentionMode::kEncoder, segs.data(), segs.size(), nullptr);
      for (const Segment& sg : segs) sg.write_to->advance(sg.T);
      ++encoder_passes_;
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
    check_cache(cache);
    check_positions(cfg_, cache.length() + n);
    const Segment seg{ids, n, cache.length(), &cache, nullptr, soft_embedding};
    run_pass(AttentionMode::kDenoiser, &seg, 1, hidden_out);
  }

  // Materialised LM head: logits [n, V] = hidden E^T, softcapped. For parity tools and tests; the
  // sampler uses the streaming VocabPass, which never holds [n, V].
  void lm_head(const float* hidden, std::int64_t n, float* logits) const {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    linear(ctx_, weights_->embed_tokens, hidden, H, n, logits, V);
    const float cap = cfg_.final_logit_softcapping;
    if (cap > 0.0f) {
      parallel_for(
          n,
          [&](std::int64_t t) {
            float* row = logits + t * V;
            for (std::int64_t i = 0; i < V; ++i) row[i] = math::softcap(row[i], cap);
          },
          threads_for(n, V));
    }
  }

  // The model work of one denoising step, as the Decoder drives it: the denoiser pass over the
  // canvas (fed the soft embedding of this canvas's previous step, unless `first_step`), then the
  // streaming vocabulary pass. Per-position argmax / candidate / entropy land in `stats`; hidden
  // states and the soft embedding stay inside the engine (on the GPU they never leave the device).
  void denoise_step(const std::int32_t* canvas, std::int64_t n, bool first_step, const KvCache& cache,
                    const VocabPassArgs& args, VocabPassResult& stats) {
    DenoiseItem<KvCache, DenoiseState> it;
    it.canvas = canvas;
    it.n = n;
    it.first_step = first_step;
    it.cache = &cache;
    it.args = args;
    it.stats = &stats;
    it.state = &soft_state_;
    denoise_step_batch(&it, 1);
  }

  // One denoising step for several sequences in one denoiser pass and one vocabulary pass; each
  // item's self-conditioning input comes from, and its next one goes to, `item.state`. What an
  // item gets does not depend on the other items (KernelContext::row_invariant).
  void denoise_step_batch(DenoiseItem<KvCache, DenoiseState>* items, std::size_t count) {
    check_denoise_items(cfg_, items, count, [this](const KvCache& c) { check_cache(c); });
    const std::int64_t H = cfg_.hidden_size;
    std::int64_t rows = 0;
    for (std::size_t i = 0; i < count; ++i) rows += items[i].n;
    std::vector<Segment>& segs = step_segments_;
    std::vector<VocabSegment>& vsegs = vocab_segments_;
    segs.clear();
    vsegs.clear();
    std::int64_t row0 = 0;
    for (std::size_t i = 0; i < count; ++i) {
      auto& it = items[i];
      const bool use_soft = !it.first_step && it.state->size() >= static_cast<std::size_t>(it.n * H);
      segs.push_back(Segment{it.canvas, it.n, it.cache->length(), it.cache, nullptr, use_soft ? it.state->data() : nullptr});
      vsegs.push_back(VocabSegment{row0, it.n, it.args, it.stats});
      row0 += it.n;
    }
    if (step_hidden_.size() < static_cast<std::size_t>(rows * H)) step_hidden_.resize(static_cast<std::size_t>(rows * H));
    run_pass(AttentionMode::kDenoiser, segs.data(), segs.size(), step_hidden_.data());
    vocab_pass_.run(ctx_, weights_->embed_tokens, cfg_.final_logit_softcapping, model_->embed_scale(),
                    step_hidden_.data(), vsegs.data(), vsegs.size());
    for (std::size_t i = 0; i < count; ++i) {
      auto& it = items[i];
      if (it.args.soft_embedding) {
        it.state->swap(it.stats->soft_embedding);
      } else {
        it.state->clear();
      }
    }
  }

  // The streaming vocabulary pass over final-normed hidden states [n, H] (see cpu/vocab_pass.hpp).
  void vocab_pass(const float* hidden, std::int64_t n, const VocabPassArgs& args, VocabPassResult& out) {
    vocab_pass_.run(ctx_, weights_->embed_tokens, cfg_.final_logit_softcapping, model_->embed_scale(), hidden,
                    n, args, out);
  }

  // The self-conditioning soft embedding softmax(l) E * embed_scale from materialised
  // temperature-scaled logits [n, V] (the reference path; VocabPass fuses it).
  void soft_embedding_from_logits(const float* logits, std::int64_t n, float* out) const {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    std::vector<float> probs(static_cast<std::size_t>(n * V));
    parallel_for(
        n,
        [&](std::int64_t t) {
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
        },
        threads_for(n, V));
    linear_transposed(ctx_, weights_->embed_tokens, probs.data(), V, n, out, H);
    const float scale = model_->embed_scale();
    for (std::int64_t i = 0; i < n * H; ++i) out[i] *= scale;
  }

 private:
  // One sequence's rows in a pass: its tokens, its positions p0.. and the cache its attention
  // reads (and, for encoder passes, writes).
  struct Segment {
    const std::int32_t* ids;
    std::int64_t T;
    std::int64_t p0;
    const KvCache* cache;
    KvCache* write_to;
    const float* soft;  // denoiser: the self-conditioning input [T, H], or nullptr
  };

  // cos/sin [T, D/2] of every row's position for one set of inverse frequencies (a layer type).
  struct RopeRows {
    const float* inv_freq = nullptr;  // which set; nullptr: not computed in this pass
    int half = 0;
    std::vector<float> cos, sin;
  };

  struct Workspace {
    // [T, ...] activations. Inside a layer o holds the router's input (it is the self-conditioning
    // MLP's output before the first layer) and, after the attention's residual add, a holds the
    // experts' normed input.
    std::vector<float> x, h, a, o, q, k, v, attn, d, g, u, s;
    std::vector<float> router;                                   // router logits/probs
    std::vector<RopeRows> rope;                                  // this pass's tables, one per frequency set
    std::vector<std::int64_t> row_pos;                           // [T]: each row's position
    std::vector<float> sc_in;                                    // self-conditioning inputs, gathered
    // One run of experts' rows (expert_rows), sorted by expert. The down product writes its outputs
    // over expert_in, which the gate/up product has finished reading.
    std::vector<float> expert_in, expert_mid;
    std::vector<std::int32_t> slot_order;                        // [T, K]: each token's slots by expert
    std::vector<std::int32_t> next_slot;                         // [T]: its first slot not yet added
    std::vector<float> topk_w;
    std::vector<int> topk_i;
    std::vector<std::int32_t> rows_of_expert;                    // token index per routed slot
    std::vector<std::int32_t> slot_of_row;
    std::vector<std::int64_t> expert_begin;
  };

  // Which keys each query row of one sequence's pass sees (T x Nk) and each query block's span of
  // them, for one layer type: the attention policy decides from the mode, the layer type, the
  // window, the positions and the sequence, never the layer, so the layers of one type in a pass
  // share it.
  struct MaskKey {
    std::uint64_t pass = 0;  // the engine's pass it was made in (0: none)
    AttentionMode mode = AttentionMode::kEncoder;
    LayerType type = LayerType::kSliding;
    int sequence = 0;
    std::int64_t p0 = 0, T = 0, lo = 0, Nk = 0;
    bool operator==(const MaskKey& o) const {
      return std::tie(pass, mode, type, sequence, p0, T, lo, Nk) ==
             std::tie(o.pass, o.mode, o.type, o.sequence, o.p0, o.T, o.lo, o.Nk);
    }
  };
  struct VisibleKeys {
    MaskKey key;
    std::uint64_t used = 0;              // when it was last used, for replacing the older of the two
    std::vector<std::uint8_t> visible;   // T x Nk
    std::vector<std::int64_t> key_span;  // per query block: keys [first, last)
  };

  // What one attention call uses, one per thread. The sequence's own mask, key spans and bf16 tile
  // layouts belong to the thread that called attend (several sequences attend at once when a pass
  // holds many); scores and kv_rows are used by whichever thread runs a task inside that call.
  struct AttentionScratch {
    VisibleKeys masks[2];  // one per layer type of an interleaved pattern
    std::uint64_t mask_uses = 0;
    std::vector<std::uint16_t> keys_bf16, values_bf16;  // per KV head: tile layouts (fast, AMX)
    std::vector<float> scores;                          // one query block's scores (fp32 path)
    std::vector<float> kv_rows;                         // one head's K or V rows being converted
    std::vector<float> key_panels, value_panels;        // per KV head: PanelOperand layouts (AVX2)
    std::vector<PanelOperand> keys_laid, values_laid;
  };

  static void grow(std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  // Inside this engine's parallel regions thread numbers are below ctx_.threads. Called from a
  // caller's own parallel region (say, one engine per thread), the engine's regions run on the
  // calling thread, whose number may be larger but stays the same for the whole call.
  AttentionScratch& this_threads_scratch() {
    return attention_scratch_[static_cast<std::size_t>(thread_index()) % attention_scratch_.size()];
  }

  void check_cache(const KvCache& cache) const {
    throw_if_error(check_kv_cache_layout(cache.layout(), cfg_, DType::kF32));
  }

  void reserve(std::int64_t T) {
    const std::size_t t = static_cast<std::size_t>(T);
    const std::size_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    std::size_t qd = 0, kd = 0;
    for (const auto& s : cfg_.layers) {
      qd = std::max<std::size_t>(qd, static_cast<std::size_t>(cfg_.num_heads) * s.head_dim);
      kd = std::max<std::size_t>(kd, static_cast<std::size_t>(s.num_kv_heads) * s.head_dim);
    }
    for (auto* b : {&ws_.x, &ws_.h, &ws_.a, &ws_.o, &ws_.s, &ws_.d}) grow(*b, t * H);
    grow(ws_.q, t * qd);
    grow(ws_.attn, t * qd);
    grow(ws_.k, t * kd);
    grow(ws_.v, t * kd);
    grow(ws_.g, t * I);
    grow(ws_.u, t * I);
    if (cfg_.enable_moe_block) {
      const std::size_t E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
      grow(ws_.router, t * E);
      grow(ws_.topk_w, t * K);
      if (ws_.topk_i.size() < t * K) ws_.topk_i.resize(t * K);
      const std::size_t rows = static_cast<std::size_t>(expert_rows(cfg_, T, opts_.expert_run_bytes));
      grow(ws_.expert_in, rows * H);
      grow(ws_.expert_mid, rows * 2 * Im);
    }
    reserved_ = std::max(reserved_, T);
  }

  // One pass through every layer over the rows of several sequences, stacked in segment order.
  // Row-wise work (embeddings, norms, every weight product, the experts) runs on all rows at once;
  // attention runs per segment against its own cache. Encoder passes write each segment's K/V.
  void run_pass(AttentionMode mode, const Segment* segs, std::size_t count, float* hidden_out) {
    std::int64_t T = 0;
    for (std::size_t i = 0; i < count; ++i) T += segs[i].T;
    if (T > reserved_) reserve(T);
    float* x = ws_.x.data();
    ws_.row_pos.resize(static_cast<std::size_t>(T));
    for (std::size_t i = 0, r = 0; i < count; ++i) {
      embed(segs[i].ids, segs[i].T, x + static_cast<std::int64_t>(r) * cfg_.hidden_size);
      for (std::int64_t t = 0; t < segs[i].T; ++t) ws_.row_pos[r++] = segs[i].p0 + t;
    }
    for (RopeRows& r : ws_.rope) r.inv_freq = nullptr;  // new positions
    ++pass_serial_;                                      // and new attention masks
    if (mode == AttentionMode::kDenoiser) {
      add_self_conditioning(segs, count, x);
      // post_norm (weightless) runs on every step, also when the SC signal is zero.
      norm_rows(x, nullptr, T, x);
    }
    const int L = cfg_.num_layers();
    const bool cache_only = mode == AttentionMode::kEncoder && hidden_out == nullptr;
    for (int l = 0; l < L; ++l) layer(l, mode, T, segs, count, /*kv_only=*/cache_only && l == L - 1);
    if (hidden_out != nullptr) norm_rows(x, model_->vector(-1, Param::kFinalNorm), T, hidden_out);
  }

  void embed(const std::int32_t* ids, std::int64_t T, float* x) const {
    const int H = cfg_.hidden_size;
    const float scale = model_->embed_scale();
    const Weight& E = weights_->embed_tokens;
    for (std::int64_t t = 0; t < T; ++t) {
      const std::byte* row = E.row_range(ids[t], 1).data;
      for (int i = 0; i < H; ++i) x[t * H + i] = kernels::MatrixB::element(row, E.dtype, i) * scale;
    }
  }

  // x += down(gelu(gate(n)) * up(n)), n = RMSNorm(soft_embedding; pre_norm), for the segments that
  // have a soft embedding (none on the first step of a canvas: the SC MLP then contributes exactly
  // zero and is skipped). Their inputs are gathered so the MLP's weights are read once.
  void add_self_conditioning(const Segment* segs, std::size_t count, float* x) {
    const std::int64_t H = cfg_.hidden_size;
    std::int64_t rows = 0;
    const float* soft = nullptr;
    for (std::size_t i = 0; i < count; ++i) {
      if (segs[i].soft == nullptr) continue;
      soft = segs[i].soft;
      rows += segs[i].T;
    }
    if (rows == 0) return;
    if (rows != segs[0].T || count != 1) {  // several inputs: one contiguous block
      grow(ws_.sc_in, static_cast<std::size_t>(rows * H));
      std::int64_t r = 0;
      for (std::size_t i = 0; i < count; ++i) {
        if (segs[i].soft == nullptr) continue;
        std::copy(segs[i].soft, segs[i].soft + segs[i].T * H, ws_.sc_in.data() + r * H);
        r += segs[i].T;
      }
      soft = ws_.sc_in.data();
    }
    const SelfConditioningWeights& sc = weights_->self_conditioning;
    float* n = ws_.h.data();
    norm_rows(soft, model_->vector(-1, Param::kScPreNorm), rows, n);
    gated_mlp(n, rows, sc.gate_proj, sc.up_proj, sc.down_proj, ws_.o.data());
    std::int64_t r = 0, row0 = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (segs[i].soft != nullptr) {
        const float* add = ws_.o.data() + r * H;
        float* xr = x + row0 * H;
        vmath::add_row(ctx_.isa, xr, add, segs[i].T * H);
        r += segs[i].T;
      }
      row0 += segs[i].T;
    }
  }

  // out [T, H] = down(gelu_tanh(in Wg^T) * (in Wu^T)).
  void gated_mlp(const float* in, std::int64_t T, const Weight& Wg, const Weight& Wu, const Weight& Wd, float* out) {
    const int H = cfg_.hidden_size;
    const std::int64_t I = Wg.rows();
    float* g = ws_.g.data();
    float* u = ws_.u.data();
    const LinearOutput gate_up[] = {{&Wg, g, I}, {&Wu, u, I}};
    linear_shared_input(ctx_, in, H, T, gate_up, 2);
    parallel_for(
        T, [&](std::int64_t t) { vmath::gelu_mul(ctx_.isa, g + t * I, u + t * I, I); }, threads_for(T, I));
    linear(ctx_, Wd, g, I, T, out, H);
  }

  // Threads for a row-wise region: `rows` rows of `per_row` elementary operations each.
  int threads_for(std::int64_t rows, std::int64_t per_row) const {
    return threads_for_work(ctx_.threads, static_cast<double>(rows) * static_cast<double>(per_row));
  }

  void norm_rows(const float* in, const float* weight, std::int64_t T, float* out) const {
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    parallel_for(
        T, [&](std::int64_t t) { vmath::rms_norm_row(ctx_.isa, in + t * H, weight, H, eps, out + t * H); },
        threads_for(T, H));
  }

  // One layer. The row-wise steps between the products (norms, residual adds, the layer scalar) run
  // in as few parallel regions as the data flow allows: each region start costs a thread wake-up.
  // With `kv_only` (the last layer of an encoder pass whose hidden states nobody reads) the layer
  // ends once its K/V are written to the caches.
  void layer(int l, AttentionMode mode, std::int64_t T, const Segment* segs, std::size_t count, bool kv_only) {
    const LayerWeights& W = weights_->layers[static_cast<std::size_t>(l)];
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const Isa isa = ctx_.isa;
    float* x = ws_.x.data();
    float* h = ws_.h.data();
    float* a = ws_.a.data();
    float* d = ws_.d.data();
    float* s = ws_.s.data();
    // Attention block: x = x + post_attn(o_proj(attn(input_ln(x)))); then h = pre_ff(x).
    norm_rows(x, model_->vector(l, Param::kInputLayernorm), T, h);
    attention(l, mode, T, segs, count, h, a, kv_only);
    if (kv_only) return;
    const float* post_attention = model_->vector(l, Param::kPostAttentionLayernorm);
    const float* pre_ff = model_->vector(l, Param::kPreFeedforwardLayernorm);
    // With experts, the same region also writes the experts' two inputs, both row-wise functions
    // of the post-attention residual r = x: the router's (into o, free inside a layer) and
    // pre_feedforward_layernorm_2(r) (into a, read by the add just before). Once per token here,
    // not once per routed slot, and no region of their own.
    float* router_in = ws_.o.data();
    const float* pre_ff_2 = Experts::kMixtureOfExperts ? model_->vector(l, Param::kPreFeedforwardLayernorm2) : nullptr;
    parallel_for(
        T,
        [&](std::int64_t t) {
          float* ar = a + t * H;
          float* xr = x + t * H;
          vmath::rms_norm_row(isa, ar, post_attention, H, eps, ar);
          vmath::add_row(isa, xr, ar, H);
          vmath::rms_norm_row(isa, xr, pre_ff, H, eps, h + t * H);
          if constexpr (Experts::kMixtureOfExperts) {
            vmath::rms_norm_row(isa, xr, pre_ff_2, H, eps, ar);
            router_input_row(l, xr, router_in + t * H);
          }
        },
        threads_for(T, (Experts::kMixtureOfExperts ? 6 : 3) * H));
    // Feed-forward block on the post-attention residual r = x.
    gated_mlp(h, T, W.mlp_gate, W.mlp_up, W.mlp_down, d);
    const float scalar = model_->layer_scalar(l);
    if constexpr (Experts::kMixtureOfExperts) {
      mixture_of_experts(l, T, router_in, a, s);
      const float* post_ff_1 = model_->vector(l, Param::kPostFeedforwardLayernorm1);
      const float* post_ff_2 = model_->vector(l, Param::kPostFeedforwardLayernorm2);
      const float* post_ff = model_->vector(l, Param::kPostFeedforwardLayernorm);
      parallel_for(
          T,
          [&](std::int64_t t) {
            float* dr = d + t * H;
            float* sr = s + t * H;
            float* xr = x + t * H;
            vmath::rms_norm_row(isa, dr, post_ff_1, H, eps, dr);
            vmath::rms_norm_row(isa, sr, post_ff_2, H, eps, sr);
            vmath::add_row(isa, sr, dr, H);
            vmath::rms_norm_row(isa, sr, post_ff, H, eps, sr);
            vmath::add_scale_row(isa, xr, sr, scalar, H);
          },
          threads_for(T, 4 * H));
    } else {
      const float* post_ff = model_->vector(l, Param::kPostFeedforwardLayernorm);
      parallel_for(
          T,
          [&](std::int64_t t) {
            float* sr = s + t * H;
            float* xr = x + t * H;
            vmath::rms_norm_row(isa, d + t * H, post_ff, H, eps, sr);
            vmath::add_scale_row(isa, xr, sr, scalar, H);
          },
          threads_for(T, 4 * H));
    }
  }

  // cos/sin of pos * inv_freq for each row's position and the D/2 pairs of layer l: the angle is
  // fp32 pos * inv_freq as in transformers (math::rope_angle, as on the GPU), cos/sin of it in fp32.
  // Layers of one type share their frequencies, so a pass computes each set once (run_pass clears
  // them).
  const RopeRows& rope_table(int l, std::int64_t T) {
    const int half = cfg_.layers[static_cast<std::size_t>(l)].head_dim / 2;
    const float* inv = rope_.layer(l);
    for (const RopeRows& r : ws_.rope)
      if (r.inv_freq == inv && r.half == half) return r;
    RopeRows* r = nullptr;
    for (RopeRows& free : ws_.rope)
      if (free.inv_freq == nullptr) r = &free;
    if (r == nullptr) r = &ws_.rope.emplace_back();
    grow(r->cos, static_cast<std::size_t>(T * half));
    grow(r->sin, static_cast<std::size_t>(T * half));
    float* cs = r->cos.data();
    float* sn = r->sin.data();
    parallel_for(
        T,
        [&](std::int64_t t) {
          for (int i = 0; i < half; ++i) {
            const float angle = math::rope_angle(ws_.row_pos[static_cast<std::size_t>(t)], inv[i]);
            cs[t * half + i] = std::cos(angle);
            sn[t * half + i] = std::sin(angle);
          }
        },
        threads_for(T, 40 * half));  // a cos and a sin are some 40 operations
    r->inv_freq = inv;
    r->half = half;
    return *r;
  }

  // Self-attention of layer l; `h` is the normed input [T, H], the result [T, H] goes to `out`.
  // `kv_only`: project, norm and rotate the keys and values, write them to each segment's cache,
  // and stop (no queries, no attention, no output).
  void attention(int l, AttentionMode mode, std::int64_t T, const Segment* segs, std::size_t count, const float* h,
                 float* out, bool kv_only) {
    const LayerSpec& spec = cfg_.layers[l];
    const LayerWeights& W = weights_->layers[static_cast<std::size_t>(l)];
    const int H = cfg_.hidden_size, D = spec.head_dim, Hq = cfg_.num_heads, Hkv = spec.num_kv_heads;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    float* q = ws_.q.data();
    float* k = ws_.k.data();
    float* v = ws_.v.data();
    LinearOutput proj[3];
    int projections = 0;
    if (!kv_only) proj[projections++] = {&W.q_proj, q, Hq * D};
    proj[projections++] = {&W.k_proj, k, Hkv * D};
    if (spec.has_v_proj) proj[projections++] = {&W.v_proj, v, Hkv * D};
    linear_shared_input(ctx_, h, H, T, proj, projections);
    // Per-head norms, then RoPE on q and k (never on v). With k_eq_v, V is v_norm of the raw k
    // projection: normed into v before k is normed in place.
    const RopeRows& rope = rope_table(l, T);
    const float* qn = model_->vector(l, Param::kQNorm);
    const float* kn = model_->vector(l, Param::kKNorm);
    const Isa isa = ctx_.isa;
    const bool k_eq_v = !spec.has_v_proj;
    parallel_for(
        T,
        [&](std::int64_t t) {
          const float* cs = rope.cos.data() + t * (D / 2);
          const float* sn = rope.sin.data() + t * (D / 2);
          const auto rotate = [&](float* vec) {
            for (int i = 0; i < D / 2; ++i) math::rope_rotate_pair(vec[i], vec[i + D / 2], cs[i], sn[i]);
          };
          for (int hh = 0; hh < (kv_only ? 0 : Hq); ++hh) {
            float* row = q + (t * Hq + hh) * D;
            vmath::rms_norm_row(isa, row, qn, D, eps, row);
            rotate(row);
          }
          for (int g = 0; g < Hkv; ++g) {
            float* kr = k + (t * Hkv + g) * D;
            float* vr = v + (t * Hkv + g) * D;
            vmath::rms_norm_row(isa, k_eq_v ? kr : vr, nullptr, D, eps, vr);
            vmath::rms_norm_row(isa, kr, kn, D, eps, kr);
            rotate(kr);
          }
        },
        threads_for(T, 4 * ((kv_only ? 0 : Hq) + 2 * Hkv) * D));
    if (kv_only) {
      for (std::size_t i = 0, row0 = 0; i < count; row0 += static_cast<std::size_t>(segs[i].T), ++i) {
        if (segs[i].write_to == nullptr) continue;
        const std::size_t at = row0 * static_cast<std::size_t>(Hkv * D);
        store_keys_values(l, segs[i].T, segs[i].p0, k + at, v + at, *segs[i].write_to);
      }
      return;
    }
    // A pass of many sequences (a batch of canvases) attends them on all threads at once, one
    // sequence per task: each sequence alone is too little work to share, and one parallel region
    // per sequence cost more than its attention. With few sequences, each one's heads and query
    // blocks are shared instead. Either way every sequence is computed the same way, bit for bit.
    seg_rows_.resize(count + 1);
    seg_rows_[0] = 0;
    for (std::size_t i = 0; i < count; ++i) seg_rows_[i + 1] = seg_rows_[i] + segs[i].T;
    const auto attend_segment = [&](std::int64_t i) {
      const Segment& sg = segs[i];
      const std::int64_t row0 = seg_rows_[static_cast<std::size_t>(i)];
      attend(l, mode, static_cast<int>(i), sg.T, *sg.cache, sg.write_to, sg.p0, q + row0 * Hq * D, k + row0 * Hkv * D,
             v + row0 * Hkv * D, ws_.attn.data() + row0 * Hq * D);
    };
    if (ctx_.threads > 1 && count >= 2 * static_cast<std::size_t>(ctx_.threads)) {
      parallel_for(static_cast<std::int64_t>(count), attend_segment, ctx_.threads);
    } else {
      for (std::size_t i = 0; i < count; ++i) attend_segment(static_cast<std::int64_t>(i));
    }
    linear(ctx_, W.o_proj, ws_.attn.data(), Hq * D, T, out, H);
  }

  // The mask for `key` (see VisibleKeys): the one made earlier in this pass for the same sequence,
  // positions and layer type, or made now over the older of the two.
  const VisibleKeys& visible_keys(AttentionScratch& own, const MaskKey& key) {
    ++own.mask_uses;
    for (VisibleKeys& m : own.masks) {
      if (m.key == key) {
        m.used = own.mask_uses;
        return m;
      }
    }
    VisibleKeys& m = own.masks[0].used <= own.masks[1].used ? own.masks[0] : own.masks[1];
    m.key = key;
    m.used = own.mask_uses;
    const AttentionMode mode = key.mode;
    const LayerType type = key.type;
    const int sequence = key.sequence;
    const std::int64_t p0 = key.p0, T = key.T, lo = key.lo, Nk = key.Nk;
    const int Wn = cfg_.sliding_window;
    const std::int64_t Np = p0 - lo;
    m.visible.resize(static_cast<std::size_t>(T * Nk));
    parallel_for(
        T,
        [&](std::int64_t i) {
          std::uint8_t* row = m.visible.data() + i * Nk;
          for (std::int64_t j = 0; j < Nk; ++j) {
            const std::int64_t key_pos = j < Np ? lo + j : p0 + (j - Np);
            row[j] = attention_visible<Attention>(mode, type, Wn, p0 + i, key_pos, p0, sequence) ? 1 : 0;
          }
        },
        threads_for(T, Nk));
    // Queries go in blocks of kQueryBlock rows; each block computes scores only over the span of
    // keys some row of it sees (a causal block skips the keys after its last row).
    const std::int64_t blocks = (T + kQueryBlock - 1) / kQueryBlock;
    m.key_span.resize(static_cast<std::size_t>(2 * blocks));
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::int64_t first = Nk, last = -1;
      for (std::int64_t i = b * kQueryBlock; i < std::min(T, (b + 1) * kQueryBlock); ++i) {
        const std::uint8_t* row = m.visible.data() + i * Nk;
        for (std::int64_t j = 0; j < Nk; ++j) {
          if (row[j]) {
            first = std::min(first, j);
            break;
          }
        }
        for (std::int64_t j = Nk - 1; j >= 0; --j) {
          if (row[j]) {
            last = std::max(last, j);
            break;
          }
        }
      }
      m.key_span[2 * b] = first;
      m.key_span[2 * b + 1] = last + 1;
    }
    return m;
  }

  // The attention core of segment `sequence`: its T query rows at positions p0.. against its
  // cached keys and its own new keys (q, k, v, attn point at the segment's first row).
  void attend(int l, AttentionMode mode, int sequence, std::int64_t T, const KvCache& cache, KvCache* write_to, std::int64_t p0,
              const float* q, const float* k, const float* v, float* attn) {
    const LayerSpec& spec = cfg_.layers[l];
    const int D = spec.head_dim, Hq = cfg_.num_heads, Hkv = spec.num_kv_heads;
    const int group = Hq / Hkv;
    const Isa isa = ctx_.isa;
    const int Wn = cfg_.sliding_window;
    const std::int64_t lo = std::min(p0, Attention::first_visible_cached(mode, spec.type, Wn, p0));
    const std::int64_t Np = p0 - lo;  // cached keys any query may see
    const std::int64_t Nk = Np + T;
    AttentionScratch& own = this_threads_scratch();
    const VisibleKeys& mask = visible_keys(own, {pass_serial_, mode, spec.type, sequence, p0, T, lo, Nk});
    const std::int64_t blocks = (T + kQueryBlock - 1) / kQueryBlock;
    // Passes of a few tokens (autoregressive decoding) would convert every visible key to tiles
    // for a handful of queries: they stay on the fp32 kernels.
    KernelContext actx = ctx_;
    if (T < kMinTileQueries) actx.precision = Precision::kExact;
#if DG_X86_KERNELS
    if (actx.bf16_tiles()) {
      attention_on_tiles(l, T, cache, lo, Np, own, mask, q, k, v, attn);
    } else
#endif
    {
    // On AVX2 each KV head's visible keys and values are laid out as panels once per layer, not
    // once per (query head, query block) product. Passes of a few queries (autoregressive
    // decoding) would lay out every key for a handful of products, and very long spans would
    // need a large scratch: those keep the per-call products.
    const std::size_t key_floats = PanelOperand::floats(Nk, D), value_floats = PanelOperand::floats(D, Nk);
    const bool laid_out = PanelOperand::available(actx) && T >= kMinTileQueries &&
                          (key_floats + value_floats) * static_cast<std::size_t>(Hkv) <= kMaxPanelFloats;
    if (laid_out) lay_out_keys_and_values(l, T, cache, lo, Np, D, Hkv, k, v, own, key_floats, value_floats);
    const std::size_t per_task = static_cast<std::size_t>(kQueryBlock * (Nk + kernels::kPairPanelWidth));
    parallel_for(
        Hq * blocks,
        [&](std::int64_t task) {
          const std::int64_t hh = task / blocks, b = task % blocks;
          const std::int64_t i0 = b * kQueryBlock, rows = std::min(kQueryBlock, T - i0);
          const std::int64_t j0 = mask.key_span[2 * b], j1 = mask.key_span[2 * b + 1], span = j1 - j0;
          float* oh = attn + (i0 * Hq + hh) * D;
          if (span <= 0) {  // no visible key (cannot happen with a causal policy: self is visible)
            for (std::int64_t i = 0; i < rows; ++i) std::fill(oh + i * Hq * D, oh + i * Hq * D + D, 0.0f);
            return;
          }
          const int g = static_cast<int>(hh) / group;
          std::vector<float>& scores = this_threads_scratch().scores;
          grow(scores, per_task);
          float* S = scores.data();
          const float* qh = q + (i0 * Hq + hh) * D;
          if (laid_out && PanelOperand::matches_matmul(actx, rows)) {
            // Scores over keys [a0, j1), a0 the panel holding j0; the softmax and P V read [j0, j1).
            const std::int64_t a0 = j0 / kernels::kPairPanelWidth * kernels::kPairPanelWidth, width = j1 - a0;
            own.keys_laid[static_cast<std::size_t>(g)].multiply(qh, Hq * D, rows, a0, width, 0, D, S, width, false);
            for (std::int64_t i = 0; i < rows; ++i) {
              float* row = S + i * width + (j0 - a0);
              vmath::mask_row(isa, row, mask.visible.data() + (i0 + i) * Nk + j0, span);
              vmath::softmax_row(isa, row, span);
            }
            own.values_laid[static_cast<std::size_t>(g)].multiply(S + (j0 - a0), width, rows, 0, D, j0, span, oh, Hq * D,
                                                                  false);
            return;
          }
          // Scores (scale 1.0) over keys [j0, j1): the cached part, then the new part.
          const std::int64_t c0 = j0, c1 = std::min(j1, Np), n0 = std::max(j0, Np), n1 = j1;
          if (c1 > c0) matmul_nt(actx, qh, Hq * D, cache.keys(l, g) + (lo + c0) * D, D, S, span, rows, c1 - c0, D);
          if (n1 > n0) {
            matmul_nt(actx, qh, Hq * D, k + ((n0 - Np) * Hkv + g) * D, Hkv * D, S + (n0 - j0), span, rows, n1 - n0, D);
          }
          for (std::int64_t i = 0; i < rows; ++i) {
            float* row = S + i * span;
            const std::uint8_t* vis = mask.visible.data() + (i0 + i) * Nk + j0;
            vmath::mask_row(isa, row, vis, span);
            vmath::softmax_row(isa, row, span);
          }
          if (c1 > c0) matmul_nn(actx, S, span, cache.values(l, g) + (lo + c0) * D, D, oh, Hq * D, rows, D, c1 - c0);
          if (n1 > n0) {
            matmul_nn(actx, S + (n0 - j0), span, v + ((n0 - Np) * Hkv + g) * D, Hkv * D, oh, Hq * D, rows, D, n1 - n0,
                      /*accumulate=*/c1 > c0);
          }
        },
        threads_for(T, 2 * Hq * Nk * D));
    }
    if (write_to != nullptr) store_keys_values(l, T, p0, k, v, *write_to);
  }

  // The T new rows of keys and values [T, Hkv, D] of layer l into the cache at positions p0..
  void store_keys_values(int l, std::int64_t T, std::int64_t p0, const float* k, const float* v, KvCache& cache) const {
    const int D = cfg_.layers[l].head_dim, Hkv = cfg_.layers[l].num_kv_heads;
    for (int g = 0; g < Hkv; ++g) {
      float* kc = cache.keys(l, g) + p0 * D;
      float* vc = cache.values(l, g) + p0 * D;
      for (std::int64_t t = 0; t < T; ++t) {
        std::copy(k + (t * Hkv + g) * D, k + (t * Hkv + g + 1) * D, kc + t * D);
        std::copy(v + (t * Hkv + g) * D, v + (t * Hkv + g + 1) * D, vc + t * D);
      }
    }
  }

  // KV head g's visible cached keys (or values), then its new ones, contiguous at `rows`.
  void gather_head_rows(int l, int g, bool keys, const KvCache& cache, std::int64_t lo, std::int64_t Np, std::int64_t T,
                        const float* fresh, float* rows) const {
    const int D = cfg_.layers[l].head_dim, Hkv = cfg_.layers[l].num_kv_heads;
    const float* cached = keys ? cache.keys(l, g) : cache.values(l, g);
    if (Np > 0) std::copy(cached + lo * D, cached + (lo + Np) * D, rows);
    for (std::int64_t t = 0; t < T; ++t) {
      const float* src = fresh + (t * Hkv + g) * D;
      std::copy(src, src + D, rows + (Np + t) * D);
    }
  }

  // The KV heads in parallel: each one's keys, then its values, gathered as rows (Nk x D) and
  // handed to lay_out(g, keys, rows), which converts them to the layout its kernels read.
  template <class LayOut>
  void lay_out_head_rows(int l, std::int64_t T, const KvCache& cache, std::int64_t lo, std::int64_t Np, const float* k,
                         const float* v, const LayOut& lay_out) {
    const int D = cfg_.layers[l].head_dim, Hkv = cfg_.layers[l].num_kv_heads;
    const std::int64_t Nk = Np + T;
    parallel_for(
        Hkv,
        [&](std::int64_t g) {
          std::vector<float>& kv_rows = this_threads_scratch().kv_rows;
          grow(kv_rows, static_cast<std::size_t>(Nk * D));
          float* rows = kv_rows.data();
          for (const bool keys : {true, false}) {
            gather_head_rows(l, static_cast<int>(g), keys, cache, lo, Np, T, keys ? k : v, rows);
            lay_out(static_cast<std::size_t>(g), keys, rows);
          }
        },
        threads_for_work(ctx_.threads, 4.0 * static_cast<double>(Hkv * Nk * D)));
  }

  // Each KV head's visible cached keys and values, then its new ones, as PanelOperands in `own`.
  void lay_out_keys_and_values(int l, std::int64_t T, const KvCache& cache, std::int64_t lo, std::int64_t Np, int D,
                               int Hkv, const float* k, const float* v, AttentionScratch& own, std::size_t key_floats,
                               std::size_t value_floats) {
    const std::int64_t Nk = Np + T;
    grow(own.key_panels, key_floats * static_cast<std::size_t>(Hkv));
    grow(own.value_panels, value_floats * static_cast<std::size_t>(Hkv));
    own.keys_laid.resize(static_cast<std::size_t>(Hkv));
    own.values_laid.resize(static_cast<std::size_t>(Hkv));
    lay_out_head_rows(l, T, cache, lo, Np, k, v, [&](std::size_t g, bool keys, const float* rows) {
      if (keys) {
        own.keys_laid[g] = PanelOperand::rows_as_outputs(rows, D, Nk, D, own.key_panels.data() + key_floats * g);
      } else {
        own.values_laid[g] = PanelOperand::rows_as_depth(rows, D, Nk, D, own.value_panels.data() + value_floats * g);
      }
    });
  }

#if DG_X86_KERNELS
  // The attention core of the fast precision on AMX tiles. Each KV head's visible keys and values
  // are converted to bf16 tile layouts once per layer (keys: pairs of dims per key, for q K^T;
  // values: pairs of keys per dim, for P V), then every (query head, query block) task runs both
  // products on tiles with direct loads, over its key span rounded out to 32 keys (the extra keys
  // are masked). Scores, masks and the softmax stay fp32.
  void attention_on_tiles(int l, std::int64_t T, const KvCache& cache, std::int64_t lo, std::int64_t Np,
                          AttentionScratch& own, const VisibleKeys& mask, const float* q, const float* k,
                          const float* v, float* attn) {
    namespace amx = kernels::amx;
    const LayerSpec& spec = cfg_.layers[l];
    const int D = spec.head_dim, Hq = cfg_.num_heads, Hkv = spec.num_kv_heads, group = Hq / Hkv;
    const std::int64_t Nk = Np + T, Nk32 = amx::round_up(Nk, 32);
    const std::size_t key_tiles = amx::packed_size(Nk, D), value_tiles = static_cast<std::size_t>(Nk32 * amx::round_up(D, 16));
    if (own.keys_bf16.size() < key_tiles * Hkv) own.keys_bf16.resize(key_tiles * Hkv);
    if (own.values_bf16.size() < value_tiles * Hkv) own.values_bf16.resize(value_tiles * Hkv);
    lay_out_head_rows(l, T, cache, lo, Np, k, v, [&](std::size_t g, bool keys, const float* rows) {
      if (keys) {
        amx::pack_activations_pairs(rows, D, Nk, D, own.keys_bf16.data() + key_tiles * g);
      } else {
        amx::pack_pair_tiles(rows, D, Nk, D, own.values_bf16.data() + value_tiles * g);
      }
    });
    const std::int64_t blocks = (T + kQueryBlock - 1) / kQueryBlock;
    // Scores and values on tiles over every visible key (an upper bound: masks narrow the spans).
    const double attention_macs = 2.0 * static_cast<double>(Hq) * static_cast<double>(T) * static_cast<double>(Nk) * D;
    const Isa isa = ctx_.isa;
    parallel_for(
        Hq * blocks,
        [&](std::int64_t task) {
          const std::int64_t hh = task / blocks, b = task % blocks;
          const std::int64_t i0 = b * kQueryBlock, rows = std::min(kQueryBlock, T - i0);
          const std::int64_t j0 = mask.key_span[2 * b], j1 = mask.key_span[2 * b + 1];
          float* oh = attn + (i0 * Hq + hh) * D;
          if (j1 <= j0) {  // no visible key (cannot happen with a causal policy: self is visible)
            for (std::int64_t i = 0; i < rows; ++i) std::fill(oh + i * Hq * D, oh + i * Hq * D + D, 0.0f);
            return;
          }
          const std::int64_t a0 = j0 / 32 * 32, a1 = std::min(amx::round_up(j1, 32), Nk32), span = a1 - a0;
          const std::int64_t rows16 = amx::round_up(rows, 16);
          std::uint16_t* qb = kernels::scratch<std::uint16_t, 8>(static_cast<std::size_t>(rows16 * amx::round_up(D, 32)));
          float* S = kernels::scratch<float, 9>(static_cast<std::size_t>(rows16 * span));
          std::uint16_t* pb = kernels::scratch<std::uint16_t, 10>(static_cast<std::size_t>(rows16 * span));
          const int g = static_cast<int>(hh) / group;
          amx::pack_activations_rows(q + (i0 * Hq + hh) * D, Hq * D, rows, D, qb);
          amx::scores_on_tiles(qb, rows, D, own.keys_bf16.data() + key_tiles * static_cast<std::size_t>(g), a0 / 16,
                               span / 16, S, span);
          for (std::int64_t i = 0; i < rows; ++i) {
            float* row = S + i * span;
            const std::uint8_t* vis = mask.visible.data() + (i0 + i) * Nk;
            for (std::int64_t j = 0; j < span; ++j) {
              const std::int64_t key = a0 + j;
              if (key >= Nk || !vis[key]) row[j] = -std::numeric_limits<float>::infinity();
            }
            vmath::softmax_row(isa, row, span);
          }
          amx::pack_activations_rows(S, span, rows, span, pb);
          amx::values_on_tiles(pb, rows, own.values_bf16.data() + value_tiles * static_cast<std::size_t>(g), a0 / 32,
                               span / 32, D, oh, Hq * D, false);
        },
        threads_for_product(ctx_, attention_macs, T));
  }
#endif

  // The router's input row for residual row r: rms_noscale(r) * scale * hidden^-0.5, in that order
  // (transformers').
  void router_input_row(int l, const float* r, float* out) const {
    const int H = cfg_.hidden_size;
    const float root = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
    vmath::rms_norm_row(ctx_.isa, r, nullptr, H, static_cast<float>(cfg_.rms_norm_eps), out);
    vmath::mul_scale_row(ctx_.isa, out, model_->vector(l, Param::kRouterScale), root, H);
  }

  // Router and experts of layer l. `z` holds the router's input rows (router_input_row), `normed`
  // the experts' (pre_feedforward_layernorm_2 of the residual); writes the combined output [T, H].
  void mixture_of_experts(int l, std::int64_t T, const float* z, const float* normed, float* out) {
    const LayerWeights& W = weights_->layers[static_cast<std::size_t>(l)];
    const int H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
    // The router stays exact in every precision: its top-k choice is where rounding would show.
    KernelContext exact = ctx_;
    exact.precision = Precision::kExact;
    float* logits = ws_.router.data();
    linear(exact, W.router_proj, z, H, T, logits, E);
    const float* per_expert = model_->vector(l, Param::kRouterPerExpertScale);
    // Softmax, top-k, each token's slots in ascending expert order (the order its K contributions
    // are summed in, as transformers' index_add over the experts) and the output zeroed: one region.
    ws_.slot_order.resize(static_cast<std::size_t>(T * K));
    ws_.next_slot.assign(static_cast<std::size_t>(T), 0);
    parallel_for(
        T,
        [&](std::int64_t t) {
          float* row = logits + t * E;
          float m = row[0];
          for (int e = 1; e < E; ++e) m = std::max(m, row[e]);
          float sum = 0.0f;
          for (int e = 0; e < E; ++e) {
            row[e] = std::exp(row[e] - m);
            sum += row[e];
          }
          for (int e = 0; e < E; ++e) row[e] /= sum;
          const int* idx = ws_.topk_i.data() + t * K;
          math::router_top_k(row, per_expert, E, K, ws_.topk_w.data() + t * K, ws_.topk_i.data() + t * K);
          std::int32_t* order = ws_.slot_order.data() + t * K;
          for (int j = 0; j < K; ++j) order[j] = j;
          std::sort(order, order + K, [&](std::int32_t a, std::int32_t b) { return idx[a] < idx[b]; });
          std::fill(out + t * H, out + (t + 1) * H, 0.0f);
        },
        threads_for(T, static_cast<std::int64_t>(E) * (K + 16) + H));  // an exp is about 16 operations
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
    std::vector<std::int64_t>& row_of_slot = slot_rows_;
    row_of_slot.resize(static_cast<std::size_t>(T * K));
    for (std::int64_t j = 0; j < T * K; ++j) row_of_slot[ws_.slot_of_row[j]] = j;
    // The experts go in runs of consecutive experts of at most expert_rows() routed rows, so that
    // their buffers stay within EngineOptions::expert_run_bytes (or T rows) however long the pass
    // (a batch of many sequences; the released shape's 256-token pass needed 34 MiB in one run). Each
    // run's contributions are added as it ends; runs go in ascending expert order, so every token
    // still sums its K contributions in ascending expert order, and the bits are those of one run.
    const std::int64_t budget = expert_rows(cfg_, T, opts_.expert_run_bytes);
    const std::int64_t* begin = ws_.expert_begin.data();
    float* in = ws_.expert_in.data();
    float* mid = ws_.expert_mid.data();
    float* y = in;  // the experts' outputs overwrite their inputs (see Workspace)
    for (int e0 = 0, e1 = 0; e0 < E; e0 = e1) {
      for (e1 = e0 + 1; e1 < E && begin[e1 + 1] - begin[e0] <= budget;) ++e1;
      const std::int64_t first = begin[e0], rows = begin[e1] - first;
      if (rows == 0) continue;
      // Each expert start to end on one thread: its input rows gathered into expert order, then
      // gate|up, gelu(gate) * up and down, while its rows are in that core's cache (one parallel
      // region, not one per step).
      const double macs = 3.0 * static_cast<double>(H) * static_cast<double>(Im);
      for_each_group(ctx_, begin, e0, e1, macs, [&](std::int64_t e, std::int64_t b, std::int64_t n) {
        for (std::int64_t j = b; j < b + n; ++j) {
          const float* src = normed + static_cast<std::int64_t>(ws_.rows_of_expert[first + j]) * H;
          std::copy(src, src + H, in + j * H);
        }
        linear(ctx_, W.experts_gate_up.group(e), in + b * H, H, n, mid + b * 2 * Im, 2 * Im, false, /*serial=*/true);
        for (std::int64_t j = b; j < b + n; ++j) {
          float* row = mid + j * 2 * Im;  // gate rows first, then up rows: [gate | up]
          vmath::gelu_mul(ctx_.isa, row, row + Im, Im);
        }
        linear(ctx_, W.experts_down.group(e), mid + b * 2 * Im, 2 * Im, n, y + b * H, H, false, /*serial=*/true);
      });
      parallel_for(
          T,
          [&](std::int64_t t) {
            const std::int32_t* order = ws_.slot_order.data() + t * K;
            std::int32_t& next = ws_.next_slot[static_cast<std::size_t>(t)];
            float* o = out + t * H;
            for (; next < K; ++next) {
              const std::int64_t slot = t * K + order[next];
              if (ws_.topk_i[slot] >= e1) break;
              vmath::add_weighted_row(ctx_.isa, o, y + (row_of_slot[slot] - first) * H, ws_.topk_w[slot], H);
            }
          },
          threads_for(T, (rows + T - 1) / T * H));
    }
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& cfg_;
  EngineOptions opts_;
  KernelContext ctx_;
  const ModelWeights* weights_ = nullptr;  // the model's, or its tile-packed copy on AMX tiles
  RopeTables rope_ = RopeTables::build(cfg_);
  std::int64_t base_rows_ = 0;  // rows reserved at construction: an encoder chunk or a canvas
  std::int64_t reserved_ = 0;
  std::int64_t encoder_passes_ = 0;
  std::uint64_t pass_serial_ = 0;  // run_pass calls so far: which pass a VisibleKeys belongs to
  Workspace ws_;
  std::vector<AttentionScratch> attention_scratch_;  // one per thread (constructor)
  std::vector<std::int64_t> seg_rows_;  // first row of each segment in a pass
  std::vector<std::int64_t> slot_rows_;
  VocabPass vocab_pass_;
  std::vector<float> step_hidden_;  // the denoiser's hidden states of a step
  DenoiseState soft_state_;          // denoise_step's self-conditioning state (single sequence)
  std::vector<Segment> step_segments_;
  std::vector<VocabSegment> vocab_segments_;
};

}  // namespace diffusion_gemma::cpu
