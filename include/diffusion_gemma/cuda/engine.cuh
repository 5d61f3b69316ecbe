// SPDX-License-Identifier: Apache-2.0
// cuda::Engine<Backbone>: runs a Backbone<Attention, Experts> over a shared cuda::Model on its own
// stream, with the public interface the Decoder uses from cpu::Engine (encode, denoise_step,
// make_cache, config) plus the host-facing denoise / lm_head / vocab_pass /
// soft_embedding_from_logits that tests and `dgemma parity` compare. The layer recipe mirrors
// cpu/engine.hpp step by step (same fusions of norm and residual, same router order, same
// ascending-expert combine); the masks are the Attention policy's visible().
//
// Storage: activations that feed a GEMM are kept in the model's dtype (BF16 or F32), everything
// else (residual stream, norms, softmax statistics) in F32. Hidden states and the
// self-conditioning soft embedding of denoise_step stay on the device.
//
// nvcc only: this header instantiates the kernels. Host code that only needs the types includes
// cuda/model.hpp and cuda/kv_cache.hpp.
#pragma once

#if !defined(__CUDACC__)
#error "diffusion_gemma/cuda/engine.cuh launches kernels: include it from a .cu file compiled by nvcc"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/engine_buffers.cuh>
#include <diffusion_gemma/cuda/kv_cache.hpp>
#include <diffusion_gemma/cuda/launch/attention.cuh>
#include <diffusion_gemma/cuda/launch/gemm.hpp>
#include <diffusion_gemma/cuda/launch/grouped_gemm.cuh>
#include <diffusion_gemma/cuda/launch/moe.cuh>
#include <diffusion_gemma/cuda/launch/norm.cuh>
#include <diffusion_gemma/cuda/launch/rope.cuh>
#include <diffusion_gemma/cuda/launch/vocab_pass.cuh>
#include <diffusion_gemma/cuda/model.hpp>
#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/cuda/workspace.hpp>
#include <diffusion_gemma/model/backbone.hpp>
#include <diffusion_gemma/model/input_checks.hpp>
#include <diffusion_gemma/model/kv_layout.hpp>
#include <diffusion_gemma/model/pass_plan.hpp>
#include <diffusion_gemma/model/rope_table.hpp>
#include <diffusion_gemma/model/token_id_check.hpp>
#include <diffusion_gemma/sampler/batch_item_checks.hpp>
#include <diffusion_gemma/sampler/batch_items.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma::cuda {

struct EngineOptions {
  std::int64_t max_pass_tokens = 256;  // longer encoder inputs run in chunks of this size (exact: causal)
  std::int64_t vocab_tile = 8192;      // vocabulary ids per GEMM of the vocabulary pass; multiple of kSampleChunk
};

template <class Backbone_>
class Engine {
 public:
  using Backbone = Backbone_;
  using Attention = typename Backbone::Attention;
  using Experts = typename Backbone::Experts;
  using Cache = KvCache;
  // A sequence's self-conditioning state, kept on the device between its denoising steps.
  struct DenoiseState {
    DeviceBuffer<float> soft;
    bool valid = false;
    std::int64_t rows = 0;
  };

  explicit Engine(std::shared_ptr<const Model> model, EngineOptions opts = {})
      : model_(std::move(model)), cfg_(model_->config()), opts_(opts) {
    throw_if_error(Backbone::can_implement(cfg_));
    if (cfg_.enable_moe_block) throw_if_error(can_route(cfg_.num_experts, cfg_.top_k_experts));
    for (int l = 0; l < cfg_.num_layers(); ++l) {
      const int D = cfg_.layers[static_cast<std::size_t>(l)].head_dim;
      if (D > kAttentionMaxHeadDim) {
        throw_error(StatusCode::kUnsupported, cfg_.source, ": layer ", l, " head_dim ", D,
                    " exceeds the CUDA attention's ", kAttentionMaxHeadDim);
      }
    }
    if (opts_.vocab_tile <= 0 || opts_.vocab_tile % kSampleChunk != 0) {
      throw_error(StatusCode::kInvalidArgument, "cuda::EngineOptions::vocab_tile ", opts_.vocab_tile,
                  " must be a positive multiple of ", kSampleChunk);
    }
    check_max_pass_tokens(opts_.max_pass_tokens, "cuda::EngineOptions::max_pass_tokens");
    // Encoder passes run max_pass_tokens at a time; the workspace also holds a whole canvas.
    base_rows_ = std::max<std::int64_t>(opts_.max_pass_tokens, cfg_.is_diffusion() ? cfg_.canvas_length : 1);
    reserve(base_rows_);
    // The RoPE tables come from the host (the CPU back-end's bits), not from powf on the device.
    rope_inv_freq_ = DeviceBuffer<float>(rope_.inv_freq.size(), "RoPE inverse frequencies");
    rope_inv_freq_.upload(rope_.inv_freq.data(), rope_.inv_freq.size());
    bad_token_ = DeviceBuffer<BadTokenWord>(1, "bad-token word");
    bad_token_host_ = PinnedBuffer<BadTokenWord>(1);
    DG_CUDA_CHECK(cudaMemsetAsync(bad_token_.data(), 0xff, sizeof(BadTokenWord), stream()));  // kNoBadToken
  }

