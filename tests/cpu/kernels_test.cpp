// SPDX-License-Identifier: Apache-2.0
// The CPU kernels against oracles, on every kernel family this machine can run (generic always;
// AVX2, AVX-512 and AMX where the CPU has them; the skipped ones are named in the output):
//   - products with a weight (linear, linear_transposed, grouped_linear) against a double-precision
//     sum, for F32, BF16 and F16 weights, with sizes that are not multiples of any panel or tile;
//   - the exact precision's promise: AVX2 and AVX-512 give the same bits, at any thread count;
//   - matrices packed for AMX tiles give the bits of the row-major tile kernel, BF16 matrices packed
//     as pair tiles the bits of the row-major AVX2 kernel, and both packings lay out BF16 alike;
//   - attention's tile products (scores, probabilities x values) against fp64 sums of bf16 inputs;
//   - the vector exp / tanh / GELU against core/math.hpp's scalar definitions, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/linear.hpp>
#include <diffusion_gemma/cpu/tile_pack.hpp>
#include <diffusion_gemma/cpu/vmath.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

namespace {

std::vector<cpu::Isa> runnable_isas() {
  std::vector<cpu::Isa> out;
  for (int i = 0; i < static_cast<int>(cpu::Isa::kSentinel); ++i) {
    const auto isa = static_cast<cpu::Isa>(i);
    if (isa <= cpu::cpu_features().best()) {
      out.push_back(isa);
    } else {
      WARN("kernel family " << cpu::isa_name(isa) << " not run: this CPU lacks it (" << cpu::cpu_features().flags()
                            << ")");
    }
  }
  return out;
}

// A weight stored in `dtype`, with its values as the kernels see them (widened exactly).
struct TestWeight {
  std::vector<std::byte> bytes;
  std::vector<double> values;
  Weight view;
};

TestWeight make_weight(DType dtype, std::int64_t rows, std::int64_t cols, std::mt19937& rng, std::int64_t groups = 1,
                       std::size_t misalign = 0) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  TestWeight w;
  const std::int64_t n = groups * rows * cols;
  const std::size_t es = dtype_size(dtype);
  w.bytes.resize(static_cast<std::size_t>(n) * es + misalign);
  w.values.resize(static_cast<std::size_t>(n));
  std::byte* base = w.bytes.data() + misalign;
  for (std::int64_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    if (dtype == DType::kF32) {
      std::memcpy(base + i * 4, &f, 4);
      w.values[i] = f;
    } else if (dtype == DType::kBF16) {
      const bfloat16 b = bfloat16::from_float(f);
      std::memcpy(base + i * 2, &b.bits, 2);
      w.values[i] = b.to_float();
    } else {
      const float16 h = float16::from_float(f);
      std::memcpy(base + i * 2, &h.bits, 2);
      w.values[i] = h.to_float();
    }
  }
  w.view.data = base;
  w.view.dtype = dtype;
  w.view.shape = groups > 1 ? Shape{groups, rows, cols} : Shape{rows, cols};
  return w;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Largest |got - want| / (sum_k |a b| + tiny) over the output.
double worst_relative(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (scale[i] + 1e-30));
  return worst;
}

const char* dtype_label(DType t) { return dtype_name(t); }

// Whether a weight's row-major and packed forms give the same bits through linear(), on padded
// strides and over a random C (for the accumulating form).
bool same_product(const cpu::KernelContext& ctx, const Weight& rows, const Weight& packed, std::int64_t m,
                  bool accumulate, std::mt19937& rng) {
  const std::int64_t n = rows.rows(), k = rows.cols(), ldx = k + 3, ldy = n + 5;
  const auto x = random_floats(static_cast<std::size_t>(m * ldx), rng);
  auto want = random_floats(static_cast<std::size_t>(m * ldy), rng);
  auto got = want;
  cpu::linear(ctx, rows, x.data(), ldx, m, want.data(), ldy, accumulate);
  cpu::linear(ctx, packed, x.data(), ldx, m, got.data(), ldy, accumulate);
  return got == want;
}

}  // namespace

