// SPDX-License-Identifier: Apache-2.0
// BF16 matrix products on Intel AMX tiles for the vocabulary pass (the LM head and the
// self-conditioning product sum_i p_i E_i), the two [C x V x H] GEMMs that dominate a denoise
// step. Opt-in (EngineOptions::vocab_precision = kBFloat16) and used only where the CPU has
// AMX-BF16 and the kernel grants the tile state; everything else runs the fp32 Eigen path.
//
// Numerics: inputs rounded to bf16 (round to nearest even), products accumulated in fp32. Logits
// then differ from the fp32 path by ~1e-2 absolute on O(10) values; tests/cpu/vocab_pass_test.cpp
// states the tolerances.
//
// The embedding table is packed twice at load, in the two VNNI layouts the tiles read (16 rows x
// 32 bf16 per 1 KiB tile): for the LM head (K = hidden, N = vocabulary) and for the
// self-conditioning product (K = vocabulary, N = hidden). 2 x V x H x 2 bytes in all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DG_AMX_POSSIBLE 1
#else
#define DG_AMX_POSSIBLE 0
#endif

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>

namespace diffusion_gemma::cpu::amx {

inline constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// True when AMX-BF16 and AVX512-BF16 instructions can run in this process (CPUID bits, then the
// Linux permission for the tile state, requested once).
inline bool available() {
#if DG_AMX_POSSIBLE
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    // The fp32 -> bf16 conversion uses AVX512-BF16 (leaf 7, sub-leaf 1, EAX bit 5).
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0 || ((a >> 5) & 1u) == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// The embedding table [V, H] in both VNNI tile layouts, padded with zeros to Vp = round_up(V, 32)
// and Hp = round_up(H, 32).
struct PackedEmbedding {
  std::int64_t V = 0, H = 0, Vp = 0, Hp = 0;
  std::vector<std::uint16_t> lm_head;  // tile (v/16, h/32): row p, dword n = (E[v+n][h+2p], E[v+n][h+2p+1])
  std::vector<std::uint16_t> soft;     // tile (v/32, h/16): row p, dword n = (E[v+2p][h+n], E[v+2p+1][h+n])

  bool empty() const { return lm_head.empty(); }
  const std::uint16_t* lm_head_tile(std::int64_t vb, std::int64_t kb) const { return lm_head.data() + (vb * (Hp / 32) + kb) * 512; }
  const std::uint16_t* soft_tile(std::int64_t kv, std::int64_t hb) const { return soft.data() + (kv * (Hp / 16) + hb) * 512; }

  static PackedEmbedding pack(const float* E, std::int64_t V, std::int64_t H) {
    PackedEmbedding p;
    p.V = V;
    p.H = H;
    p.Vp = round_up(V, 32);
    p.Hp = round_up(H, 32);
    p.lm_head.assign(static_cast<std::size_t>(p.Vp * p.Hp), 0);
    p.soft.assign(static_cast<std::size_t>(p.Vp * p.Hp), 0);
    const auto at = [&](std::int64_t v, std::int64_t h) -> std::uint16_t {
      return v < V && h < H ? bfloat16::from_float(E[v * H + h]).bits : 0;
    };
    {
      parallel_for(p.Vp / 32, [&](std::int64_t i) {
        for (std::int64_t v = i * 32; v < i * 32 + 32; ++v) {
          for (std::int64_t h = 0; h < p.Hp; ++h) {
            const std::uint16_t x = at(v, h);
            // LM head layout: tile (v/16, h/32), row (h%32)/2, dword v%16, half h%2.
            p.lm_head[static_cast<std::size_t>(((v / 16) * (p.Hp / 32) + h / 32) * 512 + ((h % 32) / 2) * 32 +
                                               (v % 16) * 2 + h % 2)] = x;
            // Soft layout: tile (v/32, h/16), row (v%32)/2, dword h%16, half v%2.
            p.soft[static_cast<std::size_t>(((v / 32) * (p.Hp / 16) + h / 16) * 512 + ((v % 32) / 2) * 32 +
                                            (h % 16) * 2 + v % 2)] = x;
          }
        }
      });
    }
    return p;
  }
};

#if DG_AMX_POSSIBLE

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Tiles 0-3: fp32 accumulators; 4-5: A (16 rows x 32 bf16); 6-7: B (VNNI, 16 x 16 pairs).
__attribute__((target("amx-tile,amx-bf16"))) inline void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Lambdas do not inherit a function's target attribute, so every loop body that uses the
// intrinsics is its own target function; the parallel_for lambdas only call them. The build
// therefore never needs -mavx512f or -mamx-tile (the CI machine's -march=native has neither).

// Converts row r of the conversion below.
__attribute__((target("avx512f,avx512bf16,avx512vl"))) inline void to_bf16_row(const float* s, std::int64_t cols,
                                                                                std::uint16_t* d,
                                                                                std::int64_t padded_cols) {
  std::int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + c), reinterpret_cast<const __m256i&>(v));
  }
  for (; c < cols; ++c) d[c] = bfloat16::from_float(s[c]).bits;
  for (; c < padded_cols; ++c) d[c] = 0;
}

