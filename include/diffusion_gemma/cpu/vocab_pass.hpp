// SPDX-License-Identifier: Apache-2.0
// The streaming vocabulary pass (docs/sampler.md §5): for each canvas position, in one pass over
// vocabulary tiles, the LM head, softcap and temperature, then argmax, a categorical sample,
// the entropy and the self-conditioning soft embedding sum_i p_i E_i, with an online max/rescale
// as flash attention does over keys. Memory is O(C*H + C*tile); no [C, V] tensor exists.
//
// Both products go through cpu/linear.hpp with the embedding table as the weight, read in place
// in its stored dtype: the LM head is linear() over a tile of E's rows, the soft embedding is
// linear_transposed() (P E_tile). In the fast precision both take bf16 products: AMX tiles, or
// AVX512-BF16 dot products on AVX-512 CPUs without AMX.
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

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>
#include <diffusion_gemma/cpu/linear.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/cpu/vmath.hpp>
#include <diffusion_gemma/model/weight.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma {

namespace cpu {

// The rows of one sequence in a batched vocabulary pass: its own temperature and sampling key
// (draws are keyed by the row's position inside its canvas, 0..n-1), its own results.
struct VocabSegment {
  std::int64_t row0 = 0;
  std::int64_t n = 0;
  VocabPassArgs args{};
  VocabPassResult* out = nullptr;
};

// Runs the pass. `E` is the embedding table [V, H] (the tied LM head); `hidden` [C, H] holds the
// final-normed hidden states; `cap` is the final logit softcap (0: none).
//
// Parallelism: the vocabulary tiles are dealt round-robin to kShards independent shards (one
// parallel region per pass, single-threaded products inside), whose partial states merge at the
// end in shard order. The shard count is a constant, so results do not depend on the thread count.
class VocabPass {
 public:
  static constexpr std::int64_t kTile = 1024;  // a multiple of kSampleChunk and of the kernels' panels
  // Floats between rows of a shard's logits. Not kTile: rows 4 KiB apart fall on the same L1 sets
  // and alias in the store buffer, and the LM head writes its 16 x 16 results down 16 rows at a
  // time. With 16 floats more, its tile product over 256 rows x 512 ran 1.2x faster on the AMX Xeon.
  static constexpr std::int64_t kLogitStride = kTile + 16;
  static constexpr int kShards = 8;
  // Fewest rows in a block when a shard's rows are cut between threads (small vocabularies).
  static constexpr std::int64_t kMinBlockRows = 32;

  // Bytes of working memory a pass over C positions of width H uses (all shards).
  static std::size_t workspace_bytes(std::int64_t C, std::int64_t H) {
    const std::size_t per_shard = static_cast<std::size_t>(C) * (kLogitStride + H) + kTile / kSampleChunk;
    return kShards * per_shard * sizeof(float) + static_cast<std::size_t>(C * H) * 2;
  }

  void run(const KernelContext& ctx, const Weight& E, float cap, float embed_scale, const float* hidden,
           std::int64_t C, const VocabPassArgs& args, VocabPassResult& out) {
    const VocabSegment seg{0, C, args, &out};
    run(ctx, E, cap, embed_scale, hidden, &seg, 1);
  }

