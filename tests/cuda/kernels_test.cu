// SPDX-License-Identifier: Apache-2.0
// Every CUDA kernel against its host oracle: the DG_HOST_DEVICE math of core/ run on the host
// (norms, RoPE, GELU, router, Philox), naive double-precision attention with the same Attention
// policy, the sampler policies of sampler/ (acceptance, renoise, stopping) and the CPU back-end's
// streaming vocabulary pass (through fixtures.cpp).
//
// Tolerances, per tensor:
// - FP32 outputs of element/row kernels: the same formula in the same order; differences come only
//   from device vs libm transcendental rounding (a few ulp): 1e-6 relative, 2e-5 absolute after RoPE
//   (cos/sin of angles up to ~100 rad).
// - BF16 outputs: one rounding of the FP32 result, 2^-8 relative (one bf16 ulp).
// - Attention: an online fp32 softmax against a double oracle: 2e-5 (FP32), 1e-2 relative (BF16
//   inputs rounded identically on both sides, BF16 output).
// - Vocabulary pass: decisions (argmax, sampled ids, chunk choice) exactly equal to the CPU pass;
//   entropies 1e-5 nats, soft embeddings 1e-4 (FP32), 1e-2 relative (BF16 probabilities).
// - Canvas step: bit-exact against the host policies (same sequential double sums), with the
//   kernel's documented tie order (lower position first) where EntropyBound's std::sort may
//   order equal entropies otherwise (docs/sampler.md 3.7).
// - Grouped GEMM (F32 and BF16 storage, fp32 accumulation): within the worst-case bound of one
//   fp32 FMA chain over k, 1.01 k 2^-24 sum |x_i w_i| (about 6e-6 relative at k = 100), against a
//   double reference from the same (bf16-rounded) inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include <diffusion_gemma/cuda/cuda.cuh>
#include <diffusion_gemma/model/rope_table.hpp>
#include <diffusion_gemma/model/token_id_check.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>
#include <diffusion_gemma/sampler/rng.hpp>
#include <diffusion_gemma/sampler/stopping.hpp>

#include "fixtures.hpp"
#include "support/catch.hpp"

using namespace diffusion_gemma;
namespace dc = diffusion_gemma::cuda;

namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

template <class T>
dc::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  dc::DeviceBuffer<T> b(v.size(), "test input");
  b.upload(v.data(), v.size());
  return b;
}

template <class T>
std::vector<T> to_host(const dc::DeviceBuffer<T>& b) {
  DG_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> v(b.size());
  b.download(v.data(), v.size());
  return v;
}

std::vector<bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<bfloat16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bfloat16::from_float(v[i]);
  return out;
}

std::vector<float> widen(const std::vector<bfloat16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
  return out;
}

std::vector<float> round_bf16(const std::vector<float>& v) { return widen(to_bf16(v)); }

// max over i of |a - b| / (abs_floor + |b|): a relative error that does not blow up near 0.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b, double abs_floor = 1.0) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / (abs_floor + std::abs(static_cast<double>(b[i]))));
  }
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

constexpr double kBf16Ulp = 1.0 / 256.0;

bool verbose_kernels() { return std::getenv("DG_TEST_VERBOSE") != nullptr; }

}  // namespace

// ---- reductions ------------------------------------------------------------------------------------

namespace {

__global__ void reduce_probe_kernel(const float* x, int n, float* sum_out, dc::ArgMax* argmax_out,
                                    math::SoftmaxStats* stats_out) {
  __shared__ float sums[dc::kRowThreads / dc::kWarpSize + 1];
  __shared__ dc::SharedArray<dc::ArgMax, dc::kRowThreads / dc::kWarpSize + 1> am;
  __shared__ dc::SharedArray<math::SoftmaxStats, dc::kRowThreads / dc::kWarpSize + 1> st;
  float s = 0.0f;
  dc::ArgMax a;
  math::SoftmaxStats stats;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += dc::kRowThreads) {
    s += x[i];
    a = dc::argmax_merge(a, dc::ArgMax{dc::argmax_key(x[i]), i});
    math::SoftmaxStats one;
    one.max = x[i];
    one.sum = 1.0f;
    one.weighted = 0.0f;
    stats.merge(one);
  }
  s = dc::block_sum<dc::kRowThreads>(s, sums);
  a = dc::block_argmax<dc::kRowThreads>(a, am.get());
  stats = dc::block_merge_stats<dc::kRowThreads>(stats, st.get());
  if (threadIdx.x == 0) {
    *sum_out = s;
    *argmax_out = a;
    *stats_out = stats;
  }
}

}  // namespace

TEST_CASE("block reductions: sum, argmax with lowest-index ties and NaN, merged softmax statistics", "[cuda][device]") {
  struct Case {
    int n;
    bool nan;
  };
  for (const Case c : {Case{1, false}, Case{31, false}, Case{257, false}, Case{5000, false}, Case{300, true}}) {
    const int n = c.n;
    std::vector<float> x = random_floats(static_cast<std::size_t>(n), 11u + n, -4.0f, 4.0f);
    if (n > 40) {
      x[37] = 9.0f;  // the maximum twice: the lower index must win
      x[static_cast<std::size_t>(n - 3)] = 9.0f;
    }
    if (c.nan) x[5] = NAN;  // never an argmax
    auto dx = to_device(x);
    dc::DeviceBuffer<float> sum(1, "sum");
    dc::DeviceBuffer<dc::ArgMax> am(1, "argmax");
    dc::DeviceBuffer<math::SoftmaxStats> st(1, "stats");
    reduce_probe_kernel<<<1, dc::kRowThreads>>>(dx.data(), n, sum.data(), am.data(), st.data());
    DG_CUDA_CHECK(cudaGetLastError());
    const auto s = to_host(sum)[0];
    const auto a = to_host(am)[0];
    const auto stats = to_host(st)[0];
    double ref_sum = 0.0, m = -INFINITY;
    int ref_arg = 0;
    for (int i = 0; i < n; ++i) {
      if (std::isnan(x[i])) continue;
      ref_sum += x[i];
      if (x[i] > m) {
        m = x[i];
        ref_arg = i;
      }
    }
    double z = 0.0, w = 0.0;
    for (int i = 0; i < n; ++i) {
      if (std::isnan(x[i])) continue;
      z += std::exp(x[i] - m);
      w += std::exp(x[i] - m) * (x[i] - m);
    }
    INFO("n = " << n << (c.nan ? " with a NaN" : ""));
    CHECK(a.index == ref_arg);
    CHECK(a.value == static_cast<float>(m));
    if (!c.nan) {
      CHECK(std::abs(s - ref_sum) < 1e-5 * n);
      CHECK(std::abs(stats.log_sum_exp() - (m + std::log(z))) < 1e-5 * (1.0 + std::abs(m)));
      CHECK(std::abs(stats.entropy() - (std::log(z) - w / z)) < 1e-4);
    }
  }
}

