// SPDX-License-Identifier: Apache-2.0
// Round-to-nearest quantisation of one [out, in] matrix into the compressed-tensors tensors
// (docs/quantization.md), and the `quantization_config` that describes them. `dgemma quantize`
// streams a checkpoint through these one matrix at a time.
//
// The arithmetic follows compressed-tensors' own RTN (calculate_qparams and quantize): minimum
// and maximum taken with 0, symmetric scale = max|w| / (range / 2), asymmetric scale =
// (max - min) / range with zero = round(clamp(qmin - min / scale)); every step is rounded to the
// scale dtype as torch computes it in the weight's dtype; w / scale (+ zero) is then rounded half
// to even and clamped. Symmetric int4 therefore divides max|w| by 7.5, not 7.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/quant.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>

namespace diffusion_gemma::io {

enum class QuantScheme {
  kW4A16,  // int4 weights, packed; group-wise scales by default
  kW8A16,  // int8 weights, packed; per-channel scales by default
  kInt8,   // int8 weights stored as I8 (W8A8: activations int8 per token at vLLM's choice)
  kFp8,    // FP8 E4M3 weights, per-channel scales (FP8_DYNAMIC)
  kSentinel
};

inline const char* quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::kW4A16: return "w4a16";
    case QuantScheme::kW8A16: return "w8a16";
    case QuantScheme::kInt8: return "int8";
    case QuantScheme::kFp8: return "fp8";
    case QuantScheme::kSentinel: break;
  }
  return "?";
}

inline bool parse_quant_scheme(const std::string& s, QuantScheme* out) {
  for (int i = 0; i < static_cast<int>(QuantScheme::kSentinel); ++i) {
    if (s == quant_scheme_name(static_cast<QuantScheme>(i))) {
      *out = static_cast<QuantScheme>(i);
      return true;
    }
  }
  return false;
}

struct QuantizeSpec {
  QuantScheme scheme = QuantScheme::kW4A16;
  std::int64_t group_size = 0;  // 0: one scale per output channel
  bool symmetric = true;
  DType scale_dtype = DType::kBF16;  // the checkpoint's dtype, as compressed-tensors stores scales

  int bits() const { return scheme == QuantScheme::kW4A16 ? 4 : 8; }
  bool is_float() const { return scheme == QuantScheme::kFp8; }
  const char* format() const {
    if (scheme == QuantScheme::kFp8) return "float-quantized";
    if (scheme == QuantScheme::kInt8) return "int-quantized";
    return "pack-quantized";
  }
  std::string strategy() const { return group_size > 0 ? "group" : "channel"; }

  void validate() const {
    if (group_size < 0) throw_error(StatusCode::kInvalidArgument, "quantize: group size ", group_size, " must be positive");
    if (!symmetric && scheme != QuantScheme::kW4A16 && scheme != QuantScheme::kW8A16) {
      throw_error(StatusCode::kInvalidArgument, "quantize: --asymmetric applies to w4a16 and w8a16 only");
    }
    if (scale_dtype != DType::kBF16 && scale_dtype != DType::kF16 && scale_dtype != DType::kF32) {
      throw_error(StatusCode::kInvalidArgument, "quantize: scales must be BF16, F16 or F32");
    }
  }

  // The config group's `weights` entry, as compressed-tensors' QuantizationArgs serialises it.
  nlohmann::ordered_json weights_json() const {
    nlohmann::ordered_json w;
    w["num_bits"] = bits();
    w["type"] = is_float() ? "float" : "int";
    w["symmetric"] = symmetric;
    w["group_size"] = group_size > 0 ? nlohmann::ordered_json(group_size) : nlohmann::ordered_json(nullptr);
    w["strategy"] = strategy();
    w["block_structure"] = nullptr;
    w["dynamic"] = false;
    w["actorder"] = nullptr;
    w["observer"] = "minmax";
    w["observer_kwargs"] = nlohmann::ordered_json::object();
    return w;
  }

