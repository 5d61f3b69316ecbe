// SPDX-License-Identifier: Apache-2.0
// The int8 products of 4-bit weights (int8_products.hpp) on AMX-INT8 tiles, for Sapphire Rapids
// and later when DG_CPU_INT8_TILES=1 opts in. Off by default: the per-chunk scaling below leaves
// the tiles waiting, and in the model this measured slower than the bf16 tiles on dequantised
// blocks (docs/quantization.md §2.1).
//
// The panel int8_products.hpp unpacks, [k / 4][16][4] signed bytes, is already the layout of the
// B operand of tdpbusd (k / 4 rows of 64 bytes, 4 consecutive inputs of one output column side by
// side), and the activation codes are unsigned bytes in rows, the A operand. One tdpbusd adds
// 16 rows x 16 columns x 64 inputs of exactly the byte products that take vpdpbusd 16 x 16
// instructions, into exact int32 sums. A chunk's sums start from the panel's offsets (a tile
// loaded with row stride 0, every row the same 16 offsets), leave the tile once per chunk, and go
// through the same fp32 step as the VNNI kernel: fma(float(sum), scale * alpha, f). So every
// output has the VNNI kernel's bits, which tests/cpu/kernels_test.cpp checks.
//
// The tiles take blocks of 16 rows (a partial last block padded to 16) and chunks cut into whole K
// steps of 64 (or 32) inputs; a last block of fewer than kMinTileRows rows, and matrices whose
// chunks are not a multiple of 32 inputs, take the VNNI kernel.
// Tiles: 0, 1, 6 and 7 accumulate (two panels, alternate chunks), 2 and 3 hold activations, 4 and
// 5 panels. The tile state is released at the end of every call, as in amx.hpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/amx.hpp>
#include <diffusion_gemma/cpu/kernels/int8_products.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::int8::amx {

// Inputs per tdpbusd for these activations: 64 or 32 when every chunk (the last one too) is a
// whole number of them, else 0 (no tile form).
inline std::int64_t k_step(const Activations& a) {
  for (std::int64_t step : {std::int64_t{64}, std::int64_t{32}}) {
    if (a.chunks.length % step == 0 && a.k % step == 0) return step;
  }
  return 0;
}

DG_BEGIN_TARGET_AMX_INT8

inline void configure(std::int64_t step) {
  kernels::amx::TileConfig t;
  for (int i = 0; i < 2; ++i) {
    t.rows[i] = 16;  // int32 sums of even chunks, 16 rows x 16 columns (tiles 0 and 1)
    t.colsb[i] = 64;
    t.rows[2 + i] = 16;  // activation codes, 16 rows x `step` inputs (tiles 2 and 3)
    t.colsb[2 + i] = static_cast<std::uint16_t>(step);
    t.rows[4 + i] = static_cast<std::uint8_t>(step / 4);  // panel quads, `step` / 4 rows x 16 columns x 4 (4, 5)
    t.colsb[4 + i] = 64;
    t.rows[6 + i] = 16;  // int32 sums of odd chunks (6 and 7)
    t.colsb[6 + i] = 64;
  }
  kernels::amx::load_config(t);
}

// Chunk `ch`'s int32 sums of rows [r0, r0 + 16) times two neighbouring panels into tiles t0 and t1
// (each starts from its panel's offsets: a tile loaded with row stride 0, every row the same 16),
// with the activations in `ta` and the panels in 4 and 5. A macro because tile numbers must be
// literals. One activation tile serves both panels: it comes from L2, where a product's codes do
// not fit L1, so loading it once per panel pair halves that traffic.
#define DG_INT8_AMX_CHUNK(t0, t1, ta, ch)                                       \
  do {                                                                              \
    const std::int64_t c0_ = (ch) * a.chunks.length;                                \
    const std::int64_t c1_ = std::min(a.k, c0_ + a.chunks.length);                  \
    _tile_loadd(t0, p0.offset + (ch) * kPanel, 0);                                  \
    _tile_loadd(t1, p1.offset + (ch) * kPanel, 0);                                  \
    for (std::int64_t c_ = c0_; c_ < c1_; c_ += step) {                             \
      _tile_loadd(ta, codes + c_, a.k);                                             \
      _tile_loadd(4, p0.values + c_ * kPanel, 64);                                  \
      _tile_dpbusd(t0, ta, 4);                                                      \
      _tile_loadd(5, p1.values + c_ * kPanel, 64);                                  \
      _tile_dpbusd(t1, ta, 5);                                                      \
    }                                                                               \
  } while (0)

