// SPDX-License-Identifier: Apache-2.0
// The single entry point for products with a weight on the CPU: linear() (y = x W^T, every
// projection, MLP, router, self-conditioning MLP and the LM head), grouped_linear() (experts) and
// linear_transposed() (y = x W, the self-conditioning soft embedding P E). The kernel is chosen at
// run time from the engine's KernelContext (instruction set and precision), never from the flags
// the caller was compiled with.
//
// Precisions (docs/design.md, "The weight path"):
//   exact  fp32 activations and accumulation; BF16/F16 weights widened exactly in registers. The
//          products every parity test holds to (bitwise equal between the AVX2 and AVX-512 paths).
//   fast   on CPUs with AMX: activations rounded to bf16, fp32 accumulation on the tiles. On
//          AVX-512 CPUs with AVX512-BF16 and no AMX: the same products (the packed matrices, the
//          LM head, the soft embedding and attention) multiply activations rounded to bf16 with
//          dot products (cpu/kernels/avx512_bf16.hpp), twice the fp32 rate on a Zen 4. On AVX2
//          and AVX-512 CPUs: 4-bit integer weights multiply activations rounded to 8-bit integers
//          (cpu/kernels/int8_products.hpp; vpdpbusd with AVX512-VNNI), and on AMX CPUs, when
//          DG_CPU_INT8_TILES=1 opts in, the same products on AMX-INT8 tiles (cpu/kernels/int8_amx.hpp,
//          the same bits). The router is exact in both
//          precisions; every other product is exact, and so are products of at most 4 rows on AMX
//          and with the dot products, which only stream the weight.
//
// Quantized weights (docs/quantization.md) take the same kernels: blocks of rows are dequantised
// into a per-thread buffer in the scale's dtype (cpu/kernels/dequantize.hpp) and multiplied at
// once, so both precisions apply to them. Split weights (experts stored one matrix each) run
// part by part into their columns of y.
//
// matmul_nt / matmul_nn are the products of two activations (attention scores and values), with the
// same choice of kernels (bf16 tiles or dot products in the fast precision, fp32 otherwise).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/amx.hpp>
#include <diffusion_gemma/cpu/kernels/avx2.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/avx512_bf16.hpp>
#include <diffusion_gemma/cpu/kernels/dequantize_simd.hpp>
#include <diffusion_gemma/cpu/kernels/generic.hpp>
#include <diffusion_gemma/cpu/kernels/int8_amx.hpp>
#include <diffusion_gemma/cpu/kernels/int8_products.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>
#include <diffusion_gemma/cpu/parallel.hpp>
#include <diffusion_gemma/model/weight.hpp>

namespace diffusion_gemma::cpu {

enum class Precision { kExact, kFast, kSentinel };

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kExact: return "exact";
    case Precision::kFast: return "fast";
    case Precision::kSentinel: break;
  }
  return "?";
}

inline bool parse_precision(const std::string& s, Precision* out) {
  if (s == "exact") *out = Precision::kExact;
  else if (s == "fast") *out = Precision::kFast;
  else return false;
  return true;
}

// How one engine runs its kernels.
struct KernelContext {
  Isa isa = Isa::kGeneric;
  Precision precision = Precision::kExact;
  int threads = 0;  // 0: the OpenMP default
  // Every product picks its kernel by weight, precision and instruction set only, never by its
  // number of rows, so a row's result does not depend on the other rows in the pass: a sequence
  // computes the same bits alone or batched with others. Off, products of at most kStreamRows
  // rows (autoregressive decoding) stream the weight through fp32 dot products instead.
  bool row_invariant = true;
  // Opt in to AMX-INT8 tiles for the int8 products of 4-bit weights (DG_CPU_INT8_TILES=1).
  bool amx_int8 = int8_tiles_requested();

  // Whether weight products run on AMX tiles in bf16.
  bool bf16_tiles() const { return precision == Precision::kFast && isa == Isa::kAmx; }
  // Whether weight products take bf16 activations and weights through AVX512-BF16 dot products
  // (an AVX-512 CPU without AMX, or any CPU told DG_CPU_ISA=avx512, that has them).
  bool bf16_dots() const {
    return precision == Precision::kFast && isa == Isa::kAvx512 && cpu_features().avx512bf16;
  }
  // Whether a quantized weight's products take 8-bit integer activations: 4-bit weights on AVX2
  // and AVX-512 CPUs (measured faster than dequantised fp32 on a Zen 3 and a Zen 4). AMX machines
  // keep their bf16 tiles unless `amx_int8` opts in to the int8 tiles.
  bool int8_products(const QuantizedMatrix& q) const {
    const bool isa_ok = isa == Isa::kAvx2 || isa == Isa::kAvx512 || int8_tiles();
    return precision == Precision::kFast && isa_ok && kernels::int8::supported(q);
  }
  // Whether those int8 products run on AMX-INT8 tiles.
  bool int8_tiles() const {
    return amx_int8 && precision == Precision::kFast && isa == Isa::kAmx && cpu_features().amx_int8 &&
           cpu_features().avx512vnni;
  }
  // The product path in words, for `dgemma info` and benchmark output.
  std::string path() const {
    std::string s = std::string(isa_name(isa)) + ", " + precision_name(precision);
    if (precision == Precision::kFast) {
      if (bf16_tiles() && int8_tiles()) s += " (bf16 on AMX tiles, int8 activations x 4-bit weights on AMX-INT8 tiles)";
      else if (bf16_tiles()) s += " (bf16 on AMX tiles)";
      else if (bf16_dots()) s += " (bf16 dot products for the dense matrices but the router, int8 activations x 4-bit weights; otherwise exact)";
      else if (isa == Isa::kAvx2) s += " (int8 activations x 4-bit weights; otherwise exact)";
      else if (isa == Isa::kAvx512) s += " (int8 activations x 4-bit weights; otherwise exact: no AVX512-BF16)";
      else s += " (= exact)";
    }
    return s;
  }
};