  // config.json's quantization_config. `ignore`: modules kept in the checkpoint's dtype.
  nlohmann::ordered_json config_json(const std::vector<std::string>& ignore) const {
    nlohmann::ordered_json group;
    group["targets"] = {"Linear"};
    group["weights"] = weights_json();
    if (scheme == QuantScheme::kInt8 || scheme == QuantScheme::kFp8) {
      // What W8A8 / FP8_DYNAMIC declare for activations; this library computes weights-only.
      nlohmann::ordered_json a;
      a["num_bits"] = 8;
      a["type"] = is_float() ? "float" : "int";
      a["symmetric"] = true;
      a["group_size"] = nullptr;
      a["strategy"] = "token";
      a["block_structure"] = nullptr;
      a["dynamic"] = true;
      a["actorder"] = nullptr;
      a["observer"] = nullptr;
      a["observer_kwargs"] = nlohmann::ordered_json::object();
      group["input_activations"] = a;
    } else {
      group["input_activations"] = nullptr;
    }
    group["output_activations"] = nullptr;
    group["format"] = format();
    nlohmann::ordered_json q;
    q["config_groups"] = {{"group_0", group}};
    q["format"] = format();
    q["global_compression_ratio"] = nullptr;
    q["ignore"] = ignore;
    q["kv_cache_scheme"] = nullptr;
    q["quant_method"] = "compressed-tensors";
    q["quantization_status"] = "compressed";
    q["sparsity_config"] = nlohmann::ordered_json::object();
    q["transform_config"] = nlohmann::ordered_json::object();
    return q;
  }
};

// Modules kept in the checkpoint's dtype, as the published releases keep them: the embedding
// (also the tied LM head), every norm, the router, the self-conditioning MLP, the vision tower.
inline const std::vector<std::string>& default_ignore() {
  static const std::vector<std::string> ignore = {"lm_head",       "re:.*embed_tokens.*",      "re:.*norm.*",
                                                  "re:.*router.*", "re:.*self_conditioning.*", "re:.*vision.*"};
  return ignore;
}

// One output tensor: the module's name plus `suffix`.
struct QuantizedTensor {
  std::string suffix;  // ".weight", ".weight_packed", ".weight_scale", ...
  DType dtype = DType::kI32;
  Shape shape;
  std::vector<unsigned char> bytes;
};

namespace detail {

inline void put_scale(std::vector<unsigned char>& out, std::int64_t i, DType t, float v) {
  if (t == DType::kF32) {
    std::memcpy(out.data() + i * 4, &v, 4);
    return;
  }
  const std::uint16_t b = t == DType::kBF16 ? bfloat16::from_float(v).bits : float16::from_float(v).bits;
  std::memcpy(out.data() + i * 2, &b, 2);
}

inline void or_field(std::vector<unsigned char>& words, std::int64_t word, int shift, std::uint32_t value) {
  std::uint32_t w;
  std::memcpy(&w, words.data() + word * 4, 4);
  w |= value << shift;
  std::memcpy(words.data() + word * 4, &w, 4);
}

}  // namespace detail

// torch.finfo(dtype).eps: the scale compressed-tensors puts in place of a zero one.
inline float dtype_epsilon(DType t) {
  if (t == DType::kBF16) return 0.0078125f;        // 2^-7
  if (t == DType::kF16) return 0.0009765625f;      // 2^-10
  return 1.1920928955078125e-07f;                  // 2^-23
}

// The tensors (module name left off) that quantising an [out, in] matrix as `spec` says writes,
// in compressed-tensors' order, with their shapes and dtypes and no bytes yet.
inline std::vector<QuantizedTensor> planned_tensors(std::int64_t out, std::int64_t in, const QuantizeSpec& spec) {
  spec.validate();
  const std::int64_t g = spec.group_size > 0 ? spec.group_size : in;
  const std::int64_t G = (in + g - 1) / g;
  const int b = spec.bits();
  std::vector<QuantizedTensor> t;
  if (spec.scheme == QuantScheme::kW4A16 || spec.scheme == QuantScheme::kW8A16) {
    t.push_back({".weight_packed", DType::kI32, Shape{out, (in * b + 31) / 32}, {}});
  } else {
    t.push_back({".weight", spec.is_float() ? DType::kF8E4M3 : DType::kI8, Shape{out, in}, {}});
  }
  t.push_back({".weight_scale", spec.scale_dtype, Shape{out, G}, {}});
  if (t.front().suffix == ".weight_packed") t.push_back({".weight_shape", DType::kI64, Shape{2}, {}});
  if (!spec.symmetric) t.push_back({".weight_zero_point", DType::kI32, Shape{(out * b + 31) / 32, G}, {}});
  for (QuantizedTensor& x : t) x.bytes.assign(static_cast<std::size_t>(x.shape.numel()) * dtype_size(x.dtype), 0);
  return t;
}

