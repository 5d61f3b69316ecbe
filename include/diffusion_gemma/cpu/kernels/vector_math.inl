// SPDX-License-Identifier: Apache-2.0
// Element-wise kernels written once against a small set of vector operations and compiled once
// per instruction set: avx2.hpp and avx512.hpp each include this file inside their own namespace
// and target region, after defining V (float vector), M (lane mask), I (int32 vector), kWidth and
// the operations used below. No include guard: it is meant to be included more than once.
//
// exp, tanh and GELU repeat core/math.hpp's scalar definitions operation by operation (same
// fused multiply-adds, same order, same special cases), so every lane equals the scalar function
// bit for bit and tails can use the scalar code; tests/cpu/kernels_test.cpp checks it.

inline V v_exp(V x) {
  using namespace math::exp_detail;
  const V n = round_even(mul(x, set1(kLog2e)));
  V r = fnmadd(n, set1(kLn2Hi), x);
  r = fnmadd(n, set1(kLn2Lo), r);
  V p = set1(kC7);
  p = fmadd(p, r, set1(kC6));
  p = fmadd(p, r, set1(kC5));
  p = fmadd(p, r, set1(kC4));
  p = fmadd(p, r, set1(kC3));
  p = fmadd(p, r, set1(kC2));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  V e = mul(p, pow2(n));
  e = select(cmp_le(x, set1(kMinArg)), zero(), e);
  e = select(cmp_ge(x, set1(kMaxArg)), set1(INFINITY), e);
  return select(is_nan(x), x, e);
}

inline V v_tanh(V y) {
  using namespace math::tanh_detail;
  const V a = vabs(y);
  const V y2 = mul(y, y);
  V p = fmadd(set1(kT9), y2, set1(kT7));
  p = fmadd(p, y2, set1(kT5));
  p = fmadd(p, y2, set1(kT3));
  const V small = fmadd(mul(p, y2), y, y);
  const V t = sub(set1(1.0f), div(set1(2.0f), add(v_exp(mul(set1(2.0f), a)), set1(1.0f))));
  const V big = select(cmp_lt(y, zero()), sub(zero(), t), t);
  return select(cmp_lt(a, set1(kSmall)), small, big);
}

inline V v_gelu(V x) {
  const V cube = mul(mul(mul(set1(0.044715f), x), x), x);
  const V inner = mul(set1(0.7978845608028654f), add(x, cube));
  return div(x, add(set1(1.0f), v_exp(mul(set1(-2.0f), inner))));
}

// g[i] = gelu_tanh(g[i]) * u[i].
inline void gelu_mul(float* g, const float* u, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(g + i, mul(v_gelu(load(g + i)), load(u + i)));
  for (; i < n; ++i) g[i] = math::gelu_tanh(g[i]) * u[i];
}

// x[i] = softcap(x[i], cap) / t (cap 0: no softcap), and the maximum with its first index.
inline float softcap_div_max(float* x, std::int64_t n, float cap, float t, std::int64_t* arg) {
  const V vcap = set1(cap), vt = set1(t);
  V best = set1(-INFINITY);
  I best_i = iset1(0), idx = iota(), step = iset1(kWidth);
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    V l = load(x + i);
    if (cap > 0.0f) l = mul(vcap, v_tanh(div(l, vcap)));
    l = div(l, vt);
    store(x + i, l);
    const M better = cmp_gt(l, best);  // strict: a lane keeps its first maximum
    best = select(better, l, best);
    best_i = iselect(better, idx, best_i);
    idx = iadd(idx, step);
  }
  float lanes[kWidth];
  std::int32_t lane_i[kWidth];
  store(lanes, best);
  istore(lane_i, best_i);
  float m = -INFINITY;
  std::int64_t a = 0;
  for (int l = 0; l < kWidth; ++l) {
    if (lanes[l] > m || (lanes[l] == m && lane_i[l] < a)) {
      m = lanes[l];
      a = lane_i[l];
    }
  }
  for (; i < n; ++i) {
    const float l = math::softcap(x[i], cap) / t;
    x[i] = l;
    if (l > m) {
      m = l;
      a = i;
    }
  }
  *arg = a;
  return m;
}

