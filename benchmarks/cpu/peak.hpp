// SPDX-License-Identifier: Apache-2.0
// The arithmetic peak of this CPU for a kernel family, measured with our own loops (not a data
// sheet): independent fused multiply-add chains (fp32, AVX2 or AVX-512), AVX512-BF16 dot-product
// chains or AMX-BF16 tile products on every thread for a fixed time. Benchmarks print achieved GFLOP/s next to it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>

namespace dg_bench {

#if DG_X86_KERNELS
DG_BEGIN_TARGET_AVX512
inline double fma_chains_avx512(std::int64_t iterations) {
  __m512 acc[12];
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}
DG_END_TARGET

// 12 chains of vdpbf16ps: 16 lanes x 2 products each.
DG_BEGIN_TARGET_AVX512BF16
inline double dot_chains_bf16(std::int64_t iterations) {
  __m512 acc[12];
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));  // (1, 1) in bf16
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33D633D6));  // (1e-7, 1e-7)
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}
DG_END_TARGET

DG_BEGIN_TARGET_AVX2
inline double fma_chains_avx2(std::int64_t iterations) {
  __m256 acc[12];
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  alignas(32) float lanes[8];
  float s = 0.0f;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float x : lanes) s += x;
  }
  return s;
}
DG_END_TARGET

struct alignas(64) PeakTileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

DG_BEGIN_TARGET_AMX
inline double amx_products(std::int64_t iterations) {
  alignas(64) static const std::uint16_t operand[512] = {};
  alignas(64) float out[256];
  PeakTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (std::int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
DG_END_TARGET
#endif

inline constexpr int kPeakSamples = 7;

// GFLOP/s of `isa` on `threads` threads, the best of kPeakSamples samples: fp32 FMA for avx2/avx512 (and for amx when !bf16),
// AMX-BF16 tile products for amx with bf16, AVX512-BF16 dot products for avx512 with bf16 (the
// fast precision's weight products there). 0 for the generic family (no peak is claimed).
inline double measured_peak_gflops(diffusion_gemma::cpu::Isa isa, bool bf16, int threads) {
  using diffusion_gemma::cpu::Isa;
#if DG_X86_KERNELS
  if (isa == Isa::kGeneric) return 0.0;
  const bool tiles = bf16 && isa == Isa::kAmx;
  const bool dots = bf16 && isa == Isa::kAvx512;
  const bool wide = isa >= Isa::kAvx512;
  // FLOP per iteration: 12 chains x lanes x 2 (x 2 products for the dot product), or 4 tile
  // products x 16 x 16 x 32 x 2.
  const double flop_per_iteration =
      tiles ? 4.0 * 16 * 16 * 32 * 2 : dots ? 12.0 * 16 * 2 * 2 : 12.0 * (wide ? 16 : 8) * 2;
  const std::int64_t iterations = tiles ? 2000000 : 20000000;
  volatile double sink = 0.0;
  // The best of several samples: one sample of a few tens of milliseconds on a virtual machine
  // can land in a slow phase and read far below the CPU's rate, which would overstate every
  // "fraction of peak" printed against it. Slowness is the only error a sample can have, so the
  // fastest one is the estimate.
  double best = 0.0;
  for (int sample = 0; sample < kPeakSamples; ++sample) {
    const auto t0 = std::chrono::steady_clock::now();
    diffusion_gemma::cpu::parallel_for(
        threads,
        [&](std::int64_t) {
          const double r = tiles  ? amx_products(iterations)
                           : dots ? dot_chains_bf16(iterations)
                           : wide ? fma_chains_avx512(iterations)
                                  : fma_chains_avx2(iterations);
          sink = sink + r;
        },
        threads);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flop_per_iteration * static_cast<double>(iterations) * threads / seconds / 1e9);
  }
  return best;
#else
  (void)isa;
  (void)bf16;
  (void)threads;
  return 0.0;
#endif
}

// Memory read bandwidth in GB/s on `threads` threads: the best of 3 passes summing a 1 GiB
// buffer (far larger than any cache), the yardstick for how fast a step can stream its weights.
inline double measured_read_bandwidth_gbs(int threads) {
  const std::int64_t words = (std::int64_t{1} << 30) / 8, pieces = 256;
  std::vector<std::uint64_t> data(static_cast<std::size_t>(words));
  for (std::int64_t i = 0; i < words; ++i) data[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(i);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(pieces));
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    diffusion_gemma::cpu::parallel_for(
        pieces,
        [&](std::int64_t p) {
          const std::uint64_t* d = data.data() + p * (words / pieces);
          std::uint64_t s = 0;
          for (std::int64_t i = 0; i < words / pieces; ++i) s += d[i];
          sums[static_cast<std::size_t>(p)] = s;
        },
        threads);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(words * 8) / secs / 1e9);
  }
  volatile std::uint64_t sink = 0;
  for (std::uint64_t s : sums) sink = sink + s;
  return best;
}

}  // namespace dg_bench
