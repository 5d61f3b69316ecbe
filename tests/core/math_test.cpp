// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <limits>
#include <vector>

#include <diffusion_gemma/core/math.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

namespace {
double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
}  // namespace

TEST_CASE("gelu_tanh matches the tanh-approximation formula", "[core][math]") {
  for (double x = -8.0; x <= 8.0; x += 0.01) {
    REQUIRE(std::abs(math::gelu_tanh(static_cast<float>(x)) - gelu_tanh_ref(x)) < 2e-6 * (1.0 + std::abs(x)));
  }
  // The erf form differs by ~4.7e-4 at x = 2.7: the test can tell them apart.
  const double erf_form = 0.5 * 2.7 * (1.0 + std::erf(2.7 / std::sqrt(2.0)));
  CHECK(std::abs(math::gelu_tanh(2.7f) - erf_form) > 4e-4);
}

TEST_CASE("softcap bounds logits by the cap", "[core][math]") {
  CHECK(math::softcap(0.0f, 30.0f) == 0.0f);
  CHECK(math::softcap(1e6f, 30.0f) == Approx(30.0f));
  CHECK(math::softcap(15.0f, 30.0f) == Approx(30.0 * std::tanh(0.5)).epsilon(1e-6));
  CHECK(math::softcap(15.0f, 0.0f) == 15.0f);  // no cap configured
}

TEST_CASE("rms_norm_row uses a plain weight (not 1 + w) and pow(mean + eps, -1/2)", "[core][math]") {
  std::vector<float> x{1.0f, -2.0f, 3.0f, 0.5f}, w{0.5f, 2.0f, -1.0f, 0.0f}, out(4);
  math::rms_norm_row(x.data(), w.data(), 4, 1e-6f, out.data());
  const double ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
  const double inv = 1.0 / std::sqrt(ms + 1e-6);
  for (int i = 0; i < 4; ++i) CHECK(out[i] == Approx(x[i] * inv * w[i]).epsilon(1e-6));
  math::rms_norm_row(x.data(), nullptr, 4, 1e-6f, out.data());
  for (int i = 0; i < 4; ++i) CHECK(out[i] == Approx(x[i] * inv).epsilon(1e-6));
}

TEST_CASE("RoPE frequencies: default over all pairs, proportional with denominator head_dim", "[core][math][rope]") {
  // Sliding layers of the real model: head_dim 256, theta 1e4, all 128 pairs rotate.
  CHECK(math::rope_inv_freq(127, 128, 256, 1e4f, 1.0f) == Approx(1.0746e-4).epsilon(1e-3));
  // Full layers: head_dim 512, theta 1e6, partial 0.25 -> 64 rotated pairs, denominator 512.
  CHECK(math::rope_inv_freq(63, 64, 512, 1e6f, 1.0f) == Approx(0.033376).epsilon(1e-4));
  CHECK(math::rope_inv_freq(64, 64, 512, 1e6f, 1.0f) == 0.0f);
  CHECK(math::rope_inv_freq(0, 64, 512, 1e6f, 1.0f) == 1.0f);
  float lo = 1.0f, hi = 2.0f;
  const float a = 0.3f;
  math::rope_rotate_pair(lo, hi, std::cos(a), std::sin(a));
  CHECK(lo == Approx(std::cos(a) - 2.0 * std::sin(a)));
  CHECK(hi == Approx(2.0 * std::cos(a) + std::sin(a)));
}