namespace detail {

inline kernels::MatrixB matrix_of(const Weight& w, kernels::BForm form) {
  if (!w.is_dense()) {
    throw_error(StatusCode::kUnsupported, "cpu: this product has no kernel for quantized or split weights (",
                w.quant ? w.quant->scheme : std::string("split"), ")");
  }
  if (w.layout != WeightLayout::kRowMajor) {
    throw_error(StatusCode::kUnsupported, "cpu::linear: weight layout ", static_cast<int>(w.layout), " has no kernel");
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16) {
    throw_error(StatusCode::kUnsupported, "cpu::linear: weights of dtype ", dtype_name(w.dtype), " have no kernel");
  }
  kernels::MatrixB b;
  b.data = w.data;
  b.dtype = w.dtype;
  b.ld = w.cols();
  b.form = form;
  return b;
}

// The exact product on the calling thread, on the context's instruction set.
inline void gemm_exact(const KernelContext& ctx, kernels::Gemm g) {
  g.few_rows = !ctx.row_invariant;
  switch (ctx.isa) {
#if DG_X86_KERNELS
    case Isa::kAmx:
    case Isa::kAvx512: return kernels::avx512::gemm(g);
    case Isa::kAvx2: return kernels::avx2::gemm(g);
#endif
    default: return kernels::generic::gemm(g);
  }
}

// Products of fewer multiply-adds run on the calling thread: a second thread's wake-up and join
// cost about as much as the work it would take over.
inline constexpr double kMinSharedProduct = double(1 << 20);
// AMX tiles multiply several times faster than the vector kernels, so the same wake-up and join
// are worth it only for several times the work (measured on the bundled model: a single request's
// passes of 16 rows ran 1.2-1.35x slower on 2 threads than on 1 with the vector kernels' bound,
// and as fast with this one).
inline constexpr double kMinSharedTileProduct = double(1 << 23);

// Products with at most kStreamRows rows (autoregressive decoding) are bound by reading the weight
// once, which the fp32 kernels do in row order; a 16-row tile would be mostly padding.
inline constexpr std::int64_t kStreamRows = 4;

// The bound for a product of `m` rows: the tiles' when it runs on them.
inline double min_shared_product(const KernelContext& ctx, std::int64_t m) {
  return ctx.bf16_tiles() && (ctx.row_invariant || m > kStreamRows) ? kMinSharedTileProduct : kMinSharedProduct;
}

// Splits the output columns into pieces (multiples of 32, the widest panel) and runs them in
// parallel. Which thread computes a column never changes its value.
// Whether over_columns shares an m x n x k product between threads.
inline bool columns_shared(const KernelContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k) {
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return resolve_threads(ctx.threads) > 1 && work >= min_shared_product(ctx, m) && n > 32;
}

// Columns per piece of a shared n-column product: four pieces per thread, in multiples of 32.
inline std::int64_t column_piece(std::int64_t n, int threads) {
  const std::int64_t piece = (n + 4 * threads - 1) / (4 * threads);
  return std::max<std::int64_t>(32, (piece + 31) / 32 * 32);
}

template <class F>
void over_columns(const KernelContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k, F&& f) {
  if (!columns_shared(ctx, m, n, k)) {
    f(std::int64_t{0}, n);
    return;
  }
  const std::int64_t piece = column_piece(n, resolve_threads(ctx.threads));
  const std::int64_t pieces = (n + piece - 1) / piece;
  parallel_for(
      pieces, [&](std::int64_t p) { f(p * piece, std::min(n, (p + 1) * piece)); }, ctx.threads);
}

inline bool tiles_for(const KernelContext& ctx, std::int64_t m) {
  return ctx.bf16_tiles() && (ctx.row_invariant || m > kStreamRows);
}
// The same rule for the AVX512-BF16 products of row-major matrices (the LM head and the soft
// embedding), whose lanes run over 16 rows of x.
inline bool dots_for(const KernelContext& ctx, std::int64_t m) {
  return ctx.bf16_dots() && (ctx.row_invariant || m > kStreamRows);
}

// A product too narrow to split by columns (the router's few outputs) is split by rows instead,
// in pieces of 32 rows whatever the thread count (a tail of at most kStreamRows rows joins the
// piece before it, so no piece takes the few-rows kernels): every kernel computes a row the same
// way whatever other rows share its call.
template <class F>
void over_rows(const KernelContext& ctx, std::int64_t m, std::int64_t n, std::int64_t k, F&& f) {
  constexpr std::int64_t kPiece = 32;
  const int threads = resolve_threads(ctx.threads);
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (threads <= 1 || work < min_shared_product(ctx, m) || m < 2 * kPiece) {
    f(std::int64_t{0}, m);
    return;
  }
  const std::int64_t pieces = m % kPiece <= kStreamRows ? m / kPiece : m / kPiece + 1;
  parallel_for(
      pieces, [&](std::int64_t p) { f(p * kPiece, p + 1 == pieces ? m : (p + 1) * kPiece); }, ctx.threads);
}

#if DG_X86_KERNELS
template <class F>
void with_bf16_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16: return f(std::integral_constant<DType, DType::kF16>{});
    default: return f(std::integral_constant<DType, DType::kF32>{});
  }
}
#endif

