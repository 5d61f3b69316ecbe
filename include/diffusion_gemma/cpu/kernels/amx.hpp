// SPDX-License-Identifier: Apache-2.0
// AMX-BF16 products for the fast precision: activations rounded to bf16 (round to nearest even),
// products accumulated in fp32 on the tiles. Weights are read in the checkpoint's own row-major
// layout, never repacked at load:
//
//   y = x W^T (W [n, k], a torch Linear weight): W is the tiles' A operand, 16 rows x 32 k loaded
//     straight from the mapped file with the row stride, and x is packed once per call into the
//     B operand's pair-interleaved layout (16 pairs of k x 16 rows of x per 1 KiB tile). The tile
//     result is y^T, transposed on the way out. BF16 weights need no conversion; F32 and F16
//     weights, and blocks cut by the matrix edges, are staged through a bf16 copy of 32 rows.
//   y = x W^T from a packed weight (pack_weight_tiles, made once per model for the engines that
//     use the tiles): x is the A operand (bf16 rows in whole tiles) and W the B operand, its tiles laid out in
//     the order the kernel reads them, so the tile result is y itself and is stored straight into
//     it. Each output is the same sum of the same products in the same order as above (the products
//     only swap sides), so both forms give bitwise equal results; this one skips the transpose.
//   y = x B (B [k, n]: the self-conditioning product P E): x is the A operand (bf16 rows in whole tiles), and
//     B's tiles are built per 32-column strip by interleaving pairs of B rows.
//
// Tiles 0-3 accumulate, 4-5 hold A, 6-7 hold B (16 rows x 64 bytes each). The tile state is
// released at the end of every call: a thread left holding it makes every later context switch
// save and restore 8 KiB more.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/avx512_bf16.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::amx {

inline constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Elements of the packed activations for an [m, k] input (either layout below).
inline std::size_t packed_size(std::int64_t m, std::int64_t k) {
  return static_cast<std::size_t>(round_up(m, 32) * round_up(k, 32));
}

// The 64-byte tile configuration of palette 1 (8 tiles): bytes per row and rows of each tile.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// ldtilecfg with the whole configuration as its memory operand. GCC 12's _tile_loadconfig tells
// the compiler it reads only the first 8 bytes, so the stores of the tiles' widths could be
// dropped as dead, and ldtilecfg then faults (rows without bytes); seen with the int8 tiles' one.
// Plain asm needs no target attribute, so every kernel family's target region can call it.
inline void load_config(const TileConfig& cfg) { __asm__ volatile("ldtilecfg %0" : : "m"(cfg)); }

DG_BEGIN_TARGET_AMX

// The bf16 operand layouts this file shares with the AVX512-BF16 dot products.
using avx512_bf16::build_pair_tile;
using avx512_bf16::load_bf16x16_wide;
using avx512_bf16::load_bf16x32;
using avx512_bf16::pack_activations_pairs;
using avx512_bf16::store_transposed;

inline void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  load_config(cfg);
}

// x [m, k] fp32 -> the A operand: bf16 rows, zero padded, cut into 16 x 32 tiles stored whole
// (tile (mb, kb) at a_tile(out, mb, kb, ceil(k / 32)), its rows 64 bytes apart). A tile loaded
// from whole rows instead (row stride 2 k bytes) measured 1.1-1.8x slower in the products below:
// its 16 rows fall on few L1 sets and as many prefetch streams.
inline void pack_activations_rows(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k,
                                  std::uint16_t* out) {
  const std::int64_t mp = round_up(m, 16), kb_count = (k + 31) / 32;
  for (std::int64_t r = 0; r < mp; ++r) {
    std::uint16_t* dst = out + (r / 16 * kb_count * 16 + r % 16) * 32;
    for (std::int64_t kb = 0; kb < kb_count; ++kb) {
      const std::int64_t c = kb * 32;
      const __m512i v = r < m ? load_bf16x32<DType::kF32>(reinterpret_cast<const std::byte*>(x + r * ldx + c), k - c)
                              : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + kb * 512, v);
    }
  }
}
// Tile (mb, kb) of an A operand from pack_activations_rows; load it with a 64-byte row stride.
inline const std::uint16_t* a_tile(const std::uint16_t* a, std::int64_t mb, std::int64_t kb, std::int64_t kb_count) {
  return a + (mb * kb_count + kb) * 512;
}