// quantize_matrix: planned_tensors() with their bytes, for w [out, in] given as floats.
inline std::vector<QuantizedTensor> quantize_matrix(const float* w, std::int64_t out, std::int64_t in,
                                                    const QuantizeSpec& spec) {
  std::vector<QuantizedTensor> result = planned_tensors(out, in, spec);
  QuantizedTensor& values = result[0];
  QuantizedTensor& scale = result[1];
  const bool packed = values.suffix == ".weight_packed";
  if (packed) {
    const std::int64_t dims[2] = {out, in};
    std::memcpy(result[2].bytes.data(), dims, 16);
  }
  std::vector<unsigned char> unused;
  std::vector<unsigned char>& zero = spec.symmetric ? unused : result.back().bytes;
  const std::int64_t g = spec.group_size > 0 ? spec.group_size : in;
  const std::int64_t G = (in + g - 1) / g;
  const int b = spec.bits();
  const DType st = spec.scale_dtype;
  const float qmin = spec.is_float() ? -448.0f : -static_cast<float>(1 << (b - 1));
  const float qmax = spec.is_float() ? 448.0f : static_cast<float>((1 << (b - 1)) - 1);
  const float range = qmax - qmin;
  const std::int64_t row_words = (in * b + 31) / 32;
  for (std::int64_t r = 0; r < out; ++r) {
    const float* row = w + r * in;
    for (std::int64_t gi = 0; gi < G; ++gi) {
      const std::int64_t c0 = gi * g, c1 = std::min(in, c0 + g);
      float lo = 0.0f, hi = 0.0f;
      for (std::int64_t c = c0; c < c1; ++c) {
        // min/max would skip a NaN and the clamps below would store it as a finite code: a
        // checkpoint that `--check-weights` refuses must not come out looking healthy.
        if (!std::isfinite(row[c])) {
          throw_error(StatusCode::kFormatError, "non-finite weight (", row[c], ") at row ", r, ", column ", c);
        }
        lo = std::min(lo, row[c]);
        hi = std::max(hi, row[c]);
      }
      float s, z = 0.0f;
      if (spec.symmetric) {
        s = quant::round_to(st, std::max(std::fabs(lo), std::fabs(hi)) / (range / 2.0f));
      } else {
        s = quant::round_to(st, quant::round_to(st, hi - lo) / range);
      }
      if (!(s > 0.0f)) s = dtype_epsilon(st);  // an all-zero group, as compressed-tensors replaces it
      if (!std::isfinite(s)) {
        // max - min of finite weights can overflow the scale's dtype (asymmetric, |w| near its max).
        throw_error(StatusCode::kFormatError, "the scale of row ", r, ", columns ", c0, "-", c1 - 1, " overflows ",
                    dtype_name(st), " (weights from ", lo, " to ", hi, ")");
      }
      if (!spec.symmetric) {
        z = std::nearbyint(std::min(qmax, std::max(qmin, quant::round_to(st, qmin - quant::round_to(st, lo / s)))));
      }
      detail::put_scale(scale.bytes, r * G + gi, st, s);
      if (!spec.symmetric) {
        const int per = 32 / b;
        detail::or_field(zero, (r / per) * G + gi, b * static_cast<int>(r % per),
                         static_cast<std::uint32_t>(static_cast<std::int32_t>(z) + (1 << (b - 1))));
      }
      for (std::int64_t c = c0; c < c1; ++c) {
        const float x = quant::round_to(st, quant::round_to(st, row[c] / s) + z);
        if (spec.is_float()) {
          values.bytes[static_cast<std::size_t>(r * in + c)] = quant::float_to_fp8_e4m3(std::min(qmax, std::max(qmin, x)));
          continue;
        }
        const auto q = static_cast<std::int32_t>(std::min(qmax, std::max(qmin, std::nearbyint(x))));
        if (packed) {
          const int per = 32 / b;
          detail::or_field(values.bytes, r * row_words + c / per, b * static_cast<int>(c % per),
                           static_cast<std::uint32_t>(q + (1 << (b - 1))));
        } else {
          values.bytes[static_cast<std::size_t>(r * in + c)] = static_cast<unsigned char>(static_cast<std::int8_t>(q));
        }
      }
    }
  }
  return result;
}

}  // namespace diffusion_gemma::io