// Rows of a quantized weight dequantised per block: about 256 KiB of numbers, a multiple of 32
// rows (the widest panel), so the block and the activations stay in L2 while the kernel runs.
inline std::int64_t dequantized_block_rows(std::int64_t k) {
  const std::int64_t rows = (std::int64_t{1} << 17) / std::max<std::int64_t>(k, 1);
  return std::max<std::int64_t>(32, rows / 32 * 32);
}

// linear() for a quantized weight. `xp`: the activations packed for the tiles (bf16 path), or
// nullptr for the exact kernels.
inline void quantized_linear(const KernelContext& ctx, const QuantizedMatrix& q, const float* x, std::int64_t ldx,
                             const std::uint16_t* xp, std::int64_t m, float* y, std::int64_t ldy, bool accumulate) {
  const std::int64_t n = q.rows, k = q.cols;
  const DType dt = q.scale_dtype();
  const std::int64_t block = dequantized_block_rows(k);
  over_columns(ctx, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
    std::byte* buf = kernels::scratch<std::byte, 8>(static_cast<std::size_t>(block * k) * dtype_size(dt));
    for (std::int64_t r = n0; r < n1; r += block) {
      const std::int64_t rows = std::min(block, n1 - r);
      kernels::dequantize_rows(ctx.isa, q, r, rows, buf);
      kernels::MatrixB b;
      b.data = buf;
      b.dtype = dt;
      b.ld = k;
      b.form = kernels::BForm::kNK;
#if DG_X86_KERNELS
      if (xp != nullptr) {
        with_bf16_dtype(dt, [&](auto t) { kernels::amx::xwt<decltype(t)::value>(b, xp, m, k, rows, y + r, ldy, accumulate); });
        continue;
      }
#endif
      kernels::Gemm g;
      g.a = x;
      g.lda = ldx;
      g.b = b;
      g.c = y + r;
      g.ldc = ldy;
      g.m = m;
      g.n = rows;
      g.k = k;
      g.accumulate = accumulate;
      gemm_exact(ctx, g);
    }
  });
}

// linear() for a 4-bit weight in the fast precision on AVX2: the activations are rounded once on
// the calling thread, then each thread unpacks its panels of the weight and multiplies.
inline void int8_linear(const KernelContext& ctx, const QuantizedMatrix& q, const float* x, std::int64_t ldx,
                        std::int64_t m, float* y, std::int64_t ldy, bool accumulate) {
  namespace i8 = kernels::int8;
  const std::int64_t n = q.rows, k = q.cols;
  i8::Activations a;
  a.m = m;
  a.k = k;
  a.chunks = i8::chunks_of(q);
  std::uint8_t* codes = kernels::scratch<std::uint8_t, 9>(static_cast<std::size_t>(m * k));
  float* scales = kernels::scratch<float, 13>(static_cast<std::size_t>(m * a.chunks.count));
  a.codes = codes;
  a.scales = scales;
  const bool vector = DG_X86_KERNELS && ctx.isa >= Isa::kAvx2;
  const auto quantize = [&](std::int64_t r0, std::int64_t r1) {
    std::uint8_t* c = codes + r0 * k;
    float* s = scales + r0 * a.chunks.count;
#if DG_X86_KERNELS
    if (vector) return i8::avx2::quantize_activations(x + r0 * ldx, ldx, r1 - r0, k, a.chunks, c, s);
#endif
    i8::quantize_activations_scalar(x + r0 * ldx, ldx, r1 - r0, k, a.chunks, c, s);
  };
  // Rows are rounded independently, so when the product is shared between threads its rounding is
  // too (a serial part otherwise: about an eighth of a lone 256 x 704 x 2112 product on one thread).
  const int threads = resolve_threads(ctx.threads);
  if (columns_shared(ctx, m, n, k) && m >= 2 * threads) {
    const std::int64_t piece = (m + threads - 1) / threads;
    parallel_for(
        threads, [&](std::int64_t t) { quantize(std::min(m, t * piece), std::min(m, (t + 1) * piece)); }, ctx.threads);
  } else {
    quantize(0, m);
  }
  const i8::Form form = !vector ? i8::Form::kScalar
                        : ctx.isa >= Isa::kAvx512 && cpu_features().avx512vnni ? i8::Form::kAvx512Vnni
                                                                                : i8::Form::kAvx2;
#if DG_X86_KERNELS
  if (ctx.int8_tiles() && i8::amx::k_step(a) > 0) {
    over_columns(ctx, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      i8::amx::product_columns(q, a, n0, n1, y, ldy, accumulate);
    });
    return;
  }