TEST_CASE("products with a weight match a double-precision oracle on every kernel family", "[cpu][kernels]") {
  std::mt19937 rng(1234);
  struct Size {
    std::int64_t m, n, k;
  };
  // Rows below and above the 4-row streaming kernel and the 6/12-row tiles; columns and depth cut
  // by every panel (16, 32), tile (16, 32) and depth block (256 fp32, 2048 bf16 on tiles) size;
  // 301 rows at depth 600 run in two row groups (kernels::row_group_rows), the last one shorter.
  const Size sizes[] = {{1, 5, 7},     {2, 33, 48},   {4, 64, 128},    {5, 37, 300},   {13, 70, 257}, {37, 129, 512},
                        {16, 32, 64},  {9, 40, 1100}, {18, 33, 4200},  {98, 20, 600},  {301, 40, 600}};
  for (cpu::Isa isa : runnable_isas()) {
    for (cpu::Precision precision : {cpu::Precision::kExact, cpu::Precision::kFast}) {
      cpu::KernelContext ctx;
      ctx.isa = isa;
      ctx.precision = precision;
      ctx.threads = 2;
      // Exact: fp32 accumulation, error ~ sqrt(k) ulp of sum |a b|. Fast on AMX or AVX512-BF16 (the
      // row-major matrices included): a and b rounded to bf16 (2^-9 relative each), so up to ~2^-8
      // of sum |a b|.
      const double tolerance = ctx.bf16_tiles() || ctx.bf16_dots() ? 6e-3 : 1e-5;
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (const Size& s : sizes) {
          for (bool transposed : {false, true}) {
            for (bool accumulate : {false, true}) {
              INFO(cpu::isa_name(isa) << " " << cpu::precision_name(precision) << " " << dtype_label(dtype) << " m "
                                      << s.m << " n " << s.n << " k " << s.k << (transposed ? " x W" : " x W^T")
                                      << (accumulate ? " accumulate" : ""));
              // W [n, k] for x W^T; W [k, n] for x W. Unaligned start for F32 to prove unaligned loads.
              const TestWeight w = transposed ? make_weight(dtype, s.k, s.n, rng, 1, dtype == DType::kF32 ? 2 : 0)
                                              : make_weight(dtype, s.n, s.k, rng, 1, dtype == DType::kF32 ? 2 : 0);
              const std::int64_t ldx = s.k + 3, ldy = s.n + 5;
              const auto x = random_floats(static_cast<std::size_t>(s.m * ldx), rng);
              auto y = random_floats(static_cast<std::size_t>(s.m * ldy), rng);
              std::vector<double> want(y.size()), scale(y.size(), 0.0);
              for (std::int64_t i = 0; i < s.m; ++i) {
                for (std::int64_t j = 0; j < s.n; ++j) {
                  double sum = accumulate ? y[i * ldy + j] : 0.0, mag = std::abs(sum);
                  for (std::int64_t kk = 0; kk < s.k; ++kk) {
                    const double b = transposed ? w.values[kk * s.n + j] : w.values[j * s.k + kk];
                    sum += static_cast<double>(x[i * ldx + kk]) * b;
                    mag += std::abs(static_cast<double>(x[i * ldx + kk]) * b);
                  }
                  want[i * ldy + j] = sum;
                  scale[i * ldy + j] = mag;
                }
              }
              // Columns outside the output (the padding of ldy) must come out untouched.
              for (std::int64_t i = 0; i < s.m; ++i)
                for (std::int64_t j = s.n; j < ldy; ++j) want[i * ldy + j] = y[i * ldy + j], scale[i * ldy + j] = 1.0;
              if (transposed) {
                cpu::linear_transposed(ctx, w.view, x.data(), ldx, s.m, y.data(), ldy, accumulate);
              } else {
                cpu::linear(ctx, w.view, x.data(), ldx, s.m, y.data(), ldy, accumulate);
              }
              CHECK(worst_relative(y, want, scale) < tolerance);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("exact products: same bits on AVX2 and AVX-512 and at any thread count", "[cpu][kernels]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAvx2) {
    WARN("no AVX2 on this CPU: only the generic family exists here");
    return;
  }
  std::mt19937 rng(99);
  // 300 rows: row groups of 150 (AVX2's 6-row tiles) and 156 (AVX-512's 12), the same bits.
  for (const std::int64_t m : {40, 300}) {
    INFO("m " << m);
    const std::int64_t n = 300, k = 700;
    const TestWeight w = make_weight(DType::kBF16, n, k, rng);
    const auto x = random_floats(static_cast<std::size_t>(m * k), rng);
    const auto run = [&](cpu::Isa isa, int threads) {
      cpu::KernelContext ctx;
      ctx.isa = isa;
      ctx.threads = threads;
      std::vector<float> y(static_cast<std::size_t>(m * n));
      cpu::linear(ctx, w.view, x.data(), k, m, y.data(), n);
      return y;
    };
    const auto reference = run(cpu::Isa::kAvx2, 1);
    CHECK(run(cpu::Isa::kAvx2, 2) == reference);
    if (cpu::cpu_features().best() >= cpu::Isa::kAvx512) {
      CHECK(run(cpu::Isa::kAvx512, 1) == reference);
      CHECK(run(cpu::Isa::kAvx512, 2) == reference);
    } else {
      WARN("no AVX-512 on this CPU: the AVX2/AVX-512 agreement is not checked here");
    }
  }
}

TEST_CASE("narrow products (the router) shared by rows: the same bits at any thread count", "[cpu][kernels]") {
  // At most 32 outputs: linear() splits such a product into pieces of 32 rows instead of columns.
  std::mt19937 rng(31);
  struct Size {
    std::int64_t m, n, k;
  };
  // 98 rows: a tail of 2 joins the piece before it; 70: a tail of 6 is a piece of its own.
  const Size sizes[] = {{98, 20, 600}, {70, 32, 512}, {256, 8, 1024}};
  for (cpu::Isa isa : runnable_isas()) {
    for (bool row_invariant : {true, false}) {
      for (const Size& s : sizes) {
        INFO(cpu::isa_name(isa) << (row_invariant ? "" : " not row-invariant") << " m " << s.m << " n " << s.n
                                << " k " << s.k);
        const TestWeight w = make_weight(DType::kF32, s.n, s.k, rng);
        const auto x = random_floats(static_cast<std::size_t>(s.m * s.k), rng);
        const auto run = [&](int threads, std::int64_t row0, std::int64_t rows) {
          cpu::KernelContext ctx;
          ctx.isa = isa;
          ctx.precision = cpu::Precision::kExact;
          ctx.row_invariant = row_invariant;
          ctx.threads = threads;
          std::vector<float> y(static_cast<std::size_t>(rows * s.n));
          cpu::linear(ctx, w.view, x.data() + row0 * s.k, s.k, rows, y.data(), s.n);
          return y;
        };
        const auto one = run(1, 0, s.m);
        CHECK(run(2, 0, s.m) == one);
        CHECK(run(3, 0, s.m) == one);
        if (row_invariant) {  // the rows of the last piece, alone
          const auto tail = run(2, s.m - 5, 5);
          CHECK(std::equal(tail.begin(), tail.end(), one.end() - 5 * s.n));
        }
      }
    }
  }
}

TEST_CASE("grouped_linear runs each group's rows through that group's weight", "[cpu][kernels]") {
  std::mt19937 rng(5);
  const std::int64_t groups = 5, n = 48, k = 40;
  const TestWeight w = make_weight(DType::kBF16, n, k, rng, groups);
  const std::vector<std::int64_t> begin{0, 3, 3, 20, 21, 30};  // group 1 empty
  const auto x = random_floats(static_cast<std::size_t>(30 * k), rng);
  for (cpu::Isa isa : runnable_isas()) {
    cpu::KernelContext ctx;
    ctx.isa = isa;
    ctx.threads = 2;
    std::vector<float> y(static_cast<std::size_t>(30 * n), 0.0f), expect(y.size(), 0.0f);
    cpu::grouped_linear(ctx, w.view, x.data(), k, begin.data(), y.data(), n);
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t rows = begin[g + 1] - begin[g];
      if (rows > 0) cpu::linear(ctx, w.view.group(g), x.data() + begin[g] * k, k, rows, expect.data() + begin[g] * n, n);
    }
    INFO(cpu::isa_name(isa));
    CHECK(y == expect);
  }
}

TEST_CASE("matrices packed for AMX tiles give the bits of the row-major tile kernel", "[cpu][kernels][tiles]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAmx) {
    WARN("no AMX on this CPU: the packed tile kernel is not run here (" << cpu::cpu_features().flags() << ")");
    return;
  }
  std::mt19937 rng(77);
  cpu::KernelContext ctx;
  ctx.isa = cpu::Isa::kAmx;
  ctx.precision = cpu::Precision::kFast;
  ctx.threads = 2;
  ctx.row_invariant = true;
  // Both kernels sum the same bf16 products in the same order: the results must be equal, bit for
  // bit, including the tails of every tile dimension and products split across threads.
  const auto same_bits = [&](const Weight& rows, const Weight& packed, std::int64_t m, bool accumulate) {
    return same_product(ctx, rows, packed, m, accumulate, rng);
  };
  struct Size {
    std::int64_t m, n, k;
  };
  const Size sizes[] = {{1, 5, 7}, {4, 64, 128}, {13, 70, 257}, {37, 129, 512}, {16, 32, 64}, {40, 300, 700},
                        {256, 128, 128}, {18, 33, 4200}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Size& s : sizes) {
      const TestWeight w = make_weight(dtype, s.n, s.k, rng, 1, dtype == DType::kF32 ? 2 : 0);
      Weight packed = w.view;
      cpu::detail::pack_matrix_tiles(packed, /*release_mapped=*/false);
      REQUIRE(packed.tiles != nullptr);
      for (bool accumulate : {false, true}) {
        INFO(dtype_label(dtype) << " m " << s.m << " n " << s.n << " k " << s.k << (accumulate ? " accumulate" : ""));
        CHECK(same_bits(w.view, packed, s.m, accumulate));
      }
    }
  }
  // Expert groups and row ranges are views into the packed copy.
  const TestWeight e = make_weight(DType::kBF16, 48, 40, rng, 5);
  Weight packed = e.view;
  cpu::detail::pack_matrix_tiles(packed, false);
  for (std::int64_t g = 0; g < 5; ++g) {
    INFO("group " << g);
    CHECK(packed.group(g).tile_data() != nullptr);
    CHECK(same_bits(e.view.group(g), packed.group(g), 21, false));
  }
  const Weight one = packed.group(3);
  CHECK(one.row_range(16, 20).tile_data() != nullptr);
  CHECK(same_bits(e.view.group(3).row_range(16, 20), one.row_range(16, 20), 9, true));
  CHECK(one.row_range(5, 20).tile_data() == nullptr);  // not on a tile boundary: row-major kernels
  CHECK(same_bits(e.view.group(3).row_range(5, 20), one.row_range(5, 20), 9, false));
}

#if DG_X86_KERNELS
TEST_CASE("a mapped weight that starts mid-line is copied onto cache lines, byte for byte", "[cpu][kernels]") {
  std::mt19937 rng(8);
  // make_weight's misalign puts the F32 bytes 2 bytes past where the buffer starts.
  TestWeight w = make_weight(DType::kF32, 37, 100, rng, 1, 2);
  REQUIRE(reinterpret_cast<std::uintptr_t>(w.view.data) % 64 != 0);
  REQUIRE(w.view.borrowed());
  Weight copy = w.view;
  cpu::detail::align_to_cache_line(copy, /*release_mapped=*/false);
  CHECK(reinterpret_cast<std::uintptr_t>(copy.data) % 64 == 0);
  CHECK(copy.owner != nullptr);
  CHECK(copy.shape.numel() == w.view.shape.numel());
  CHECK(std::memcmp(copy.data, w.view.data, w.view.nbytes()) == 0);
  // Already on a line, or owned: left as it is.
  Weight again = copy;
  cpu::detail::align_to_cache_line(again, false);
  CHECK(again.data == copy.data);
  // The fast engines' copy holds the embedding on lines; the others keep the mapped rows.
  ModelWeights weights;
  weights.embed_tokens = w.view;
  CHECK(reinterpret_cast<std::uintptr_t>(cpu::pack_for_tiles(weights, false).embed_tokens.data) % 64 == 0);
  CHECK(cpu::pack_for_tiles(weights, false, cpu::TilePacking::kBf16Only).embed_tokens.data == w.view.data);
}

TEST_CASE("x B on AMX tiles over several column groups: the oracle, and the bits of the product split by columns",
          "[cpu][kernels][tiles]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAmx) {
    WARN("no AMX on this CPU: the tile form of x B is not run here (" << cpu::cpu_features().flags() << ")");
    return;
  }
  // On one thread a call covers every column, so B's tiles are built a group of strips at a time
  // (928 columns at depth 1100, 224 at depth 4100 and 4200): whole groups, then a last group of
  // 143 columns (a last strip of 15), 83 (a strip of 19) or 26. Split between threads, each call
  // holds one group. The sums are the same products in the same order either way.
  std::mt19937 rng(4321);
  struct Size {
    std::int64_t m, n, k;
  };
  const Size sizes[] = {{29, 1999, 1100}, {20, 531, 4200}, {3, 250, 4100}};
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Size& s : sizes) {
      for (bool accumulate : {false, true}) {
        INFO(dtype_label(dtype) << " m " << s.m << " n " << s.n << " k " << s.k << (accumulate ? " accumulate" : ""));
        const TestWeight w = make_weight(dtype, s.k, s.n, rng, 1, dtype == DType::kF32 ? 2 : 0);
        const std::int64_t ldx = s.k + 3, ldy = s.n + 5;
        const auto x = random_floats(static_cast<std::size_t>(s.m * ldx), rng);
        const auto y0 = random_floats(static_cast<std::size_t>(s.m * ldy), rng);
        const auto run = [&](int threads) {
          cpu::KernelContext ctx;
          ctx.isa = cpu::Isa::kAmx;
          ctx.precision = cpu::Precision::kFast;
          ctx.threads = threads;
          ctx.row_invariant = true;
          auto y = y0;
          cpu::linear_transposed(ctx, w.view, x.data(), ldx, s.m, y.data(), ldy, accumulate);
          return y;
        };
        const auto one = run(1);
        CHECK(run(2) == one);
        std::vector<double> want(one.size()), scale(one.size(), 1.0);
        for (std::int64_t i = 0; i < s.m; ++i) {
          for (std::int64_t j = 0; j < ldy; ++j) {
            double sum = accumulate || j >= s.n ? y0[i * ldy + j] : 0.0, mag = std::abs(sum);
            for (std::int64_t kk = 0; j < s.n && kk < s.k; ++kk) {
              const double p = static_cast<double>(x[i * ldx + kk]) * w.values[kk * s.n + j];
              sum += p;
              mag += std::abs(p);
            }
            want[i * ldy + j] = sum;
            scale[i * ldy + j] = std::max(mag, 1.0);
          }
        }
        CHECK(worst_relative(one, want, scale) < 6e-3);
      }
    }
  }
}

