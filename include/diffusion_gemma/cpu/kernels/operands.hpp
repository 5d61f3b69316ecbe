// SPDX-License-Identifier: Apache-2.0
// What every CPU product kernel receives: C[m, n] (+)= A[m, k] * op(B), with A fp32 activations
// (row-major) and B in its stored dtype (F32, BF16 or F16), read in place. B is either a torch
// Linear weight [n, k] (y = x W^T, the `kNK` form) or a [k, n] matrix (y = x B, the `kKN` form:
// the self-conditioning product P E and the attention's P V). Rows of B may start anywhere (a
// memory-mapped checkpoint gives no alignment): kernels use unaligned loads only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/float16.hpp>

namespace diffusion_gemma::cpu::kernels {

enum class BForm {
  kNK,  // B is [n, k]: C = A B^T
  kKN,  // B is [k, n]: C = A B
  kSentinel
};

struct MatrixB {
  const std::byte* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t ld = 0;  // elements between the starts of consecutive rows
  BForm form = BForm::kNK;

  const std::byte* row(std::int64_t r) const {
    return data + static_cast<std::size_t>(r) * static_cast<std::size_t>(ld) * dtype_size(dtype);
  }
  // B(k, n) in the product's own indices, whatever the form.
  float at(std::int64_t k, std::int64_t n) const {
    const std::int64_t i = form == BForm::kNK ? n * ld + k : k * ld + n;
    return element(data, dtype, i);
  }
  static float element(const std::byte* base, DType t, std::int64_t i) {
    switch (t) {
      case DType::kBF16: {
        std::uint16_t b;
        std::memcpy(&b, base + i * 2, 2);
        return bfloat16::from_bits(b).to_float();
      }
      case DType::kF16: {
        std::uint16_t b;
        std::memcpy(&b, base + i * 2, 2);
        return float16::from_bits(b).to_float();
      }
      default: {
        float f;
        std::memcpy(&f, base + i * 4, 4);
        return f;
      }
    }
  }
};

struct Gemm {
  const float* a = nullptr;
  std::int64_t lda = 0;
  MatrixB b;
  float* c = nullptr;
  std::int64_t ldc = 0;
  std::int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  // C += A op(B) instead of C = A op(B)
  bool few_rows = true;     // products of up to 4 rows may stream B (a different summation order)

  // The same product restricted to output columns [n0, n1).
  Gemm columns(std::int64_t n0, std::int64_t n1) const {
    Gemm g = *this;
    g.n = n1 - n0;
    g.c = c + n0;
    g.b.data = b.form == BForm::kNK ? b.row(n0) : b.data + static_cast<std::size_t>(n0) * dtype_size(b.dtype);
    return g;
  }
  // The same product restricted to rows [m0, m1) of A and C.
  Gemm rows(std::int64_t m0, std::int64_t m1) const {
    Gemm g = *this;
    g.m = m1 - m0;
    g.a = a + m0 * lda;
    g.c = c + m0 * ldc;
    return g;
  }
};

// Weights packed once as pair tiles (cpu/tile_pack.hpp): a [n, k] matrix becomes panels of 16
// outputs; within a panel, 32-bit pair p holds (W[j][2p], W[j][2p + 1]) for column j at element
// 2 (16 p + j) (k padded with zeros to a multiple of 32, outputs to a multiple of 16). AMX reads
// it as 16 x 32 B tiles, the AVX2 kernel as 16 columns of consecutive k; each panel is one stream.
inline constexpr std::int64_t kPairPanelWidth = 16;
inline std::size_t pair_panel_elements(std::int64_t k) { return static_cast<std::size_t>((k + 31) / 32 * 32 * 16); }
// Offset of the panel holding output `n0` (a multiple of 16).
inline std::size_t pair_panel_offset(std::int64_t n0, std::int64_t k) {
  return static_cast<std::size_t>(n0 / kPairPanelWidth) * pair_panel_elements(k);
}

// Per-thread scratch that grows and is kept (OpenMP threads live as long as the process).
template <class T, int kSlot>
T* scratch(std::size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace diffusion_gemma::cpu::kernels