#endif
  over_columns(ctx, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
    i8::product_columns(q, a, n0, n1, y, ldy, accumulate, form);
  });
}

#if DG_X86_KERNELS
// x [m, k] rounded to bf16 pairs for the AVX512-BF16 products of n output columns in all, into this
// thread's scratch. Packed by rows on the product's threads (on the calling thread alone it kept
// them waiting).
inline const std::uint32_t* pack_for_dots(const KernelContext& run, const float* x, std::int64_t ldx, std::int64_t m,
                                          std::int64_t k, std::int64_t n) {
  namespace dots = kernels::avx512_bf16;
  std::uint32_t* xa = kernels::scratch<std::uint32_t, 0>(static_cast<std::size_t>(m * dots::activation_pairs(k)));
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  parallel_for(
      (m + 15) / 16,
      [&](std::int64_t b) { dots::pack_activation_rows(x, ldx, m, k, xa, 16 * b, std::min(m, 16 * b + 16)); },
      work < kMinSharedProduct ? 1 : threads_for_work(run.threads, 4.0 * static_cast<double>(m * k)));
  return xa;
}
#endif

}  // namespace detail

// y[m, out] (+)= x[m, in] W^T for a weight W [out, in]; x rows `ldx` floats apart, y rows `ldy`.
// `serial`: run on the calling thread only (the caller is already one of many tasks).
inline void linear(const KernelContext& ctx, const Weight& w, const float* x, std::int64_t ldx, std::int64_t m, float* y,
                   std::int64_t ldy, bool accumulate = false, bool serial = false) {
  const std::int64_t n = w.rows(), k = w.cols();
  if (m <= 0 || n <= 0) return;
  if (w.is_split()) {
    std::int64_t r0 = 0;
    for (const Weight& part : *w.parts) {
      linear(ctx, part, x, ldx, m, y + r0, ldy, accumulate, serial);
      r0 += part.rows();
    }
    return;
  }
  KernelContext run = ctx;
  if (serial) run.threads = 1;
  if (w.is_quantized()) {
    if (ctx.int8_products(*w.quant)) {
      detail::int8_linear(run, *w.quant, x, ldx, m, y, ldy, accumulate);
      return;
    }
    const std::uint16_t* xp = nullptr;
#if DG_X86_KERNELS
    if (detail::tiles_for(ctx, m)) {
      std::uint16_t* packed = kernels::scratch<std::uint16_t, 4>(kernels::amx::packed_size(m, k));
      kernels::amx::pack_activations_pairs(x, ldx, m, k, packed);
      xp = packed;
    }
#endif
    detail::quantized_linear(run, *w.quant, x, ldx, xp, m, y, ldy, accumulate);
    return;
  }
  kernels::Gemm g;
  g.a = x;
  g.lda = ldx;
  g.b = detail::matrix_of(w, kernels::BForm::kNK);
  g.c = y;
  g.ldc = ldy;
  g.m = m;
  g.n = n;
  g.k = k;
  g.accumulate = accumulate;
#if DG_X86_KERNELS
  if (detail::tiles_for(ctx, m) && w.tiles) {  // packed at load (cpu/tile_pack.hpp): no transpose
    std::uint16_t* xa = kernels::scratch<std::uint16_t, 4>(kernels::amx::packed_size(m, k));
    kernels::amx::pack_activations_rows(x, ldx, m, k, xa);
    const std::uint16_t* wp = w.tile_data();
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      kernels::amx::xw_packed(wp + kernels::amx::packed_weight_offset(n0, k), xa, m, k, n1 - n0, y + n0, ldy, accumulate);
    });
    return;
  }
  if (detail::tiles_for(ctx, m)) {
    std::uint16_t* xp = kernels::scratch<std::uint16_t, 4>(kernels::amx::packed_size(m, k));
    kernels::amx::pack_activations_pairs(x, ldx, m, k, xp);
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      const kernels::Gemm part = g.columns(n0, n1);
      detail::with_bf16_dtype(w.dtype, [&](auto t) {
        kernels::amx::xwt<decltype(t)::value>(part.b, xp, m, k, n1 - n0, part.c, ldy, accumulate);
      });
    });
    return;
  }
  if (ctx.isa == Isa::kAvx2 && w.tiles && w.dtype == DType::kBF16) {  // pair tiles, lossless: the exact bits
    const std::uint16_t* wp = w.tile_data();
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      kernels::avx2::gemm_pairs(wp + kernels::pair_panel_offset(n0, k), x, ldx, m, n1 - n0, k, y + n0, ldy, accumulate);
    });
    return;
  }
  if (ctx.isa == Isa::kAvx512 && w.tiles && (ctx.bf16_dots() || w.dtype == DType::kBF16)) {
    const std::uint16_t* wp = w.tile_data();
    if (ctx.bf16_dots()) {  // any dtype, rounded to bf16 when packed; activations rounded once here
      const std::uint32_t* xa = detail::pack_for_dots(run, x, ldx, m, k, n);
      detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
        kernels::avx512_bf16::gemm_pairs(wp + kernels::pair_panel_offset(n0, k), xa, m, n1 - n0, k, y + n0, ldy,
                                         accumulate);
      });
      return;
    }
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {  // lossless: the exact bits
      kernels::avx512::gemm_pairs(wp + kernels::pair_panel_offset(n0, k), x, ldx, m, n1 - n0, k, y + n0, ldy, accumulate);
    });
    return;
  }
  if (detail::dots_for(ctx, m)) {  // a row-major matrix (the embedding as LM head): x as pair tiles of 16 rows
    std::uint16_t* xp = kernels::scratch<std::uint16_t, 4>(kernels::amx::packed_size(m, k));
    kernels::avx512_bf16::pack_activations_pairs(x, ldx, m, k, xp);
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      const kernels::Gemm part = g.columns(n0, n1);
      detail::with_bf16_dtype(w.dtype, [&](auto t) {
        kernels::avx512_bf16::xwt<decltype(t)::value>(part.b, xp, m, k, n1 - n0, part.c, ldy, accumulate);
      });
    });
    return;
  }