// ---- embedding, RMSNorm, GELU, softcap, softmax rows ---------------------------------------------------

TEST_CASE("embed_kernel gathers rows times the embedding scale", "[cuda][kernel]") {
  const int V = 50, H = 40;
  const auto table = random_floats(static_cast<std::size_t>(V * H), 1u);
  const std::vector<std::int32_t> ids{0, 49, 7, 7, 23};
  auto d_ids = to_device(ids);
  dc::DeviceBuffer<float> out(ids.size() * H, "embed out");
  auto t32 = to_device(table);
  REQUIRE(dc::launch_embed(d_ids.data(), 5, t32.data(), H, 53.0f, V, nullptr, out.data(), nullptr).ok());
  const auto got = to_host(out);
  const auto tb = to_bf16(table);
  auto t16 = to_device(tb);
  REQUIRE(dc::launch_embed(d_ids.data(), 5, t16.data(), H, 53.0f, V, nullptr, out.data(), nullptr).ok());
  const auto got16 = to_host(out);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (int i = 0; i < H; ++i) {
      CHECK(got[t * H + i] == table[ids[t] * H + i] * 53.0f);
      CHECK(got16[t * H + i] == tb[ids[t] * H + i].to_float() * 53.0f);
    }
  }
}

TEST_CASE("embed_kernel zeroes out-of-vocabulary ids and records the first one", "[cuda][kernel]") {
  const int V = 50, H = 40;
  const auto table = random_floats(static_cast<std::size_t>(V * H), 2u);
  const std::vector<std::int32_t> ids{3, 50, 7, -1, 51};  // bad at positions 1, 3 and 4
  auto d_ids = to_device(ids);
  auto t32 = to_device(table);
  dc::DeviceBuffer<float> out(ids.size() * H, "embed out");
  const std::vector<BadTokenWord> none{kNoBadToken};
  auto word = to_device(none);
  REQUIRE(dc::launch_embed(d_ids.data(), 5, t32.data(), H, 1.0f, V, word.data(), out.data(), nullptr).ok());
  const auto got = to_host(out);
  const BadTokenWord w = to_host(word)[0];
  CHECK(bad_token_position(w) == 1);
  CHECK(bad_token_id(w) == 50);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (int i = 0; i < H; ++i) {
      const bool ok = token_id_in_vocabulary(ids[t], V);
      CHECK(got[t * H + i] == (ok ? table[ids[t] * H + i] : 0.0f));
    }
  }
}

TEST_CASE("rms_norm_kernel equals math::rms_norm_row with each fusion", "[cuda][kernel]") {
  const float eps = 1e-6f;
  for (int n : {12, 48, 2816}) {
    const int rows = 5;
    const auto in = random_floats(static_cast<std::size_t>(rows * n), 2u + n, -3.0f, 3.0f);
    const auto w = random_floats(static_cast<std::size_t>(n), 3u + n, 0.5f, 1.5f);
    const auto res = random_floats(static_cast<std::size_t>(rows * n), 4u + n);
    auto d_in = to_device(in);
    auto d_w = to_device(w);
    auto d_res = to_device(res);
    struct Variant {
      bool weight, residual;
      float scale;
    };
    for (const Variant v : {Variant{true, false, 1.0f}, Variant{false, false, 1.0f}, Variant{true, true, 1.0f},
                            Variant{true, true, 0.37f}, Variant{true, false, 0.0188444f}}) {
      std::vector<float> ref(in.size());
      for (int r = 0; r < rows; ++r) {
        float* y = ref.data() + r * n;
        math::rms_norm_row(in.data() + r * n, v.weight ? w.data() : nullptr, n, eps, y);
        for (int i = 0; i < n; ++i) y[i] = v.residual ? (res[r * n + i] + y[i]) * v.scale : y[i] * v.scale;
      }
      dc::RmsNormParams p;
      p.in = d_in.data();
      p.weight = v.weight ? d_w.data() : nullptr;
      p.residual = v.residual ? d_res.data() : nullptr;
      p.scale = v.scale;
      p.eps = eps;
      p.n = n;
      p.rows = rows;
      dc::DeviceBuffer<float> out(in.size(), "norm out");
      dc::DeviceBuffer<bfloat16> out16(in.size(), "norm out bf16");
      REQUIRE(dc::launch_rms_norm(p, out.data(), nullptr).ok());
      REQUIRE(dc::launch_rms_norm(p, out16.data(), nullptr).ok());
      INFO("n " << n << " weight " << v.weight << " residual " << v.residual << " scale " << v.scale);
      CHECK(max_rel_diff(to_host(out), ref) < 1e-6);
      // One bf16 rounding of the fp32 value; the 1e-3 floor absorbs the fp32 ulps that the residual
      // variants' cancellations (res + y close to 0) magnify.
      CHECK(max_rel_diff(widen(to_host(out16)), ref, 1e-3) <= kBf16Ulp);
    }
    // In place, as the engine runs x = (x + norm(a)) * scalar.
    dc::DeviceBuffer<float> x = to_device(res);
    dc::RmsNormParams p;
    p.in = d_in.data();
    p.weight = d_w.data();
    p.residual = x.data();
    p.scale = 0.5f;
    p.eps = eps;
    p.n = n;
    p.rows = rows;
    REQUIRE(dc::launch_rms_norm(p, x.data(), nullptr).ok());
    std::vector<float> ref(in.size());
    for (int r = 0; r < rows; ++r) {
      math::rms_norm_row(in.data() + r * n, w.data(), n, eps, ref.data() + r * n);
      for (int i = 0; i < n; ++i) ref[r * n + i] = (res[r * n + i] + ref[r * n + i]) * 0.5f;
    }
    CHECK(max_rel_diff(to_host(x), ref) < 1e-6);
  }
}

