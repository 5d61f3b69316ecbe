// SPDX-License-Identifier: Apache-2.0
// Block-level sort of up to kN (entropy, position) keys for the entropy-bound acceptance rule:
// ascending entropy, lower position first on ties (a stable order: the CPU policy reproduces the
// order of transformers' CPU sort among equal entropies, this network does not; docs/sampler.md),
// NaN after everything
// (TensorRT-Edge-LLM's "non-finite is worst"). Bitonic network in shared memory; every thread of
// the block calls it.
#pragma once

#include <cmath>

#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma::cuda {

DG_DEVICE float sort_key(float entropy) { return entropy != entropy ? INFINITY : entropy; }

DG_DEVICE bool key_less(float ka, int pa, float kb, int pb) { return ka < kb || (ka == kb && pa < pb); }

// Sorts keys[0..kN) with their positions. Pad unused slots with (INFINITY, position >= length):
// positions are distinct, so the order is total and the result equals a stable sort.
template <int kN>
DG_DEVICE void block_sort_by_entropy(float* keys, int* positions) {
  static_assert(kN > 0 && (kN & (kN - 1)) == 0, "block_sort_by_entropy: kN must be a power of two");
  for (int size = 2; size <= kN; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = static_cast<int>(threadIdx.x); i < kN; i += static_cast<int>(blockDim.x)) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const bool ascending = (i & size) == 0;
        const bool out_of_order = ascending ? key_less(keys[j], positions[j], keys[i], positions[i])
                                            : key_less(keys[i], positions[i], keys[j], positions[j]);
        if (out_of_order) {
          const float k = keys[i];
          keys[i] = keys[j];
          keys[j] = k;
          const int p = positions[i];
          positions[i] = positions[j];
          positions[j] = p;
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace diffusion_gemma::cuda