TEST_CASE("SoftmaxStats: entropy and logsumexp merge exactly in any order", "[core][math][softmax]") {
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> x(1000);
  for (auto& v : x) v = nd(gen);
  x[17] = 25.0f;  // one dominant logit
  // Reference in double.
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0.0;
  for (float v : x) s += std::exp(v - m);
  double h = 0.0;
  for (float v : x) {
    const double p = std::exp(v - m) / s;
    if (p > 0) h -= p * std::log(p);
  }
  const double lse = m + std::log(s);

  for (int tile : {1, 7, 128, 1000}) {
    math::SoftmaxStats fwd, rev;
    std::vector<math::SoftmaxStats> parts;
    for (int b = 0; b < 1000; b += tile) {
      const int n = std::min(tile, 1000 - b);
      const float bm = *std::max_element(x.begin() + b, x.begin() + b + n);
      parts.push_back(math::softmax_stats_block(x.data() + b, n, bm));
    }
    for (const auto& p : parts) fwd.merge(p);
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) rev.merge(*it);
    CHECK(fwd.entropy() == Approx(h).epsilon(1e-4).margin(1e-6));
    CHECK(rev.entropy() == Approx(h).epsilon(1e-4).margin(1e-6));
    CHECK(fwd.log_sum_exp() == Approx(lse).epsilon(1e-6));
  }
  // A point mass has zero entropy; a uniform distribution has log(n).
  std::vector<float> flat(64, 3.0f);
  auto st = math::softmax_stats_block(flat.data(), 64, 3.0f);
  CHECK(st.entropy() == Approx(std::log(64.0)).epsilon(1e-6));
  std::vector<float> peaked{0.0f, -200.0f, -200.0f};
  st = math::softmax_stats_block(peaked.data(), 3, 0.0f);
  CHECK(st.entropy() == Approx(0.0).margin(1e-12));
}

TEST_CASE("router_top_k: softmax order, renormalised weights times per-expert scale", "[core][math][router]") {
  std::vector<float> probs{0.05f, 0.4f, 0.1f, 0.3f, 0.15f};
  std::vector<float> scale{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  float w[3];
  int idx[3];
  math::router_top_k(probs.data(), scale.data(), 5, 3, w, idx);
  CHECK(idx[0] == 1);
  CHECK(idx[1] == 3);
  CHECK(idx[2] == 4);
  const float total = 0.4f + 0.3f + 0.15f;
  CHECK(w[0] == Approx(0.4f / total * 2.0f));
  CHECK(w[1] == Approx(0.3f / total * 4.0f));
  CHECK(w[2] == Approx(0.15f / total * 5.0f));
  // Ties go to the lower expert index.
  std::vector<float> tied{0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> ones(4, 1.0f);
  float w2[2];
  int i2[2];
  math::router_top_k(tied.data(), ones.data(), 4, 2, w2, i2);
  CHECK(i2[0] == 0);
  CHECK(i2[1] == 1);
  // NaN probabilities (non-finite activations) rank first, as in torch.topk, and every index is an
  // expert: callers index their tables with them.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> some_nan{0.1f, nan, 0.6f, 0.3f};
  math::router_top_k(some_nan.data(), ones.data(), 4, 2, w2, i2);
  CHECK(i2[0] == 1);
  CHECK(i2[1] == 2);
  std::vector<float> all_nan(4, nan);
  math::router_top_k(all_nan.data(), ones.data(), 4, 2, w2, i2);
  CHECK(i2[0] == 0);
  CHECK(i2[1] == 1);
}

TEST_CASE("entropy bound: strictly earlier sum within the bound; crossing position accepted", "[core][math][accept]") {
  // Sorted entropies 0.02, 0.05, 0.04, 0.3: prefix sums before each: 0, 0.02, 0.07, 0.11.
  const float h[4] = {0.02f, 0.05f, 0.04f, 0.3f};
  double cum = 0.0;
  bool acc[4];
  for (int k = 0; k < 4; ++k) {
    cum += h[k];
    acc[k] = math::entropy_bound_accepts(cum, h[k], 0.1f);
  }
  CHECK(acc[0]);
  CHECK(acc[1]);
  CHECK(acc[2]);        // 0.07 <= 0.1: accepted although 0.11 would cross
  CHECK_FALSE(acc[3]);  // 0.11 > 0.1
}

TEST_CASE("linear temperature schedule runs from t_max to just above t_min", "[core][math]") {
  CHECK(math::linear_temperature(0.4f, 0.4f, 48, 48) == Approx(0.8f));
  CHECK(math::linear_temperature(0.4f, 0.4f, 1, 48) == Approx(0.408333f).epsilon(1e-5));
}