#endif
  if (n <= 32) {
    detail::over_rows(run, m, n, k, [&](std::int64_t i0, std::int64_t i1) { detail::gemm_exact(ctx, g.rows(i0, i1)); });
    return;
  }
  detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) { detail::gemm_exact(ctx, g.columns(n0, n1)); });
}

// One output of linear_shared_input: y (ldy floats per row) = x W^T.
struct LinearOutput {
  const Weight* w;
  float* y;
  std::int64_t ldy;
};

// Several weights of one input (q, k and v; gate and up): outs[i].y = x outs[i].w^T. Where the
// products take packed activations (the AVX512-BF16 dot products), x is packed once and the
// column pieces of all the products share one parallel region, so the threads meet twice instead
// of twice per product; elsewhere each runs as linear(). The same bits either way: a column's
// value does not depend on its piece.
inline void linear_shared_input(const KernelContext& ctx, const float* x, std::int64_t ldx, std::int64_t m,
                                const LinearOutput* outs, int count) {
  if (m <= 0 || count <= 0) return;
  const std::int64_t k = outs[0].w->cols();
  bool together = false;
#if DG_X86_KERNELS
  together = ctx.isa == Isa::kAvx512 && ctx.bf16_dots();
  for (int i = 0; i < count && together; ++i) {
    const Weight& w = *outs[i].w;
    together = !w.is_split() && !w.is_quantized() && w.tiles && w.cols() == k && w.rows() > 0;
  }
#endif
  if (!together) {
    for (int i = 0; i < count; ++i) linear(ctx, *outs[i].w, x, ldx, m, outs[i].y, outs[i].ldy);
    return;
  }
#if DG_X86_KERNELS
  struct Piece {
    int out;
    std::int64_t n0, n1;
  };
  std::vector<Piece> pieces;
  std::int64_t n_all = 0;
  bool shared = false;
  const int threads = resolve_threads(ctx.threads);
  for (int i = 0; i < count; ++i) {
    const std::int64_t n = outs[i].w->rows();
    n_all += n;
    const bool split = detail::columns_shared(ctx, m, n, k);
    shared = shared || split;
    const std::int64_t piece = split ? detail::column_piece(n, threads) : n;
    for (std::int64_t n0 = 0; n0 < n; n0 += piece) pieces.push_back({i, n0, std::min(n, n0 + piece)});
  }
  const std::uint32_t* xa = detail::pack_for_dots(ctx, x, ldx, m, k, n_all);
  parallel_for(
      static_cast<std::int64_t>(pieces.size()),
      [&](std::int64_t p) {
        const Piece& c = pieces[static_cast<std::size_t>(p)];
        const LinearOutput& o = outs[c.out];
        kernels::avx512_bf16::gemm_pairs(o.w->tile_data() + kernels::pair_panel_offset(c.n0, k), xa, m, c.n1 - c.n0,
                                         k, o.y + c.n0, o.ldy, false);
      },
      shared ? ctx.threads : 1);
#endif
}