TEST_CASE("BF16 matrices packed as pair tiles give the exact AVX2 and AVX-512 bits of the row-major weight",
          "[cpu][kernels][tiles]") {
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (cpu::cpu_features().best() < isa) {
      WARN("no " << cpu::isa_name(isa) << " on this CPU: its pair-tile kernel is not run here");
      continue;
    }
    INFO(cpu::isa_name(isa));
    std::mt19937 rng(31);
    cpu::KernelContext ctx;
    ctx.isa = isa;
    ctx.precision = cpu::Precision::kExact;
    ctx.threads = 2;
    // The same fp32 values reach the same chains of FMAs in the same order (AVX2 widens the pairs in
    // its tile, AVX-512 into an fp32 panel first): equal bits, for every tail (outputs not a
    // multiple of 16, depths odd, not a multiple of 32, across several depth blocks).
    const auto same_bits = [&](const Weight& rows, const Weight& packed, std::int64_t m, bool accumulate) {
      return same_product(ctx, rows, packed, m, accumulate, rng);
    };
    struct Size {
      std::int64_t m, n, k;
    };
    const Size sizes[] = {{1, 5, 7},     {3, 16, 1},     {4, 64, 128},  {7, 17, 33},    {13, 70, 257},
                          {37, 129, 512}, {40, 300, 701}, {64, 256, 256}, {18, 33, 4200}, {256, 96, 96}};
    for (const Size& s : sizes) {
      const TestWeight w = make_weight(DType::kBF16, s.n, s.k, rng, 1, 2);  // rows at an odd address
      Weight packed = w.view;
      cpu::detail::pack_matrix_tiles(packed, /*release_mapped=*/false, cpu::TilePacking::kBf16Only);
      REQUIRE(packed.tiles != nullptr);
      for (bool accumulate : {false, true}) {
        INFO("m " << s.m << " n " << s.n << " k " << s.k << (accumulate ? " accumulate" : ""));
        CHECK(same_bits(w.view, packed, s.m, accumulate));
      }
    }
    // Expert groups and row ranges are views into the packed copy; a range off a panel boundary
    // falls back to the rows.
    const TestWeight e = make_weight(DType::kBF16, 48, 40, rng, 5);
    Weight packed = e.view;
    cpu::detail::pack_matrix_tiles(packed, false, cpu::TilePacking::kBf16Only);
    for (std::int64_t g = 0; g < 5; ++g) {
      INFO("group " << g);
      CHECK(same_bits(e.view.group(g), packed.group(g), 21, false));
    }
    CHECK(same_bits(e.view.group(3).row_range(16, 20), packed.group(3).row_range(16, 20), 9, true));
    CHECK(same_bits(e.view.group(3).row_range(5, 20), packed.group(3).row_range(5, 20), 9, false));
    // Only BF16 is packed losslessly; F32 and F16 matrices keep their rows.
    for (DType dtype : {DType::kF32, DType::kF16}) {
      const TestWeight f = make_weight(dtype, 32, 64, rng);
      Weight kept = f.view;
      cpu::detail::pack_matrix_tiles(kept, false, cpu::TilePacking::kBf16Only);
      INFO(dtype_label(dtype));
      CHECK(kept.tiles == nullptr);
    }
  }
}

TEST_CASE("fast precision on AVX512-BF16: fp32 sums of bf16-rounded activations and weights", "[cpu][kernels][tiles]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAvx512 || !cpu::cpu_features().avx512bf16) {
    WARN("no AVX512-BF16 on this CPU: the bf16 dot-product kernel is not run here");
    return;
  }
  std::mt19937 rng(47);
  cpu::KernelContext ctx;
  ctx.isa = cpu::Isa::kAvx512;
  ctx.precision = cpu::Precision::kFast;
  ctx.threads = 2;
  REQUIRE(ctx.bf16_dots());
  struct Size {
    std::int64_t m, n, k;
  };
  // Tails of every block: outputs not a multiple of 16 or 32, odd depths, depths across the
  // 1024-deep blocks of k (4200: four whole blocks and a tail), rows below, at and above the 12-row
  // tile.
  const Size sizes[] = {{1, 5, 7},      {3, 16, 1},    {4, 64, 128}, {7, 17, 33},   {13, 70, 257},
                        {37, 129, 512}, {40, 300, 701}, {12, 48, 256}, {18, 33, 4200}, {100, 96, 96}};
  // F32 and F16 weights are rounded to bf16 when packed, as for the AMX tiles.
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const Size& s : sizes) {
      const TestWeight w = make_weight(dtype, s.n, s.k, rng);
      Weight packed = w.view;
      cpu::detail::pack_matrix_tiles(packed, /*release_mapped=*/false, cpu::TilePacking::kAllRoundedToBf16);
      REQUIRE(packed.tiles != nullptr);
      const std::int64_t ldx = s.k + 3, ldy = s.n + 5;
      const auto x = random_floats(static_cast<std::size_t>(s.m * ldx), rng);
      for (bool accumulate : {false, true}) {
        INFO(dtype_label(dtype) << " m " << s.m << " n " << s.n << " k " << s.k << (accumulate ? " accumulate" : ""));
        auto y = random_floats(static_cast<std::size_t>(s.m * ldy), rng);
        std::vector<double> want(y.size()), scale(y.size(), 1.0);
        for (std::int64_t i = 0; i < s.m; ++i) {
          for (std::int64_t j = 0; j < ldy; ++j) want[i * ldy + j] = y[i * ldy + j];
          for (std::int64_t j = 0; j < s.n; ++j) {
            double sum = accumulate ? y[i * ldy + j] : 0.0, mag = std::abs(sum);
            for (std::int64_t kk = 0; kk < s.k; ++kk) {
              const double p = static_cast<double>(bfloat16::from_float(x[i * ldx + kk]).to_float()) *
                               bfloat16::from_float(static_cast<float>(w.values[j * s.k + kk])).to_float();
              sum += p;
              mag += std::abs(p);
            }
            want[i * ldy + j] = sum;
            scale[i * ldy + j] = mag;
          }
        }
        const auto before = y;
        cpu::linear(ctx, packed, x.data(), ldx, s.m, y.data(), ldy, accumulate);
        // The products of bf16 values are exact in fp32; what is left is fp32 accumulation.
        CHECK(worst_relative(y, want, scale) < 1e-5);
        // One thread, and each row alone, give the same bits: no result depends on the batch.
        auto serial = before;
        cpu::KernelContext one = ctx;
        one.threads = 1;
        cpu::linear(one, packed, x.data(), ldx, s.m, serial.data(), ldy, accumulate);
        CHECK(serial == y);
        const std::int64_t last = s.m - 1;
        std::vector<float> alone(before.begin() + last * ldy, before.begin() + (last + 1) * ldy);
        cpu::linear(ctx, packed, x.data() + last * ldx, ldx, 1, alone.data(), ldy, accumulate);
        CHECK(std::equal(alone.begin(), alone.end(), y.begin() + last * ldy));
      }
    }
  }
}

// q, k and v (gate and up) share an input: linear_shared_input packs it once for the bf16 dot
// products and runs every product's columns in one region; elsewhere it calls linear() per weight.
TEST_CASE("linear_shared_input gives each weight's linear() bits", "[cpu][kernels][tiles]") {
  std::mt19937 rng(53);
  std::vector<cpu::KernelContext> contexts;
  for (cpu::Precision precision : {cpu::Precision::kExact, cpu::Precision::kFast}) {
    cpu::KernelContext ctx;
    ctx.isa = cpu::cpu_features().best() >= cpu::Isa::kAvx512 ? cpu::Isa::kAvx512 : cpu::Isa::kGeneric;
    ctx.precision = precision;
    ctx.threads = 2;
    contexts.push_back(ctx);
  }
  if (!contexts.back().bf16_dots()) WARN("no AVX512-BF16 on this CPU: only the per-weight fallback is run");
  const std::int64_t k = 257;  // odd: a half pair, and a depth tail
  const std::int64_t widths[] = {300, 70, 96};
  std::vector<TestWeight> raw;
  std::vector<Weight> packed;
  for (std::int64_t n : widths) raw.push_back(make_weight(DType::kBF16, n, k, rng));
  for (const TestWeight& w : raw) {
    Weight p = w.view;
    cpu::detail::pack_matrix_tiles(p, /*release_mapped=*/false, cpu::TilePacking::kAllRoundedToBf16);
    REQUIRE(p.tiles != nullptr);
    packed.push_back(p);
  }
  for (const cpu::KernelContext& ctx : contexts) {
    for (std::int64_t m : {1, 5, 40, 256}) {
      INFO(cpu::precision_name(ctx.precision) << " m " << m);
      const std::int64_t ldx = k + 3;
      const auto x = random_floats(static_cast<std::size_t>(m * ldx), rng);
      std::vector<std::vector<float>> want, got;
      std::vector<cpu::LinearOutput> outs;
      for (std::size_t i = 0; i < packed.size(); ++i) {
        const std::int64_t ldy = widths[i] + 5;
        want.push_back(random_floats(static_cast<std::size_t>(m * ldy), rng));
        got.push_back(want.back());
        cpu::linear(ctx, packed[i], x.data(), ldx, m, want.back().data(), ldy);
      }
      for (std::size_t i = 0; i < packed.size(); ++i) outs.push_back({&packed[i], got[i].data(), widths[i] + 5});
      cpu::linear_shared_input(ctx, x.data(), ldx, m, outs.data(), static_cast<int>(outs.size()));
      for (std::size_t i = 0; i < packed.size(); ++i) CHECK(got[i] == want[i]);
      // One thread: the same bits.
      cpu::KernelContext one = ctx;
      one.threads = 1;
      for (auto& g : got) std::fill(g.begin(), g.end(), 0.0f);
      cpu::linear_shared_input(one, x.data(), ldx, m, outs.data(), static_cast<int>(outs.size()));
      for (std::size_t i = 0; i < packed.size(); ++i) {
        const std::int64_t ldy = widths[i] + 5;
        for (std::int64_t r = 0; r < m; ++r)
          CHECK(std::equal(got[i].begin() + r * ldy, got[i].begin() + r * ldy + widths[i], want[i].begin() + r * ldy));
      }
    }
  }
}