TEST_CASE("gelu_gate, softcap and softmax_rows kernels against core/math", "[cuda][kernel]") {
  const int rows = 6, width = 70;
  const auto gu = random_floats(static_cast<std::size_t>(rows * 2 * width), 5u, -5.0f, 5.0f);
  auto d_gu = to_device(gu);
  dc::DeviceBuffer<float> act(static_cast<std::size_t>(rows * width), "act");
  REQUIRE(dc::launch_gelu_gate(d_gu.data(), rows, width, act.data(), nullptr).ok());
  std::vector<float> ref(act.size());
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < width; ++i) {
      ref[r * width + i] = math::gelu_tanh(gu[r * 2 * width + i]) * gu[r * 2 * width + width + i];
    }
  }
  CHECK(max_rel_diff(to_host(act), ref) < 1e-6);

  auto x = random_floats(1000, 6u, -80.0f, 80.0f);
  auto d_x = to_device(x);
  REQUIRE(dc::launch_softcap(d_x.data(), 1000, 30.0f, nullptr).ok());
  std::vector<float> capped(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) capped[i] = math::softcap(x[i], 30.0f);
  CHECK(max_rel_diff(to_host(d_x), capped) < 1e-6);

  const int V = 777;
  const auto l = random_floats(static_cast<std::size_t>(3 * V), 7u, -6.0f, 6.0f);
  auto d_l = to_device(l);
  dc::DeviceBuffer<float> probs(l.size(), "probs");
  REQUIRE(dc::launch_softmax_rows(d_l.data(), 3, V, probs.data(), nullptr).ok());
  std::vector<float> p_ref(l.size());
  for (int r = 0; r < 3; ++r) {
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < V; ++i) m = std::max(m, static_cast<double>(l[r * V + i]));
    for (int i = 0; i < V; ++i) s += std::exp(l[r * V + i] - m);
    for (int i = 0; i < V; ++i) p_ref[r * V + i] = static_cast<float>(std::exp(l[r * V + i] - m) / s);
  }
  CHECK(max_abs_diff(to_host(probs), p_ref) < 1e-7);
}

// ---- per-head norms and RoPE ------------------------------------------------------------------------

namespace {

struct QkvCase {
  int tokens, heads, kv_heads, head_dim;
  bool has_v;
  RopeConfig rope;
};

// The CPU engine's per-head loop: norm, then rotate-half RoPE on q and k, weightless norm on v.
void host_qkv(const QkvCase& c, const std::vector<float>& qkv, std::int64_t ld, const std::vector<float>& qn,
              const std::vector<float>& kn, std::int64_t p0, std::vector<float>& q, std::vector<float>& k,
              std::vector<float>& v) {
  const int D = c.head_dim;
  const std::vector<float> inv = rope_inv_freq_table(c.rope, D);
  const float eps = 1e-6f;
  q.assign(static_cast<std::size_t>(c.tokens * c.heads * D), 0.0f);
  k.assign(static_cast<std::size_t>(c.tokens * c.kv_heads * D), 0.0f);
  v = k;
  for (int t = 0; t < c.tokens; ++t) {
    const auto rotate = [&](float* vec) {
      for (int i = 0; i < D / 2; ++i) {
        const float angle = math::rope_angle(p0 + t, inv[static_cast<std::size_t>(i)]);
        math::rope_rotate_pair(vec[i], vec[i + D / 2], std::cos(angle), std::sin(angle));
      }
    };
    const float* row = qkv.data() + t * ld;
    for (int h = 0; h < c.heads; ++h) {
      float* o = q.data() + (t * c.heads + h) * D;
      math::rms_norm_row(row + h * D, qn.data(), D, eps, o);
      rotate(o);
    }
    for (int g = 0; g < c.kv_heads; ++g) {
      float* ko = k.data() + (t * c.kv_heads + g) * D;
      math::rms_norm_row(row + (c.heads + g) * D, kn.data(), D, eps, ko);
      rotate(ko);
      const float* vsrc = c.has_v ? row + (c.heads + c.kv_heads + g) * D : row + (c.heads + g) * D;
      math::rms_norm_row(vsrc, nullptr, D, eps, v.data() + (t * c.kv_heads + g) * D);
    }
  }
}

}  // namespace

TEST_CASE("qkv_norm_rope_kernel: per-head norms, rotate-half RoPE, k_eq_v, cache append", "[cuda][kernel]") {
  RopeConfig def;  // default RoPE over all pairs
  RopeConfig prop;
  prop.type = RopeConfig::Type::kProportional;
  prop.theta = 1e6;
  prop.partial_rotary_factor = 0.25;
  for (const QkvCase& c : {QkvCase{5, 4, 2, 12, true, def}, QkvCase{5, 4, 1, 24, false, prop},
                           QkvCase{3, 16, 8, 256, true, def}, QkvCase{4, 16, 2, 512, false, prop},
                           QkvCase{2, 8, 4, 10, true, def}}) {
    // Position 60000 too: with the host-built inv_freq table the angle is the CPU's fp32 product, so
    // only cos/sin rounding differs even where an ulp of inv_freq would be 1e-2 rad (no cache there).
    for (const std::int64_t p0 : {std::int64_t{97}, std::int64_t{60000}}) {
      const bool with_cache = p0 < 1000;
      const int D = c.head_dim;
      const std::int64_t ld = static_cast<std::int64_t>(c.heads + c.kv_heads * (c.has_v ? 2 : 1)) * D;
      const std::int64_t capacity = with_cache ? 120 : 0;
      const auto qkv = random_floats(static_cast<std::size_t>(c.tokens * ld), 8u + D, -2.0f, 2.0f);
      const auto qn = random_floats(static_cast<std::size_t>(D), 9u, 0.5f, 1.5f);
      const auto kn = random_floats(static_cast<std::size_t>(D), 10u, 0.5f, 1.5f);
      std::vector<float> q, k, v;
      host_qkv(c, qkv, ld, qn, kn, p0, q, k, v);
      auto d_qkv = to_device(qkv);
      auto d_qn = to_device(qn);
      auto d_kn = to_device(kn);
      auto d_inv = to_device(rope_inv_freq_table(c.rope, D));
      dc::DeviceBuffer<float> dq(q.size(), "q"), dk(k.size(), "k"), dv(v.size(), "v");
      dc::DeviceBuffer<float> ck(static_cast<std::size_t>(c.kv_heads * capacity * D), "cache k");  // empty: none
      dc::DeviceBuffer<float> cv(ck.size(), "cache v");
      dc::QkvNormRopeParams<float> p;
      p.qkv = d_qkv.data();
      p.ld = ld;
      p.tokens = c.tokens;
      p.num_heads = c.heads;
      p.num_kv_heads = c.kv_heads;
      p.head_dim = D;
      p.has_v = c.has_v;
      p.q_norm = d_qn.data();
      p.k_norm = d_kn.data();
      p.first_position = p0;
      p.inv_freq = d_inv.data();
      p.q = dq.data();
      p.k = dk.data();
      p.v = dv.data();
      p.cache_k = ck.data();
      p.cache_v = cv.data();
      p.cache_capacity = capacity;
      REQUIRE(dc::launch_qkv_norm_rope(p, nullptr).ok());
      INFO("head_dim " << D << " has_v " << c.has_v << " first position " << p0);
      CHECK(max_abs_diff(to_host(dq), q) < 2e-5);
      CHECK(max_abs_diff(to_host(dk), k) < 2e-5);
      CHECK(max_abs_diff(to_host(dv), v) < 2e-6);
      if (!with_cache) continue;
      const auto hk = to_host(ck), hv = to_host(cv), gk = to_host(dk), gv = to_host(dv);
      for (int t = 0; t < c.tokens; ++t) {
        for (int g = 0; g < c.kv_heads; ++g) {
          for (int d = 0; d < D; ++d) {
            CHECK(hk[(g * capacity + p0 + t) * D + d] == gk[(t * c.kv_heads + g) * D + d]);
            CHECK(hv[(g * capacity + p0 + t) * D + d] == gv[(t * c.kv_heads + g) * D + d]);
          }
        }
      }
    }
  }
}