// Activations prepared once for several products with weights of the same width (the LM head's
// hidden states against every vocabulary tile): bf16 pair tiles where the fast precision has bf16
// products (AMX tiles, AVX512-BF16 dot products), the fp32 rows otherwise.
class PackedActivations {
 public:
  void pack(const KernelContext& ctx, const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k) {
    x_ = x;
    ldx_ = ldx;
    m_ = m;
    k_ = k;
#if DG_X86_KERNELS
    if (detail::tiles_for(ctx, m) || detail::dots_for(ctx, m)) {
      pairs_.resize(kernels::amx::packed_size(m, k));
      kernels::avx512_bf16::pack_activations_pairs(x, ldx, m, k, pairs_.data());
      return;
    }
#endif
    pairs_.clear();
  }
  const float* rows() const { return x_; }
  std::int64_t ld() const { return ldx_; }
  std::int64_t m() const { return m_; }
  std::int64_t k() const { return k_; }
  const std::uint16_t* pairs() const { return pairs_.empty() ? nullptr : pairs_.data(); }

 private:
  const float* x_ = nullptr;
  std::int64_t ldx_ = 0, m_ = 0, k_ = 0;
  std::vector<std::uint16_t> pairs_;
};

// linear() from prepared activations, on the calling thread.
inline void linear(const KernelContext& ctx, const Weight& w, const PackedActivations& x, float* y, std::int64_t ldy,
                   bool accumulate = false) {
#if DG_X86_KERNELS
  if (ctx.bf16_tiles() && x.pairs() != nullptr && w.is_dense()) {
    const kernels::MatrixB b = detail::matrix_of(w, kernels::BForm::kNK);
    detail::with_bf16_dtype(w.dtype, [&](auto t) {
      kernels::amx::xwt<decltype(t)::value>(b, x.pairs(), x.m(), w.cols(), w.rows(), y, ldy, accumulate);
    });
    return;
  }
  if (ctx.bf16_dots() && x.pairs() != nullptr && w.is_dense()) {
    const kernels::MatrixB b = detail::matrix_of(w, kernels::BForm::kNK);
    detail::with_bf16_dtype(w.dtype, [&](auto t) {
      kernels::avx512_bf16::xwt<decltype(t)::value>(b, x.pairs(), x.m(), w.cols(), w.rows(), y, ldy, accumulate);
    });
    return;
  }
#endif
  linear(ctx, w, x.rows(), x.ld(), x.m(), y, ldy, accumulate, /*serial=*/true);
}

// y[m, n] (+)= x[m, k] W for a weight W [k, n] read along its rows (the soft-embedding product P E).
inline void linear_transposed(const KernelContext& ctx, const Weight& w, const float* x, std::int64_t ldx,
                              std::int64_t m, float* y, std::int64_t ldy, bool accumulate = false,
                              bool serial = false) {
  const std::int64_t k = w.rows(), n = w.cols();
  if (m <= 0 || n <= 0) return;
  kernels::Gemm g;
  g.a = x;
  g.lda = ldx;
  g.b = detail::matrix_of(w, kernels::BForm::kKN);
  g.c = y;
  g.ldc = ldy;
  g.m = m;
  g.n = n;
  g.k = k;
  g.accumulate = accumulate;
  KernelContext run = ctx;
  if (serial) run.threads = 1;
#if DG_X86_KERNELS
  if (detail::tiles_for(ctx, m)) {
    std::uint16_t* xa = kernels::scratch<std::uint16_t, 5>(kernels::amx::packed_size(m, k));
    kernels::amx::pack_activations_rows(x, ldx, m, k, xa);
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      const kernels::Gemm part = g.columns(n0, n1);
      detail::with_bf16_dtype(w.dtype, [&](auto t) {
        kernels::amx::xw<decltype(t)::value>(part.b, xa, m, k, n1 - n0, part.c, ldy, accumulate);
      });
    });
    return;
  }
  if (detail::dots_for(ctx, m)) {
    namespace dots = kernels::avx512_bf16;
    std::uint32_t* xa = kernels::scratch<std::uint32_t, 1>(static_cast<std::size_t>(m * dots::activation_pairs(k)));
    dots::pack_activations(x, ldx, m, k, xa);
    detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) {
      detail::with_bf16_dtype(w.dtype, [&](auto t) { dots::xw<decltype(t)::value>(g.b, xa, m, k, n, n0, n1, y, ldy, accumulate); });
    });
    return;
  }
