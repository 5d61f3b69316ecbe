// SPDX-License-Identifier: Apache-2.0
// The streaming vocabulary pass on the device (docs/sampler.md §5): per vocabulary tile, a cuBLAS
// GEMM for the tile's logits, vocab_tile_kernel for the row statistics, and (with
// self-conditioning) a second GEMM that adds e^(l - m) E_tile to the rows' soft embeddings. The
// workspace holds the row states and one tile of logits (and of probabilities in the storage
// type): O(C * tile), never [C, V].
#pragma once

#include <cstdint>
#include <type_traits>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/vocab_pass.cuh>
#include <diffusion_gemma/cuda/launch/gemm.hpp>
#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/cuda/workspace.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma::cuda {

template <class Act>
struct VocabPassParams {
  const Act* embed = nullptr;   // [vocab, hidden]: the tied LM head
  const Act* hidden = nullptr;  // [rows, hidden]: final-normed hidden states in the storage type
  std::int64_t vocab = 0;
  int hidden_size = 0;
  int rows = 0;
  float softcap = 0.0f;  // 0: none
  float temperature = 1.0f;
  float embed_scale = 1.0f;
  bool soft_embedding = true;
  bool sample = true;
  DrawKey key;
  std::int64_t tile = 8192;  // vocabulary ids per GEMM; a multiple of kSampleChunk
  // Outputs, device memory.
  std::int32_t* argmax = nullptr;  // [rows]
  std::int32_t* sample_out = nullptr;
  float* entropy = nullptr;
  float* soft = nullptr;  // [rows, hidden]; required when soft_embedding
};

namespace detail {

template <class Act>
struct VocabWorkspace {
  VocabRowState* rows = nullptr;
  float* logits = nullptr;
  Act* probs = nullptr;

  VocabWorkspace(Carver& c, int rows_count, std::int64_t tile) {
    rows = c.take<VocabRowState>(static_cast<std::size_t>(rows_count));
    logits = c.take<float>(static_cast<std::size_t>(rows_count) * static_cast<std::size_t>(tile));
    // fp32 storage: the SC GEMM reads the fp32 e^(l - m) in place.
    if constexpr (!std::is_same_v<Act, float>) {
      probs = c.take<Act>(static_cast<std::size_t>(rows_count) * static_cast<std::size_t>(tile));
    }
  }
};

}  // namespace detail

template <class Act>
std::size_t vocab_pass_workspace_bytes(int rows, std::int64_t tile) {
  Carver c;
  detail::VocabWorkspace<Act> w(c, rows, tile);
  return c.bytes();
}

template <class Act>
Status can_launch_vocab_pass(const VocabPassParams<Act>& p) {
  if (p.tile <= 0 || p.tile % kSampleChunk != 0) {
    return make_status(StatusCode::kInvalidArgument, "vocabulary pass: tile ", p.tile,
                       " must be a positive multiple of ", kSampleChunk);
  }
  if (p.vocab <= 0 || p.vocab > 0x7fffffff) {
    return make_status(StatusCode::kOutOfRange, "vocabulary pass: vocab size ", p.vocab);
  }
  if (!(p.temperature > 0.0f)) {
    return make_status(StatusCode::kInvalidArgument, "vocabulary pass: temperature ", p.temperature, " must be > 0");
  }
  if (p.soft_embedding && p.soft == nullptr) {
    return make_status(StatusCode::kInvalidArgument, "vocabulary pass: soft_embedding requested without an output");
  }
  return {};
}

// Enqueues the whole pass on `stream`; `workspace` holds vocab_pass_workspace_bytes<Act>(rows, tile).
template <class Act>
Status launch_vocab_pass(const VocabPassParams<Act>& p, cublasHandle_t cublas, void* workspace, cudaStream_t stream) {
  Status s = can_launch_vocab_pass(p);
  if (!s.ok() || p.rows == 0) return s;
  Carver c(workspace);
  detail::VocabWorkspace<Act> w(c, p.rows, p.tile);
  const DType dtype = dtype_of<Act>::value;
  const int H = p.hidden_size;

  vocab_init_kernel<0><<<static_cast<unsigned>((p.rows + 127) / 128), 128, 0, stream>>>(w.rows, p.rows);
  DG_CUDA_TRY_LAUNCH("vocab_init_kernel");
  if (p.soft_embedding) {
    DG_CUDA_TRY(cudaMemsetAsync(p.soft, 0, static_cast<std::size_t>(p.rows) * H * sizeof(float), stream));
  }
  for (std::int64_t v0 = 0; v0 < p.vocab; v0 += p.tile) {
    const std::int64_t n = p.vocab - v0 < p.tile ? p.vocab - v0 : p.tile;
    const Act* e_tile = p.embed + v0 * H;
    s = gemm_nt(cublas, stream, dtype, p.hidden, H, e_tile, H, w.logits, p.tile, p.rows, n, H);
    if (!s.ok()) return s;
    VocabTileParams<Act> t;
    t.logits = w.logits;
    t.ld = p.tile;
    t.probs = p.soft_embedding ? w.probs : nullptr;
    t.rows = w.rows;
    t.soft = p.soft_embedding ? p.soft : nullptr;
    t.hidden = H;
    t.v0 = v0;
    t.n = static_cast<int>(n);
    t.cap = p.softcap;
    t.temperature = p.temperature;
    t.sample = p.sample;
    t.key = p.key;
    vocab_tile_kernel<Act><<<static_cast<unsigned>(p.rows), kVocabThreads, 0, stream>>>(t);
    DG_CUDA_TRY_LAUNCH("vocab_tile_kernel");
    if (p.soft_embedding) {
      const void* probs =
          std::is_same_v<Act, float> ? static_cast<const void*>(w.logits) : static_cast<const void*>(w.probs);
      s = gemm_nn(cublas, stream, dtype, probs, p.tile, e_tile, H, p.soft, H, p.rows, H, n, 1.0f, /*beta=*/1.0f);
      if (!s.ok()) return s;
    }
  }
  vocab_finish_kernel<0><<<static_cast<unsigned>(p.rows), kVocabThreads, 0, stream>>>(
      w.rows, p.sample, p.embed_scale, H, p.argmax, p.sample_out, p.entropy, p.soft_embedding ? p.soft : nullptr);
  DG_CUDA_TRY_LAUNCH("vocab_finish_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
