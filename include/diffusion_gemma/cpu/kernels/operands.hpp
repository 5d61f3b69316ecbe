// SPDX-License-Identifier: Apache-2.0
// What every CPU product kernel receives: C[m, n] (+)= A[m, k] * op(B), with A fp32 activations
// (row-major) and B in its stored dtype (F32, BF16 or F16), read in place. B is either a torch
// Linear weight [n, k] (y = x W^T, the `kNK` form) or a [k, n] matrix (y = x B, the `kKN` form:
// the self-conditioning product P E and the attention's P V). Rows of B may start anywhere (a
// memory-mapped checkpoint gives no alignment): kernels use unaligned loads only.
#pragma once

#include <algorithm>
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
  void step() { take(per_step_); }
  // Lines one step requests; a kernel's inner loop may take them a few at a time (take) instead of
  // all at once: a burst of requests fills the core's miss buffers and stalls it.
  std::int64_t per_step() const { return per_step_; }
  void take(std::int64_t lines) {
    walk(lines, [](const void* line) { __builtin_prefetch(line, 0, 2); });
  }
  // The same walk with `request(line)` called for each line (a test sees what would be requested).
  template <class Request>
  void step(Request&& request) {
    walk(per_step_, request);
  }

 private:
  template <class Request>
  void walk(std::int64_t lines, Request&& request) {
    for (std::int64_t i = 0; i < lines && run_ < src_.runs; ++i) {
      request(reinterpret_cast<const void*>(next_));
      next_ += 64;
      if (next_ > last_) {
        ++run_;
        enter_run();
      }
    }
  }

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

// How many blocks ahead a product requests its weights. One block of a product with few rows is
// computed in less time than its weights take to arrive from memory; two ahead gave 1.05-1.17x at
// 16-128 rows with the weights in DRAM on a Zen 3, and 0.99-1.06x at 512 (benchmarks/cpu/panel_prefetch).
constexpr std::int64_t kPrefetchAhead = 2;

// Where a row-major B's block of kc depth x nvalid columns lies: nvalid rows of kc elements (kNK)
// or kc rows of nvalid (kKN).
inline PanelSource matrix_source(const MatrixB& b, std::int64_t n0, std::int64_t nvalid, std::int64_t k0,
                                 std::int64_t kc) {
  const std::size_t es = dtype_size(b.dtype), stride = static_cast<std::size_t>(b.ld) * es;
  if (b.form == BForm::kKN)
    return {b.row(k0) + static_cast<std::size_t>(n0) * es, kc, static_cast<std::size_t>(nvalid) * es, stride};
  return {b.row(n0) + static_cast<std::size_t>(k0) * es, nvalid, static_cast<std::size_t>(kc) * es, stride};
}

// The blocking of an fp32 register-tile family: depth per panel, panel width, tile rows.
struct TileShape {
  std::int64_t kc, nr, mr;
};
// Rows of A one pass over the panels works on: a block of A (rows x kc floats) of at most this
// many bytes stays in L2 while every panel of its depth block runs over it. Without the bound a
// block of a long pass (1024 rows x 256 deep, 1 MiB) was read back from L3 for every panel: the
// AVX2 product of 512 and 1024 rows ran at 71-90 GFLOP/s per thread against 100-109 in groups
// (forced to AVX2 on the AMX Xeon, k 2048, n 1024; docs/design.md). Up to 256 rows at depth 256 stay
// one group: the engine's passes (max_pass_tokens 256) measured the same either way.
constexpr std::int64_t kRowGroupBytes = 256 * 1024;

// Rows per group for m rows: groups of equal size (a multiple of the tile's rows), each at most
// about kRowGroupBytes of A.
inline std::int64_t row_group_rows(const TileShape& shape, std::int64_t m, std::int64_t kc) {
  const std::int64_t cap = std::max<std::int64_t>(shape.mr, kRowGroupBytes / (kc * std::int64_t{sizeof(float)}));
  const std::int64_t groups = (m + cap - 1) / cap;
  const std::int64_t rows = (m + groups - 1) / groups;
  return (rows + shape.mr - 1) / shape.mr * shape.mr;
}