// ---- attention --------------------------------------------------------------------------------------

namespace {

struct AttnCase {
  AttentionMode mode;
  LayerType type;
  int window, tokens, heads, kv_heads, head_dim;
  std::int64_t pass_begin;
};

// Naive double-precision attention over [cached prefix | new keys] with the policy's mask.
template <class Attention>
std::vector<float> host_attention(const AttnCase& c, std::int64_t lo, std::int64_t capacity,
                                  const std::vector<float>& q, const std::vector<float>& kn,
                                  const std::vector<float>& vn, const std::vector<float>& kc,
                                  const std::vector<float>& vc) {
  const int D = c.head_dim, group = c.heads / c.kv_heads;
  const std::int64_t p0 = c.pass_begin;
  std::vector<float> out(static_cast<std::size_t>(c.tokens * c.heads * D));
  for (int t = 0; t < c.tokens; ++t) {
    for (int h = 0; h < c.heads; ++h) {
      const int g = h / group;
      const float* qv = q.data() + (t * c.heads + h) * D;
      std::vector<double> s;
      std::vector<const float*> vs;
      const auto add = [&](std::int64_t pos, const float* key, const float* val) {
        if (!Attention::visible(c.mode, c.type, c.window, p0 + t, pos, p0)) return;
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * key[d];
        s.push_back(dot);
        vs.push_back(val);
      };
      for (std::int64_t pos = lo; pos < p0; ++pos) {
        add(pos, kc.data() + (g * capacity + pos) * D, vc.data() + (g * capacity + pos) * D);
      }
      for (int j = 0; j < c.tokens; ++j) {
        add(p0 + j, kn.data() + (j * c.kv_heads + g) * D, vn.data() + (j * c.kv_heads + g) * D);
      }
      const double m = *std::max_element(s.begin(), s.end());
      double z = 0.0;
      for (double& x : s) z += (x = std::exp(x - m));
      for (int d = 0; d < D; ++d) {
        double acc = 0.0;
        for (std::size_t j = 0; j < s.size(); ++j) acc += s[j] * vs[j][d];
        out[(t * c.heads + h) * D + d] = static_cast<float>(acc / z);
      }
    }
  }
  return out;
}

template <class Attention, class Act>
void check_attention(const AttnCase& c, unsigned seed) {
  const int D = c.head_dim;
  const std::int64_t capacity = c.pass_begin + 4;
  const std::int64_t lo =
      std::min(c.pass_begin, Attention::first_visible_cached(c.mode, c.type, c.window, c.pass_begin));
  const auto gen = [&](std::size_t n, unsigned s) {
    auto v = random_floats(n, s, -1.0f, 1.0f);
    return std::is_same_v<Act, float> ? v : round_bf16(v);
  };
  const auto q = gen(static_cast<std::size_t>(c.tokens * c.heads * D), seed);
  const auto kn = gen(static_cast<std::size_t>(c.tokens * c.kv_heads * D), seed + 1);
  const auto vn = gen(kn.size(), seed + 2);
  const auto kc = gen(static_cast<std::size_t>(c.kv_heads * capacity * D), seed + 3);
  const auto vc = gen(kc.size(), seed + 4);
  const auto ref = host_attention<Attention>(c, lo, capacity, q, kn, vn, kc, vc);
  const auto dev = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<Act, float>) {
      return to_device(v);
    } else {
      return to_device(to_bf16(v));
    }
  };
  auto d_q = dev(q), d_kn = dev(kn), d_vn = dev(vn), d_kc = dev(kc), d_vc = dev(vc);
  dc::DeviceBuffer<Act> out(ref.size(), "attention out");
  dc::AttentionParams<Act> p;
  p.q = d_q.data();
  p.k_new = d_kn.data();
  p.v_new = d_vn.data();
  p.k_cache = d_kc.data();
  p.v_cache = d_vc.data();
  p.out = out.data();
  p.cache_capacity = capacity;
  p.cached_begin = lo;
  p.pass_begin = c.pass_begin;
  p.tokens = c.tokens;
  p.num_heads = c.heads;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = D;
  p.window = c.window;
  p.mode = c.mode;
  p.type = c.type;
  REQUIRE(dc::launch_attention<Attention>(p, nullptr).ok());
  std::vector<float> got;
  if constexpr (std::is_same_v<Act, float>) {
    got = to_host(out);
  } else {
    got = widen(to_host(out));
  }
  INFO("mode " << static_cast<int>(c.mode) << " type " << static_cast<int>(c.type) << " window " << c.window
               << " tokens " << c.tokens << " heads " << c.heads << "/" << c.kv_heads << " D " << D << " p0 "
               << c.pass_begin);
  if constexpr (std::is_same_v<Act, float>) {
    CHECK(max_abs_diff(got, ref) < 2e-5);
  } else {
    CHECK(max_rel_diff(got, ref, 0.1) < 1e-2);
  }
}

}  // namespace