// 32 rows of W (from row n0, `rows` of them) as bf16 [32][kp], zero outside W.
template <DType T>
inline void stage_rows(const MatrixB& w, std::int64_t n0, std::int64_t rows, std::int64_t k, std::uint16_t* slab) {
  const std::int64_t kp = round_up(k, 32);
  for (std::int64_t r = 0; r < 32; ++r) {
    for (std::int64_t c = 0; c < kp; c += 32) {
      const __m512i v = r < rows ? load_bf16x32<T>(w.row(n0 + r) + static_cast<std::size_t>(c) * dtype_size(T), k - c)
                                 : _mm512_setzero_si512();
      _mm512_storeu_si512(slab + r * kp + c, v);
    }
  }
}

// y[m, n] (+)= x W^T for W [n, k] (BForm::kNK) from activations packed by pack_activations_pairs.
// The depth is cut into blocks of kDepthTiles x 32 so that the 32 rows of W in use stay in cache while
// every tile pair of x streams past them; partial sums of those 32 rows wait, as tiles, in a small
// buffer between the blocks and are transposed out once.
template <DType T>
inline void xwt(const MatrixB& w, const std::uint16_t* xp, std::int64_t m, std::int64_t k, std::int64_t n, float* y,
                std::int64_t ldy, bool accumulate) {
  // 32 rows x 2048 bf16 of W = 128 KiB, held in L2. Measured on the medium prefill (depth 1024 and
  // 2048): blocks of 512 (W in L1, but partial tiles stored and reloaded twice as often and x
  // streamed from L2 once per block) were 5-10 % slower than 2048 or no blocking at all.
  constexpr std::int64_t kDepthTiles = 64;
  const std::int64_t mb_count = (m + 15) / 16, kb_count = (k + 31) / 32, kp = kb_count * 32;
  std::uint16_t* slab = scratch<std::uint16_t, 1>(static_cast<std::size_t>(32 * kp));
  float* tiles = scratch<float, 2>(4 * 256);
  float* partial = scratch<float, 11>(static_cast<std::size_t>((mb_count + 1) * 2 * 256));
  // The next 32 rows of W are requested into L2 while these are multiplied: W streams from memory
  // (the LM head reads the whole embedding once per pass), and tile loads that miss wait for
  // each line in turn.
  PanelPrefetcher prefetch;
  const std::int64_t steps = (mb_count + 1) / 2 * kb_count;
  configure();
  for (std::int64_t n0 = 0; n0 < n; n0 += 32) {
    const std::int64_t rows = n - n0 < 32 ? n - n0 : 32;
    const bool two = rows > 16;
    const bool direct = T == DType::kBF16 && rows == 32 && k % 32 == 0;
    PanelSource next;
    if (n0 + 32 < n) {
      next.base = w.row(n0 + 32);
      next.runs = n - n0 - 32 < 32 ? n - n0 - 32 : 32;
      next.bytes = static_cast<std::size_t>(k) * dtype_size(T);
      next.stride = static_cast<std::size_t>(w.ld) * dtype_size(T);
    }
    prefetch.start(next, steps);
    if (!direct) stage_rows<T>(w, n0, rows, k, slab);
    const std::uint16_t* a0 = direct ? reinterpret_cast<const std::uint16_t*>(w.row(n0)) : slab;
    const std::uint16_t* a1 = direct ? reinterpret_cast<const std::uint16_t*>(w.row(n0 + 16)) : slab + 16 * kp;
    const std::int64_t stride = direct ? w.ld * 2 : kp * 2;
    for (std::int64_t kb0 = 0; kb0 < kb_count; kb0 += kDepthTiles) {
      const std::int64_t kb1 = kb0 + kDepthTiles < kb_count ? kb0 + kDepthTiles : kb_count;
      const bool first = kb0 == 0, last = kb1 == kb_count;
      for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
        const bool twom = mb + 1 < mb_count;
        float* part = partial + mb * 2 * 256;  // tiles (mb, half 0), (mb, 1), (mb + 1, 0), (mb + 1, 1)
        if (first) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        } else {
          _tile_loadd(0, part, 64);
          _tile_loadd(1, part + 512, 64);
          _tile_loadd(2, part + 256, 64);
          _tile_loadd(3, part + 768, 64);
        }
        for (std::int64_t kb = kb0; kb < kb1; ++kb) {
          prefetch.step();
          _tile_loadd(4, a0 + kb * 32, stride);
          _tile_loadd(6, xp + (mb * kb_count + kb) * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (twom) {
            _tile_loadd(7, xp + ((mb + 1) * kb_count + kb) * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (two) {
            _tile_loadd(5, a1 + kb * 32, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (twom) _tile_dpbf16ps(3, 5, 7);
          }
        }
        if (!last) {
          _tile_stored(0, part, 64);
          _tile_stored(1, part + 512, 64);
          _tile_stored(2, part + 256, 64);
          _tile_stored(3, part + 768, 64);
          continue;
        }
        _tile_stored(0, tiles, 64);
        _tile_stored(1, tiles + 256, 64);
        _tile_stored(2, tiles + 512, 64);
        _tile_stored(3, tiles + 768, 64);
        for (int i = 0; i < (two ? 2 : 1); ++i) {
          for (int j = 0; j < (twom ? 2 : 1); ++j) {
            const std::int64_t t0 = (mb + j) * 16;
            const std::int64_t nt = m - t0 < 16 ? m - t0 : 16;
            const std::int64_t ni = rows - 16 * i < 16 ? rows - 16 * i : 16;
            store_transposed(tiles + (2 * i + j) * 256, ni, nt, y + t0 * ldy + n0 + 16 * i, ldy, accumulate);
          }
        }
      }
    }
  }
  _tile_release();
}

// C tile (16 x 16 fp32) to c (row stride ldc), adding to it or not, cut to rows x cols.
inline void store_tile_rows(const float* tile, std::int64_t rows, std::int64_t cols, float* c, std::int64_t ldc,
                            bool accumulate) {
  const __mmask16 m = avx512::lanes(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const __m512 v = _mm512_loadu_ps(tile + r * 16);
    float* dst = c + r * ldc;
    _mm512_mask_storeu_ps(dst, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), v) : v);
  }
}