  const ModelConfig& config() const { return cfg_; }
  const Model& model() const { return *model_; }
  cudaStream_t stream() const { return stream_.get(); }
  // Tokens per encoder pass (EngineOptions::max_pass_tokens), and the encoder passes run so far.
  std::int64_t encode_pass_tokens() const { return opts_.max_pass_tokens; }
  std::int64_t encoder_passes() const { return encoder_passes_; }
  // The RoPE inverse frequencies on the host, and the device copy the passes read (same bits).
  const RopeTables& rope_tables() const { return rope_; }
  const float* rope_inv_freq_device() const { return rope_inv_freq_.data(); }

  KvCache make_cache(std::int64_t capacity) const { return KvCache(cfg_, capacity, model_->dtype()); }

  // Device bytes a request needs beyond the weights: a KV cache of `capacity` positions, the
  // workspace of its largest pass (an encoder chunk of the `prompt_tokens`, or a canvas of
  // `canvas_tokens`) and the self-conditioning state (computed before allocating; the Decoder
  // checks it against Options::memory_budget_bytes). Longer prompts only grow the cache.
  std::size_t request_bytes(std::int64_t capacity, std::int64_t prompt_tokens, std::int64_t canvas_tokens) const {
    const std::int64_t T =
        std::max(request_pass_rows(prompt_tokens, canvas_tokens, opts_.max_pass_tokens), base_rows_);
    Carver measure;
    carve_engine_buffers(measure, *model_, T, opts_.vocab_tile);
    const std::size_t soft = static_cast<std::size_t>(T) * cfg_.hidden_size * sizeof(float);
    return KvCache::bytes_for(cfg_, capacity, model_->dtype()) + measure.bytes() + soft;
  }

