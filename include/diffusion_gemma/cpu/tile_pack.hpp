// SPDX-License-Identifier: Apache-2.0
// Weights packed once for the AMX tile products. The fast precision on an AMX CPU multiplies
// y = x W^T with x as the tiles' A operand and W as their B operand (kernels/amx.hpp, xw_packed),
// which needs W's 32-bit pairs transposed in 16 x 16 blocks. Doing that per call costs what it
// saves, so it is done once per model, for the matrices every pass multiplies: the attention
// projections, the dense MLP, the experts and the self-conditioning MLP. The embedding keeps its
// rows (tokens are looked up by id and the vocabulary pass streams it), the router stays exact, and
// quantized or split weights keep their own kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <sys/mman.h>

#include <diffusion_gemma/cpu/kernels/amx.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::cpu {

namespace detail {

// Gives the kernel back the pages of a mapped range it no longer reads (only whole pages inside
// it). The mapping is a read-only private file map: a later read faults the same bytes back in.
inline void release_mapped_pages(const std::byte* data, std::size_t bytes) {
  const std::size_t page = 4096;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

inline void pack_matrix_tiles(Weight& w, bool release_mapped) {
#if DG_X86_KERNELS
  if (!w.is_dense() || w.empty() || w.shape.rank < 2 || w.shape.rank > 3 || w.tiles) return;
  const std::int64_t n = w.rows(), k = w.cols(), groups = w.groups();
  const std::size_t per_group = w.tile_elements_per_group();
  auto packed = std::make_shared<std::vector<std::uint16_t>>(per_group * static_cast<std::size_t>(groups));
  const std::size_t group_bytes = static_cast<std::size_t>(n * k) * dtype_size(w.dtype);
  parallel_for(groups, [&](std::int64_t g) {
    kernels::MatrixB b;
    b.data = w.data + static_cast<std::size_t>(g) * group_bytes;
    b.dtype = w.dtype;
    b.ld = k;
    b.form = kernels::BForm::kNK;
    std::uint16_t* out = packed->data() + static_cast<std::size_t>(g) * per_group;
    switch (w.dtype) {
      case DType::kBF16: kernels::amx::pack_weight_tiles<DType::kBF16>(b, n, k, out); break;
      case DType::kF16: kernels::amx::pack_weight_tiles<DType::kF16>(b, n, k, out); break;
      default: kernels::amx::pack_weight_tiles<DType::kF32>(b, n, k, out); break;
    }
  });
  if (release_mapped && w.borrowed()) release_mapped_pages(w.data, w.nbytes());
  w.tiles = std::move(packed);
  w.tile_offset = 0;
#else
  (void)w;
  (void)release_mapped;
#endif
}

}  // namespace detail

// A copy of `weights` whose matrices listed above also carry their tile form. `release_mapped`:
// the weights point into a mapped checkpoint, whose pages of the packed matrices are released
// once packed, so the copy replaces them in memory instead of doubling them (an exact engine on the
// same model reads them back from the file).
inline ModelWeights pack_for_tiles(const ModelWeights& weights, bool release_mapped) {
  ModelWeights out = weights;
  for (LayerWeights& l : out.layers) {
    for (Weight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.mlp_gate, &l.mlp_up, &l.mlp_down,
                      &l.experts_gate_up, &l.experts_down}) {
      detail::pack_matrix_tiles(*w, release_mapped);
    }
  }
  SelfConditioningWeights& sc = out.self_conditioning;
  for (Weight* w : {&sc.gate_proj, &sc.up_proj, &sc.down_proj}) detail::pack_matrix_tiles(*w, release_mapped);
  return out;
}

}  // namespace diffusion_gemma::cpu