// Elements of a packed [n, k] weight: tiles of 16 columns x 32 k, zero padded.
inline std::size_t packed_weight_size(std::int64_t n, std::int64_t k) {
  return static_cast<std::size_t>(round_up(n, 16) * round_up(k, 32));
}
// Offset of column (output feature) n0, a multiple of 16, in a packed weight of depth k.
inline std::size_t packed_weight_offset(std::int64_t n0, std::int64_t k) { return pair_panel_offset(n0, k); }

// W [n, k] (BForm::kNK) -> B tiles: tile (nb, kb) at (nb * ceil(k / 32) + kb) * 512 holds, in
// row p and 32-bit column j, the pair (W[16 nb + j][32 kb + 2p], W[16 nb + j][32 kb + 2p + 1]):
// a 16 x 16 transpose of 32-bit pairs. F32 and F16 weights are rounded to bf16 as stage_rows does.
template <DType T>
inline void pack_weight_tiles(const MatrixB& w, std::int64_t n, std::int64_t k, std::uint16_t* out) {
  const std::int64_t nb_count = (n + 15) / 16, kb_count = (k + 31) / 32;
  for (std::int64_t nb = 0; nb < nb_count; ++nb) {
    for (std::int64_t kb = 0; kb < kb_count; ++kb) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        const std::int64_t row = nb * 16 + j;
        r[j] = row < n ? _mm512_castsi512_ps(load_bf16x32<T>(w.row(row) + static_cast<std::size_t>(kb * 32) * dtype_size(T),
                                                             k - kb * 32))
                       : _mm512_setzero_ps();
      }
      avx512::transpose16(r);
      std::uint16_t* tile = out + (nb * kb_count + kb) * 512;
      for (int p = 0; p < 16; ++p) _mm512_storeu_ps(reinterpret_cast<float*>(tile + p * 32), r[p]);
    }
  }
}