TEST_CASE("fast precision on AVX512-BF16: the row-major products of the vocabulary pass", "[cpu][kernels][tiles]") {
  // The LM head (x E^T, directly and from activations prepared once) and the soft embedding (P E)
  // read the embedding in its rows: fp32 sums of the bf16-rounded inputs, the same bits at any
  // thread count and for a row alone.
  if (!cpu::cpu_features().avx512bf16) {
    WARN("no AVX512-BF16 on this CPU: the bf16 dot-product kernels are not run here");
    return;
  }
  std::mt19937 rng(53);
  cpu::KernelContext ctx;
  ctx.isa = cpu::Isa::kAvx512;
  ctx.precision = cpu::Precision::kFast;
  ctx.threads = 2;
  REQUIRE(ctx.bf16_dots());
  struct Size {
    std::int64_t m, n, k;
  };
  // Rows below, at and past the 16-row panels and the 32-row pairs of panels; weight rows past 8
  // and 16; odd depths (a BF16 row's last pair is then staged); depths across the 1024-row slabs
  // of the soft embedding; a misaligned BF16 table.
  const Size sizes[] = {{1, 5, 7},     {3, 16, 1},     {16, 9, 64},    {17, 33, 33},   {31, 100, 257},
                        {40, 300, 701}, {33, 48, 2500}, {70, 70, 96}, {100, 17, 1024}};
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const Size& s : sizes) {
      for (bool transposed : {false, true}) {
        // W is [n, k] for x W^T, [k, n] for x W.
        const TestWeight w = transposed ? make_weight(dtype, s.k, s.n, rng, 1, 2) : make_weight(dtype, s.n, s.k, rng, 1, 2);
        const auto weight = [&](std::int64_t j, std::int64_t kk) {
          return bfloat16::from_float(static_cast<float>(transposed ? w.values[kk * s.n + j] : w.values[j * s.k + kk])).to_float();
        };
        const std::int64_t ldx = s.k + 3, ldy = s.n + 5;
        const auto x = random_floats(static_cast<std::size_t>(s.m * ldx), rng);
        for (bool accumulate : {false, true}) {
          INFO(dtype_label(dtype) << (transposed ? " x W" : " x W^T") << " m " << s.m << " n " << s.n << " k " << s.k
                                  << (accumulate ? " accumulate" : ""));
          auto y = random_floats(static_cast<std::size_t>(s.m * ldy), rng);
          std::vector<double> want(y.begin(), y.end()), scale(y.size(), 1.0);
          for (std::int64_t i = 0; i < s.m; ++i) {
            for (std::int64_t j = 0; j < s.n; ++j) {
              double sum = accumulate ? y[i * ldy + j] : 0.0, mag = std::abs(sum);
              for (std::int64_t kk = 0; kk < s.k; ++kk) {
                const double p = static_cast<double>(bfloat16::from_float(x[i * ldx + kk]).to_float()) * weight(j, kk);
                sum += p;
                mag += std::abs(p);
              }
              want[i * ldy + j] = sum;
              scale[i * ldy + j] = mag;
            }
          }
          const auto product = [&](const cpu::KernelContext& c, std::int64_t rows, std::int64_t first, float* out) {
            if (transposed) {
              cpu::linear_transposed(c, w.view, x.data() + first * ldx, ldx, rows, out, ldy, accumulate);
            } else {
              cpu::linear(c, w.view, x.data() + first * ldx, ldx, rows, out, ldy, accumulate);
            }
          };
          const auto before = y;
          product(ctx, s.m, 0, y.data());
          CHECK(worst_relative(y, want, scale) < 1e-5);
          auto serial = before;
          cpu::KernelContext one = ctx;
          one.threads = 1;
          product(one, s.m, 0, serial.data());
          CHECK(serial == y);
          const std::int64_t last = s.m - 1;
          std::vector<float> alone(before.begin() + last * ldy, before.begin() + (last + 1) * ldy);
          product(ctx, 1, last, alone.data());
          CHECK(std::equal(alone.begin(), alone.end(), y.begin() + last * ldy));
          if (!transposed) {  // the LM head's form: activations prepared once, the product on one thread
            cpu::PackedActivations prepared;
            prepared.pack(ctx, x.data(), ldx, s.m, s.k);
            CHECK(prepared.pairs() != nullptr);
            auto again = before;
            cpu::linear(ctx, w.view, prepared, again.data(), ldy, accumulate);
            CHECK(again == y);
          }
        }
      }
    }
  }
}

TEST_CASE("attention's activation products match a double-precision oracle on every kernel family",
          "[cpu][kernels]") {
  // matmul_nt (scores: q K^T) and matmul_nn (probabilities x values), fp32 operands with padded
  // strides; in the fast precision with bf16 products both operands are rounded to bf16.
  std::mt19937 rng(59);
  struct Size {
    std::int64_t m, n, k;
  };
  const Size sizes[] = {{1, 7, 5}, {16, 40, 128}, {37, 300, 64}, {64, 129, 256}, {20, 1100, 33}};
  for (cpu::Isa isa : runnable_isas()) {
    for (cpu::Precision precision : {cpu::Precision::kExact, cpu::Precision::kFast}) {
      cpu::KernelContext ctx;
      ctx.isa = isa;
      ctx.precision = precision;
      const double tolerance = ctx.bf16_tiles() || ctx.bf16_dots() ? 6e-3 : 1e-5;
      for (const Size& s : sizes) {
        for (bool nn : {false, true}) {
          for (bool accumulate : {false, true}) {
            INFO(cpu::isa_name(isa) << " " << cpu::precision_name(precision) << (nn ? " a b" : " a b^T") << " m " << s.m
                                    << " n " << s.n << " k " << s.k << (accumulate ? " accumulate" : ""));
            const std::int64_t lda = s.k + 1, ldb = (nn ? s.n : s.k) + 3, ldc = s.n + 2;
            const auto a = random_floats(static_cast<std::size_t>(s.m * lda), rng);
            const auto b = random_floats(static_cast<std::size_t>((nn ? s.k : s.n) * ldb), rng);
            auto c = random_floats(static_cast<std::size_t>(s.m * ldc), rng);
            std::vector<double> want(c.begin(), c.end()), scale(c.size(), 1.0);
            for (std::int64_t i = 0; i < s.m; ++i) {
              for (std::int64_t j = 0; j < s.n; ++j) {
                double sum = accumulate ? c[i * ldc + j] : 0.0, mag = std::abs(sum);
                for (std::int64_t kk = 0; kk < s.k; ++kk) {
                  const double p = static_cast<double>(a[i * lda + kk]) * (nn ? b[kk * ldb + j] : b[j * ldb + kk]);
                  sum += p;
                  mag += std::abs(p);
                }
                want[i * ldc + j] = sum;
                scale[i * ldc + j] = mag;
              }
            }
            if (nn) {
              cpu::matmul_nn(ctx, a.data(), lda, b.data(), ldb, c.data(), ldc, s.m, s.n, s.k, accumulate);
            } else {
              cpu::matmul_nt(ctx, a.data(), lda, b.data(), ldb, c.data(), ldc, s.m, s.n, s.k, accumulate);
            }
            CHECK(worst_relative(c, want, scale) < tolerance);
          }
        }
      }
    }
  }
}