TEST_CASE("attention_kernel against a double-precision oracle: both modes, windows, GQA, head dims", "[cuda][kernel]") {
  using M = AttentionMode;
  using L = LayerType;
  const AttnCase cases[] = {
      {M::kEncoder, L::kSliding, 5, 6, 4, 2, 16, 7},      // causal window over cache and new tokens
      {M::kEncoder, L::kFull, 5, 40, 4, 2, 12, 0},        // prefill of 40 tokens: several key tiles
      {M::kEncoder, L::kSliding, 5, 40, 4, 1, 24, 100},   // cached keys before the window are skipped
      {M::kDenoiser, L::kSliding, 5, 8, 4, 2, 16, 9},     // fixed last window-1 prefix for every query
      {M::kDenoiser, L::kFull, 5, 12, 8, 1, 32, 40},      // GQA group 8
      {M::kDenoiser, L::kSliding, 1024, 20, 16, 8, 256, 50},  // the 256 fast path, group 2
      {M::kDenoiser, L::kFull, 1024, 17, 16, 2, 512, 33},     // the 512 fast path, group 8
      {M::kEncoder, L::kFull, 1024, 33, 16, 2, 512, 3},
      {M::kDenoiser, L::kSliding, 6, 8, 4, 2, 10, 3},     // prefix shorter than the window
  };
  unsigned seed = 100;
  for (const AttnCase& c : cases) {
    check_attention<Gemma4Attention, float>(c, seed);
    check_attention<Gemma4Attention, bfloat16>(c, seed);
    seed += 10;
  }
  // The policy is a template parameter: JAX's per-position canvas window gives its own mask.
  check_attention<JaxCanvasAttention, float>({M::kDenoiser, L::kSliding, 6, 8, 4, 2, 16, 12}, 999u);
}

// ---- router and expert grouping --------------------------------------------------------------------------

TEST_CASE("router_kernel routes like the CPU engine (softmax, top-k, renormalise, per-expert scale)",
          "[cuda][kernel]") {
  const std::pair<int, int> shapes[] = {{5, 2}, {8, 3}, {128, 8}};  // (experts, top-k)
  for (const auto& ek : shapes) {
    const int E = ek.first, K = ek.second, T = 70;
    const auto logits = random_floats(static_cast<std::size_t>(T * E), 20u + E, -3.0f, 3.0f);
    const auto scale = random_floats(static_cast<std::size_t>(E), 21u, 0.5f, 2.0f);
    auto d_l = to_device(logits);
    auto d_s = to_device(scale);
    dc::DeviceBuffer<float> w(static_cast<std::size_t>(T * K), "weights");
    dc::DeviceBuffer<int> idx(static_cast<std::size_t>(T * K), "experts");
    dc::DeviceBuffer<int> ids(static_cast<std::size_t>(T * K), "slots");
    REQUIRE(dc::launch_router(d_l.data(), T, E, K, d_s.data(), w.data(), idx.data(), ids.data(), nullptr).ok());
    const auto gw = to_host(w);
    const auto gi = to_host(idx);
    const auto gs = to_host(ids);
    for (int t = 0; t < T; ++t) {
      std::vector<float> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      float m = row[0];
      for (int e = 1; e < E; ++e) m = std::max(m, row[e]);
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) {
        row[e] = std::exp(row[e] - m);
        sum += row[e];
      }
      for (int e = 0; e < E; ++e) row[e] /= sum;
      std::vector<float> rw(K);
      std::vector<int> ri(K);
      math::router_top_k(row.data(), scale.data(), E, K, rw.data(), ri.data());
      for (int j = 0; j < K; ++j) {
        CHECK(gi[t * K + j] == ri[j]);
        CHECK(std::abs(gw[t * K + j] - rw[j]) <= 1e-6f * (1.0f + std::abs(rw[j])));
        CHECK(gs[t * K + j] == t * K + j);
      }
    }
  }
}

TEST_CASE("expert grouping (CUB radix sort), gather and ascending-expert combine", "[cuda][kernel]") {
  const int T = 9, K = 3, E = 5, H = 8;
  const int n = T * K;
  std::mt19937 rng(5);
  std::vector<int> slot_expert(n), slot_id(n);
  for (int t = 0; t < T; ++t) {
    std::vector<int> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    for (int j = 0; j < K; ++j) slot_expert[t * K + j] = e[j];
  }
  std::iota(slot_id.begin(), slot_id.end(), 0);
  auto d_e = to_device(slot_expert);
  auto d_i = to_device(slot_id);
  dc::DeviceBuffer<int> sorted_e(n, "sorted experts"), sorted_s(n, "sorted slots"), begin(E + 1, "begin");
  const std::size_t temp_bytes = dc::moe_group_workspace_bytes(n, E);
  dc::DeviceBuffer<std::byte> temp(std::max<std::size_t>(temp_bytes, 1), "cub temp");
  dc::MoeGroupParams g;
  g.slot_expert = d_e.data();
  g.slot_id = d_i.data();
  g.sorted_expert = sorted_e.data();
  g.sorted_slot = sorted_s.data();
  g.expert_begin = begin.data();
  g.n = n;
  g.num_experts = E;
  REQUIRE(dc::launch_moe_group(g, temp.data(), temp_bytes, nullptr).ok());
  // Expected: a stable sort of the slots by expert.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return slot_expert[a] < slot_expert[b]; });
  std::vector<int> ref_begin(E + 1, 0);
  for (int s : slot_expert) ++ref_begin[s + 1];
  for (int e = 0; e < E; ++e) ref_begin[e + 1] += ref_begin[e];
  CHECK(to_host(sorted_s) == order);
  CHECK(to_host(begin) == ref_begin);

  const auto x = random_floats(static_cast<std::size_t>(T * H), 30u);
  auto d_x = to_device(x);
  dc::DeviceBuffer<float> rows(static_cast<std::size_t>(n * H), "grouped rows");
  dc::DeviceBuffer<int> row_of_slot(n, "row of slot");
  REQUIRE(dc::launch_gather_rows(d_x.data(), sorted_s.data(), n, K, H, rows.data(), row_of_slot.data(), nullptr).ok());
  const auto gr = to_host(rows);
  const auto ros = to_host(row_of_slot);
  for (int j = 0; j < n; ++j) {
    CHECK(ros[order[j]] == j);
    for (int i = 0; i < H; ++i) CHECK(gr[j * H + i] == x[(order[j] / K) * H + i]);
  }

  const auto y = random_floats(static_cast<std::size_t>(n * H), 31u, -2.0f, 2.0f);
  const auto w = random_floats(static_cast<std::size_t>(n), 32u, 0.0f, 1.0f);
  auto d_y = to_device(y);
  auto d_w = to_device(w);
  dc::DeviceBuffer<float> out(static_cast<std::size_t>(T * H), "combined");
  REQUIRE(dc::launch_moe_combine(d_y.data(), d_w.data(), d_e.data(), row_of_slot.data(), T, K, H, out.data(), nullptr)
              .ok());
  const auto got = to_host(out);
  for (int t = 0; t < T; ++t) {
    std::vector<int> js(K);
    std::iota(js.begin(), js.end(), 0);
    std::sort(js.begin(), js.end(), [&](int a, int b) { return slot_expert[t * K + a] < slot_expert[t * K + b]; });
    for (int i = 0; i < H; ++i) {
      float acc = 0.0f;
      for (int j : js) {
        const int s = t * K + j;
        const float prod = y[ros[s] * H + i] * w[s];
        acc = acc + prod;
      }
      CHECK(got[t * H + i] == acc);
    }
  }
}

