// SPDX-License-Identifier: Apache-2.0
// Per-element math shared by the CPU back-end and the CUDA kernels (DG_HOST_DEVICE). Each
// function follows the transformers reference operation by operation, in fp32, so that the two
// back-ends and the reference agree; comments say where the order of operations matters.
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/bit_cast.hpp>
#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma::math {

DG_HOST_DEVICE float neg_infinity() { return -INFINITY; }

// exp(x) built from fused multiply-adds, written so that the CPU's vector kernels
// (cpu/simd/vector_math.inl) reproduce it bit for bit, lane by lane, and CUDA computes it the same
// way: n = rint(x log2 e); r = x - n ln2 in two parts (Cody-Waite); e^r by its Taylor series to
// degree 7 (truncation below 1e-8 relative on |r| <= ln2/2); times 2^n assembled in the exponent
// bits. Within 2 ulp of expf on [-87.3, 88.3]; results below FLT_MIN flush to 0 and x above
// 88.376 (where 2^n would need exponent 128) gives +inf. NaN stays NaN.
namespace exp_detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;        // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMaxArg = 88.3762626647949f;  // n = 127 at most
constexpr float kMinArg = -87.3365478515625f; // n = -126 at least: normal results only
// 1/k! for k = 7 .. 2, highest degree first (Horner).
constexpr float kC7 = 1.98412698e-4f, kC6 = 1.38888889e-3f, kC5 = 8.33333333e-3f;
constexpr float kC4 = 4.16666667e-2f, kC3 = 1.66666667e-1f, kC2 = 0.5f;
}  // namespace exp_detail

DG_HOST_DEVICE float exp_approx(float x) {
  using namespace exp_detail;
  if (!(x == x)) return x;
  if (x >= kMaxArg) return INFINITY;
  if (x <= kMinArg) return 0.0f;
  const float n = rintf(x * kLog2e);
  float r = fmaf(-n, kLn2Hi, x);
  r = fmaf(-n, kLn2Lo, r);
  float p = kC7;
  p = fmaf(p, r, kC6);
  p = fmaf(p, r, kC5);
  p = fmaf(p, r, kC4);
  p = fmaf(p, r, kC3);
  p = fmaf(p, r, kC2);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const float scale = bits_to_float(static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23);
  return p * scale;
}

// tanh from exp_approx: an odd Taylor polynomial below |y| = 0.25 (where 1 - 2/(e^2y + 1) would
// cancel), 1 - 2/(e^2|y| + 1) with the sign of y above. Within a few ulp of tanhf.
namespace tanh_detail {
constexpr float kSmall = 0.25f;
constexpr float kT9 = 62.0f / 2835.0f, kT7 = -17.0f / 315.0f, kT5 = 2.0f / 15.0f, kT3 = -1.0f / 3.0f;
}  // namespace tanh_detail

DG_HOST_DEVICE float tanh_approx(float y) {
  using namespace tanh_detail;
  const float a = fabsf(y);
  if (a < kSmall) {
    const float y2 = y * y;
    float p = fmaf(kT9, y2, kT7);
    p = fmaf(p, y2, kT5);
    p = fmaf(p, y2, kT3);
    return fmaf(p * y2, y, y);
  }
  const float t = 1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f);
  return y < 0.0f ? -t : t;
}

// GELU, tanh approximation (`gelu_pytorch_tanh`): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715
// x^3), computed as the identical x / (1 + e^(-2u)): one exp and one divide, no cancellation.
DG_HOST_DEVICE float gelu_tanh(float x) {
  const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * x * x * x);
  return x / (1.0f + exp_approx(-2.0f * inner));
}

// Final-logit softcap, fp32 as DiffusionGemma's head computes it: cap * tanh(x / cap).
DG_HOST_DEVICE float softcap(float x, float cap) { return cap > 0.0f ? cap * tanh_approx(x / cap) : x; }

// RMSNorm scale for a row whose squares sum to `sum_squares` (Gemma 4: plain weight, no 1 + w).
// transformers writes pow(mean + eps, -0.5); torch dispatches that exponent to rsqrt, which it
// computes as an fp32 division of 1 by an fp32 square root. powf gives the correctly rounded
// result instead, which differs from torch's in about a quarter of inputs (and costs 6 % of a
// small model's pass).
DG_HOST_DEVICE float rms_inverse(double sum_squares, int n, float eps) {
  const float mean = static_cast<float>(sum_squares / n);
  return 1.0f / sqrtf(mean + eps);
}

// Normalises `x` (n values) into `out`, times `weight` when given (may alias x).
DG_HOST_DEVICE void rms_norm_row(const float* x, const float* weight, int n, float eps, float* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = rms_inverse(ss, n, eps);
  if (weight != nullptr) {
    for (int i = 0; i < n; ++i) out[i] = (x[i] * inv) * weight[i];
  } else {
    for (int i = 0; i < n; ++i) out[i] = x[i] * inv;
  }
}