TEST_CASE("operands laid out as panels once give matmul_nt's and matmul_nn's bits on any columns and depth",
          "[cpu][kernels]") {
  // The attention's use: keys laid out once, scores over columns starting on a panel before the
  // first key a block sees; values laid out once, P V over a depth range starting anywhere.
  cpu::KernelContext ctx;
  ctx.isa = cpu::Isa::kAvx2;
  if (!cpu::PanelOperand::available(ctx) || cpu::cpu_features().best() < cpu::Isa::kAvx2) {
    WARN("PanelOperand not run: it is read by the AVX2 family only, which this build or CPU lacks");
    return;
  }
  std::mt19937 rng(61);
  struct Case {
    std::int64_t m, n_total, k_total, n0, n, k0, k;  // columns [n0, n0 + n), depth [k0, k0 + k)
  };
  const Case cases[] = {{64, 700, 64, 0, 700, 0, 64},  {5, 300, 128, 48, 245, 0, 128}, {37, 40, 33, 16, 3, 0, 33},
                        {64, 64, 700, 0, 64, 13, 600}, {23, 130, 257, 0, 130, 1, 256}, {6, 17, 520, 0, 17, 259, 261}};
  for (const bool row_invariant : {true, false}) {
    ctx.row_invariant = row_invariant;
    for (const Case& s : cases) {
      for (const bool nn : {false, true}) {
        for (const bool accumulate : {false, true}) {
          INFO((nn ? "a b" : "a b^T") << " m " << s.m << " columns [" << s.n0 << ", " << s.n0 + s.n << ") of " << s.n_total
                                      << " depth [" << s.k0 << ", " << s.k0 + s.k << ") of " << s.k_total
                                      << (accumulate ? " accumulate" : "") << (row_invariant ? " row-invariant" : ""));
          if (!cpu::PanelOperand::matches_matmul(ctx, s.m)) continue;
          const std::int64_t lda = s.k + 3, ldb = (nn ? s.n_total : s.k_total) + 1, ldc = s.n + 5;
          const auto a = random_floats(static_cast<std::size_t>(s.m * lda), rng);
          const auto b = random_floats(static_cast<std::size_t>((nn ? s.k_total : s.n_total) * ldb), rng);
          const auto c0 = random_floats(static_cast<std::size_t>(s.m * ldc), rng);
          std::vector<float> want = c0, got = c0;
          std::vector<float> panels(cpu::PanelOperand::floats(s.n_total, s.k_total), -1.0f);
          if (nn) {
            cpu::matmul_nn(ctx, a.data(), lda, b.data() + s.k0 * ldb + s.n0, ldb, want.data(), ldc, s.m, s.n, s.k,
                           accumulate);
            cpu::PanelOperand::rows_as_depth(b.data(), ldb, s.k_total, s.n_total, panels.data())
                .multiply(a.data(), lda, s.m, s.n0, s.n, s.k0, s.k, got.data(), ldc, accumulate);
          } else {
            cpu::matmul_nt(ctx, a.data(), lda, b.data() + s.n0 * ldb + s.k0, ldb, want.data(), ldc, s.m, s.n, s.k,
                           accumulate);
            cpu::PanelOperand::rows_as_outputs(b.data(), ldb, s.n_total, s.k_total, panels.data())
                .multiply(a.data(), lda, s.m, s.n0, s.n, s.k0, s.k, got.data(), ldc, accumulate);
          }
          CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("the weight prefetcher requests every line of a block once, spread over the steps", "[cpu][kernels]") {
  // Runs of 40 bytes, 100 apart, from an address 24 bytes into a line: runs cross line boundaries.
  alignas(64) static std::byte memory[4096];
  struct Case {
    std::size_t offset, bytes, stride;
    std::int64_t runs, steps;
  };
  const Case cases[] = {{24, 40, 100, 9, 4}, {0, 1024, 0, 1, 3}, {63, 2, 64, 5, 100}, {0, 64, 128, 16, 1}, {8, 8, 8, 0, 3}};
  for (const Case& c : cases) {
    INFO("offset " << c.offset << " bytes " << c.bytes << " stride " << c.stride << " runs " << c.runs << " steps "
                   << c.steps);
    const std::byte* base = memory + c.offset;
    std::vector<std::uintptr_t> want;  // every line a byte of the block lies on, run by run
    for (std::int64_t r = 0; r < c.runs; ++r) {
      const auto first = reinterpret_cast<std::uintptr_t>(base + r * c.stride) / 64;
      const auto last = (reinterpret_cast<std::uintptr_t>(base + r * c.stride) + c.bytes - 1) / 64;
      for (auto line = first; line <= last; ++line) want.push_back(line * 64);
    }
    cpu::kernels::PanelPrefetcher prefetch;
    prefetch.start(cpu::kernels::PanelSource{base, c.runs, c.bytes, c.stride}, c.steps);
    std::vector<std::uintptr_t> got;
    std::int64_t busiest = 0;
    for (std::int64_t s = 0; s < c.steps + 2; ++s) {  // steps past the last request nothing
      const std::size_t before = got.size();
      prefetch.step([&](const void* line) { got.push_back(reinterpret_cast<std::uintptr_t>(line)); });
      busiest = std::max<std::int64_t>(busiest, static_cast<std::int64_t>(got.size() - before));
      if (s == c.steps - 1) CHECK(got.size() == want.size());  // all requested within the steps
    }
    CHECK(got == want);
    CHECK(busiest == (static_cast<std::int64_t>(want.size()) + c.steps - 1) / c.steps);
  }
}

TEST_CASE("the portable pair-tile packing lays out and rounds weights exactly as the AMX packing does",
          "[cpu][kernels][tiles]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAmx) {
    WARN("no AMX on this CPU: the two packings are not compared here (" << cpu::cpu_features().flags() << ")");
    return;
  }
  std::mt19937 rng(32);
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{5, 7}, {16, 32}, {33, 257}, {70, 700}}) {
      const TestWeight w = make_weight(dtype, n, k, rng);
      std::vector<std::uint16_t> portable(w.view.tile_elements_per_group(), 0xFFFF), amx(portable.size(), 0xFFFF);
      cpu::kernels::MatrixB b;
      b.data = w.view.data;
      b.dtype = dtype;
      b.ld = k;
      for (std::int64_t n0 = 0; n0 < n; n0 += 16) {
        switch (dtype) {
          case DType::kBF16: cpu::detail::pack_pair_panel<DType::kBF16>(w.view.data, n, k, n0, portable.data()); break;
          case DType::kF16: cpu::detail::pack_pair_panel<DType::kF16>(w.view.data, n, k, n0, portable.data()); break;
          default: cpu::detail::pack_pair_panel<DType::kF32>(w.view.data, n, k, n0, portable.data()); break;
        }
      }
      switch (dtype) {
        case DType::kBF16: cpu::kernels::amx::pack_weight_tiles<DType::kBF16>(b, n, k, amx.data()); break;
        case DType::kF16: cpu::kernels::amx::pack_weight_tiles<DType::kF16>(b, n, k, amx.data()); break;
        default: cpu::kernels::amx::pack_weight_tiles<DType::kF32>(b, n, k, amx.data()); break;
      }
      INFO(dtype_label(dtype) << " n " << n << " k " << k);
      CHECK(portable == amx);
    }
  }
}

TEST_CASE("attention products on AMX tiles equal fp32 sums of their bf16-rounded inputs", "[cpu][kernels][tiles]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAmx) {
    WARN("no AMX on this CPU: the attention tile kernels are not run here (" << cpu::cpu_features().flags() << ")");
    return;
  }
  namespace amx = cpu::kernels::amx;
  std::mt19937 rng(91);
  const auto bf = [](float f) { return static_cast<double>(bfloat16::from_float(f).to_float()); };
  // |got - want| within fp32 accumulation error of sum |a b|, for every output in range.
  const auto close = [](double got, double want, double scale) { return std::abs(got - want) <= 1e-5 * scale + 1e-30; };
  struct Size {
    std::int64_t m, d, keys;
  };
  for (const Size& sz : {Size{5, 64, 40}, Size{16, 128, 96}, Size{37, 100, 70}, Size{33, 256, 160}}) {
    INFO("queries " << sz.m << " head dim " << sz.d << " keys " << sz.keys);
    const std::int64_t m16 = amx::round_up(sz.m, 16), key_tiles = (sz.keys + 15) / 16;
    const auto q = random_floats(static_cast<std::size_t>(sz.m * sz.d), rng);
    const auto k = random_floats(static_cast<std::size_t>(sz.keys * sz.d), rng);
    std::vector<std::uint16_t> qa(amx::packed_size(sz.m, sz.d)), kt(amx::packed_size(sz.keys, sz.d));
    amx::pack_activations_rows(q.data(), sz.d, sz.m, sz.d, qa.data());
    amx::pack_activations_pairs(k.data(), sz.d, sz.keys, sz.d, kt.data());
    // Scores against key tiles [1, key_tiles): the first tile is skipped, as a query block whose
    // visible keys start later skips it.
    const std::int64_t lds = 16 * (key_tiles - 1);
    std::vector<float> s(static_cast<std::size_t>(m16 * lds));
    amx::scores_on_tiles(qa.data(), sz.m, sz.d, kt.data(), 1, key_tiles - 1, s.data(), lds);
    bool scores_ok = true;
    for (std::int64_t r = 0; r < sz.m; ++r) {
      for (std::int64_t j = 16; j < sz.keys; ++j) {
        double want = 0.0, scale = 0.0;
        for (std::int64_t c = 0; c < sz.d; ++c) {
          const double t = bf(q[r * sz.d + c]) * bf(k[j * sz.d + c]);
          want += t;
          scale += std::abs(t);
        }
        scores_ok = scores_ok && close(s[r * lds + j - 16], want, scale);
      }
    }
    CHECK(scores_ok);
    // Probabilities [m, keys] times values [keys, d] over key blocks [1, kbs) of 32, added to o.
    const std::int64_t kbs = (sz.keys + 31) / 32, span = 32 * kbs;
    auto p = random_floats(static_cast<std::size_t>(sz.m * span), rng);
    for (std::int64_t r = 0; r < sz.m; ++r)
      for (std::int64_t j = sz.keys; j < span; ++j) p[r * span + j] = 0.0f;
    std::vector<float> v = random_floats(static_cast<std::size_t>(span * sz.d), rng);
    std::vector<std::uint16_t> pa(amx::packed_size(sz.m, span)), vt(amx::packed_size(span, sz.d));
    amx::pack_pair_tiles(v.data(), sz.d, span, sz.d, vt.data());
    // The probabilities of blocks [1, kbs) alone, packed as the engine packs one query block's span.
    amx::pack_activations_rows(p.data() + 32, span, sz.m, span - 32, pa.data());
    const auto o0 = random_floats(static_cast<std::size_t>(sz.m * sz.d), rng);
    auto o = o0;
    amx::values_on_tiles(pa.data(), sz.m, vt.data(), 1, kbs - 1, sz.d, o.data(), sz.d, /*accumulate=*/true);
    bool values_ok = true;
    for (std::int64_t r = 0; r < sz.m; ++r) {
      for (std::int64_t c = 0; c < sz.d; ++c) {
        double want = 0.0, scale = 0.0;
        for (std::int64_t j = 32; j < span; ++j) {
          const double t = bf(p[r * span + j]) * bf(v[j * sz.d + c]);
          want += t;
          scale += std::abs(t);
        }
        values_ok = values_ok && close(o[r * sz.d + c], o0[r * sz.d + c] + want, scale + std::abs(o0[r * sz.d + c]));
      }
    }
    CHECK(values_ok);
  }
}
#endif

TEST_CASE("vector exp, tanh and GELU equal the scalar definitions bit for bit", "[cpu][kernels][math]") {
  std::vector<float> xs;
  for (float v = -100.0f; v < 100.0f; v += 0.0137f) xs.push_back(v);
  for (float v = -1.0f; v < 1.0f; v += 1.3e-4f) xs.push_back(v);
  for (float v : {0.0f, -0.0f, 0.25f, -0.25f, 0.2499999f, 88.3762626647949f, 88.37626f, -87.3365478515625f, -87.33654f,
                  1e-30f, -1e-30f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN}) {
    xs.push_back(v);
  }
  const auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
  for (cpu::Isa isa : runnable_isas()) {
    INFO(cpu::isa_name(isa));
    std::vector<float> g = xs, ones(xs.size(), 1.0f);
    cpu::vmath::gelu_mul(isa, g.data(), ones.data(), static_cast<std::int64_t>(g.size()));
    std::vector<float> cap = xs;
    std::int64_t arg = 0;
    cpu::vmath::softcap_div_max(isa, cap.data(), static_cast<std::int64_t>(cap.size()), 30.0f, 1.0f, &arg);
    std::vector<float> e = xs;
    float sum = 0, weighted = 0;
    cpu::vmath::exp_shift_sums(isa, e.data(), static_cast<std::int64_t>(e.size()), 0.0f, 256, &sum, &weighted, nullptr);
    int bad_gelu = 0, bad_cap = 0, bad_exp = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      bad_gelu += !same(g[i], math::gelu_tanh(xs[i]) * 1.0f);
      bad_cap += !same(cap[i], math::softcap(xs[i], 30.0f) / 1.0f);
      bad_exp += !same(e[i], math::exp_approx(xs[i] - 0.0f));
    }
    CHECK(bad_gelu == 0);
    CHECK(bad_cap == 0);
    CHECK(bad_exp == 0);
  }
}