  // The pass over the stacked rows of several sequences: E is read once for all of them.
  void run(const KernelContext& ctx, const Weight& E, float cap, float embed_scale, const float* hidden,
           const VocabSegment* segs, std::size_t count) {
    const std::int64_t V = E.rows(), H = E.cols();
    std::int64_t C = 0;
    bool any_soft = false;
    row_segment_.clear();
    for (std::size_t i = 0; i < count; ++i) {
      segs[i].out->resize(segs[i].n, H, segs[i].args.soft_embedding);
      any_soft = any_soft || segs[i].args.soft_embedding;
      row_segment_.insert(row_segment_.end(), static_cast<std::size_t>(segs[i].n), static_cast<std::int32_t>(i));
      C += segs[i].n;
    }
    if (C == 0) return;
    const std::int64_t tiles = (V + kTile - 1) / kTile;
    const int shards = static_cast<int>(std::min<std::int64_t>(kShards, tiles));
    // A small vocabulary has fewer shards than threads: then each shard's rows are cut into blocks
    // and a task is a (shard, block). Rows never interact inside a shard, and with row_invariant
    // every product gives a row the same bits whatever rows share its call, so the cut changes
    // nothing but the time. (Not on AMX tiles: there the LM head's operand is packed once for all rows.)
    std::int64_t blocks = 1;
    const int threads = resolve_threads(ctx.threads);
    hidden_.pack(ctx, hidden, H, C, H);
    if (shards < threads && ctx.row_invariant && hidden_.pairs() == nullptr) {
      blocks = std::max<std::int64_t>(1, std::min<std::int64_t>((threads + shards - 1) / shards, C / kMinBlockRows));
    }
    const std::int64_t block_rows = (C + blocks - 1) / blocks;
    shards_.resize(static_cast<std::size_t>(shards));
    for (Shard& sh : shards_) {
      sh.rows.resize(static_cast<std::size_t>(C));
      sh.logits = kernels::cache_aligned(sh.logits_store, static_cast<std::size_t>(C * kLogitStride));
      if (any_soft) sh.acc = kernels::cache_aligned(sh.acc_store, static_cast<std::size_t>(C * H));
    }
    constexpr std::int64_t kChunks = kTile / kSampleChunk;
    chunk_mass_.resize(static_cast<std::size_t>(shards * blocks * kChunks));
    KernelContext serial = ctx;
    serial.threads = 1;
    // Both products over every id, and the per-logit work: a small vocabulary's pass over a few
    // rows (the bundled model's) is too little to share.
    const double pass_work = 2.0 * static_cast<double>(C) * static_cast<double>(V) * static_cast<double>(H);
    parallel_for(
        shards * blocks,
        [&](std::int64_t task) {
          const std::int64_t si = task % shards, r0 = (task / shards) * block_rows, r1 = std::min(C, r0 + block_rows);
          if (r0 >= r1) return;
          Shard& sh = shards_[static_cast<std::size_t>(si)];
          float* chunk_mass = chunk_mass_.data() + task * kChunks;
          std::fill(sh.rows.begin() + r0, sh.rows.begin() + r1, Row{});
          if (any_soft) std::fill(sh.acc + r0 * H, sh.acc + r1 * H, 0.0f);
          for (std::int64_t t = si; t < tiles; t += shards) {
            const std::int64_t v0 = t * kTile, n = std::min(kTile, V - v0);
            const Weight rows = E.row_range(v0, n);
            float* L = sh.logits;
            if (blocks == 1) {
              linear(serial, rows, hidden_, L, kLogitStride);  // the LM head's operand prepared once for every tile
            } else {
              linear(serial, rows, hidden + r0 * H, H, r1 - r0, L + r0 * kLogitStride, kLogitStride);
            }
            for (std::int64_t r = r0; r < r1; ++r) {
              const VocabSegment& sg = segs[row_segment_[static_cast<std::size_t>(r)]];
              row_update(ctx.isa, sh, chunk_mass, L + r * kLogitStride, n, v0, r, r - sg.row0, cap, sg.args, any_soft, H);
            }
            // The rows' scale factors were applied in row_update; now add P E_tile for the block's rows.
            if (any_soft) {
              linear_transposed(serial, rows, L + r0 * kLogitStride, kLogitStride, r1 - r0, sh.acc + r0 * H, H,
                                /*accumulate=*/true);
            }
          }
        },
        threads_for_product(ctx, pass_work, C));
    // Merge the shards in order: statistics, argmax (lowest index on ties), sample (highest Gumbel
    // score; lowest id on ties), and the soft embeddings rescaled to the common max.
    parallel_for(
        C,
        [&](std::int64_t r) {
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
          const VocabSegment& sg = segs[row_segment_[static_cast<std::size_t>(r)]];
          VocabPassResult& out = *sg.out;
          const std::int64_t i = r - sg.row0;
          out.argmax[i] = best.argmax;
          out.sample[i] = sg.args.sample ? best.sample : -1;
          // No finite logit in the whole row (NaN activations skip every comparison): a NaN
          // entropy says so to the caller, instead of a distribution over nothing.
          out.entropy[i] = stats.max > -std::numeric_limits<float>::infinity() ? stats.entropy()
                                                                               : std::numeric_limits<float>::quiet_NaN();
          if (sg.args.soft_embedding) {
            float* s = out.soft_embedding.data() + i * H;
            std::fill(s, s + H, 0.0f);
            for (int si = 0; si < shards; ++si) {
              const Shard& sh = shards_[static_cast<std::size_t>(si)];
              const Row& row = sh.rows[static_cast<std::size_t>(r)];
              if (row.stats.sum == 0.0f) continue;
              const float w = std::exp(row.stats.max - stats.max) * (embed_scale / stats.sum);
              const float* a = sh.acc + r * H;
              for (std::int64_t h = 0; h < H; ++h) s[h] += a[h] * w;
            }
          }
        },
        threads_for_work(ctx.threads, static_cast<double>(C) * static_cast<double>(shards) * static_cast<double>(H + 8)));
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
    // Both on cache lines (the tile products store and load whole 64-byte rows).
    float* logits = nullptr;  // [C, kLogitStride]: one tile's logits, then its probabilities
    float* acc = nullptr;     // [C, H]: sum of e^(l - m) E rows, m the shard's running row max
    std::vector<float> logits_store, acc_store;
  };