  // Causal pass over `n` new tokens (host ids) at positions cache.length()..; appends their K/V.
  // Copies the final-normed hidden states [n, H] to the host when `hidden_out` is given.
  void encode(const std::int32_t* ids, std::int64_t n, KvCache& cache, float* hidden_out = nullptr) {
    check_token_ids(cfg_, ids, n, "encoder input");
    check_cache(cache);
    if (cache.length() + n > cache.capacity()) {
      throw_error(StatusCode::kOutOfRange, "encoder: ", n, " tokens after ", cache.length(),
                  " cached positions exceed the KV cache capacity of ", cache.capacity());
    }
    check_positions(cfg_, cache.length() + n);
    const int H = cfg_.hidden_size;
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t chunk = encoder_pass_tokens(n, done, opts_.max_pass_tokens);
      upload_ids(ids + done, chunk);
      dispatch([&](auto act) {
        run_pass<decltype(act)>(AttentionMode::kEncoder, buf_.ids, chunk, nullptr, cache, &cache, cache.length(),
                                hidden_out != nullptr ? buf_.hidden : nullptr);
      });
      if (hidden_out != nullptr) download(hidden_out + done * H, buf_.hidden, chunk * H);
      cache.advance(chunk);
      ++encoder_passes_;
      done += chunk;
    }
    synchronize();  // report asynchronous failures here, at the call that caused them
  }

  // Bidirectional pass over a canvas (host ids) at positions cache.length()..; the cache is read,
  // not written. `soft_embedding` [n, H] (host) is the self-conditioning input, or nullptr.
  void denoise(const std::int32_t* ids, std::int64_t n, const float* soft_embedding, const KvCache& cache,
               float* hidden_out) {
    check_denoise(ids, n, cache);
    upload_ids(ids, n);
    const float* soft = nullptr;
    if (soft_embedding != nullptr) {
      ensure_scratch_soft(n);
      DG_CUDA_CHECK(cudaMemcpyAsync(scratch_soft_.data(), soft_embedding, bytes_f32(n * cfg_.hidden_size),
                                    cudaMemcpyHostToDevice, stream()));
      soft = scratch_soft_.data();
    }
    dispatch([&](auto act) {
      run_pass<decltype(act)>(AttentionMode::kDenoiser, buf_.ids, n, soft, cache, nullptr, cache.length(), buf_.hidden);
    });
    if (hidden_out != nullptr) download(hidden_out, buf_.hidden, n * cfg_.hidden_size);  // optional, as on the CPU
    synchronize();
  }

  // The model work of one denoising step, as the Decoder drives it: the denoiser pass (fed this
  // canvas's previous soft embedding unless `first_step`), then the streaming vocabulary pass.
  // Argmax / candidate / entropy come back to the host; hidden states and the soft embedding stay
  // on the device (stats.soft_embedding is left as it is).
  void denoise_step(const std::int32_t* canvas, std::int64_t n, bool first_step, const KvCache& cache,
                    const VocabPassArgs& args, VocabPassResult& stats) {
    check_denoise(canvas, n, cache);
    upload_ids(canvas, n);
    // reserve() sizes whichever state is swapped in (denoise_step_batch lends an item's), so the
    // one in use now may be smaller than the pass: a larger canvas starts a fresh state.
    const std::size_t soft_need = static_cast<std::size_t>(n) * static_cast<std::size_t>(cfg_.hidden_size);
    if (soft_.size() < soft_need) {
      stream_.synchronize();  // nothing in flight may still use the old buffer
      soft_ = DeviceBuffer<float>(soft_need, "self-conditioning state");
      soft_valid_ = false;
    }
    const bool use_soft = !first_step && soft_valid_ && soft_rows_ == n;
    dispatch([&](auto act) {
      using Act = decltype(act);
      // The pass reads the previous soft embedding before the vocabulary pass overwrites it: one
      // buffer suffices because both run in order on one stream.
      run_pass<Act>(AttentionMode::kDenoiser, buf_.ids, n, use_soft ? soft_.data() : nullptr, cache, nullptr,
                    cache.length(), buf_.hidden);
      run_vocab_pass<Act>(buf_.hidden, n, args, buf_.argmax, buf_.sample, buf_.entropy,
                          args.soft_embedding ? soft_.data() : nullptr);
    });
    soft_valid_ = args.soft_embedding;
    soft_rows_ = n;
    copy_stats(n, stats);
  }

  // The batched forms ContinuousBatcher and BatchDecoder drive. There are no batched kernels on
  // the GPU yet: the items run one after another with the single-sequence passes, each with its
  // own cache and self-conditioning state, so the results are those of running them alone. The
  // items are checked as the CPU engine checks them, all before any work.
  void encode_batch(const EncodeItem<KvCache>* items, std::size_t count) {
    check_encode_items(cfg_, items, count, [this](const KvCache& c) { check_cache(c); });
    for (std::size_t i = 0; i < count; ++i) {
      if (items[i].n == 0) continue;  // an empty item is a no-op, as on the CPU
      const SequenceIndex scope(sequence_, static_cast<int>(i));
      encode(items[i].ids, items[i].n, *items[i].cache);
    }
  }

  // The item index the attention policy sees while an item of a batched call runs (0 otherwise).
  struct SequenceIndex {
    SequenceIndex(int& slot, int value) : slot_(slot) { slot_ = value; }
    ~SequenceIndex() { slot_ = 0; }
    int& slot_;
  };

  void denoise_step_batch(DenoiseItem<KvCache, DenoiseState>* items, std::size_t count) {
    check_denoise_items(cfg_, items, count, [this](const KvCache& c) { check_cache(c); });
    for (std::size_t i = 0; i < count; ++i) {
      auto& it = items[i];
      DenoiseState& st = *it.state;
      const std::size_t need = static_cast<std::size_t>(std::max<std::int64_t>(it.n, 1) * cfg_.hidden_size);
      if (st.soft.size() < need) {
        st.soft = DeviceBuffer<float>(need, "self-conditioning state");
        st.valid = false;
      }
      const auto exchange = [&] {
        std::swap(soft_, st.soft);
        std::swap(soft_valid_, st.valid);
        std::swap(soft_rows_, st.rows);
      };
      exchange();
      const SequenceIndex scope(sequence_, static_cast<int>(i));
      try {
        denoise_step(it.canvas, it.n, it.first_step, *it.cache, it.args, *it.stats);
      } catch (...) {
        exchange();
        throw;
      }
      exchange();
    }
  }

  // Materialised LM head: logits [n, V] = hidden E^T, softcapped (host in and out). For parity
  // tools and tests; the sampler uses the streaming pass, which never holds [n, V].
  void lm_head(const float* hidden, std::int64_t n, float* logits) {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    DeviceBuffer<float> h(static_cast<std::size_t>(n * H), "lm_head hidden");
    DeviceBuffer<float> out(static_cast<std::size_t>(n * V), "lm_head logits");
    DeviceBuffer<std::byte> h_act(static_cast<std::size_t>(n * H) * dtype_size(model_->dtype()), "lm_head input");
    DG_CUDA_CHECK(cudaMemcpyAsync(h.data(), hidden, bytes_f32(n * H), cudaMemcpyHostToDevice, stream()));
    dispatch([&](auto act) {
      using Act = decltype(act);
      const Act* in = storage_copy<Act>(h.data(), n * H, h_act.data());
      check(gemm_nt(cublas_.get(), stream(), model_->dtype(), in, H, model_->ptr(model_->embed_tokens()), H,
                    out.data(), V, n, V, H));
    });
    check(launch_softcap(out.data(), n * V, cfg_.final_logit_softcapping, stream()));
    download(logits, out.data(), n * V);
    synchronize();
  }

  // The streaming vocabulary pass over final-normed hidden states [n, H] (host in and out; the
  // soft embedding comes back too when args.soft_embedding).
  void vocab_pass(const float* hidden, std::int64_t n, const VocabPassArgs& args, VocabPassResult& out) {
    if (n > reserved_) reserve(n);
    DG_CUDA_CHECK(cudaMemcpyAsync(buf_.hidden, hidden, bytes_f32(n * cfg_.hidden_size), cudaMemcpyHostToDevice,
                                  stream()));
    float* soft = nullptr;
    if (args.soft_embedding) {
      ensure_scratch_soft(n);
      soft = scratch_soft_.data();
    }
    dispatch([&](auto act) {
      run_vocab_pass<decltype(act)>(buf_.hidden, n, args, buf_.argmax, buf_.sample, buf_.entropy, soft);
    });
    copy_stats(n, out);
    if (args.soft_embedding) {
      out.soft_embedding.resize(static_cast<std::size_t>(n * cfg_.hidden_size));
      download(out.soft_embedding.data(), soft, n * cfg_.hidden_size);
      synchronize();
    }
  }

  // softmax(logits) E * embed_scale from materialised temperature-scaled logits [n, V] (host in
  // and out): the reference self-conditioning path (the vocabulary pass fuses it).
  void soft_embedding_from_logits(const float* logits, std::int64_t n, float* out) {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    DeviceBuffer<float> l(static_cast<std::size_t>(n * V), "SC logits");
    DeviceBuffer<std::byte> probs(static_cast<std::size_t>(n * V) * dtype_size(model_->dtype()), "SC probabilities");
    DeviceBuffer<float> o(static_cast<std::size_t>(n * H), "SC soft embedding");
    DG_CUDA_CHECK(cudaMemcpyAsync(l.data(), logits, bytes_f32(n * V), cudaMemcpyHostToDevice, stream()));
    dispatch([&](auto act) {
      using Act = decltype(act);
      Act* p = reinterpret_cast<Act*>(probs.data());
      check(launch_softmax_rows(l.data(), n, V, p, stream()));
      check(gemm_nn(cublas_.get(), stream(), model_->dtype(), p, V, model_->ptr(model_->embed_tokens()), H, o.data(),
                    H, n, H, V, model_->embed_scale()));
    });
    download(out, o.data(), n * H);
    synchronize();
  }

  // Waits for the engine's stream. Reports (kOutOfRange) an out-of-vocabulary id that a device
  // pass met since the last synchronisation: every host-facing call synchronises this way.
  void synchronize() {
    DG_CUDA_CHECK(cudaMemcpyAsync(bad_token_host_.data(), bad_token_.data(), sizeof(BadTokenWord),
                                  cudaMemcpyDeviceToHost, stream()));
    stream_.synchronize();
    const BadTokenWord bad = bad_token_host_[0];
    if (bad != kNoBadToken) {
      // Cleared in stream order: the next pass starts with no record.
      DG_CUDA_CHECK(cudaMemsetAsync(bad_token_.data(), 0xff, sizeof(BadTokenWord), stream()));
      throw_if_error(bad_token_status(bad, cfg_.vocab_size, "a device pass (encode_device or denoise_device)"));
    }
  }

  // ---- device-level entry points: device pointers, enqueued on stream() --------------------------
  // (Nothing in a pass waits for the host: the expert GEMMs read their row groups on the device.)
  // The ids are checked on the device: an out-of-vocabulary id is reported by the next
  // synchronize() (or any host-facing call), naming its position in the pass.

  void encode_device(const std::int32_t* ids, std::int64_t n, KvCache& cache, float* hidden_out = nullptr) {
    check_cache(cache);
    if (n > reserved_) {
      throw_error(StatusCode::kOutOfRange, "encode_device: ", n, " tokens exceed one pass of ", reserved_,
                  " (the workspace's rows; encode() runs longer inputs in chunks)");
    }
    if (cache.length() + n > cache.capacity()) {
      throw_error(StatusCode::kOutOfRange, "encode_device: the KV cache capacity of ", cache.capacity(),
                  " is exceeded");
    }
    check_positions(cfg_, cache.length() + n);
    dispatch([&](auto act) {
      run_pass<decltype(act)>(AttentionMode::kEncoder, ids, n, nullptr, cache, &cache, cache.length(), hidden_out);
    });
    cache.advance(n);
    ++encoder_passes_;
  }
  void denoise_device(const std::int32_t* ids, std::int64_t n, const float* soft, const KvCache& cache,
                      float* hidden_out) {
    check_cache(cache);
    if (n > reserved_) reserve(n);
    check_positions(cfg_, cache.length() + n);
    dispatch([&](auto act) {
      run_pass<decltype(act)>(AttentionMode::kDenoiser, ids, n, soft, cache, nullptr, cache.length(), hidden_out);
    });
  }
  void vocab_pass_device(const float* hidden, std::int64_t n, const VocabPassArgs& args, std::int32_t* argmax,
                         std::int32_t* sample, float* entropy, float* soft) {
    if (n > reserved_) reserve(n);
    dispatch([&](auto act) { run_vocab_pass<decltype(act)>(hidden, n, args, argmax, sample, entropy, soft); });
  }

 private:
  void reserve(std::int64_t T) {
    if (T > 0x7fffffff / std::max(1, cfg_.top_k_experts)) {
      throw_error(StatusCode::kOutOfRange, "cuda::Engine: a pass of ", T, " tokens is too long");
    }
    stream_.synchronize();  // nothing in flight may still use the old workspace
    Carver measure;
    carve_engine_buffers(measure, *model_, T, opts_.vocab_tile);
    buf_ = EngineBuffers{};  // if the allocation below fails, the next call starts over
    reserved_ = 0;
    workspace_ = DeviceBuffer<std::byte>();
    check_fits("cuda::Engine workspace for passes of " + std::to_string(T) + " tokens", measure.bytes());
    workspace_ = DeviceBuffer<std::byte>(measure.bytes(), "engine workspace");
    Carver real(workspace_.data());
    buf_ = carve_engine_buffers(real, *model_, T, opts_.vocab_tile);
    stats_host_ = PinnedBuffer<std::int32_t>(static_cast<std::size_t>(3 * T));
    const std::size_t soft = static_cast<std::size_t>(T) * cfg_.hidden_size;
    if (soft_.size() < soft) {
      soft_ = DeviceBuffer<float>(soft, "self-conditioning state");
      soft_valid_ = false;
    }
    reserved_ = T;
  }

  template <class F>
  decltype(auto) dispatch(F&& f) const {
    return dispatch_storage(model_->dtype(), std::forward<F>(f));
  }

  static std::size_t bytes_f32(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }
  static void check(const Status& s) { throw_if_error(s); }

  void download(float* host, const float* device, std::int64_t n) {
    DG_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes_f32(n), cudaMemcpyDeviceToHost, stream()));
  }

  void upload_ids(const std::int32_t* ids, std::int64_t n) {
    if (n > reserved_) reserve(n);
    DG_CUDA_CHECK(cudaMemcpyAsync(buf_.ids, ids, static_cast<std::size_t>(n) * sizeof(std::int32_t),
                                  cudaMemcpyHostToDevice, stream()));
  }

  void ensure_scratch_soft(std::int64_t n) {
    const std::size_t need = static_cast<std::size_t>(n) * cfg_.hidden_size;
    if (scratch_soft_.size() < need) {
      stream_.synchronize();
      scratch_soft_ = DeviceBuffer<float>(need, "soft-embedding scratch");
    }
  }

  // Argmax, candidates and entropies of the last vocabulary pass, to the host.
  void copy_stats(std::int64_t n, VocabPassResult& out) {
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;
    std::int32_t* host = stats_host_.data();
    DG_CUDA_CHECK(cudaMemcpyAsync(host, buf_.argmax, bytes, cudaMemcpyDeviceToHost, stream()));
    DG_CUDA_CHECK(cudaMemcpyAsync(host + n, buf_.sample, bytes, cudaMemcpyDeviceToHost, stream()));
    DG_CUDA_CHECK(cudaMemcpyAsync(host + 2 * n, buf_.entropy, bytes, cudaMemcpyDeviceToHost, stream()));
    synchronize();
    out.resize(n, cfg_.hidden_size, false);
    std::copy(host, host + n, out.argmax.begin());
    std::copy(host + n, host + 2 * n, out.sample.begin());
    std::memcpy(out.entropy.data(), host + 2 * n, bytes);
  }


  // A cache made for another model (or dtype) would be read and written out of bounds.
  void check_cache(const KvCache& cache) const {
    throw_if_error(check_kv_cache_layout(cache.layout(), cfg_, model_->dtype()));
  }

  void check_denoise(const std::int32_t* ids, std::int64_t n, const KvCache& cache) const {
    if (!cfg_.is_diffusion()) {
      throw_error(StatusCode::kUnsupported, cfg_.source, ": denoising needs a DiffusionGemma checkpoint");
    }
    check_token_ids(cfg_, ids, n, "canvas");
    check_cache(cache);
    check_positions(cfg_, cache.length() + n);
  }

  // `in` [n] fp32 as the storage type: itself for F32, a converted copy in `scratch` for BF16.
  template <class Act>
  const Act* storage_copy(const float* in, std::int64_t n, void* scratch) {
    if constexpr (std::is_same_v<Act, float>) {
      (void)n;
      (void)scratch;
      return in;
    } else {
      check(launch_convert(in, n, static_cast<Act*>(scratch), stream()));
      return static_cast<const Act*>(scratch);
    }
  }

  static RmsNormParams norm(const float* in, const float* weight, std::int64_t rows, int n, float eps,
                            const float* residual = nullptr, float scale = 1.0f) {
    RmsNormParams p;
    p.in = in;
    p.weight = weight;
    p.residual = residual;
    p.scale = scale;
    p.eps = eps;
    p.n = n;
    p.rows = rows;
    return p;
  }

  // y = x W^T for a weight of the model: in [m, k] (storage dtype), W [n, k], out [m, n] fp32.
  void linear(const void* in, const TensorRef& w, std::int64_t m, std::int64_t n, std::int64_t k, float* out) {
    check(gemm_nt(cublas_.get(), stream(), model_->dtype(), in, k, model_->ptr(w), k, out, n, m, n, k));
  }

  template <class Act>
  void run_vocab_pass(const float* hidden, std::int64_t n, const VocabPassArgs& args, std::int32_t* argmax,
                      std::int32_t* sample, float* entropy, float* soft) {
    VocabPassParams<Act> p;
    p.embed = model_->ptr<Act>(model_->embed_tokens());
    p.hidden = storage_copy<Act>(hidden, n * cfg_.hidden_size, buf_.hidden_act);
    p.vocab = cfg_.vocab_size;
    p.hidden_size = cfg_.hidden_size;
    p.rows = static_cast<int>(n);
    p.softcap = cfg_.final_logit_softcapping;
    p.temperature = args.temperature;
    p.embed_scale = model_->embed_scale();
    p.soft_embedding = args.soft_embedding;
    p.sample = args.sample;
    p.key = args.key;
    p.tile = opts_.vocab_tile;
    p.argmax = argmax;
    p.sample_out = sample;
    p.entropy = entropy;
    p.soft = soft;
    check(launch_vocab_pass(p, cublas_.get(), buf_.vocab, stream()));
  }

  // One pass of T tokens (device ids) at positions p0.. through every layer; final-normed hidden
  // states [T, H] fp32 to `hidden_out` (device) when given.
  template <class Act>
  void run_pass(AttentionMode mode, const std::int32_t* ids, std::int64_t T, const float* soft, const KvCache& cache,
                KvCache* write_to, std::int64_t p0, float* hidden_out) {
    const Model& M = *model_;
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Act* act_in = static_cast<Act*>(buf_.act_in);
    check(launch_embed(ids, T, M.ptr<Act>(M.embed_tokens()), H, M.embed_scale(), cfg_.vocab_size, bad_token_.data(),
                       buf_.x, stream()));
    if (mode == AttentionMode::kDenoiser) {
      if (soft != nullptr) {  // x += down(gelu(gate(n)) * up(n)), n = RMSNorm(soft; pre_norm)
        check(launch_rms_norm(norm(soft, M.ptr<float>(M.sc_pre_norm()), T, H, eps), act_in, stream()));
        gated_mlp<Act>(T, M.sc_gate_up(), M.sc_down(), buf_.a);
        check(launch_add(buf_.x, buf_.a, T * H, stream()));
      }
      // post_norm (weightless) runs on every step, also when the SC signal is zero.
      check(launch_rms_norm(norm(buf_.x, nullptr, T, H, eps), buf_.x, stream()));
    }
    for (int l = 0; l < cfg_.num_layers(); ++l) layer<Act>(l, mode, T, cache, write_to, p0);
    if (hidden_out != nullptr) {
      check(launch_rms_norm(norm(buf_.x, M.ptr<float>(M.final_norm()), T, H, eps), hidden_out, stream()));
    }
  }

  // out [T, H] = down(gelu_tanh(gate(in)) * up(in)) with in = act_in [T, H]; act_in is reused for
  // the gated activations (the gate|up GEMM has consumed it by then, in stream order).
  template <class Act>
  void gated_mlp(std::int64_t T, const TensorRef& gate_up, const TensorRef& down, float* out) {
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size;
    Act* act_in = static_cast<Act*>(buf_.act_in);
    linear(act_in, gate_up, T, 2 * I, H, buf_.gu);
    check(launch_gelu_gate(buf_.gu, T, I, act_in, stream()));
    linear(act_in, down, T, H, I, out);
  }

  template <class Act>
  void layer(int l, AttentionMode mode, std::int64_t T, const KvCache& cache, KvCache* write_to, std::int64_t p0) {
    const Model& M = *model_;
    const DeviceLayer& L = M.layer(l);
    const int H = cfg_.hidden_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Act* act_in = static_cast<Act*>(buf_.act_in);
    // Attention block: x = x + post_attn(o_proj(attn(input_ln(x)))).
    check(launch_rms_norm(norm(buf_.x, M.ptr<float>(L.input_layernorm), T, H, eps), act_in, stream()));
    attention<Act>(l, mode, T, cache, write_to, p0);
    check(launch_rms_norm(norm(buf_.a, M.ptr<float>(L.post_attention_layernorm), T, H, eps, buf_.x), buf_.x, stream()));
    // Feed-forward block on the post-attention residual r = x.
    check(launch_rms_norm(norm(buf_.x, M.ptr<float>(L.pre_feedforward_layernorm), T, H, eps), act_in, stream()));
    gated_mlp<Act>(T, L.mlp_gate_up, L.mlp_down, buf_.d);
    if constexpr (Experts::kMixtureOfExperts) {
      check(launch_rms_norm(norm(buf_.d, M.ptr<float>(L.post_feedforward_layernorm_1), T, H, eps), buf_.d, stream()));
      mixture_of_experts<Act>(L, T);  // routed on x (= r) itself; result in s
      check(launch_rms_norm(norm(buf_.s, M.ptr<float>(L.post_feedforward_layernorm_2), T, H, eps, buf_.d), buf_.s,
                            stream()));
      check(launch_rms_norm(norm(buf_.s, M.ptr<float>(L.post_feedforward_layernorm), T, H, eps, buf_.x, L.layer_scalar),
                            buf_.x, stream()));
    } else {
      check(launch_rms_norm(norm(buf_.d, M.ptr<float>(L.post_feedforward_layernorm), T, H, eps, buf_.x, L.layer_scalar),
                            buf_.x, stream()));
    }
  }

  // Self-attention of layer l on act_in (the normed input); the o_proj output goes to a [T, H].
  template <class Act>
  void attention(int l, AttentionMode mode, std::int64_t T, const KvCache& cache, KvCache* write_to, std::int64_t p0) {
    const Model& M = *model_;
    const DeviceLayer& L = M.layer(l);
    const LayerSpec& spec = cfg_.layers[static_cast<std::size_t>(l)];
    const int H = cfg_.hidden_size, D = spec.head_dim, Hq = cfg_.num_heads, Hkv = spec.num_kv_heads;
    Act* act_in = static_cast<Act*>(buf_.act_in);
    linear(act_in, L.qkv, T, L.qkv_rows, H, buf_.qkv);

    QkvNormRopeParams<Act> r;
    r.qkv = buf_.qkv;
    r.ld = L.qkv_rows;
    r.tokens = static_cast<int>(T);
    r.num_heads = Hq;
    r.num_kv_heads = Hkv;
    r.head_dim = D;
    r.has_v = spec.has_v_proj;
    r.q_norm = M.ptr<float>(L.q_norm);
    r.k_norm = M.ptr<float>(L.k_norm);
    r.eps = static_cast<float>(cfg_.rms_norm_eps);
    r.first_position = p0;
    r.inv_freq = rope_inv_freq_.data() + rope_.layer_offset[static_cast<std::size_t>(l)];
    r.q = static_cast<Act*>(buf_.q);
    r.k = static_cast<Act*>(buf_.k);
    r.v = static_cast<Act*>(buf_.v);
    if (write_to != nullptr) {
      r.cache_k = static_cast<Act*>(write_to->keys(l));
      r.cache_v = static_cast<Act*>(write_to->values(l));
      r.cache_capacity = write_to->capacity();
    }
    check(launch_qkv_norm_rope(r, stream()));

    const int W = cfg_.sliding_window;
    AttentionParams<Act> a;
    a.q = static_cast<const Act*>(buf_.q);
    a.k_new = static_cast<const Act*>(buf_.k);
    a.v_new = static_cast<const Act*>(buf_.v);
    a.k_cache = static_cast<const Act*>(cache.keys(l));
    a.v_cache = static_cast<const Act*>(cache.values(l));
    a.out = act_in;  // the normed input is no longer needed once projected
    a.cache_capacity = cache.capacity();
    a.cached_begin = std::min(p0, Attention::first_visible_cached(mode, spec.type, W, p0));
    a.pass_begin = p0;
    a.sequence = sequence_;
    a.tokens = static_cast<int>(T);
    a.num_heads = Hq;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    a.window = W;
    a.mode = mode;
    a.type = spec.type;
    check(launch_attention<Attention>(a, stream()));
    linear(act_in, L.o_proj, T, H, static_cast<std::int64_t>(Hq) * D, buf_.a);
  }

  // Router on the residual x, experts on pre_ff_2(x), combined into s [T, H].
  template <class Act>
  void mixture_of_experts(const DeviceLayer& L, std::int64_t T) {
    const Model& M = *model_;
    const int H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.top_k_experts, Im = cfg_.moe_intermediate_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const int TK = static_cast<int>(T) * K;
    Act* act_in = static_cast<Act*>(buf_.act_in);
    // Router input: rms_noscale(x) * scale * hidden^-0.5, in that order (transformers').
    const float root = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
    check(launch_rms_norm(norm(buf_.x, M.ptr<float>(L.router_scale), T, H, eps, nullptr, root), act_in, stream()));
    linear(act_in, L.router_proj, T, E, H, buf_.router_logits);
    check(launch_router(buf_.router_logits, static_cast<int>(T), E, K, M.ptr<float>(L.router_per_expert_scale),
                        buf_.slot_weight, buf_.slot_expert, buf_.slot_id, stream()));
    MoeGroupParams g;
    g.slot_expert = buf_.slot_expert;
    g.slot_id = buf_.slot_id;
    g.sorted_expert = buf_.sorted_expert;
    g.sorted_slot = buf_.sorted_slot;
    g.expert_begin = buf_.expert_begin;
    g.n = TK;
    g.num_experts = E;
    check(launch_moe_group(g, buf_.sort_temp, buf_.sort_temp_bytes, stream()));
    Act* x2 = static_cast<Act*>(buf_.x2);
    Act* in = static_cast<Act*>(buf_.expert_in);
    check(launch_rms_norm(norm(buf_.x, M.ptr<float>(L.pre_feedforward_layernorm_2), T, H, eps), x2, stream()));
    check(launch_gather_rows(x2, buf_.sorted_slot, TK, K, H, in, buf_.row_of_slot, stream()));
    // Two grouped GEMMs over all experts; the group offsets stay on the device (no host wait).
    GroupedGemmParams<Act> gu;
    gu.in = in;
    gu.weights = M.ptr<Act>(L.experts_gate_up);  // [E, 2 Im, H]
    gu.group_begin = buf_.expert_begin;
    gu.out = buf_.expert_mid;
    gu.rows = TK;
    gu.num_groups = E;
    gu.n = 2 * Im;
    gu.k = H;
    check(launch_grouped_gemm_nt(gu, stream()));
    Act* act = static_cast<Act*>(buf_.expert_act);
    check(launch_gelu_gate(buf_.expert_mid, TK, Im, act, stream()));
    GroupedGemmParams<Act> down;
    down.in = act;
    down.weights = M.ptr<Act>(L.experts_down);  // [E, H, Im]
    down.group_begin = buf_.expert_begin;
    down.out = buf_.expert_out;
    down.rows = TK;
    down.num_groups = E;
    down.n = H;
    down.k = Im;
    check(launch_grouped_gemm_nt(down, stream()));
    check(launch_moe_combine(buf_.expert_out, buf_.slot_weight, buf_.slot_expert, buf_.row_of_slot, static_cast<int>(T),
                             K, H, buf_.s, stream()));
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& cfg_;
  EngineOptions opts_;
  Stream stream_;
  CublasHandle cublas_;
  RopeTables rope_ = RopeTables::build(cfg_);
  DeviceBuffer<float> rope_inv_freq_;        // rope_.inv_freq on the device
  DeviceBuffer<BadTokenWord> bad_token_;     // first out-of-vocabulary id of a device pass
  PinnedBuffer<BadTokenWord> bad_token_host_;
  std::int64_t base_rows_ = 0;  // rows reserved at construction: an encoder chunk or a canvas
  std::int64_t reserved_ = 0;
  std::int64_t encoder_passes_ = 0;
  EngineBuffers buf_;
  DeviceBuffer<std::byte> workspace_;
  DeviceBuffer<float> soft_;          // denoise_step's self-conditioning state [n, H]
  DeviceBuffer<float> scratch_soft_;  // host-facing denoise / vocab_pass soft embeddings
  PinnedBuffer<std::int32_t> stats_host_;
  bool soft_valid_ = false;
  int sequence_ = 0;  // see SequenceIndex
  std::int64_t soft_rows_ = 0;
};

}  // namespace diffusion_gemma::cuda
