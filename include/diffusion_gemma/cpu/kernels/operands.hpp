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

// Where the weights of one block of a product come from: `runs` runs of `bytes` bytes, `stride`
// bytes apart (a panel's rows in a row-major weight, or one run for a packed panel).
struct PanelSource {
  const std::byte* base = nullptr;
  std::int64_t runs = 0;
  std::size_t bytes = 0;
  std::size_t stride = 0;
};

// Requests a PanelSource's cache lines into L2 a few per step, spread over the steps of the work
// that comes before their use. The product kernels are bound by arithmetic while their weights
// stream from memory: a block requested while the one before it is computed is there in time.
class PanelPrefetcher {
 public:
  void start(const PanelSource& s, std::int64_t steps) {
    src_ = s;
    run_ = 0;
    std::int64_t lines = 0;
    if (s.bytes > 0) {
      if (s.stride % 64 == 0) {  // every run starts at the same place in its line
        lines = s.runs * lines_of(0);
      } else {
        for (std::int64_t r = 0; r < s.runs; ++r) lines += lines_of(r);
      }
    }
    if (lines == 0) src_.runs = 0;
    per_step_ = steps > 0 ? (lines + steps - 1) / steps : lines;
    enter_run();
  }
  void step() {
    step([](const void* line) { __builtin_prefetch(line, 0, 2); });
  }
  // The same walk with `request(line)` called for each line (a test sees what would be requested).
  template <class Request>
  void step(Request&& request) {
    for (std::int64_t i = 0; i < per_step_ && run_ < src_.runs; ++i) {
      request(reinterpret_cast<const void*>(next_));
      next_ += 64;
      if (next_ > last_) {
        ++run_;
        enter_run();
      }
    }
  }

 private:
  std::uintptr_t run_begin(std::int64_t r) const {
    return reinterpret_cast<std::uintptr_t>(src_.base + static_cast<std::size_t>(r) * src_.stride);
  }
  std::uintptr_t first_line(std::int64_t r) const { return run_begin(r) & ~std::uintptr_t{63}; }
  std::uintptr_t last_line(std::int64_t r) const { return (run_begin(r) + src_.bytes - 1) & ~std::uintptr_t{63}; }
  std::int64_t lines_of(std::int64_t r) const {
    return static_cast<std::int64_t>((last_line(r) - first_line(r)) / 64 + 1);
  }
  void enter_run() {
    if (run_ >= src_.runs) return;
    next_ = first_line(run_);
    last_ = last_line(run_);
  }
  PanelSource src_;
  std::int64_t run_ = 0, per_step_ = 0;
  std::uintptr_t next_ = 0, last_ = 0;
};

// Per-thread scratch that grows and is kept (OpenMP threads live as long as the process).
template <class T, int kSlot>
T* scratch(std::size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace diffusion_gemma::cpu::kernels