#endif
  detail::over_columns(run, m, n, k, [&](std::int64_t n0, std::int64_t n1) { detail::gemm_exact(ctx, g.columns(n0, n1)); });
}

// Threads for `macs` multiply-adds of products of `rows` rows (or of work as dense as theirs) in
// one region: the calling thread alone below detail::min_shared_product.
inline int threads_for_product(const KernelContext& ctx, double macs, std::int64_t rows) {
  return macs < detail::min_shared_product(ctx, rows) ? 1 : ctx.threads;
}

// Runs f(g, first, rows) for the groups g in [g0, g1) that have rows, rows [begin[g], begin[g +
// 1)) of a product whose every row costs `macs_per_row` multiply-adds; `first` counts from
// begin[g0]. One task per group (each group's weights are read once, by one thread); on the
// calling thread alone when all groups together are too little work to share (the same bound as
// over_columns). Tasks start largest first: threads take them in order as they come free, and a
// large group taken last would keep one thread busy while the others wait. Which thread runs a
// group does not change its bits.
template <class F>
void for_each_group(const KernelContext& ctx, const std::int64_t* begin, std::int64_t g0, std::int64_t g1,
                    double macs_per_row, F&& f) {
  const std::int64_t base = begin[g0], total = begin[g1] - base;
  std::vector<std::int64_t> order;  // the groups with rows
  for (std::int64_t g = g0; g < g1; ++g)
    if (begin[g + 1] > begin[g]) order.push_back(g);
  const std::int64_t rows_per_group = total / std::max<std::int64_t>(1, static_cast<std::int64_t>(order.size()));
  const int threads = threads_for_product(ctx, static_cast<double>(total) * macs_per_row, rows_per_group);
  if (resolve_threads(threads) > 1) {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return begin[a + 1] - begin[a] > begin[b + 1] - begin[b]; });
  }
  parallel_for(
      static_cast<std::int64_t>(order.size()),
      [&](std::int64_t i) {
        const std::int64_t g = order[static_cast<std::size_t>(i)];
        f(g, begin[g] - base, begin[g + 1] - begin[g]);
      },
      threads);
}

// Experts: for a weight [groups, out, in], rows [begin[g], begin[g + 1]) of x go through group g
// (for_each_group's tasks).
inline void grouped_linear(const KernelContext& ctx, const Weight& w, const float* x, std::int64_t ldx,
                           const std::int64_t* begin, float* y, std::int64_t ldy) {
  const double macs = static_cast<double>(w.group(0).rows()) * static_cast<double>(w.group(0).cols());
  for_each_group(ctx, begin, 0, w.groups(), macs, [&](std::int64_t g, std::int64_t, std::int64_t rows) {
    linear(ctx, w.group(g), x + begin[g] * ldx, ldx, rows, y + begin[g] * ldy, ldy, false, /*serial=*/true);
  });
}

namespace detail {

inline kernels::Gemm activation_product(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                         kernels::BForm form, float* c, std::int64_t ldc, std::int64_t m,
                                         std::int64_t n, std::int64_t k, bool accumulate) {
  kernels::Gemm g;
  g.a = a;
  g.lda = lda;
  g.b.data = reinterpret_cast<const std::byte*>(b);
  g.b.dtype = DType::kF32;
  g.b.ld = ldb;
  g.b.form = form;
  g.c = c;
  g.ldc = ldc;
  g.m = m;
  g.n = n;
  g.k = k;
  g.accumulate = accumulate;
  return g;
}

}  // namespace detail

// c[m, n] (+)= a[m, k] b[n, k]^T for two fp32 activations (attention scores), on the calling
// thread. In the fast precision (AMX tiles, AVX512-BF16 dot products) both operands are rounded to
// bf16 on the way.
inline void matmul_nt(const KernelContext& ctx, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      float* c, std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k,
                      bool accumulate = false) {
  const kernels::Gemm g = detail::activation_product(a, lda, b, ldb, kernels::BForm::kNK, c, ldc, m, n, k, accumulate);
#if DG_X86_KERNELS
  if (detail::tiles_for(ctx, m) && n > 0) {
    std::uint16_t* xp = kernels::scratch<std::uint16_t, 6>(kernels::amx::packed_size(m, k));
    kernels::amx::pack_activations_pairs(a, lda, m, k, xp);
    kernels::amx::xwt<DType::kF32>(g.b, xp, m, k, n, c, ldc, accumulate);
    return;
  }
  if (detail::dots_for(ctx, m) && n > 0) {
    std::uint16_t* xp = kernels::scratch<std::uint16_t, 6>(kernels::amx::packed_size(m, k));
    kernels::avx512_bf16::pack_activations_pairs(a, lda, m, k, xp);
    kernels::avx512_bf16::xwt<DType::kF32>(g.b, xp, m, k, n, c, ldc, accumulate);
    return;
  }
#endif
  detail::gemm_exact(ctx, g);
}

