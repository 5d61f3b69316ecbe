// SPDX-License-Identifier: Apache-2.0
// Weights packed once as pair tiles (kernels/operands.hpp: panels of 16 outputs, the 32-bit pairs of
// consecutive inputs side by side). Three kernels read that form:
//   - AMX's bf16 tile products (the fast precision on an AMX CPU), which need W's pairs transposed
//     in 16 x 16 blocks, and the AVX512-BF16 dot products (the fast precision on an AVX-512 CPU
//     without AMX), which take each pair of 16 outputs as one vector: every matrix is packed,
//     F32 and F16 ones rounded to bf16 (to nearest even);
//   - the exact AVX2 and AVX-512 products, for which a panel of 16 columns becomes one forward
//     stream instead of 16 rows read side by side and transposed: only BF16 matrices are packed,
//     which is lossless.
// Doing it per call costs what it saves, so it is done once per model, for the matrices every pass
// multiplies: the attention projections, the dense MLP, the experts and the self-conditioning MLP.
// The embedding keeps its rows (tokens are looked up by id and the vocabulary pass streams it), the
// router stays exact and row-major, and quantized or split weights keep their own kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include <sys/mman.h>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/amx.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::cpu {

// Which matrices a packed copy holds (see the top of this file).
enum class TilePacking {
  kAllRoundedToBf16,  // the bf16 products of the fast precision
  kBf16Only,          // the exact AVX2 and AVX-512 kernels: lossless
};

namespace detail {

// Gives the kernel back the pages of a mapped range it no longer reads (only whole pages inside
// it). The mapping is a read-only private file map: a later read faults the same bytes back in.
inline void release_mapped_pages(const std::byte* data, std::size_t bytes) {
  const std::size_t page = 4096;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// The panel of outputs [n0, n0 + 16) of a [n, k] matrix (row-major, rows `k` elements apart) as
// pair tiles, on any CPU: BF16 values are copied, F32 and F16 ones rounded to bf16 (to nearest
// even, as the AMX packing rounds them); pads are zero.
template <DType T>
inline void pack_pair_panel(const std::byte* w, std::int64_t n, std::int64_t k, std::int64_t n0, std::uint16_t* out) {
  std::uint16_t* panel = out + kernels::pair_panel_offset(n0, k);
  const std::int64_t kp = (k + 31) / 32 * 32;
  const std::size_t es = dtype_size(T);
  for (std::int64_t j = 0; j < kernels::kPairPanelWidth; ++j) {
    std::uint16_t* column = panel + 2 * j;
    std::int64_t i = 0;
    if (n0 + j < n) {
      const std::byte* row = w + static_cast<std::size_t>((n0 + j) * k) * es;
      for (; i < k; ++i) {
        std::uint16_t* dst = column + (i / 2) * 2 * kernels::kPairPanelWidth + (i & 1);
        if constexpr (T == DType::kBF16) {
          std::memcpy(dst, row + 2 * i, 2);
        } else {
          *dst = bfloat16::from_float(kernels::MatrixB::element(row, T, i)).bits;
        }
      }
    }
    for (; i < kp; ++i) column[(i / 2) * 2 * kernels::kPairPanelWidth + (i & 1)] = 0;
  }
}

// `threads`: the packing's thread count, as EngineOptions::threads (0: default_threads()).
inline void pack_matrix_tiles(Weight& w, bool release_mapped, TilePacking which = TilePacking::kAllRoundedToBf16,
                              int threads = 0) {
#if DG_X86_KERNELS
  if (!w.is_dense() || w.empty() || w.shape.rank < 2 || w.shape.rank > 3 || w.tiles) return;
  if (which == TilePacking::kBf16Only && w.dtype != DType::kBF16) return;
  const bool amx = cpu_features().best() >= Isa::kAmx;
  const std::int64_t n = w.rows(), k = w.cols(), groups = w.groups();
  const std::size_t per_group = w.tile_elements_per_group();
  // Left uninitialised (every element is written below), so its pages are taken only as each group
  // is packed, and each group's mapped pages are given back right after: memory grows by about a
  // group per thread at a time, not by the whole matrix (1 GB for the real model's experts).
  std::shared_ptr<std::uint16_t[]> packed(new std::uint16_t[per_group * static_cast<std::size_t>(groups)]);
  const std::size_t group_bytes = static_cast<std::size_t>(n * k) * dtype_size(w.dtype);
  const std::int64_t panels = (n + kernels::kPairPanelWidth - 1) / kernels::kPairPanelWidth;
  const auto pack_group = [&](std::int64_t g, int panel_threads) {
    const std::byte* src = w.data + static_cast<std::size_t>(g) * group_bytes;
    std::uint16_t* out = packed.get() + static_cast<std::size_t>(g) * per_group;
    if (amx) {
      kernels::MatrixB b;
      b.data = src;
      b.dtype = w.dtype;
      b.ld = k;
      b.form = kernels::BForm::kNK;
      switch (w.dtype) {
        case DType::kBF16: kernels::amx::pack_weight_tiles<DType::kBF16>(b, n, k, out); break;
        case DType::kF16: kernels::amx::pack_weight_tiles<DType::kF16>(b, n, k, out); break;
        default: kernels::amx::pack_weight_tiles<DType::kF32>(b, n, k, out); break;
      }
    } else {
      const auto pack_panels = [&](auto t) {
        parallel_for(
            panels, [&](std::int64_t p) { pack_pair_panel<decltype(t)::value>(src, n, k, p * kernels::kPairPanelWidth, out); },
            panel_threads);
      };
      switch (w.dtype) {
        case DType::kBF16: pack_panels(std::integral_constant<DType, DType::kBF16>{}); break;
        case DType::kF16: pack_panels(std::integral_constant<DType, DType::kF16>{}); break;
        default: pack_panels(std::integral_constant<DType, DType::kF32>{}); break;
      }
    }
    if (release_mapped && w.borrowed()) release_mapped_pages(src, group_bytes);
  };
  if (groups > 1) {
    parallel_for(groups, [&](std::int64_t g) { pack_group(g, 1); }, threads);
  } else {
    pack_group(0, amx ? 1 : threads);
  }
  if (release_mapped && w.borrowed()) release_mapped_pages(w.data, w.nbytes());  // pages across groups
  w.tiles = std::move(packed);
  w.tile_offset = 0;
#else
  (void)w;
  (void)release_mapped;
  (void)which;
#endif
}

// A mapped weight whose bytes do not start on a cache line, copied into an owned buffer that does
// (so does every row whose bytes are a multiple of 64, as the embedding's are at H = 512). The vocabulary
// pass loads the embedding's rows as 64-byte tile rows; from a checkpoint whose embedding starts
// 40 bytes past a line, each of those loads touched two lines, and the same BF16 pass ran 1.1x
// faster on the AMX Xeon from a copy of the file with the embedding moved to a page boundary. The
// copy is made a slice at a time, each slice's mapped pages released right after (as packing does),
// so memory grows by one slice, not by the matrix.
inline void align_to_cache_line(Weight& w, bool release_mapped) {
  if (!w.is_dense() || !w.borrowed() || reinterpret_cast<std::uintptr_t>(w.data) % 64 == 0) return;
  const std::size_t bytes = w.nbytes(), slice = std::size_t{16} << 20;
  auto* copy = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (copy == nullptr) return;  // the mapped rows still work, only slower
  for (std::size_t at = 0; at < bytes; at += slice) {
    const std::size_t n = bytes - at < slice ? bytes - at : slice;
    std::memcpy(copy + at, w.data + at, n);
    if (release_mapped) release_mapped_pages(w.data + at, n);
  }
  if (release_mapped) release_mapped_pages(w.data, bytes);  // the pages the slices straddled
  w.owner = std::shared_ptr<const void>(copy, [](const void* q) { std::free(const_cast<void*>(q)); });
  w.data = copy;
}

}  // namespace detail

// Calls f(Weight&) for each matrix listed at the top of this file.
template <class Weights, class F>
void for_each_packable_matrix(Weights& weights, F&& f) {
  for (auto& l : weights.layers) {
    for (auto* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.mlp_gate, &l.mlp_up, &l.mlp_down,
                    &l.experts_gate_up, &l.experts_down}) {
      f(*w);
    }
  }
  auto& sc = weights.self_conditioning;
  for (auto* w : {&sc.gate_proj, &sc.up_proj, &sc.down_proj}) f(*w);
}