// The shared inner loop of the products whose A operand is whole tiles: tiles 0-3 (already zeroed
// or loaded) += A row blocks {a0, a1} x B column blocks {b0, b1} over kbs depth tiles; A tiles are
// 512 elements apart along the depth, B tiles `b_step` apart. Without the second row block
// (`twom`) or column block (`twon`) only tiles 0 and 1, or 0 and 2, are touched.
inline void accumulate_2x2(const std::uint16_t* a0, const std::uint16_t* a1, const std::uint16_t* b0,
                           const std::uint16_t* b1, std::int64_t b_step, std::int64_t kbs, bool twom, bool twon) {
  for (std::int64_t kb = 0; kb < kbs; ++kb) {
    _tile_loadd(4, a0 + kb * 512, 64);
    _tile_loadd(6, b0 + kb * b_step, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (twon) {
      _tile_loadd(7, b1 + kb * b_step, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (twom) {
      _tile_loadd(5, a1 + kb * 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      if (twon) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

inline void store_tile(int t, float* dst, std::int64_t stride_bytes) {
  switch (t) {
    case 0: _tile_stored(0, dst, stride_bytes); break;
    case 1: _tile_stored(1, dst, stride_bytes); break;
    case 2: _tile_stored(2, dst, stride_bytes); break;
    default: _tile_stored(3, dst, stride_bytes); break;
  }
}

// y[m, n] (+)= x W^T from activations packed by pack_activations_rows and W packed by
// pack_weight_tiles (`wp` at the first of the n columns). Tiles: 0-3 accumulate (m tile i, n tile j
// in 2 i + j), 4-5 hold x, 6-7 hold W.
inline void xw_packed(const std::uint16_t* wp, const std::uint16_t* xa, std::int64_t m, std::int64_t k, std::int64_t n,
                      float* y, std::int64_t ldy, bool accumulate) {
  const std::int64_t mb_count = (m + 15) / 16, kb_count = (k + 31) / 32, nb_count = (n + 15) / 16;
  float* tile = scratch<float, 2>(256);
  configure();
  for (std::int64_t nb = 0; nb < nb_count; nb += 2) {
    const bool twon = nb + 1 < nb_count;
    const std::uint16_t* b0 = wp + nb * kb_count * 512;
    const std::uint16_t* b1 = b0 + kb_count * 512;
    for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
      const bool twom = mb + 1 < mb_count;
      const std::uint16_t* a0 = a_tile(xa, mb, 0, kb_count);
      const std::uint16_t* a1 = a_tile(xa, mb + 1, 0, kb_count);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      accumulate_2x2(a0, a1, b0, b1, 512, kb_count, twom, twon);
      for (int i = 0; i < (twom ? 2 : 1); ++i) {
        for (int j = 0; j < (twon ? 2 : 1); ++j) {
          const std::int64_t r0 = (mb + i) * 16, c0 = (nb + j) * 16;
          const std::int64_t rows = m - r0 < 16 ? m - r0 : 16, cols = n - c0 < 16 ? n - c0 : 16;
          float* dst = y + r0 * ldy + c0;
          if (!accumulate && rows == 16 && cols == 16) {
            store_tile(2 * i + j, dst, ldy * 4);
          } else {  // the sum is made from zero and added after, as xwt does
            store_tile(2 * i + j, tile, 64);
            store_tile_rows(tile, rows, cols, dst, ldy, accumulate);
          }
        }
      }
    }
  }
  _tile_release();
}

// Every B tile of B [k, n] (fp32 rows), tile (kb, nb) at (kb * ceil(n / 16) + nb) * 512: the
// attention's values, prepared once per layer and read by every query block.
inline void pack_pair_tiles(const float* b, std::int64_t ldb, std::int64_t k, std::int64_t n, std::uint16_t* out) {
  MatrixB m;
  m.data = reinterpret_cast<const std::byte*>(b);
  m.dtype = DType::kF32;
  m.ld = ldb;
  m.form = BForm::kKN;
  const std::int64_t kb_count = (k + 31) / 32, nb_count = (n + 15) / 16;
  for (std::int64_t kb = 0; kb < kb_count; ++kb)
    for (std::int64_t nb = 0; nb < nb_count; ++nb) build_pair_tile<DType::kF32>(m, k, n, kb, nb * 16, out + (kb * nb_count + nb) * 512);
}

// Attention scores on tiles: s[r][16 t + j] = q[r] . key[16 (t0 + t) + j] for rows r < m and key
// tiles t in [0, tiles), q as an A operand over [m, d] (pack_activations_rows) and the
// keys as pair tiles (pack_activations_pairs over [keys, d]: tile (key tile, d block)). s rows are
// `lds` floats apart and must hold round_up(m, 16) rows and 16 * tiles columns.
inline void scores_on_tiles(const std::uint16_t* q, std::int64_t m, std::int64_t d, const std::uint16_t* keys,
                            std::int64_t t0, std::int64_t tiles, float* s, std::int64_t lds) {
  const std::int64_t mb_count = (m + 15) / 16, db_count = (d + 31) / 32;
  configure();
  for (std::int64_t t = 0; t < tiles; t += 2) {
    const bool two = t + 1 < tiles;
    for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
      const bool twom = mb + 1 < mb_count;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const std::uint16_t* k0 = keys + (t0 + t) * db_count * 512;
      accumulate_2x2(a_tile(q, mb, 0, db_count), a_tile(q, mb + 1, 0, db_count), k0, k0 + db_count * 512, 512,
                     db_count, twom, two);
      float* c = s + mb * 16 * lds + t * 16;
      _tile_stored(0, c, lds * 4);
      if (two) _tile_stored(1, c + 16, lds * 4);
      if (twom) {
        _tile_stored(2, c + 16 * lds, lds * 4);
        if (two) _tile_stored(3, c + 16 * lds + 16, lds * 4);
      }
    }
  }
  _tile_release();
}

// Attention output on tiles: o[r][:d] (+)= p[r] . V over key blocks [kb0, kb0 + kbs) of 32, p given
// as an A operand over [m, 32 kbs] (pack_activations_rows) and V as pair tiles (pack_pair_tiles over [keys, d]).
inline void values_on_tiles(const std::uint16_t* p, std::int64_t m, const std::uint16_t* values, std::int64_t kb0,
                            std::int64_t kbs, std::int64_t d, float* o, std::int64_t ldo, bool accumulate) {
  const std::int64_t mb_count = (m + 15) / 16, nb_count = (d + 15) / 16;
  float* tiles = scratch<float, 2>(4 * 256);
  configure();
  for (std::int64_t nb = 0; nb < nb_count; nb += 2) {
    const bool two = nb + 1 < nb_count;
    for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
      const bool twom = mb + 1 < mb_count;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const std::uint16_t* v0 = values + (kb0 * nb_count + nb) * 512;
      accumulate_2x2(a_tile(p, mb, 0, kbs), a_tile(p, mb + 1, 0, kbs), v0, v0 + 512, nb_count * 512, kbs, twom, two);
      _tile_stored(0, tiles, 64);
      _tile_stored(1, tiles + 256, 64);
      _tile_stored(2, tiles + 512, 64);
      _tile_stored(3, tiles + 768, 64);
      for (int i = 0; i < (twom ? 2 : 1); ++i) {
        for (int j = 0; j < (two ? 2 : 1); ++j) {
          const std::int64_t r0 = (mb + i) * 16, c0 = (nb + j) * 16;
          store_tile_rows(tiles + (2 * i + j) * 256, m - r0 < 16 ? m - r0 : 16, d - c0 < 16 ? d - c0 : 16,
                          o + r0 * ldo + c0, ldo, accumulate);
        }
      }
    }
  }
  _tile_release();
}

// The B tiles of columns [c0, c0 + cols) of B [k, n] (BForm::kKN) (cols a multiple of 16 or
// reaching n): tile (nb, kb), nb counted from c0, at (nb * ceil(k / 32) + kb) * 512, as
// build_pair_tile lays it out. Each pair of B rows is read once, across all the columns: built a
// 32-column strip at a time, the 32 rows' 64-byte pieces 2 n bytes apart came from L3 at a stride
// the prefetchers did not follow, and the build took as long as the products.
template <DType T>
inline void build_pair_strips(const MatrixB& b, std::int64_t k, std::int64_t n, std::int64_t c0, std::int64_t cols,
                              std::uint16_t* out) {
  // Rows kAhead ahead are requested as each pair is read: these rows come from L3 or memory, and
  // a pair's work is too short to wait for them one line at a time.
  constexpr std::int64_t kAhead = 64;
  const std::int64_t kb_count = (k + 31) / 32, nb_count = (cols + 15) / 16;
  const std::size_t span = static_cast<std::size_t>(std::min(cols, n - c0)) * dtype_size(T);
  const std::size_t first = static_cast<std::size_t>(c0) * dtype_size(T);
  for (std::int64_t kb = 0; kb < kb_count; ++kb) {
    for (int p = 0; p < 16; ++p) {
      const std::int64_t r0 = kb * 32 + 2 * p;
      for (std::int64_t r = r0 + kAhead; r < r0 + kAhead + 2 && r < k; ++r) {
        const std::byte* row = b.row(r) + first;
        for (std::size_t o = 0; o < span; o += 64) __builtin_prefetch(row + o, 0, 2);
        __builtin_prefetch(row + span - 1, 0, 2);
      }
      for (std::int64_t nb = 0; nb < nb_count; ++nb) {
        const std::int64_t c = c0 + 16 * nb, count = n - c < 16 ? n - c : 16;
        const std::size_t off = static_cast<std::size_t>(c) * dtype_size(T);
        const __m512i lo = r0 < k ? load_bf16x16_wide<T>(b.row(r0) + off, count) : _mm512_setzero_si512();
        const __m512i hi = r0 + 1 < k ? load_bf16x16_wide<T>(b.row(r0 + 1) + off, count) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + (nb * kb_count + kb) * 512 + p * 32, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
  }
}

// y[m, n] (+)= x B for B [k, n] (BForm::kKN), x given as bf16 rows by pack_activations_rows.
// B's tiles are built for a group of 32-column strips at once: whole rows of B up to 2 MiB of tiles
// (the vocabulary pass's 1024 x 512 and 1024 x 1024 blocks of the embedding), read in order. On
// the AMX Xeon whole rows were 2-3 % faster over the pass than groups of 512 KiB.
template <DType T>
inline void xw(const MatrixB& b, const std::uint16_t* xa, std::int64_t m, std::int64_t k, std::int64_t n, float* y,
               std::int64_t ldy, bool accumulate) {
  const std::int64_t mb_count = (m + 15) / 16, kb_count = (k + 31) / 32;
  const std::int64_t group = std::max<std::int64_t>(32, (std::int64_t{1} << 20) / (kb_count * 32) / 32 * 32);
  std::uint16_t* bt = scratch<std::uint16_t, 3>(static_cast<std::size_t>(kb_count * 32 * group));
  // C tiles that overhang y go through `edge`, one 16 x 16 slot per tile. With `accumulate` they
  // start from y's values too (zero padded), so a row's sum is y + products in the tiles' order
  // whether or not its 16-row block is whole: the same bits for a row alone and inside a batch.
  float* edge = scratch<float, 2>(4 * 256);
  configure();
  for (std::int64_t n0 = 0; n0 < n; n0 += 32) {
    const std::int64_t cols = n - n0 < 32 ? n - n0 : 32;
    const bool two = cols > 16;
    const std::int64_t g0 = n0 / group * group;
    if (n0 == g0) build_pair_strips<T>(b, k, n, g0, n - g0 < group ? n - g0 : group, bt);
    const std::uint16_t* b0 = bt + (n0 - g0) / 16 * kb_count * 512;
    for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
      const bool twom = mb + 1 < mb_count;
      const auto inside = [&](int i, int j) { return (mb + i) * 16 + 16 <= m && n0 + 16 * j + 16 <= n; };
      const auto used = [&](int i, int j) { return (i == 0 || twom) && (j == 0 || two); };
      float* c[2][2];
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) c[i][j] = y + (mb + i) * 16 * ldy + n0 + 16 * j;
      // Where tile t reads and writes its C block: y itself (row stride ldy) or its edge slot (16).
      float* at[4];
      std::int64_t ld[4];
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 2; ++j) {
          const int t = 2 * i + j;
          at[t] = inside(i, j) ? c[i][j] : edge + t * 256;
          ld[t] = inside(i, j) ? ldy : 16;
          if (!accumulate || !used(i, j) || inside(i, j)) continue;
          const std::int64_t r0 = (mb + i) * 16, cj = n0 + 16 * j;
          for (std::int64_t r = 0; r < 16; ++r)
            for (std::int64_t q = 0; q < 16; ++q)
              at[t][r * 16 + q] = r0 + r < m && cj + q < n ? y[(r0 + r) * ldy + cj + q] : 0.0f;
        }
      }
      if (accumulate) {
        if (used(0, 0)) _tile_loadd(0, at[0], ld[0] * 4); else _tile_zero(0);
        if (used(0, 1)) _tile_loadd(1, at[1], ld[1] * 4); else _tile_zero(1);
        if (used(1, 0)) _tile_loadd(2, at[2], ld[2] * 4); else _tile_zero(2);
        if (used(1, 1)) _tile_loadd(3, at[3], ld[3] * 4); else _tile_zero(3);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      const std::uint16_t* a0 = a_tile(xa, mb, 0, kb_count);
      const std::uint16_t* a1 = a_tile(xa, mb + 1, 0, kb_count);
      accumulate_2x2(a0, a1, b0, b0 + kb_count * 512, 512, kb_count, twom, two);
      for (int i = 0; i < (twom ? 2 : 1); ++i) {
        for (int j = 0; j < (two ? 2 : 1); ++j) {
          const int t = 2 * i + j;
          store_tile(t, at[t], ld[t] * 4);
          if (inside(i, j)) continue;
          const std::int64_t r0 = (mb + i) * 16, cj = n0 + 16 * j;
          for (std::int64_t r = 0; r < 16 && r0 + r < m; ++r)
            for (std::int64_t q = 0; q < 16 && cj + q < n; ++q) y[(r0 + r) * ldy + cj + q] = at[t][r * 16 + q];
        }
      }
    }
  }
  _tile_release();
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::amx

#endif  // DG_X86_KERNELS