TEST_CASE("the row-wise glue (residual adds, scalings, attention mask, weighted sums) equals the scalar loops bit for bit",
          "[cpu][kernels][math]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::bernoulli_distribution coin(0.6);
  for (cpu::Isa isa : runnable_isas()) {
    INFO(cpu::isa_name(isa));
    for (std::int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 100, 1024, 1029}) {
      INFO("n = " << n);
      std::vector<float> x(n), y(n), w(n);
      std::vector<std::uint8_t> vis(n);
      for (std::int64_t i = 0; i < n; ++i) {
        x[i] = nd(rng);
        y[i] = nd(rng);
        w[i] = nd(rng);
        vis[i] = coin(rng) ? static_cast<std::uint8_t>(1 + i % 200) : 0;  // any non-zero byte is visible
      }
      const float s = 0.7071f, wt = 0.3183f;
      std::vector<float> got = x, want = x;
      cpu::vmath::mask_row(isa, got.data(), vis.data(), n);
      for (std::int64_t i = 0; i < n; ++i) want[i] = vis[i] ? x[i] : -INFINITY;
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      got = x;
      cpu::vmath::add_row(isa, got.data(), y.data(), n);
      for (std::int64_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      got = x;
      cpu::vmath::add_scale_row(isa, got.data(), y.data(), s, n);
      for (std::int64_t i = 0; i < n; ++i) want[i] = (x[i] + y[i]) * s;
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      got = x;
      cpu::vmath::add_weighted_row(isa, got.data(), y.data(), wt, n);
      for (std::int64_t i = 0; i < n; ++i) {
        const volatile float product = y[i] * wt;  // rounded before the sum, as the engine's loop was
        want[i] = x[i] + product;
      }
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      got = x;
      cpu::vmath::mul_scale_row(isa, got.data(), w.data(), s, n);
      for (std::int64_t i = 0; i < n; ++i) want[i] = (x[i] * w[i]) * s;
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the scalar exp, tanh and GELU stay close to libm", "[cpu][kernels][math]") {
  double exp_rel = 0.0, tanh_abs = 0.0, gelu_abs = 0.0;
  for (float x = -87.0f; x < 88.0f; x += 0.00731f) {
    exp_rel = std::max(exp_rel, std::abs(math::exp_approx(x) - std::exp(static_cast<double>(x))) / std::exp(static_cast<double>(x)));
  }
  for (float x = -12.0f; x < 12.0f; x += 0.000731f) {
    tanh_abs = std::max(tanh_abs, std::abs(math::tanh_approx(x) - std::tanh(static_cast<double>(x))));
    const double ref = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * static_cast<double>(x) * x * x)));
    gelu_abs = std::max(gelu_abs, std::abs(math::gelu_tanh(x) - ref));
  }
  INFO("exp relative " << exp_rel << ", tanh absolute " << tanh_abs << ", gelu absolute " << gelu_abs);
  CHECK(exp_rel < 2.5e-7);   // measured 1.2e-7 (1 ulp)
  CHECK(tanh_abs < 2e-7);    // measured 6e-8
  CHECK(gelu_abs < 2e-6);    // measured 9.5e-7 (half an ulp of |x| ~ 12)
  CHECK(std::isnan(math::exp_approx(NAN)));
  CHECK(math::exp_approx(-INFINITY) == 0.0f);
  CHECK(math::exp_approx(INFINITY) == INFINITY);
}

TEST_CASE("DG_CPU_ISA is parsed strictly", "[cpu][isa]") {
  CHECK(cpu::resolve_isa(nullptr) == cpu::cpu_features().best());
  CHECK(cpu::resolve_isa("generic") == cpu::Isa::kGeneric);
  try {
    cpu::resolve_isa("avx9");
    FAIL("an unknown family must be refused");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("DG_CPU_ISA='avx9'") != std::string::npos);
  }
  if (cpu::cpu_features().best() < cpu::Isa::kAmx) {
    CHECK_THROWS_AS(cpu::resolve_isa("amx"), Error);
  }
}

TEST_CASE("DG_CPU_INT8_TILES is parsed strictly and opts in only on AMX in the fast precision", "[cpu][isa]") {
  CHECK_FALSE(cpu::parse_int8_tiles(nullptr));
  CHECK_FALSE(cpu::parse_int8_tiles(""));
  CHECK_FALSE(cpu::parse_int8_tiles("0"));
  CHECK(cpu::parse_int8_tiles("1"));
  try {
    cpu::parse_int8_tiles("yes");
    FAIL("a value other than 0 or 1 must be refused");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("DG_CPU_INT8_TILES='yes'") != std::string::npos);
  }
  cpu::KernelContext ctx;
  ctx.amx_int8 = true;
  ctx.precision = cpu::Precision::kFast;
  ctx.isa = cpu::Isa::kAvx512;
  CHECK_FALSE(ctx.int8_tiles());
  ctx.isa = cpu::Isa::kAmx;
  ctx.precision = cpu::Precision::kExact;
  CHECK_FALSE(ctx.int8_tiles());
  ctx.precision = cpu::Precision::kFast;
  CHECK(ctx.int8_tiles() == (cpu::cpu_features().amx_int8 && cpu::cpu_features().avx512vnni));
  ctx.amx_int8 = false;
  CHECK_FALSE(ctx.int8_tiles());
}

namespace {

// A random quantized matrix in one of the compressed-tensors layouts, with its storage.
struct RandomQuantized {
  std::vector<unsigned char> values, scales, zeros;
  QuantizedMatrix q;
  RandomQuantized(QuantFormat format, int bits, std::int64_t rows, std::int64_t cols, std::int64_t group, DType scale_dtype,
                  bool asymmetric, std::mt19937& gen) {
    q.format = format;
    q.bits = bits;
    q.rows = rows;
    q.cols = cols;
    q.group_size = group;
    const std::int64_t row_bytes = format == QuantFormat::kPacked ? (cols * bits + 31) / 32 * 4 : cols;
    values.resize(static_cast<std::size_t>(rows * row_bytes));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : values) b = static_cast<unsigned char>(byte(gen));
    if (format == QuantFormat::kFp8) {
      for (auto& b : values)
        if ((b & 0x7f) == 0x7f) b = 0x3f;  // no NaN codes
    }
    const std::int64_t groups = group > 0 ? (cols + group - 1) / group : 1;
    const std::int64_t n_scales = group < 0 ? 1 : rows * groups;
    scales.resize(static_cast<std::size_t>(n_scales) * dtype_size(scale_dtype));
    std::uniform_real_distribution<float> scale(1e-3f, 0.1f);
    for (std::int64_t i = 0; i < n_scales; ++i) {
      const float s = scale(gen);
      if (scale_dtype == DType::kF32) std::memcpy(scales.data() + 4 * i, &s, 4);
      else {
        const std::uint16_t h = scale_dtype == DType::kBF16 ? bfloat16::from_float(s).bits : float16::from_float(s).bits;
        std::memcpy(scales.data() + 2 * i, &h, 2);
      }
    }
    const auto raw = [](std::vector<unsigned char>& v, DType t, Shape s) {
      RawTensor r;
      r.data = reinterpret_cast<const std::byte*>(v.data());
      r.dtype = t;
      r.shape = s;
      r.nbytes = v.size();
      return r;
    };
    q.values = raw(values, format == QuantFormat::kPacked ? DType::kI32 : DType::kU8, Shape{rows, row_bytes});
    q.scale = raw(scales, scale_dtype, Shape{n_scales});
    if (asymmetric) {
      zeros.resize(static_cast<std::size_t>((rows * bits + 31) / 32 * groups * 4));
      for (auto& b : zeros) b = static_cast<unsigned char>(byte(gen));
      q.zero_point = raw(zeros, DType::kI32, Shape{(rows * bits + 31) / 32, groups});
    }
  }
};

}  // namespace

TEST_CASE("vector FP8 decoding covers all 256 codes, NaN included", "[cpu][kernels][quant]") {
  std::vector<unsigned char> codes(256), scale(4);
  for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
  const float one = 1.0f;
  std::memcpy(scale.data(), &one, 4);
  QuantizedMatrix q;
  q.format = QuantFormat::kFp8;
  q.rows = 1;
  q.cols = 256;
  q.group_size = -1;
  q.values.data = reinterpret_cast<const std::byte*>(codes.data());
  q.values.dtype = DType::kF8E4M3;
  q.values.shape = Shape{1, 256};
  q.scale.data = reinterpret_cast<const std::byte*>(scale.data());
  q.scale.dtype = DType::kF32;
  q.scale.shape = Shape{1};
  std::vector<std::byte> want(256 * 4);
  cpu::kernels::dequantize_rows(q, 0, 1, want.data());
  for (cpu::Isa isa : runnable_isas()) {
    std::vector<std::byte> got(256 * 4);
    cpu::kernels::dequantize_rows(isa, q, 0, 1, got.data());
    for (int i = 0; i < 256; ++i) {
      float a, b;
      std::memcpy(&a, want.data() + 4 * i, 4);
      std::memcpy(&b, got.data() + 4 * i, 4);
      INFO(cpu::isa_name(isa) << " code " << i << " scalar " << a << " vector " << b);
      CHECK((a == b || (std::isnan(a) && std::isnan(b))));
    }
  }
}