// ---- grouped GEMM of the experts -------------------------------------------------------------------------

namespace {

// One grouped GEMM on the device against a double reference from the same (bf16-rounded for BF16)
// inputs. Every output is one fp32 FMA chain over k, so its error is at most
// gamma_k * sum_i |a_i w_i| with gamma_k = k u / (1 - k u), u = 2^-24: the tolerance is that bound
// (times 1.01), whatever the order, for F32 and BF16 storage alike (a bf16 product is exact in fp32).
// The rows past the last group (`extra_rows`) must keep their NaN sentinel.
template <class Act>
void check_grouped_gemm(const std::vector<int>& sizes, int n, int k, int extra_rows, unsigned seed) {
  const int E = static_cast<int>(sizes.size());
  std::vector<int> begin(static_cast<std::size_t>(E) + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), begin.begin() + 1);
  const int grouped = begin.back(), rows = grouped + extra_rows;
  INFO("experts " << E << ", grouped rows " << grouped << ", rows " << rows << ", n " << n << ", k " << k
                  << (std::is_same_v<Act, float> ? ", F32" : ", BF16"));
  auto x = random_floats(static_cast<std::size_t>(rows) * k, seed, -1.0f, 1.0f);
  auto w = random_floats(static_cast<std::size_t>(E) * n * k, seed + 1, -0.5f, 0.5f);
  if constexpr (!std::is_same_v<Act, float>) {
    x = round_bf16(x);
    w = round_bf16(w);
  }
  const auto dev = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<Act, float>) {
      return to_device(v);
    } else {
      return to_device(to_bf16(v));
    }
  };
  auto d_x = dev(x);
  auto d_w = dev(w);
  auto d_begin = to_device(begin);
  dc::DeviceBuffer<float> out(std::max<std::size_t>(static_cast<std::size_t>(rows) * n, 1), "grouped out");
  const std::vector<float> sentinel(out.size(), std::numeric_limits<float>::quiet_NaN());
  out.upload(sentinel.data(), sentinel.size());
  dc::GroupedGemmParams<Act> p;
  p.in = d_x.data();
  p.weights = d_w.data();
  p.group_begin = d_begin.data();
  p.out = out.data();
  p.rows = rows;
  p.num_groups = E;
  p.n = n;
  p.k = k;
  REQUIRE(dc::launch_grouped_gemm_nt(p, nullptr).ok());
  const auto got = to_host(out);
  const double gamma = 1.01 * k * std::ldexp(1.0, -24);
  double worst = 0.0;  // max error / tolerance
  int bad = 0;
  for (int g = 0; g < E; ++g) {
    for (int r = begin[static_cast<std::size_t>(g)]; r < begin[static_cast<std::size_t>(g) + 1]; ++r) {
      for (int c = 0; c < n; ++c) {
        double ref = 0.0, scale = 0.0;
        for (int i = 0; i < k; ++i) {
          const double prod = static_cast<double>(x[static_cast<std::size_t>(r) * k + i]) *
                              w[(static_cast<std::size_t>(g) * n + c) * k + i];
          ref += prod;
          scale += std::abs(prod);
        }
        const double v = got[static_cast<std::size_t>(r) * n + c];
        const double err = std::abs(v - ref);
        const double tol = gamma * scale + 1e-30;
        worst = std::max(worst, std::isfinite(v) ? err / tol : INFINITY);
        if (!(err <= tol) && ++bad <= 5) {
          UNSCOPED_INFO("row " << r << " (expert " << g << ") column " << c << ": " << v << " vs " << ref);
        }
      }
    }
  }
  CHECK(bad == 0);
  if (verbose_kernels()) std::printf("grouped GEMM: max error / bound %.3g\n", worst);
  int written_outside = 0;
  for (std::size_t i = static_cast<std::size_t>(grouped) * n; i < static_cast<std::size_t>(rows) * n; ++i) {
    written_outside += std::isnan(got[i]) ? 0 : 1;
  }
  CHECK(written_outside == 0);
}

template <class Act>
void check_grouped_gemm_shapes() {
  SECTION("random groups with empty experts; n and k not multiples of the tiles") {
    std::mt19937 rng(60);
    for (int trial = 0; trial < 6; ++trial) {
      const int E = std::uniform_int_distribution<int>(1, 12)(rng);
      std::vector<int> sizes(static_cast<std::size_t>(E));
      for (int& s : sizes) {
        s = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 0 : std::uniform_int_distribution<int>(1, 80)(rng);
      }
      const int n = std::vector<int>{1, 63, 70, 130}[static_cast<std::size_t>(trial % 4)];
      const int k = std::vector<int>{1, 31, 45, 100}[static_cast<std::size_t>((trial + 1) % 4)];
      check_grouped_gemm<Act>(sizes, n, k, trial % 2 == 0 ? 0 : 5, 61u + static_cast<unsigned>(trial));
    }
  }
  SECTION("every row in one expert, a partial last tile") {
    check_grouped_gemm<Act>({0, 0, 97, 0}, 64, 64, 0, 70u);
    check_grouped_gemm<Act>({129}, 70, 33, 3, 71u);
  }
  SECTION("tile-aligned groups and sizes") {
    check_grouped_gemm<Act>({32, 0, 64, 32}, 128, 96, 0, 72u);
  }
  SECTION("no grouped rows at all, and k = 0") {
    check_grouped_gemm<Act>({0, 0, 0}, 16, 8, 7, 73u);
    check_grouped_gemm<Act>({3, 0, 4}, 16, 0, 0, 74u);
  }
  SECTION("a scaled-down MoE layer: 64 tokens top-4 over 16 experts, gate|up then down") {
    std::mt19937 rng(75);
    std::vector<int> sizes(16, 0);
    for (int t = 0; t < 64; ++t) {
      std::vector<int> e(16);
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < 4; ++j) ++sizes[static_cast<std::size_t>(e[static_cast<std::size_t>(j)])];
    }
    check_grouped_gemm<Act>(sizes, 2 * 88, 352, 0, 76u);
    check_grouped_gemm<Act>(sizes, 352, 88, 0, 77u);
  }
}

}  // namespace

