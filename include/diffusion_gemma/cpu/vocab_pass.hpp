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
//
// Parallelism: the vocabulary tiles are dealt round-robin to kShards independent shards (one
// parallel region per pass, single-threaded GEMMs inside), whose partial states merge at the end
// in shard order. The shard count is a constant, so results do not depend on the thread count.
class VocabPass {
 public:
  static constexpr std::int64_t kTile = 1024;  // a multiple of kSampleChunk and of the AMX blocks
  static constexpr int kShards = 8;

  // Runs the two GEMMs in bf16 on AMX tiles from this packed table instead of fp32 (nullptr: fp32).
  void use_bf16(const amx::PackedEmbedding* packed) { packed_ = packed; }
  bool bf16() const { return packed_ != nullptr; }

  void run(const float* E, std::int64_t V, std::int64_t H, float cap, float embed_scale, const float* hidden,
           std::int64_t C, const VocabPassArgs& args, VocabPassResult& out) {
    out.resize(C, H, args.soft_embedding);
    const bool bf16 = packed_ != nullptr;
    const std::int64_t Mp = bf16 ? amx::round_up(C, 16) : C;
    const std::int64_t ld = bf16 ? packed_->Hp : H;  // row stride of the soft-embedding accumulators
    const std::int64_t tiles = (V + kTile - 1) / kTile;
    const int shards = static_cast<int>(std::min<std::int64_t>(kShards, tiles));
    shards_.resize(static_cast<std::size_t>(shards));
#if DG_AMX_POSSIBLE
    if (bf16) {
      hidden_bf16_.resize(static_cast<std::size_t>(Mp * packed_->Hp));
      amx::to_bf16(hidden, H, C, H, hidden_bf16_.data(), packed_->Hp, Mp, packed_->Hp);
    }
#endif
    parallel_for(shards, [&](std::int64_t si) {
      Shard& sh = shards_[static_cast<std::size_t>(si)];
      sh.rows.assign(static_cast<std::size_t>(C), Row{});
      sh.logits.resize(static_cast<std::size_t>(Mp * kTile));
      if (args.soft_embedding) sh.acc.assign(static_cast<std::size_t>(Mp * ld), 0.0f);
      sh.ld = ld;
      for (std::int64_t t = si; t < tiles; t += shards) {
        const std::int64_t v0 = t * kTile, n = std::min(kTile, V - v0);
        float* L = sh.logits.data();
#if DG_AMX_POSSIBLE
        if (bf16) {
          amx::lm_head(hidden_bf16_.data(), Mp, *packed_, v0, amx::round_up(n, 32), L, kTile);
        } else {
          gemm_nt(hidden, H, E + v0 * H, H, L, kTile, C, n, H);
        }
#else
        gemm_nt(hidden, H, E + v0 * H, H, L, kTile, C, n, H);
#endif
        for (std::int64_t r = 0; r < C; ++r) row_update(sh, L + r * kTile, n, v0, r, cap, args);
        if (!args.soft_embedding) continue;
        // The rows' scale factors were applied in row_update; now add P E_tile for the whole tile.
#if DG_AMX_POSSIBLE
        if (bf16) {
          const std::int64_t np = amx::round_up(n, 32);
          sh.probs_bf16.resize(static_cast<std::size_t>(Mp * kTile));
          amx::to_bf16(L, kTile, C, n, sh.probs_bf16.data(), kTile, Mp, np);
          amx::soft_accumulate(sh.probs_bf16.data(), kTile, Mp, *packed_, v0, np, sh.acc.data());
          continue;
        }
#endif
        gemm_nn(L, kTile, E + v0 * H, H, sh.acc.data(), ld, C, H, n, /*accumulate=*/true);
      }
    });
    // Merge the shards in order: statistics, argmax (lowest index on ties), sample (highest Gumbel
    // score; lowest id on ties), and the soft embeddings rescaled to the common max.
    parallel_for(C, [&](std::int64_t r) {
      math::SoftmaxStats stats;
      Row best = shards_[0].rows[static_cast<std::size_t>(r)];
      for (int si = 0; si < shards; ++si) {
        const Row& row = shards_[static_cast<std::size_t>(si)].rows[static_cast<std::size_t>(r)];
        stats.merge(row.stats);
        if (row.best > best.best || (row.best == best.best && row.argmax < best.argmax)) {
          best.best = row.best;
          best.argmax = row.argmax;
        }
        if (row.sample_score > best.sample_score ||
            (row.sample_score == best.sample_score && row.sample < best.sample)) {
          best.sample_score = row.sample_score;
          best.sample = row.sample;
        }
      }
      out.argmax[r] = best.argmax;
      out.sample[r] = args.sample ? best.sample : -1;
      out.entropy[r] = stats.entropy();
      if (args.soft_embedding) {
        float* s = out.soft_embedding.data() + r * H;
        std::fill(s, s + H, 0.0f);
        for (int si = 0; si < shards; ++si) {
          const Shard& sh = shards_[static_cast<std::size_t>(si)];
          const Row& row = sh.rows[static_cast<std::size_t>(r)];
          if (row.stats.sum == 0.0f) continue;
          const float w = std::exp(row.stats.max - stats.max) * (embed_scale / stats.sum);
          const float* a = sh.acc.data() + r * sh.ld;
          for (std::int64_t i = 0; i < H; ++i) s[i] += a[i] * w;
        }
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

  struct Shard {
    std::vector<Row> rows;
    std::vector<float> logits;  // [Mp, kTile]: one tile's logits, then its probabilities
    std::vector<float> acc;     // [Mp, ld]: sum of e^(l - m) E rows, m the shard's running row max
    std::int64_t ld = 0;
    std::vector<float> scratch;
    std::vector<std::uint16_t> probs_bf16;
  };

  // Processes one row of a tile in place: `L` holds raw logits on entry and p = e^(l - m) on exit,
  // where m is the row's running max in this shard after this tile (its accumulator row is
  // rescaled to match). Vectorised with Eigen arrays: softcap, temperature and exp dominate once
  // the GEMMs are fast.
  void row_update(Shard& sh, float* L, std::int64_t n, std::int64_t v0, std::int64_t r, float cap,
                  const VocabPassArgs& args) const {
    using Array = Eigen::Map<Eigen::ArrayXf>;
    Row& row = sh.rows[static_cast<std::size_t>(r)];
    const float T = args.temperature;
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
      float* s = sh.acc.data() + r * sh.ld;
      for (std::int64_t i = 0; i < sh.ld; ++i) s[i] *= alpha;
    }
    // Block statistics relative to m (>= the tile's max: any reference works, and this one is the
    // exponent base the soft embedding accumulates with).
    if (sh.scratch.size() < static_cast<std::size_t>(n)) sh.scratch.resize(static_cast<std::size_t>(n));
    Array e(sh.scratch.data(), n);
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

  const amx::PackedEmbedding* packed_ = nullptr;
  std::vector<Shard> shards_;
  std::vector<std::uint16_t> hidden_bf16_;
};

}  // namespace cpu
}  // namespace diffusion_gemma