// c[m, n] (+)= a[m, k] b[k, n] for two fp32 activations (attention probabilities x values), on
// the calling thread; bf16 products in the fast precision, as matmul_nt.
inline void matmul_nn(const KernelContext& ctx, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      float* c, std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k,
                      bool accumulate = false) {
  const kernels::Gemm g = detail::activation_product(a, lda, b, ldb, kernels::BForm::kKN, c, ldc, m, n, k, accumulate);
#if DG_X86_KERNELS
  if (detail::tiles_for(ctx, m) && n > 0) {
    std::uint16_t* xa = kernels::scratch<std::uint16_t, 7>(kernels::amx::packed_size(m, k));
    kernels::amx::pack_activations_rows(a, lda, m, k, xa);
    kernels::amx::xw<DType::kF32>(g.b, xa, m, k, n, c, ldc, accumulate);
    return;
  }
  if (detail::dots_for(ctx, m) && n > 0) {
    namespace dots = kernels::avx512_bf16;
    std::uint32_t* xa = kernels::scratch<std::uint32_t, 4>(static_cast<std::size_t>(m * dots::activation_pairs(k)));
    dots::pack_activations(a, lda, m, k, xa);
    dots::xw<DType::kF32>(g.b, xa, m, k, n, 0, n, c, ldc, accumulate);
    return;
  }
#endif
  detail::gemm_exact(ctx, g);
}

// An fp32 activation laid out once as the AVX2 tile's panels, for many products against it: an
// attention layer's keys (q K^T) and values (P V), multiplied by every query block of every query
// head of their group. matmul_nt and matmul_nn lay out the panels they need on each call; on a
// Zen 2 that packing was 3 % of the small configuration's commit. Only the AVX2 family reads
// them (the fp32 attention of the other ISAs goes through matmul_nt and matmul_nn).
class PanelOperand {
 public:
  static bool available(const KernelContext& ctx) {
#if DG_X86_KERNELS
    return ctx.isa == Isa::kAvx2;
#else
    (void)ctx;
    return false;
#endif
  }
  // Whether matmul_nt and matmul_nn run the panel tile for m rows, so that multiply gives their
  // bits (a product of a few rows that may differ by batch takes the few-rows kernel instead).
  static bool matches_matmul(const KernelContext& ctx, std::int64_t m) {
    return ctx.row_invariant || m > detail::kStreamRows;
  }
  static std::size_t floats(std::int64_t n, std::int64_t k) {
    return static_cast<std::size_t>((n + kernels::kPairPanelWidth - 1) / kernels::kPairPanelWidth * kernels::kPairPanelWidth * k);
  }

  // b[n, k] (row-major, rows `ldb` apart) as the operand of x b^T: n outputs, depth k.
  static PanelOperand rows_as_outputs(const float* b, std::int64_t ldb, std::int64_t n, std::int64_t k, float* out) {
    return pack(b, ldb, kernels::BForm::kNK, n, k, out);
  }
  // b[k, n] as the operand of x b: n outputs, depth k.
  static PanelOperand rows_as_depth(const float* b, std::int64_t ldb, std::int64_t k, std::int64_t n, float* out) {
    return pack(b, ldb, kernels::BForm::kKN, n, k, out);
  }

  // c[m, n] (+)= a[m, k] op(B)[k0 .. k0 + k, n0 .. n0 + n) on the calling thread, n0 a multiple of
  // 16: the same bits as matmul_nt / matmul_nn on those rows and columns of b, for the rows where
  // those run the panel tile (more than kStreamRows rows, or row-invariant products).
  void multiply(const float* a, std::int64_t lda, std::int64_t m, std::int64_t n0, std::int64_t n, std::int64_t k0,
                std::int64_t k, float* c, std::int64_t ldc, bool accumulate) const {
#if DG_X86_KERNELS
    kernels::avx2::gemm_panels(data_ + static_cast<std::size_t>(n0 * k_), k_, k0, a, lda, m, n, k, c, ldc, accumulate);
#else
    (void)a, (void)lda, (void)m, (void)n0, (void)n, (void)k0, (void)k, (void)c, (void)ldc, (void)accumulate;
#endif
  }

 private:
  static PanelOperand pack(const float* b, std::int64_t ldb, kernels::BForm form, std::int64_t n, std::int64_t k,
                           float* out) {
    PanelOperand p;
    p.data_ = out;
    p.k_ = k;
#if DG_X86_KERNELS
    kernels::MatrixB mb;
    mb.data = reinterpret_cast<const std::byte*>(b);
    mb.dtype = DType::kF32;
    mb.ld = ldb;
    mb.form = form;
    kernels::avx2::pack_panels(mb, n, k, out);
#else
    (void)b, (void)ldb, (void)form, (void)n;
#endif
    return p;
  }

  const float* data_ = nullptr;
  std::int64_t k_ = 0;
};

}  // namespace diffusion_gemma::cpu