// A copy of `weights` whose matrices listed above (those `which` selects) also carry their tile
// form. `release_mapped`: the weights point into a mapped checkpoint, whose pages of the packed
// matrices are released once packed, so the copy replaces them in memory instead of doubling them
// (an engine on the same model that reads the rows reads them back from the file).
// The bf16 copy (kAllRoundedToBf16, the fast engines') also holds the embedding on cache lines
// (detail::align_to_cache_line) when the checkpoint's does not start on one.
// `threads` as EngineOptions::threads (0: default_threads()).
inline ModelWeights pack_for_tiles(const ModelWeights& weights, bool release_mapped,
                                   TilePacking which = TilePacking::kAllRoundedToBf16, int threads = 0) {
  ModelWeights out = weights;
  for_each_packable_matrix(out, [&](Weight& w) { detail::pack_matrix_tiles(w, release_mapped, which, threads); });
  if (which == TilePacking::kAllRoundedToBf16) detail::align_to_cache_line(out.embed_tokens, release_mapped);
  return out;
}

// Whether a kBf16Only copy would hold the same tiles as a kAllRoundedToBf16 one.
inline bool packable_matrices_all_bf16(const ModelWeights& weights) {
  bool all = true;
  for_each_packable_matrix(weights, [&](const Weight& w) {
    if (w.is_dense() && !w.empty() && w.dtype != DType::kBF16) all = false;
  });
  return all;
}

}  // namespace diffusion_gemma::cpu