  // Processes one row of a tile in place: `L` holds raw logits on entry and p = e^(l - m) on exit,
  // where m is the row's running max in this shard after this tile (its accumulator row is
  // rescaled to match).
  // `r` is the row in the stacked pass, `position` its index inside its own canvas (the draws' key).
  // `chunk_mass`: the task's scratch, one float per sampling chunk of a tile.
  static void row_update(Isa isa, Shard& sh, float* chunk_mass, float* L, std::int64_t n, std::int64_t v0,
                         std::int64_t r, std::int64_t position, float cap, const VocabPassArgs& args, bool soft,
                         std::int64_t H) {
    Row& row = sh.rows[static_cast<std::size_t>(r)];
    std::int64_t tile_arg = 0;
    // cap * tanh(x / cap), then an fp32 divide by T, as the reference.
    const float tile_max = vmath::softcap_div_max(isa, L, n, cap, args.temperature, &tile_arg);
    if (tile_max > row.best) {  // strict: the first index wins ties, like torch.argmax
      row.best = tile_max;
      row.argmax = static_cast<std::int32_t>(v0 + tile_arg);
    }
    const float old_max = row.stats.max;
    const float m = tile_max > old_max ? tile_max : old_max;
    if (soft && old_max != m && old_max != -std::numeric_limits<float>::infinity()) {
      const float alpha = std::exp(old_max - m);
      float* s = sh.acc + r * H;
      for (std::int64_t i = 0; i < H; ++i) s[i] *= alpha;
    }
    // Block statistics relative to m (>= the tile's max: any reference works, and this one is the
    // exponent base the soft embedding accumulates with).
    math::SoftmaxStats block;
    block.max = m;
    vmath::exp_shift_sums(isa, L, n, m, kSampleChunk, &block.sum, &block.weighted, chunk_mass);
    row.stats.merge(block);
    if (!args.sample) return;
    for (std::int64_t c0 = 0; c0 < n; c0 += kSampleChunk) {
      const std::int64_t cn = std::min(kSampleChunk, n - c0);
      const float mass = chunk_mass[c0 / kSampleChunk];
      if (!(mass > 0.0f)) continue;
      const std::uint32_t chunk = static_cast<std::uint32_t>((v0 + c0) / kSampleChunk);
      const Philox4x32 d = draw(args.key, DrawPurpose::kSample, static_cast<std::uint32_t>(position), chunk);
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

  std::vector<Shard> shards_;
  std::vector<float> chunk_mass_;  // [task][kTile / kSampleChunk]
  PackedActivations hidden_;
  std::vector<std::int32_t> row_segment_;  // the segment of each stacked row
};

}  // namespace cpu
}  // namespace diffusion_gemma