TEST_CASE("vector dequantisation equals the scalar form bit for bit; quantized products match the oracle",
          "[cpu][kernels][quant]") {
  std::mt19937 gen(11);
  struct Layout {
    QuantFormat format;
    int bits;
    bool asymmetric;
  };
  const Layout layouts[] = {{QuantFormat::kPacked, 4, false}, {QuantFormat::kPacked, 4, true}, {QuantFormat::kPacked, 8, false},
                            {QuantFormat::kPacked, 8, true},  {QuantFormat::kInt8, 8, false},  {QuantFormat::kFp8, 8, false}};
  for (const Layout& l : layouts) {
    for (DType st : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (std::int64_t group : {std::int64_t{0}, std::int64_t{32}, std::int64_t{64}, std::int64_t{-1}}) {
        if (group < 0 && l.format == QuantFormat::kPacked) continue;
        for (std::int64_t cols : {std::int64_t{96}, std::int64_t{104}, std::int64_t{13}, std::int64_t{200}}) {
          if (group > 0 && cols % 8 != 0) continue;
          const std::int64_t rows = 37;
          RandomQuantized m(l.format, l.bits, rows, cols, group, st, l.asymmetric, gen);
          INFO("format " << static_cast<int>(l.format) << " bits " << l.bits << " asym " << l.asymmetric << " scale "
                         << dtype_name(st) << " group " << group << " cols " << cols);
          std::vector<std::byte> want(static_cast<std::size_t>(rows * cols) * dtype_size(st));
          cpu::kernels::dequantize_rows(m.q, 0, rows, want.data());
          for (cpu::Isa isa : runnable_isas()) {
            INFO(cpu::isa_name(isa));
            std::vector<std::byte> got(want.size());
            cpu::kernels::dequantize_rows(isa, m.q, 3, rows - 3, got.data());
            CHECK(std::memcmp(got.data(), want.data() + 3 * cols * static_cast<std::int64_t>(dtype_size(st)),
                              got.size() - 3 * cols * dtype_size(st)) == 0);
            // The product with the quantized weight equals the product with its dequantised copy.
            Weight w = Weight::quantized(m.q);
            Weight dense;
            dense.data = want.data();
            dense.dtype = st;
            dense.shape = Shape{rows, cols};
            const std::int64_t M = 7;
            std::vector<float> x(static_cast<std::size_t>(M * cols)), y(static_cast<std::size_t>(M * rows)), z(y.size());
            std::normal_distribution<float> normal;
            for (float& v : x) v = normal(gen);
            cpu::KernelContext ctx;
            ctx.isa = isa;
            ctx.precision = cpu::Precision::kExact;
            cpu::linear(ctx, w, x.data(), cols, M, y.data(), rows);
            cpu::linear(ctx, dense, x.data(), cols, M, z.data(), rows);
            CHECK(y == z);
          }
        }
      }
    }
  }
}

namespace {

// The scalar reference of the int8 products for x [m, k] (rows ldx apart) and a 4-bit q, with the
// activation scales it rounded to.
struct Int8Reference {
  cpu::kernels::int8::Chunks chunks;
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  Int8Reference(const QuantizedMatrix& q, const float* x, std::int64_t ldx, std::int64_t m, float* y, std::int64_t ldy,
                bool accumulate) {
    namespace i8 = cpu::kernels::int8;
    chunks = i8::chunks_of(q);
    codes.resize(static_cast<std::size_t>(m * q.cols));
    scales.resize(static_cast<std::size_t>(m * chunks.count));
    i8::quantize_activations_scalar(x, ldx, m, q.cols, chunks, codes.data(), scales.data());
    i8::Activations a;
    a.codes = codes.data();
    a.scales = scales.data();
    a.m = m;
    a.k = q.cols;
    a.chunks = chunks;
    i8::product_columns(q, a, 0, q.rows, y, ldy, accumulate, i8::Form::kScalar);
  }
};

// Largest |fast - exact| over the bound the roundings allow, for each output: the weights times
// half an activation step of their chunk, plus the exact path's rounding of the dequantised weight
// (`weight_rounding`, relative) and of fp32 sums. `deq`: q dequantised into `st`, [n, k].
double worst_over_bound(const Int8Reference& r8, const std::vector<std::byte>& deq, DType st, const float* x,
                        std::int64_t ldx, std::int64_t m, std::int64_t n, std::int64_t k, const float* fast,
                        const float* exact, std::int64_t ldy, double weight_rounding) {
  double worst = 0.0;
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      double bound = 1e-30;
      for (std::int64_t c = 0; c < k; ++c) {
        const double wv = cpu::kernels::MatrixB::element(deq.data(), st, j * k + c);
        const double half_step = 0.5 * r8.scales[static_cast<std::size_t>(r * r8.chunks.count + c / r8.chunks.length)];
        bound += std::abs(wv) * (half_step + std::abs(x[r * ldx + c]) * (weight_rounding + 1e-5));
      }
      worst = std::max(worst, std::abs(static_cast<double>(fast[r * ldy + j]) - exact[r * ldy + j]) / bound);
    }
  }
  return worst;
}

}  // namespace