// RoPE inverse frequency of pair i (0 <= i < head_dim/2): theta^-(2i/denominator) / factor for
// the rotated pairs, 0 (no rotation) for the rest. Computed in fp32 as transformers does.
DG_HOST_DEVICE float rope_inv_freq(int i, int rotated_pairs, int denominator, float theta, float factor) {
  if (i >= rotated_pairs) return 0.0f;
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(denominator);
  return (1.0f / powf(theta, exponent)) / factor;
}

// The RoPE angle of a position: one fp32 product, computed alike by both back-ends from the same
// host-built inv_freq bits (model/rope_table.hpp); only cos/sin of it differ by device.
DG_HOST_DEVICE float rope_angle(std::int64_t position, float inv_freq) {
  return static_cast<float>(position) * inv_freq;
}

// Rotate-half RoPE on one head vector in place: element i pairs with i + half (not interleaved).
// cos/sin come from the fp32 angle pos * inv_freq.
DG_HOST_DEVICE void rope_rotate_pair(float& lo, float& hi, float cos_a, float sin_a) {
  const float x0 = lo, x1 = hi;
  lo = x0 * cos_a - x1 * sin_a;
  hi = x1 * cos_a + x0 * sin_a;
}

// Running softmax statistics of a stream of logits x_i: max m, S = sum e^(x-m) and
// W = sum e^(x-m) (x-m). From them: logsumexp = m + log S, entropy = log S - W/S (nats). Blocks
// merge exactly, so a vocabulary can be reduced in tiles, in any order, on any device.
struct SoftmaxStats {
  float max = -INFINITY;
  float sum = 0.0f;
  float weighted = 0.0f;

  DG_HOST_DEVICE void merge(const SoftmaxStats& o) {
    if (o.sum == 0.0f) return;
    if (sum == 0.0f) {
      *this = o;
      return;
    }
    const float m = max > o.max ? max : o.max;
    const float da = max - m, db = o.max - m;
    const float ea = expf(da), eb = expf(db);
    weighted = ea * (weighted + da * sum) + eb * (o.weighted + db * o.sum);
    sum = ea * sum + eb * o.sum;
    max = m;
  }
  DG_HOST_DEVICE float log_sum_exp() const { return max + logf(sum); }
  DG_HOST_DEVICE float entropy() const {
    const float h = logf(sum) - weighted / sum;
    return h > 0.0f ? h : 0.0f;  // tiny negative values are rounding, entropy is >= 0
  }
};

// Statistics of a block of n values whose maximum is already known (two-pass within a tile).
DG_HOST_DEVICE SoftmaxStats softmax_stats_block(const float* x, int n, float block_max) {
  SoftmaxStats s;
  s.max = block_max;
  float sum = 0.0f, weighted = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float d = x[i] - block_max;
    const float e = expf(d);
    sum += e;
    if (e > 0.0f) weighted += e * d;  // masked (-inf) logits contribute nothing, not NaN
  }
  s.sum = sum;
  s.weighted = weighted;
  return s;
}

// Gumbel(0, 1) noise from a uniform in the open interval (0, 1).
DG_HOST_DEVICE float gumbel(float u) { return -logf(-logf(u)); }

// Router of one token (Gemma 4): softmax over expert logits, top-k by probability (ties: lower
// expert first), renormalise to sum 1, then multiply by per_expert_scale[expert].
// `probs` holds the softmax already; writes k weights and indices. A NaN probability (from a
// non-finite activation) ranks above every number, as in torch.topk, so every index written is an
// expert: the caller indexes its tables with them.
DG_HOST_DEVICE void router_top_k(const float* probs, const float* per_expert_scale, int num_experts, int k,
                                 float* weights, int* indices) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_p = -1.0f;
    for (int e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int t = 0; t < j; ++t) taken = taken || (indices[t] == e);
      const bool nan = probs[e] != probs[e], best_nan = best_p != best_p;
      if (!taken && (best < 0 || (nan && !best_nan) || (!best_nan && probs[e] > best_p))) {
        best_p = probs[e];
        best = e;
      }
    }
    indices[j] = best;
    weights[j] = best_p;
  }
  float total = 0.0f;
  for (int j = 0; j < k; ++j) total += weights[j];
  for (int j = 0; j < k; ++j) weights[j] = (weights[j] / total) * per_expert_scale[indices[j]];
}

// Entropy-bound acceptance, decided in sorted (ascending entropy) order: position k is accepted
// when the sum of the strictly earlier entropies is within the bound. transformers computes it
// as float(inclusive cumsum, accumulated in double) - H_k <= float(bound); mirrored exactly.
DG_HOST_DEVICE bool entropy_bound_accepts(double inclusive_prefix_sum, float entropy_k, float bound) {
  const float cum = static_cast<float>(inclusive_prefix_sum);
  return (cum - entropy_k) <= bound;
}

// Temperature of the linear schedule at `steps_remaining` = n (N..1), in fp32 as the reference:
// t_min + (t_max - t_min) * (n / N).
DG_HOST_DEVICE float linear_temperature(float t_min, float t_span, int steps_remaining, int max_steps) {
  return t_min + t_span * (static_cast<float>(steps_remaining) / static_cast<float>(max_steps));
}

}  // namespace diffusion_gemma::math