// Requests rows [m0, m1) x columns [n0, n0 + nr) of C (clipped to n) into L1. A tile loads its C
// tile before its first FMA, and every FMA waits on it; after the first depth block C has left L1
// (a pass's output, 256 x 1024 floats, is 1 MiB), so each tile began with a wait on L2 or L3.
// Requested one tile ahead it is there in time: on a Zen 2 the vocabulary pass's two products ran
// at 76 and 70 GFLOP/s per thread inside the engine, and at 79-80 with the request
// (docs/design.md, "exact"). The bits do not change.
inline void request_c_tile(const float* c, std::int64_t ldc, std::int64_t m0, std::int64_t m1, std::int64_t n0,
                           std::int64_t n, std::int64_t nr) {
  if (n0 >= n) return;
  const std::int64_t last = std::min(nr, n - n0) - 1;
  for (std::int64_t r = m0; r < m1; ++r) {
    __builtin_prefetch(c + r * ldc + n0, 1, 3);
    __builtin_prefetch(c + r * ldc + n0 + last, 1, 3);
  }
}

// How a family's tiles read A. RowsInPlace: where it lies, each tile's rows lda apart. A family
// that lays A out for its tiles (the AVX2 one: each tile's rows interleaved by depth) provides the
// same two members: block(rows, kc), room for a row group's block (nullptr: A stays in place),
// and tile(a, lda, m0, m1, k0, kc, out), rows [m0, m1) (one tile's) over depth [k0, k0 + kc) laid
// out at out.
struct RowsInPlace {
  float* block(std::int64_t, std::int64_t) const { return nullptr; }
  void tile(const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*) const {}
};

// Requests rows [m0, m1) of A over depth [k0, k0 + kc): the rows the next tile lays out, asked
// for while this one computes.
inline void request_a_rows(const float* a, std::int64_t lda, std::int64_t m0, std::int64_t m1, std::int64_t k0,
                           std::int64_t kc) {
  for (std::int64_t r = m0; r < m1; ++r) {
    const char* row = reinterpret_cast<const char*>(a + r * lda + k0);
    const std::int64_t bytes = kc * static_cast<std::int64_t>(sizeof(float));
    for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
    __builtin_prefetch(row + bytes - 1, 0, 3);
  }
}