TEST_CASE("grouped GEMM of the experts against a double reference (group offsets on the device)",
          "[cuda][kernel][moe]") {
  SECTION("F32") { check_grouped_gemm_shapes<float>(); }
  SECTION("BF16") { check_grouped_gemm_shapes<bfloat16>(); }
}

// ---- the streaming vocabulary pass -------------------------------------------------------------------------

namespace {

template <class Act>
VocabPassResult gpu_vocab_pass(const std::vector<float>& E, std::int64_t V, int H, float cap, float embed_scale,
                               const std::vector<float>& hidden, int C, const VocabPassArgs& args, std::int64_t tile) {
  const auto dev = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<Act, float>) {
      return to_device(v);
    } else {
      return to_device(to_bf16(v));
    }
  };
  auto d_e = dev(E);
  auto d_h = dev(hidden);
  dc::DeviceBuffer<std::int32_t> argmax(C, "argmax"), sample(C, "sample");
  dc::DeviceBuffer<float> entropy(C, "entropy"), soft(static_cast<std::size_t>(C * H), "soft");
  dc::VocabPassParams<Act> p;
  p.embed = d_e.data();
  p.hidden = d_h.data();
  p.vocab = V;
  p.hidden_size = H;
  p.rows = C;
  p.softcap = cap;
  p.temperature = args.temperature;
  p.embed_scale = embed_scale;
  p.soft_embedding = args.soft_embedding;
  p.sample = args.sample;
  p.key = args.key;
  p.tile = tile;
  p.argmax = argmax.data();
  p.sample_out = sample.data();
  p.entropy = entropy.data();
  p.soft = soft.data();
  dc::DeviceBuffer<std::byte> ws(dc::vocab_pass_workspace_bytes<Act>(C, tile), "vocab workspace");
  dc::CublasHandle cublas;
  REQUIRE(dc::launch_vocab_pass(p, cublas.get(), ws.data(), nullptr).ok());
  VocabPassResult r;
  r.argmax = to_host(argmax);
  r.sample = to_host(sample);
  r.entropy = to_host(entropy);
  if (args.soft_embedding) r.soft_embedding = to_host(soft);
  return r;
}

}  // namespace

TEST_CASE("vocabulary pass equals the CPU pass: argmax, samples, entropy, soft embedding", "[cuda][vocab]") {
  const std::int64_t V = 2600;  // three 1024 tiles, the last one partial (and a partial sampling chunk)
  const int H = 24, C = 9;
  const auto E = random_floats(static_cast<std::size_t>(V * H), 40u, -0.6f, 0.6f);
  const auto hidden = random_floats(static_cast<std::size_t>(C * H), 41u, -2.0f, 2.0f);
  for (float cap : {30.0f, 0.0f}) {
    for (float T : {1.0f, 0.8f, 0.4083333f, 0.05f}) {
      VocabPassArgs args;
      args.temperature = T;
      args.key = DrawKey{7, 3, 11};
      INFO("softcap " << cap << " temperature " << T);
      const VocabPassResult ref = dg_cuda_test::cpu_vocab_pass(E, V, H, cap, 53.0f, hidden, C, args);
      const VocabPassResult got = gpu_vocab_pass<float>(E, V, H, cap, 53.0f, hidden, C, args, 1024);
      CHECK(got.argmax == ref.argmax);
      CHECK(got.sample == ref.sample);
      CHECK(max_abs_diff(got.entropy, ref.entropy) < 1e-5);
      CHECK(max_rel_diff(got.soft_embedding, ref.soft_embedding) < 1e-4);
      // BF16 storage: the same decisions on bf16-rounded inputs; probabilities rounded for the SC GEMM.
      const auto Eb = round_bf16(E), hb = round_bf16(hidden);
      const VocabPassResult ref16 = dg_cuda_test::cpu_vocab_pass(Eb, V, H, cap, 53.0f, hb, C, args);
      const VocabPassResult got16 = gpu_vocab_pass<bfloat16>(E, V, H, cap, 53.0f, hidden, C, args, 1024);
      CHECK(got16.argmax == ref16.argmax);
      CHECK(got16.sample == ref16.sample);
      CHECK(max_abs_diff(got16.entropy, ref16.entropy) < 1e-5);
      CHECK(max_rel_diff(got16.soft_embedding, ref16.soft_embedding) < 1e-2);
    }
  }
  SECTION("tile size only changes rounding: 256-id tiles give the same decisions") {
    VocabPassArgs args;
    args.temperature = 0.8f;
    args.key = DrawKey{1, 2, 3};
    const VocabPassResult a = gpu_vocab_pass<float>(E, V, H, 30.0f, 53.0f, hidden, C, args, 1024);
    const VocabPassResult b = gpu_vocab_pass<float>(E, V, H, 30.0f, 53.0f, hidden, C, args, 256);
    CHECK(a.argmax == b.argmax);
    CHECK(a.sample == b.sample);
    CHECK(max_abs_diff(a.entropy, b.entropy) < 1e-5);
  }
  SECTION("no sampling, no soft embedding") {
    VocabPassArgs args;
    args.sample = false;
    args.soft_embedding = false;
    const VocabPassResult r = gpu_vocab_pass<float>(E, V, H, 30.0f, 53.0f, hidden, C, args, 1024);
    for (int i = 0; i < C; ++i) CHECK(r.sample[i] == -1);
  }
}