// The fast precision on AVX2 and AVX-512 CPUs: 4-bit weights times activations rounded to 8-bit integers
// (cpu/kernels/int8_products.hpp). The AVX2 kernel must give the scalar reference's bits, at any
// thread count and for a row alone; against the exact product it may differ only by the rounding of
// the activations (half a step of each chunk's scale) and of the exact path's bf16 weights.
TEST_CASE("fast precision on AVX2: int8 activations x 4-bit weights", "[cpu][kernels][quant][int8]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAvx2) {
    WARN("the int8 products are not run: this CPU lacks AVX2");
    return;
  }
  namespace i8 = cpu::kernels::int8;
  // The AMX-INT8 form where this CPU has it (and its tile permission): it must give the same bits.
  const bool amx_int8 = cpu::cpu_features().best() == cpu::Isa::kAmx && cpu::cpu_features().amx_int8 &&
                        cpu::cpu_features().avx512vnni;
  if (!amx_int8) WARN("the AMX-INT8 form of the int8 products is not run: this CPU lacks AMX-INT8");
  int tiled_runs = 0;  // products where the tiles took at least one block of 16 rows
  std::mt19937 gen(23);
  for (bool asymmetric : {false, true}) {
    for (DType st : {DType::kBF16, DType::kF32}) {
      for (std::int64_t group : {std::int64_t{0}, std::int64_t{32}, std::int64_t{64}}) {
        for (std::int64_t cols : {std::int64_t{96}, std::int64_t{200}, std::int64_t{256}}) {
          const std::int64_t rows = cols == 256 ? 300 : 37;
          RandomQuantized m(QuantFormat::kPacked, 4, rows, cols, group, st, asymmetric, gen);
          REQUIRE(i8::supported(m.q));
          const Weight w = Weight::quantized(m.q);
          std::vector<std::byte> deq(static_cast<std::size_t>(rows * cols) * dtype_size(st));
          cpu::kernels::dequantize_rows(m.q, 0, rows, deq.data());
          for (std::int64_t M : {std::int64_t{1}, std::int64_t{5}, std::int64_t{6}, std::int64_t{13}, std::int64_t{20},
                                 std::int64_t{37}}) {
            INFO("asym " << asymmetric << " scale " << dtype_name(st) << " group " << group << " cols " << cols
                         << " rows " << rows << " m " << M);
            const std::int64_t ldx = cols + 3, ldy = rows + 5;
            std::vector<float> x = random_floats(static_cast<std::size_t>(M * ldx), gen);
            x[static_cast<std::size_t>(ldx - 4)] *= 40.0f;  // an outlier coarsens only its own chunk
            std::vector<float> want = random_floats(static_cast<std::size_t>(M * ldy), gen);
            const std::vector<float> accumulated = want;
            const Int8Reference reference(m.q, x.data(), ldx, M, want.data(), ldy, false);
            // Whether the M x rows outputs of `got` have the bits of `expected` (padding ignored).
            const auto same_outputs = [&](const std::vector<float>& got, const std::vector<float>& expected) {
              bool same = true;
              for (std::int64_t r = 0; r < M; ++r)
                for (std::int64_t n = 0; n < rows; ++n) same &= got[r * ldy + n] == expected[r * ldy + n];
              return same;
            };
            // `want` from linear() on one and two threads, over a C of noise.
            const auto check_threads = [&](cpu::KernelContext c) {
              for (int threads : {1, 2}) {
                c.threads = threads;
                std::vector<float> got = random_floats(want.size(), gen);
                cpu::linear(c, w, x.data(), ldx, M, got.data(), ldy);
                CHECK(same_outputs(got, want));
              }
            };
            // The AVX2 path through linear(), on one and two threads, overwriting and accumulating.
            cpu::KernelContext ctx;
            ctx.isa = cpu::Isa::kAvx2;
            ctx.precision = cpu::Precision::kFast;
            REQUIRE(ctx.int8_products(m.q));
            check_threads(ctx);
            ctx.threads = 2;
            std::vector<float> acc_got = accumulated;
            cpu::linear(ctx, w, x.data(), ldx, M, acc_got.data(), ldy, /*accumulate=*/true);
            bool acc_ok = true;
            for (std::int64_t r = 0; r < M; ++r)
              for (std::int64_t n = 0; n < rows; ++n)
                acc_ok &= acc_got[r * ldy + n] == accumulated[r * ldy + n] + want[r * ldy + n];
            CHECK(acc_ok);
            // A row alone gives the bits it gives among others.
            std::vector<float> alone(static_cast<std::size_t>(ldy));
            cpu::linear(ctx, w, x.data() + (M - 1) * ldx, ldx, 1, alone.data(), ldy);
            CHECK(std::memcmp(alone.data(), want.data() + (M - 1) * ldy, static_cast<std::size_t>(rows) * 4) == 0);
            // An AVX-512 engine gives the same bits: vpdpbusd where the CPU has AVX512-VNNI, else the
            // AVX2 kernel.
            if (cpu::cpu_features().best() >= cpu::Isa::kAvx512) {
              cpu::KernelContext wide = ctx;
              wide.isa = cpu::Isa::kAvx512;
              REQUIRE(wide.int8_products(m.q));
              std::vector<float> got(want.size());
              cpu::linear(wide, w, x.data(), ldx, M, got.data(), ldy);
              CHECK(same_outputs(got, want));
            }
            // AMX-INT8 tiles give the same bits (blocks of 16 rows on the tiles, the rest on vpdpbusd).
            if (amx_int8) {
              cpu::KernelContext tiles = ctx;
              tiles.isa = cpu::Isa::kAmx;
              tiles.amx_int8 = true;
              REQUIRE(tiles.int8_tiles());
              REQUIRE(tiles.int8_products(m.q));
              check_threads(tiles);
              std::vector<float> acc_tiles = accumulated;
              cpu::linear(tiles, w, x.data(), ldx, M, acc_tiles.data(), ldy, /*accumulate=*/true);
              CHECK(same_outputs(acc_tiles, acc_got));
              i8::Activations shape;
              shape.k = cols;
              shape.chunks = i8::chunks_of(m.q);
              tiled_runs += M >= 16 && i8::amx::k_step(shape) > 0;
            }
            // Within the rounding bound of the exact product.
            cpu::KernelContext exact;
            exact.isa = cpu::Isa::kAvx2;
            exact.precision = cpu::Precision::kExact;
            std::vector<float> ref(want.size());
            cpu::linear(exact, w, x.data(), ldx, M, ref.data(), ldy);
            const double weight_rounding = st == DType::kBF16 ? 1.0 / 256 : 0.0;
            CHECK(worst_over_bound(reference, deq, st, x.data(), ldx, M, rows, cols, want.data(), ref.data(), ldy,
                                   weight_rounding) <= 1.0);
          }
        }
      }
    }
  }
  if (amx_int8) CHECK(tiled_runs > 0);
  // A NaN activation makes its row's outputs NaN, as the exact product does; other rows are finite.
  RandomQuantized m(QuantFormat::kPacked, 4, 40, 64, 32, DType::kBF16, false, gen);
  std::vector<float> x = random_floats(2 * 64, gen);
  x[70] = std::nanf("");
  std::vector<float> y(2 * 40);
  cpu::KernelContext ctx;
  ctx.isa = cpu::Isa::kAvx2;
  ctx.precision = cpu::Precision::kFast;
  cpu::linear(ctx, Weight::quantized(m.q), x.data(), 64, 2, y.data(), 40);
  bool first_finite = true, second_nan = true;
  for (int n = 0; n < 40; ++n) {
    first_finite &= std::isfinite(y[static_cast<std::size_t>(n)]);
    second_nan &= std::isnan(y[static_cast<std::size_t>(40 + n)]);
  }
  CHECK(first_finite);
  CHECK(second_nan);
  // GPTQ (qweight [k / 8, n], scales [groups, n], qzeros [groups, n / 8]) with its groups in order,
  // v1 and v2 zero points, full and partial panels: the same three promises.
  for (int zero_offset : {0, 1}) {
    for (std::int64_t rows : {std::int64_t{48}, std::int64_t{37}}) {
      const std::int64_t cols = 128, group = 32, groups = cols / group;
      std::vector<std::uint32_t> qweight(static_cast<std::size_t>(cols / 8 * rows));
      std::vector<std::uint32_t> qzeros(static_cast<std::size_t>(groups * ((rows * 4 + 31) / 32)));
      std::vector<std::uint16_t> scales(static_cast<std::size_t>(groups * rows));
      std::uniform_int_distribution<std::uint32_t> word;
      std::uniform_real_distribution<float> scale(1e-3f, 0.1f);
      for (auto& v : qweight) v = word(gen);
      for (auto& v : qzeros) v = word(gen) & (zero_offset ? 0xEEEEEEEEu : 0xFFFFFFFFu);  // v1: zero - 1 <= 14
      for (auto& v : scales) v = float16::from_float(scale(gen)).bits;
      QuantizedMatrix q;
      q.format = QuantFormat::kGptq;
      q.bits = 4;
      q.rows = rows;
      q.cols = cols;
      q.group_size = group;
      q.zero_offset = zero_offset;
      q.values.data = reinterpret_cast<const std::byte*>(qweight.data());
      q.values.dtype = DType::kI32;
      q.values.shape = Shape{cols / 8, rows};
      q.values.nbytes = qweight.size() * 4;
      q.scale.data = reinterpret_cast<const std::byte*>(scales.data());
      q.scale.dtype = DType::kF16;
      q.scale.shape = Shape{groups, rows};
      q.scale.nbytes = scales.size() * 2;
      q.zero_point.data = reinterpret_cast<const std::byte*>(qzeros.data());
      q.zero_point.dtype = DType::kI32;
      q.zero_point.shape = Shape{groups, (rows * 4 + 31) / 32};
      q.zero_point.nbytes = qzeros.size() * 4;
      INFO("GPTQ rows " << rows << " zero offset " << zero_offset);
      REQUIRE(i8::supported(q));
      const std::int64_t M = 7;
      std::vector<float> gx = random_floats(static_cast<std::size_t>(M * cols), gen);
      std::vector<float> want(static_cast<std::size_t>(M * rows)), got(want.size()), ref(want.size());
      const Int8Reference reference(q, gx.data(), cols, M, want.data(), rows, false);
      cpu::linear(ctx, Weight::quantized(q), gx.data(), cols, M, got.data(), rows);
      CHECK(got == want);
      cpu::KernelContext exact;
      exact.isa = cpu::Isa::kAvx2;
      exact.precision = cpu::Precision::kExact;
      cpu::linear(exact, Weight::quantized(q), gx.data(), cols, M, ref.data(), rows);
      std::vector<std::byte> deq(static_cast<std::size_t>(rows * cols) * 2);
      cpu::kernels::dequantize_rows(q, 0, rows, deq.data());
      CHECK(worst_over_bound(reference, deq, DType::kF16, gx.data(), cols, M, rows, cols, got.data(), ref.data(), rows,
                             1.0 / 1024) <= 1.0);
      // On AMX-INT8 tiles, with a block of 16 rows and a partial one: the scalar reference's bits.
      if (amx_int8) {
        const std::int64_t tm = 21;
        std::vector<float> tx = random_floats(static_cast<std::size_t>(tm * cols), gen);
        std::vector<float> twant(static_cast<std::size_t>(tm * rows)), tgot(twant.size());
        const Int8Reference treference(q, tx.data(), cols, tm, twant.data(), rows, false);
        cpu::KernelContext tiles = ctx;
        tiles.isa = cpu::Isa::kAmx;
        tiles.amx_int8 = true;
        REQUIRE(tiles.int8_tiles());
        cpu::linear(tiles, Weight::quantized(q), tx.data(), cols, tm, tgot.data(), rows);
        CHECK(tgot == twant);
      }
      // Activation order (groups not in input order) keeps the exact path.
      q.groups_in_order = false;
      CHECK_FALSE(i8::supported(q));
    }
  }
  // Layouts without this kernel keep the exact path.
  CHECK_FALSE(i8::supported(RandomQuantized(QuantFormat::kPacked, 8, 4, 64, 32, DType::kBF16, false, gen).q));
  CHECK_FALSE(i8::supported(RandomQuantized(QuantFormat::kPacked, 4, 4, 64, 16, DType::kBF16, false, gen).q));
  CHECK_FALSE(i8::supported(RandomQuantized(QuantFormat::kInt8, 8, 4, 64, 0, DType::kBF16, false, gen).q));
}

// The AVX2 tile sums a few quads of byte products in 16 bits before widening them (kQuadRun): at
// the largest codes and weights those sums come closest to wrapping, and a run too long for the
// bound would wrap here and differ from the scalar reference.
TEST_CASE("int8 products at the largest byte products: the 16-bit sums never wrap", "[cpu][kernels][quant][int8]") {
  if (cpu::cpu_features().best() < cpu::Isa::kAvx2) {
    WARN("the int8 products are not run: this CPU lacks AVX2");
    return;
  }
  std::mt19937 gen(29);
  const std::int64_t rows = 40, cols = 256, M = 7;
  // (value, zero) nibbles: q = 0 with zero 15 gives w = -15, q = 15 with zero 0 gives w = +15.
  for (const auto& [value, zero] : {std::pair<unsigned char, unsigned char>{0x00, 0xFF}, {0xFF, 0x00}}) {
    for (std::int64_t group : {std::int64_t{0}, std::int64_t{64}}) {
      RandomQuantized m(QuantFormat::kPacked, 4, rows, cols, group, DType::kF32, /*asymmetric=*/true, gen);
      std::fill(m.values.begin(), m.values.end(), value);
      std::fill(m.zeros.begin(), m.zeros.end(), zero);
      const Weight w = Weight::quantized(m.q);
      // Every row constant and positive: every code is 255.
      std::vector<float> x(static_cast<std::size_t>(M * cols));
      for (std::int64_t r = 0; r < M; ++r)
        std::fill(x.begin() + r * cols, x.begin() + (r + 1) * cols, 0.5f + static_cast<float>(r));
      std::vector<float> want(static_cast<std::size_t>(M * rows)), got(want.size());
      const Int8Reference reference(m.q, x.data(), cols, M, want.data(), rows, false);
      REQUIRE(reference.codes.front() == 255);
      cpu::KernelContext ctx;
      ctx.isa = cpu::Isa::kAvx2;
      ctx.precision = cpu::Precision::kFast;
      REQUIRE(ctx.int8_products(m.q));
      cpu::linear(ctx, w, x.data(), cols, M, got.data(), rows);
      INFO("value byte " << int(value) << " zero byte " << int(zero) << " group " << group);
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      // And they are the product itself: a constant row rounds to its codes without loss, so the
      // result is the dequantised weight's product up to fp32 rounding (a wrapped sum is far off).
      std::vector<float> deq(static_cast<std::size_t>(rows * cols));
      cpu::kernels::dequantize_rows(m.q, 0, rows, reinterpret_cast<std::byte*>(deq.data()));
      double worst = 0.0;
      for (std::int64_t r = 0; r < M; ++r)
        for (std::int64_t n = 0; n < rows; ++n) {
          double exact = 0.0;
          for (std::int64_t c = 0; c < cols; ++c) exact += double(x[r * cols + c]) * deq[n * cols + c];
          worst = std::max(worst, std::abs(got[r * rows + n] - exact) / std::abs(exact));
        }
      CHECK(worst < 1e-4);
    }
  }
}