// Rows [r0, r0 + rows) of `a` (rows <= 16; the block is read whole) times panels p0 and p1 into
// y[r0.., 0..nvalid0) and y[r0.., 16..16 + nvalid1) (nvalid1 = 0: p1 is not stored, a last odd
// panel). Chunks alternate between sum tiles {0, 1} (activations in 2) and {6, 7} (activations in
// 3): the tiles sum chunk ch + 1 while the vector units scale chunk ch's sums, which takes longer
// than the tile product itself (the scale is per chunk, so the sums leave the tiles once per 32 or
// 64 inputs).
inline void block_product(const Activations& a, std::int64_t r0, std::int64_t rows, const Panel& p0, const Panel& p1,
                          std::int64_t step, std::int64_t nvalid0, std::int64_t nvalid1, float* y, std::int64_t ldy,
                          bool accumulate) {
  alignas(64) std::int32_t sums[2][16 * kPanel];
  __m512 f0[16], f1[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) f0[i] = f1[i] = _mm512_setzero_ps();
  const std::uint8_t* codes = a.codes + r0 * a.k;
  const float* ascale = a.scales + r0 * a.chunks.count;
  DG_INT8_AMX_CHUNK(0, 1, 2, 0);
  for (std::int64_t ch = 0; ch < a.chunks.count; ++ch) {
    const bool odd = ch & 1;
    if (ch + 1 < a.chunks.count) {
      if (odd) DG_INT8_AMX_CHUNK(0, 1, 2, ch + 1);
      else DG_INT8_AMX_CHUNK(6, 7, 3, ch + 1);
    }
    if (odd) {
      _tile_stored(6, sums[0], 64);
      _tile_stored(7, sums[1], 64);
    } else {
      _tile_stored(0, sums[0], 64);
      _tile_stored(1, sums[1], 64);
    }
    const __m512 ws0 = _mm512_loadu_ps(p0.scale + ch * kPanel), ws1 = _mm512_loadu_ps(p1.scale + ch * kPanel);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const __m512 as = _mm512_set1_ps(ascale[i * a.chunks.count + ch]);
      f0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[0] + i * kPanel)), _mm512_mul_ps(ws0, as), f0[i]);
      f1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[1] + i * kPanel)), _mm512_mul_ps(ws1, as), f1[i]);
    }
  }
  const __mmask16 m0 = avx512::lanes(nvalid0), m1 = avx512::lanes(nvalid1);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i < rows) {
      float* out = y + (r0 + i) * ldy;
      _mm512_mask_storeu_ps(out, m0, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m0, out), f0[i]) : f0[i]);
      _mm512_mask_storeu_ps(out + kPanel, m1,
                            accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m1, out + kPanel), f1[i]) : f1[i]);
    }
  }
}

#undef DG_INT8_AMX_CHUNK

// Fewest rows of a partial block worth a whole tile: below, the VNNI kernel's cost per row (about
// five times a tile row's) is less than the 16 rows the tile computes.
inline constexpr std::int64_t kMinTileRows = 4;

// y[:, n0:n1) (+)= a times rows [n0, n1) of q, two panels at a time (n0 a multiple of 16), as
// int8::product_columns with Form::kAvx512Vnni: the same bits. Needs k_step(a) > 0.
// A partial last block of at least kMinTileRows rows takes the tiles too, from a copy of its codes
// padded to 16 rows (rows never mix, so the padding changes no valid row); fewer take vpdpbusd.
inline void product_columns(const QuantizedMatrix& q, const Activations& a, std::int64_t n0, std::int64_t n1, float* y,
                            std::int64_t ldy, bool accumulate) {
  const std::int64_t step = k_step(a);
  const std::int64_t full = a.m / 16 * 16, tail = a.m - full;
  const bool tiled_tail = tail >= kMinTileRows;
  Activations rest = a;
  rest.codes = a.codes + full * a.k;
  rest.scales = a.scales + full * a.chunks.count;
  rest.m = tail;
  if (tiled_tail) {  // 16 rows: the tail's codes and scales, then code 128 (zero) and scale 0
    std::uint8_t* codes = kernels::scratch<std::uint8_t, 16>(static_cast<std::size_t>(16 * a.k));
    float* scales = kernels::scratch<float, 16>(static_cast<std::size_t>(16 * a.chunks.count));
    std::copy(rest.codes, rest.codes + tail * a.k, codes);
    std::fill(codes + tail * a.k, codes + 16 * a.k, std::uint8_t{128});
    std::copy(rest.scales, rest.scales + tail * a.chunks.count, scales);
    std::fill(scales + tail * a.chunks.count, scales + 16 * a.chunks.count, 0.0f);
    rest.codes = codes;
    rest.scales = scales;
    rest.m = 16;
  }
  const bool tiles = full > 0 || tiled_tail;
  const Panel p0 = panel_scratch(q.cols, a.chunks);
  Panel p1;
  p1.values = kernels::scratch<std::int8_t, 15>(panel_value_bytes(q.cols));
  p1.offset = kernels::scratch<std::int32_t, 15>(static_cast<std::size_t>(a.chunks.count * kPanel));
  p1.scale = kernels::scratch<float, 15>(static_cast<std::size_t>(a.chunks.count * kPanel));
  if (tiles) configure(step);
  float* y_tail = y + full * ldy;
  for (std::int64_t c = n0; c < n1; c += 2 * kPanel) {
    const std::int64_t nvalid0 = std::min(kPanel, n1 - c);
    avx512vnni::unpack_panel(q, c, a.chunks, p0);
    // A last odd panel goes through the pair kernel with itself as the second, which is not stored.
    const bool two = c + kPanel < n1;
    const std::int64_t nvalid1 = two ? std::min(kPanel, n1 - c - kPanel) : 0;
    if (two) avx512vnni::unpack_panel(q, c + kPanel, a.chunks, p1);
    const Panel& second = two ? p1 : p0;
    for (std::int64_t r = 0; r < full; r += 16) {
      block_product(a, r, 16, p0, second, step, nvalid0, nvalid1, y + c, ldy, accumulate);
    }
    if (tiled_tail) {
      block_product(rest, 0, tail, p0, second, step, nvalid0, nvalid1, y_tail + c, ldy, accumulate);
    } else if (tail > 0) {
      avx512vnni::panel_product(rest, p0, nvalid0, y_tail + c, ldy, accumulate);
      if (two) avx512vnni::panel_product(rest, p1, nvalid1, y_tail + c + kPanel, ldy, accumulate);
    }
  }
  if (tiles) _tile_release();
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::int8::amx

#endif  // DG_X86_KERNELS
