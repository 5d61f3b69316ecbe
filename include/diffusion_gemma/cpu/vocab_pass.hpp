// SPDX-License-Identifier: Apache-2.0
// The streaming vocabulary pass (ARCHITECTURE.md §2): for each canvas position, in one pass over
// vocabulary tiles, the LM head, softcap and temperature, then argmax, a categorical sample,
// the entropy and the self-conditioning soft embedding sum_i p_i E_i, with an online max/rescale
// as flash attention does over keys. Memory is O(C*H + C*tile); no [C, V] tensor exists.
//
// Sampling is exact and parallel-friendly: the vocabulary is cut into fixed chunks of
// kSampleChunk ids; a chunk is chosen by Gumbel-max over the chunk log-masses and a token inside
// it by inverse CDF, each with its own counter-based draw. P(token) = P(chunk) P(token | chunk)
// is the softmax probability, and the draws depend only on (seed, canvas, step, position, chunk).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/cpu/amx.hpp>
#include <diffusion_gemma/cpu/gemm.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma {

namespace cpu {

// Runs the pass. `E` is the embedding table [V, H] (the tied LM head); `hidden` [C, H] holds the
// final-normed hidden states; `cap` is the final logit softcap (0: none).
class VocabPass {
 public:
  static constexpr std::int64_t kTile = 1024;  // a multiple of kSampleChunk and of the AMX blocks

  // Runs the two GEMMs in bf16 on AMX tiles from this packed table instead of fp32 (nullptr: fp32).
  void use_bf16(const amx::PackedEmbedding* packed) { packed_ = packed; }
  bool bf16() const { return packed_ != nullptr; }

  void run(const float* E, std::int64_t V, std::int64_t H, float cap, float embed_scale, const float* hidden,
           std::int64_t C, const VocabPassArgs& args, VocabPassResult& out) {
    out.resize(C, H, args.soft_embedding);
    const bool bf16 = packed_ != nullptr;
    const std::int64_t Mp = bf16 ? amx::round_up(C, 16) : C;
    logits_.resize(static_cast<std::size_t>(Mp * kTile));
    rows_.assign(static_cast<std::size_t>(C), Row{});
    // The soft-embedding accumulator: the output itself in fp32, a padded [Mp, Hp] block for AMX.
    if (bf16) {
      acc_.assign(static_cast<std::size_t>(Mp * packed_->Hp), 0.0f);
      acc_ld_ = packed_->Hp;
      acc_data_ = acc_.data();
    } else {
      if (args.soft_embedding) std::fill(out.soft_embedding.begin(), out.soft_embedding.begin() + C * H, 0.0f);
      acc_ld_ = H;
      acc_data_ = args.soft_embedding ? out.soft_embedding.data() : nullptr;
    }
#if DG_AMX_POSSIBLE
    if (bf16) {
      hidden_bf16_.resize(static_cast<std::size_t>(Mp * packed_->Hp));
      probs_bf16_.resize(static_cast<std::size_t>(Mp * kTile));
      amx::to_bf16(hidden, H, C, H, hidden_bf16_.data(), packed_->Hp, Mp, packed_->Hp);
    }
#endif
    const float T = args.temperature;
    for (std::int64_t v0 = 0; v0 < V; v0 += kTile) {
      const std::int64_t n = std::min(kTile, V - v0);
      float* L = logits_.data();
#if DG_AMX_POSSIBLE
      if (bf16) {
        amx::lm_head(hidden_bf16_.data(), Mp, *packed_, v0, amx::round_up(n, 32), L, kTile);
      } else {
        gemm_nt(hidden, H, E + v0 * H, H, L, kTile, C, n, H);
      }
#else
      gemm_nt(hidden, H, E + v0 * H, H, L, kTile, C, n, H);
#endif
      parallel_for(C, [&](std::int64_t r) { row_update(L + r * kTile, n, v0, r, cap, T, args); });
      if (args.soft_embedding) {
        // The rows' scale factors were applied in row_update; now add P E_tile for the whole tile.
#if DG_AMX_POSSIBLE
        if (bf16) {
          const std::int64_t np = amx::round_up(n, 32);
          amx::to_bf16(L, kTile, C, n, probs_bf16_.data(), kTile, Mp, np);
          amx::soft_accumulate(probs_bf16_.data(), kTile, Mp, *packed_, v0, np, acc_data_);
          continue;
        }
#endif
        gemm_nn(L, kTile, E + v0 * H, H, acc_data_, acc_ld_, C, H, n, /*accumulate=*/true);
      }
    }
    parallel_for(C, [&](std::int64_t r) {
      const Row& row = rows_[r];
      out.argmax[r] = row.argmax;
      out.sample[r] = args.sample ? row.sample : -1;
      out.entropy[r] = row.stats.entropy();
      if (args.soft_embedding) {
        const float scale = embed_scale / row.stats.sum;
        const float* a = acc_data_ + r * acc_ld_;
        float* s = out.soft_embedding.data() + r * H;
        for (std::int64_t i = 0; i < H; ++i) s[i] = a[i] * scale;
      }
    });
  }