// C (+)= A op(B) in blocks of shape.kc depth x shape.nr columns, the loop the AVX2 and AVX-512
// families share: for each depth block and each group of rows (row_group_rows),
// pack_rows may lay the group's block of A out for the tile, one tile at a time while the first
// panel runs (each tile's rows at packed + (m0 - g0) * kc, the tile then handed that and shape.mr
// for lda, and the next tile's rows requested meanwhile: packing a whole block before its first
// tile waited on A's loads with nothing to compute),
// fill_panel(n0, nvalid, k0, kc) returns the block's panel (an fp32 panel it has just written, or
// the packed weights themselves where the tile reads them directly), and
// tile(rows, a, lda, panel, kc, c, ldc, load_c, nvalid) computes C[rows x nr] (+)= A[rows x kc]
// panel over the group's rows of A, storing only the first `nvalid` columns of C.
// source(n0, nvalid, k0, kc) says where a block's weights are, so that the block kPrefetchAhead
// ahead (in the order the panels are filled) is requested a few lines per row tile while the tile
// works: the tile is bound by arithmetic, the weights stream from memory, and without the request
// each panel fill waits on its loads. Every C element stays one chain over k in order, whatever
// the blocking.
template <class Tile, class FillPanel, class Source, class PackRows = RowsInPlace>
inline void blocked_product(const TileShape& shape, Tile&& tile, const float* a, std::int64_t lda, std::int64_t m,
                            std::int64_t n, std::int64_t k, float* c, std::int64_t ldc, bool accumulate,
                            FillPanel&& fill_panel, Source&& source, PackRows&& pack_rows = PackRows{}) {
  if (k == 0) {
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = 0.0f;
    return;
  }
  const std::int64_t panels = (n + shape.nr - 1) / shape.nr;
  const std::int64_t group = row_group_rows(shape, m, std::min(k, shape.kc));
  const std::int64_t groups = (m + group - 1) / group;
  PanelPrefetcher prefetch;
  for (std::int64_t k0 = 0; k0 < k; k0 += shape.kc) {
    const std::int64_t kc = k - k0 < shape.kc ? k - k0 : shape.kc;
    const bool load_c = accumulate || k0 > 0;
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t g0 = g * group, g1 = std::min(m, g0 + group);
      const std::int64_t tiles = (g1 - g0 + shape.mr - 1) / shape.mr;
      float* packed = pack_rows.block(g1 - g0, kc);
      for (std::int64_t n0 = 0; n0 < n; n0 += shape.nr) {
        const std::int64_t nvalid = n - n0 < shape.nr ? n - n0 : shape.nr;
        const auto* panel = fill_panel(n0, nvalid, k0, kc);
        // The panel filled kPrefetchAhead fills from now: panels run fastest, then groups, then depth.
        const std::int64_t ahead = (k0 / shape.kc * groups + g) * panels + n0 / shape.nr + kPrefetchAhead;
        const std::int64_t next_n0 = (ahead % panels) * shape.nr, next_k0 = ahead / (panels * groups) * shape.kc;
        if (next_k0 < k) {
          const std::int64_t next_kc = k - next_k0 < shape.kc ? k - next_k0 : shape.kc;
          prefetch.start(source(next_n0, n - next_n0 < shape.nr ? n - next_n0 : shape.nr, next_k0, next_kc), tiles);
        } else {
          prefetch.start(PanelSource{}, tiles);
        }
        for (std::int64_t m0 = g0; m0 < g1; m0 += shape.mr) {
          const std::int64_t rows = g1 - m0 < shape.mr ? g1 - m0 : shape.mr;
          prefetch.step();
          if (load_c) {  // the tile after this one: down the group, then the next panel's first
            const bool down = m0 + shape.mr < g1;
            const std::int64_t next = down ? m0 + shape.mr : g0;
            request_c_tile(c, ldc, next, std::min(g1, next + shape.mr), down ? n0 : n0 + shape.nr, n, shape.nr);
          }
          if (packed != nullptr) {
            if (n0 == 0) {
              pack_rows.tile(a, lda, m0, m0 + rows, k0, kc, packed + (m0 - g0) * kc);
              if (m0 + shape.mr < g1) request_a_rows(a, lda, m0 + shape.mr, std::min(g1, m0 + 2 * shape.mr), k0, kc);
            }
            tile(rows, packed + (m0 - g0) * kc, shape.mr, panel, kc, c + m0 * ldc + n0, ldc, load_c, nvalid);
          } else {
            tile(rows, a + m0 * lda + k0, lda, panel, kc, c + m0 * ldc + n0, ldc, load_c, nvalid);
          }
        }
      }
    }
  }
}

// `count` elements of `buffer` starting on a cache line (grown as needed, never shrunk). A tile or
// vector row that straddles two lines is two loads: the AMX-INT8 product ran 1.45x slower from the
// 16-byte alignment malloc happened to give one build.
template <class T>
T* cache_aligned(std::vector<T>& buffer, std::size_t count) {
  constexpr std::size_t kAlign = 64;
  static_assert(kAlign % sizeof(T) == 0, "aligned elements must divide a cache line");
  const std::size_t slack = kAlign / sizeof(T);
  if (buffer.size() < count + slack) buffer.resize(count + slack);
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + ((kAlign - at % kAlign) % kAlign) / sizeof(T);
}

// Per-thread scratch that grows and is kept (OpenMP threads live as long as the process), aligned
// to a cache line; one buffer per element type and slot.
template <class T, int kSlot>
T* scratch(std::size_t count) {
  thread_local std::vector<T> buffer;
  return cache_aligned(buffer, count);
}

}  // namespace diffusion_gemma::cpu::kernels