// Converts rows [0, rows) x cols [0, cols) of fp32 `src` (row stride ld_src) to bf16 `dst` (row
// stride ld_dst), zero-filling up to padded_rows x padded_cols.
inline void to_bf16(const float* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols, std::uint16_t* dst,
                    std::int64_t ld_dst, std::int64_t padded_rows, std::int64_t padded_cols) {
  parallel_for(padded_rows, [&](std::int64_t r) {
    std::uint16_t* d = dst + r * ld_dst;
    if (r >= rows) {
      std::memset(d, 0, static_cast<std::size_t>(padded_cols) * 2);
      return;
    }
    to_bf16_row(src + r * ld_src, cols, d, padded_cols);
  });
}

// One 32-column block nb of the product below.
__attribute__((target("amx-tile,amx-bf16"))) inline void lm_head_block(const std::uint16_t* A, std::int64_t Mp,
                                                                       const PackedEmbedding& E, std::int64_t v0,
                                                                       std::int64_t nb, float* L, std::int64_t ldl) {
  const std::int64_t KB = E.Hp / 32;
  const std::int64_t lda = E.Hp * 2;
  load_tile_config();
  const std::int64_t vb = (v0 + nb * 32) / 16;
  for (std::int64_t m = 0; m < Mp; m += 32) {
    const bool two = m + 16 < Mp;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (std::int64_t kb = 0; kb < KB; ++kb) {
      _tile_loadd(4, A + m * E.Hp + kb * 32, lda);
      _tile_loadd(6, E.lm_head_tile(vb, kb), 64);
      _tile_loadd(7, E.lm_head_tile(vb + 1, kb), 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, A + (m + 16) * E.Hp + kb * 32, lda);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    float* out = L + m * ldl + nb * 32;
    _tile_stored(0, out, ldl * 4);
    _tile_stored(1, out + 16, ldl * 4);
    if (two) {
      _tile_stored(2, out + 16 * ldl, ldl * 4);
      _tile_stored(3, out + 16 * ldl + 16, ldl * 4);
    }
  }
  // Tiles left configured make every later context switch of this thread save and restore 8 KiB of
  // tile data; releasing them keeps the rest of the program (many short parallel regions) fast.
  _tile_release();
}

// L[Mp, np] (fp32, row stride ldl) = A[Mp, Hp] (bf16, rows of Hp) x E[v0 : v0 + np]^T.
// Mp is a multiple of 16, np of 32, v0 of 32.
inline void lm_head(const std::uint16_t* A, std::int64_t Mp, const PackedEmbedding& E, std::int64_t v0,
                    std::int64_t np, float* L, std::int64_t ldl) {
  parallel_for(np / 32, [&](std::int64_t nb) { lm_head_block(A, Mp, E, v0, nb, L, ldl); });
}

// acc[Mp, Hp] (fp32) += P[Mp, np] (bf16, row stride ldp) x E[v0 : v0 + np, :]. np, v0 multiples of 32.
// One (32-row, 32-column) task of the product below.
__attribute__((target("amx-tile,amx-bf16"))) inline void soft_accumulate_block(const std::uint16_t* P,
                                                                               std::int64_t ldp, std::int64_t Mp,
                                                                               const PackedEmbedding& E,
                                                                               std::int64_t v0, std::int64_t np,
                                                                               float* acc, std::int64_t task) {
  const std::int64_t hblocks = E.Hp / 32;
  const std::int64_t ldc = E.Hp * 4;
  load_tile_config();
  const std::int64_t m = (task / hblocks) * 32, hb = (task % hblocks) * 2;  // two 16-column tiles
  const bool two = m + 16 < Mp;
  float* c0 = acc + m * E.Hp + hb * 16;
  _tile_loadd(0, c0, ldc);
  _tile_loadd(1, c0 + 16, ldc);
  if (two) {
    _tile_loadd(2, c0 + 16 * E.Hp, ldc);
    _tile_loadd(3, c0 + 16 * E.Hp + 16, ldc);
  }
  for (std::int64_t k = 0; k < np; k += 32) {
    const std::int64_t kv = (v0 + k) / 32;
    _tile_loadd(4, P + m * ldp + k, ldp * 2);
    _tile_loadd(6, E.soft_tile(kv, hb), 64);
    _tile_loadd(7, E.soft_tile(kv, hb + 1), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, P + (m + 16) * ldp + k, ldp * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c0, ldc);
  _tile_stored(1, c0 + 16, ldc);
  if (two) {
    _tile_stored(2, c0 + 16 * E.Hp, ldc);
    _tile_stored(3, c0 + 16 * E.Hp + 16, ldc);
  }
  _tile_release();
}

inline void soft_accumulate(const std::uint16_t* P, std::int64_t ldp, std::int64_t Mp, const PackedEmbedding& E,
                            std::int64_t v0, std::int64_t np, float* acc) {
  const std::int64_t tasks = (Mp + 31) / 32 * (E.Hp / 32);
  parallel_for(tasks, [&](std::int64_t task) { soft_accumulate_block(P, ldp, Mp, E, v0, np, acc, task); });
}

#endif  // DG_AMX_POSSIBLE

}  // namespace diffusion_gemma::cpu::amx