// x[i] = e^(x[i] - m); returns sum e and sum e (x - m) (masked -inf logits add nothing), and
// writes the sum of e over each `chunk` consecutive values to chunk_sums (chunk a multiple of
// kWidth; the last chunk may be partial).
inline void exp_shift_sums(float* x, std::int64_t n, float m, std::int64_t chunk, float* sum, float* weighted,
                           float* chunk_sums) {
  const V vm = set1(m);
  V s_all = zero(), w_all = zero();
  float tail_s = 0.0f, tail_w = 0.0f;
  for (std::int64_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
    const std::int64_t c1 = c0 + chunk < n ? c0 + chunk : n;
    V s = zero();
    float ts = 0.0f;
    std::int64_t i = c0;
    for (; i + kWidth <= c1; i += kWidth) {
      const V d = sub(load(x + i), vm);
      const V e = v_exp(d);
      store(x + i, e);
      s = add(s, e);
      w_all = add(w_all, select(cmp_gt(e, zero()), mul(e, d), zero()));
    }
    for (; i < c1; ++i) {
      const float d = x[i] - m;
      const float e = math::exp_approx(d);
      x[i] = e;
      ts += e;
      if (e > 0.0f) tail_w += e * d;
    }
    s_all = add(s_all, s);
    tail_s += ts;
    if (chunk_sums != nullptr) chunk_sums[c] = reduce_add(s) + ts;
  }
  *sum = reduce_add(s_all) + tail_s;
  *weighted = reduce_add(w_all) + tail_w;
}

// Softmax of one attention row in place: masked keys hold -inf and come out as 0.
inline void softmax_row(float* x, std::int64_t n) {
  V vmax = set1(-INFINITY);
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) vmax = max(vmax, load(x + i));
  float m = reduce_max(vmax);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  const V vm = set1(m);
  V s = zero();
  for (i = 0; i + kWidth <= n; i += kWidth) {
    const V e = v_exp(sub(load(x + i), vm));
    store(x + i, e);
    s = add(s, e);
  }
  float sum = reduce_add(s);
  for (; i < n; ++i) {
    x[i] = math::exp_approx(x[i] - m);
    sum += x[i];
  }
  const V inv = set1(1.0f / sum);
  for (i = 0; i + kWidth <= n; i += kWidth) store(x + i, mul(load(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / sum;
}

// The row-wise glue between the products (residual adds, scalings, the attention mask, the
// experts' weighted sum). Each lane does the scalar code's operations in its order, a product
// rounded before a sum (the library is compiled without contraction), so the bits equal the
// scalar loops'; vectorised here so they run at full width whatever flags the caller compiled with.

// x[j] = -inf where visible[j] is 0 (keys the query may not see), in place.
inline void mask_row(float* x, const std::uint8_t* visible, std::int64_t n) {
  const V ninf = set1(-INFINITY);
  std::int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) store(x + j, select(zero_bytes(visible + j), ninf, load(x + j)));
  for (; j < n; ++j)
    if (visible[j] == 0) x[j] = -INFINITY;
}

// x[i] += y[i].
inline void add_row(float* x, const float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, add(load(x + i), load(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

// x[i] = (x[i] + y[i]) * s.
inline void add_scale_row(float* x, const float* y, float s, std::int64_t n) {
  const V vs = set1(s);
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, mul(add(load(x + i), load(y + i)), vs));
  for (; i < n; ++i) x[i] = (x[i] + y[i]) * s;
}

// x[i] += y[i] * w.
inline void add_weighted_row(float* x, const float* y, float w, std::int64_t n) {
  const V vw = set1(w);
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, add(load(x + i), mul(load(y + i), vw)));
  for (; i < n; ++i) x[i] += y[i] * w;
}

// x[i] = (x[i] * w[i]) * s.
inline void mul_scale_row(float* x, const float* w, float s, std::int64_t n) {
  const V vs = set1(s);
  std::int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(x + i, mul(mul(load(x + i), load(w + i)), vs));
  for (; i < n; ++i) x[i] = (x[i] * w[i]) * s;
}

// out = x * (mean(x^2) + eps)^-1/2 [* weight]: the sum of squares in double, as the scalar
// definition (math::rms_norm_row) accumulates it; only the order of that sum differs.
inline void rms_norm_row(const float* x, const float* weight, std::int64_t n, float eps, float* out) {
  double ss = sum_squares_double(x, n);
  const float inv = math::rms_inverse(ss, static_cast<int>(n), eps);
  const V vinv = set1(inv);
  std::int64_t i = 0;
  if (weight != nullptr) {
    for (; i + kWidth <= n; i += kWidth) store(out + i, mul(mul(load(x + i), vinv), load(weight + i)));
    for (; i < n; ++i) out[i] = (x[i] * inv) * weight[i];
  } else {
    for (; i + kWidth <= n; i += kWidth) store(out + i, mul(load(x + i), vinv));
    for (; i < n; ++i) out[i] = x[i] * inv;
  }
}