 private:
  struct Row {
    math::SoftmaxStats stats;  // running max / sum / weighted sum of l = softcap(raw) / T
    float best = -std::numeric_limits<float>::infinity();
    std::int32_t argmax = 0;
    float sample_score = -std::numeric_limits<float>::infinity();
    std::int32_t sample = 0;
  };

  // Processes one row of a tile in place: `L` holds raw logits on entry and p = e^(l - m) on exit,
  // where m is the row's running max after this tile (the SC accumulator is rescaled to match).
  // Vectorised with Eigen arrays: softcap, temperature and exp dominate once the GEMMs are fast.
  void row_update(float* L, std::int64_t n, std::int64_t v0, std::int64_t r, float cap, float T,
                  const VocabPassArgs& args) {
    using Array = Eigen::Map<Eigen::ArrayXf>;
    Row& row = rows_[r];
    Array l(L, n);
    if (cap > 0.0f) l = (l / cap).tanh() * cap;  // cap * tanh(x / cap), in the reference's order
    l = l / T;                                     // an fp32 divide, as the reference
    Eigen::Index tile_arg = 0;
    const float tile_max = l.maxCoeff(&tile_arg);  // first index of the maximum
    if (tile_max > row.best) {                     // strict: the first index wins ties, like torch.argmax
      row.best = tile_max;
      row.argmax = static_cast<std::int32_t>(v0 + tile_arg);
    }
    const float old_max = row.stats.max;
    const float m = tile_max > old_max ? tile_max : old_max;
    if (args.soft_embedding && old_max != m && old_max != -std::numeric_limits<float>::infinity()) {
      const float alpha = std::exp(old_max - m);
      float* s = acc_data_ + r * acc_ld_;
      for (std::int64_t i = 0; i < acc_ld_; ++i) s[i] *= alpha;
    }
    // Block statistics relative to m (>= the tile's max: any reference works, and this one is the
    // exponent base the soft embedding accumulates with).
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<std::size_t>(n)) scratch.resize(static_cast<std::size_t>(n));
    Array e(scratch.data(), n);
    l -= m;
    e = l.exp();
    math::SoftmaxStats block;
    block.max = m;
    block.sum = e.sum();
    block.weighted = (e * l).sum();
    row.stats.merge(block);
    l = e;
    if (args.sample) {
      for (std::int64_t c0 = 0; c0 < n; c0 += kSampleChunk) {
        const std::int64_t cn = std::min(kSampleChunk, n - c0);
        const float mass = Array(L + c0, cn).sum();
        if (!(mass > 0.0f)) continue;
        const std::uint32_t chunk = static_cast<std::uint32_t>((v0 + c0) / kSampleChunk);
        const Philox4x32 d = draw(args.key, DrawPurpose::kSample, static_cast<std::uint32_t>(r), chunk);
        const float score = m + std::log(mass) + math::gumbel(uniform_open01(d.v[1]));
        if (score <= row.sample_score) continue;
        row.sample_score = score;
        const float target = uniform_open01(d.v[0]) * mass;
        float cum = 0.0f;
        std::int64_t pick = -1;
        for (std::int64_t i = 0; i < cn; ++i) {
          if (L[c0 + i] > 0.0f) pick = i;  // rounding fallback: the last id with mass
          cum += L[c0 + i];
          if (cum > target) {
            pick = i;
            break;
          }
        }
        row.sample = static_cast<std::int32_t>(v0 + c0 + pick);
      }
    }
  }

  std::vector<float> logits_;
  std::vector<Row> rows_;
  const amx::PackedEmbedding* packed_ = nullptr;
  std::vector<float> acc_;
  float* acc_data_ = nullptr;
  std::int64_t acc_ld_ = 0;
  std::vector<std::uint16_t> hidden_bf16_, probs_bf16_;
};

}  // namespace cpu
}  // namespace diffusion_gemma