TEST_CASE("device chunked Gumbel sampling follows the softmax distribution", "[cuda][vocab][statistics]") {
  // As the CPU test: V = 600 (three chunks, the last partial), a peaked and a flat region; here 500
  // identical rows per pass (each row draws with its own position) times 80 keys = 40000 draws,
  // in tiles of 256 ids so that the sample also crosses tiles.
  const std::int64_t V = 600;
  const int H = 4, C = 500;
  std::vector<float> E(static_cast<std::size_t>(V * H), 0.0f), hidden(static_cast<std::size_t>(C * H), 0.0f);
  for (std::int64_t i = 0; i < V; ++i) E[i * H] = static_cast<float>(std::sin(0.37 * i) * 3.0 + (i == 300 ? 4.0 : 0.0));
  for (int r = 0; r < C; ++r) hidden[r * H] = 1.0f;
  const float T = 0.7f;
  std::vector<double> p(V);
  double m = -1e30, s = 0.0;
  for (std::int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(E[i * H] / T));
  for (std::int64_t i = 0; i < V; ++i) s += p[i] = std::exp(E[i * H] / T - m);
  for (auto& x : p) x /= s;
  std::vector<int> counts(V, 0);
  int draws = 0;
  for (std::uint32_t key = 0; key < 80; ++key) {
    VocabPassArgs a;
    a.temperature = T;
    a.soft_embedding = false;
    a.key = DrawKey{99, key, 0};
    const VocabPassResult r = gpu_vocab_pass<float>(E, V, H, 0.0f, 1.0f, hidden, C, a, 256);
    for (int i = 0; i < C; ++i) {
      REQUIRE(r.sample[i] >= 0);
      REQUIRE(r.sample[i] < V);
      ++counts[r.sample[i]];
      ++draws;
    }
  }
  double chi2 = 0.0, rare_expected = 0.0, rare_seen = 0.0;
  int dof = -1;
  for (std::int64_t i = 0; i < V; ++i) {
    const double e = p[i] * draws;
    if (e >= 5.0) {
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++dof;
    } else {
      rare_expected += e;
      rare_seen += counts[i];
    }
  }
  INFO("chi2 " << chi2 << " with " << dof << " degrees of freedom");
  CHECK(chi2 < dof + 6.0 * std::sqrt(2.0 * dof));
  CHECK(std::abs(rare_seen - rare_expected) < 6.0 * std::sqrt(rare_expected + 1.0));
}

// ---- the canvas step ------------------------------------------------------------------------------------------

namespace {

// EntropyBound's rule with the device's tie order: equal entropies lower position first.
std::vector<std::uint8_t> accept_ties_lower_position_first(const std::vector<float>& entropy, float bound) {
  std::vector<int> order(entropy.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return entropy[x] < entropy[y]; });
  std::vector<std::uint8_t> accepted(entropy.size(), 0);
  double cum = 0.0;
  for (int p : order) {
    cum += entropy[p];
    accepted[p] = math::entropy_bound_accepts(cum, entropy[p], bound) ? 1 : 0;
  }
  return accepted;
}

}  // namespace

TEST_CASE("canvas_step_kernel equals EntropyBound + UniformState renoise + StableAndConfident", "[cuda][sampler]") {
  const std::uint32_t V = 262144;
  for (int L : {12, 200, 256}) {
    for (int stab : {0, 1, 2}) {
      INFO("length " << L << " stability threshold " << stab);
      std::mt19937 rng(static_cast<unsigned>(L * 10 + stab));
      const PhiloxRng philox(PhiloxRng::Arguments{1234});
      EntropyBound::Arguments acc_args;
      acc_args.entropy_bound = 0.1;
      EntropyBound::State acc_state;
      StableAndConfident::Arguments stop_args;
      stop_args.stability_threshold = stab;
      stop_args.confidence_threshold = 0.005;
      StableAndConfident::State stop_state;
      StableAndConfident::reset(stop_args, stop_state);

      dc::DeviceBuffer<std::int32_t> history(static_cast<std::size_t>(std::max(stab, 1) * L), "history");
      dc::DeviceBuffer<dc::CanvasStepState> state(1, "state");
      DG_CUDA_CHECK(cudaMemset(state.data(), 0, sizeof(dc::CanvasStepState)));
      std::vector<std::int32_t> argmax(L);
      for (auto& a : argmax) a = static_cast<std::int32_t>(rng() % V);
      for (int step = 0; step < 6; ++step) {
        std::vector<float> entropy(L);
        std::vector<std::int32_t> candidate(L);
        const bool confident_step = step >= 3;  // tiny entropies: the confidence test can pass
        for (int i = 0; i < L; ++i) {
          const unsigned q = rng() % 50;
          entropy[i] = confident_step ? 1e-4f * static_cast<float>(q % 7) : 0.01f * static_cast<float>(q);  // ties
          candidate[i] = static_cast<std::int32_t>(rng() % V);
        }
        if (step == 1 || step == 4) argmax[static_cast<std::size_t>(rng() % L)] ^= 1;  // a draft change
        const StepView view{argmax.data(), candidate.data(), entropy.data(), L, step, 6 - step};
        std::vector<std::uint8_t> accepted(L);
        EntropyBound::accept(acc_args, view, acc_state, accepted.data());
        // The two tie orders agree whenever no two entropies are equal; the rows here are full of
        // ties, so the device is held to its own documented order.
        const std::vector<std::uint8_t> accepted_stable =
            accept_ties_lower_position_first(entropy, static_cast<float>(acc_args.entropy_bound));
        {
          std::vector<float> sorted = entropy;
          std::sort(sorted.begin(), sorted.end());
          if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) CHECK(accepted_stable == accepted);
        }
        accepted = accepted_stable;
        std::vector<std::int32_t> next(L);
        for (int i = 0; i < L; ++i) next[i] = accepted[i] ? candidate[i] : UniformState::renoise(philox, 5, step, i, V);
        const bool stop = StableAndConfident::update(stop_args, view, stop_state);

        auto d_ent = to_device(entropy);
        auto d_arg = to_device(argmax);
        auto d_cand = to_device(candidate);
        dc::DeviceBuffer<std::uint8_t> d_acc(L, "accepted");
        dc::DeviceBuffer<std::int32_t> d_next(L, "next");
        dc::CanvasStepParams p;
        p.entropy = d_ent.data();
        p.argmax = d_arg.data();
        p.candidate = d_cand.data();
        p.length = L;
        p.entropy_bound = static_cast<float>(acc_args.entropy_bound);
        p.key = philox.key(5, step);
        p.vocab = V;
        p.stability_threshold = stab;
        p.confidence_threshold = static_cast<float>(stop_args.confidence_threshold);
        p.history = history.data();
        p.state = state.data();
        p.accepted = d_acc.data();
        p.next_canvas = d_next.data();
        REQUIRE(dc::launch_canvas_step(p, nullptr).ok());
        const dc::CanvasStepState st = to_host(state)[0];
        INFO("step " << step);
        CHECK(to_host(d_acc) == accepted);
        CHECK(to_host(d_next) == next);
        CHECK((st.stable != 0) == stop_state.stable);
        CHECK((st.confident != 0) == stop_state.confident);
        CHECK((st.stop != 0) == stop);
        CHECK(st.accepted == std::count(accepted.begin(), accepted.end(), 1));
        double sum = 0.0;
        for (float e : entropy) sum += e;
        CHECK(st.mean_entropy == static_cast<float>(sum / L));
      }
    }
  }
}
