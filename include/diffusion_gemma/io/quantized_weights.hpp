// SPDX-License-Identifier: Apache-2.0
// Binds one Linear weight in whatever form the checkpoint stores it (docs/quantization.md):
//   plain      `<module>.weight` F32/BF16/F16 [out, in]
//   FP8/INT8   `<module>.weight` F8_E4M3/I8 [out, in] + `weight_scale` (compressed-tensors)
//   packed     `<module>.weight_packed` I32 + `weight_scale` + `weight_shape` (+ `weight_zero_point`)
//   GPTQ       `<module>.qweight` + `qzeros` + `scales` (+ `g_idx`)
// and MoE experts either fused ([E, 2I, H] and [E, H, I] tensors) or split one matrix per expert
// (`experts.{e}.gate_proj`, `.up_proj`, `.down_proj`, each in any of the forms above).
//
// Every shape and dtype, and the agreement between the stored form and `quantization_config`,
// is checked here, before anything computes; the views borrow the memory map.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/binder.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/model/weight.hpp>

namespace diffusion_gemma::io::detail {

inline bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

class MatrixBinder {
 public:
  MatrixBinder(Binder& b, const QuantizationConfig& qc, BindReport* report) : b_(b), qc_(qc), report_(report) {}

  // A Linear module's weight [out, in] (module: the name without ".weight").
  Weight linear(const std::string& module, std::int64_t out, std::int64_t in) {
    if (b_.has(module + ".weight_g_idx")) {
      unsupported(module + ".weight_g_idx", "activation-order groups (weight_g_idx)");
    }
    if (b_.has(module + ".weight_global_scale")) unsupported(module + ".weight_global_scale", "NVFP4 weights");
    if (b_.has(module + ".qweight")) return gptq(module, out, in);
    if (b_.has(module + ".weight_packed")) return packed(module, out, in);
    const SafetensorsEntry* w = b_.checkpoint().find(module + ".weight");
    if (w != nullptr && (w->tensor.dtype == DType::kI8 || w->tensor.dtype == DType::kF8E4M3)) {
      return unpacked(module, out, in, w->tensor.dtype);
    }
    if (w != nullptr && qc_.method == QuantMethod::kCompressedTensors) {
      const int g = qc_.group_of(module, "Linear");
      if (g >= 0) {
        b_.problem(module + ".weight: stored as " + dtype_name(w->tensor.dtype) + ", but quantization_config group '" +
                   qc_.groups[static_cast<std::size_t>(g)].name + "' quantizes this module (" +
                   qc_.groups[static_cast<std::size_t>(g)].weights.describe() + ")");
      }
    }
    return Weight::borrow(b_.take(module + ".weight", Shape{out, in}));
  }

  // A weight that only plain dtypes may hold (the embedding, which is also the tied LM head).
  Weight plain(const std::string& name, const Shape& shape) {
    const std::string module = name.size() > 7 ? name.substr(0, name.size() - 7) : name;
    for (const char* suffix : {".weight_packed", ".weight_scale", ".qweight"}) {
      if (b_.has(module + suffix)) {
        unsupported(module + suffix, "a quantized embedding (keep embed_tokens and lm_head in the ignore list)");
      }
    }
    return Weight::borrow(b_.take(name, shape));
  }

  // Experts of one layer: `fused` names the [E, rows, cols] tensor; otherwise each expert e is
  // `<experts>{e}.<part>` for every part, stacked by rows (gate then up).
  Weight experts(const std::string& fused, const std::string& experts, const std::vector<std::string>& parts,
                 std::int64_t E, std::int64_t part_rows, std::int64_t cols) {
    const Shape shape{E, part_rows * static_cast<std::int64_t>(parts.size()), cols};
    const std::string first = experts + "0." + parts.front();
    const bool split = b_.has(first + ".weight") || b_.has(first + ".weight_packed") || b_.has(first + ".qweight");
    if (b_.has(fused) || !split) {
      if (!b_.has(fused)) {
        b_.missing(fused + " " + shape.str() + " (or per-expert " + experts + "{e}." + parts.front() + ")");
        return {};
      }
      return Weight::borrow(b_.take(fused, shape));
    }
    if (report_) report_->split_experts = true;
    std::vector<Weight> groups;
    groups.reserve(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) {
      std::vector<Weight> blocks;
      for (const std::string& p : parts) blocks.push_back(linear(experts + std::to_string(e) + "." + p, part_rows, cols));
      groups.push_back(blocks.size() == 1 ? blocks.front() : Weight::split(Shape{shape[1], cols}, std::move(blocks)));
    }
    return Weight::split(shape, std::move(groups));
  }

 private:
  template <class... Args>
  [[noreturn]] void unsupported(const std::string& tensor, Args&&... what) {
    throw_error(StatusCode::kUnsupported, b_.checkpoint().file_of(tensor), ": tensor '", tensor, "': ",
                std::forward<Args>(what)..., " is not supported");
  }

  // Takes `name`, checking dtype (any of `dtypes`) and shape; records a problem and returns an
  // empty view when they do not match.
  RawTensor take_as(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape) {
    const SafetensorsEntry* e = b_.use(name);
    if (e == nullptr) {
      b_.missing(name + " " + shape.str());
      return {};
    }
    bool dtype_ok = false;
    std::string allowed;
    for (DType t : dtypes) {
      dtype_ok = dtype_ok || e->tensor.dtype == t;
      allowed += (allowed.empty() ? "" : "/") + std::string(dtype_name(t));
    }
    if (!dtype_ok || e->tensor.shape != shape) {
      b_.problem(name + ": " + dtype_name(e->tensor.dtype) + " " + e->tensor.shape.str() + ", expected " + allowed + " " +
                 shape.str() + " (" + b_.checkpoint().file_of(name) + ")");
      return {};
    }
    return e->tensor;
  }

  // The compressed-tensors group of a module stored quantized; refuses a module the config does
  // not quantize or quantizes in another format.
  const QuantWeights& ct_scheme(const std::string& tensor, const std::string& module, const char* stored_as) {
    if (qc_.method != QuantMethod::kCompressedTensors) {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(tensor), ": tensor '", tensor, "' is stored ",
                  stored_as, ", but config.json has no compressed-tensors quantization_config");
    }
    const int g = qc_.group_of(module, "Linear");
    if (g < 0) {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(tensor), ": tensor '", tensor, "' is stored ",
                  stored_as, ", but quantization_config does not quantize module '", module,
                  "' (it is ignored or no config group targets it)");
    }
    return qc_.groups[static_cast<std::size_t>(g)].weights;
  }

  // weight_scale of a compressed-tensors module; fills q.group_size from the strategy.
  void ct_scale(const std::string& module, const QuantWeights& w, QuantizedMatrix& q) {
    const std::string name = module + ".weight_scale";
    const std::int64_t out = q.rows, in = q.cols;
    Shape shape;
    if (w.strategy == "tensor") {
      q.group_size = -1;
      const SafetensorsEntry* e = b_.checkpoint().find(name);
      shape = e != nullptr && e->tensor.shape.rank == 0 ? Shape{} : Shape{1};
      if (e != nullptr && e->tensor.shape == Shape{1, 1}) shape = Shape{1, 1};
    } else if (w.strategy == "channel") {
      q.group_size = 0;
      shape = Shape{out, 1};
    } else {
      q.group_size = w.group_size;
      shape = Shape{out, (in + w.group_size - 1) / w.group_size};
    }
    q.scale = take_as(name, {DType::kBF16, DType::kF16, DType::kF32}, shape);
  }

  void note(const QuantizedMatrix& q) {
    if (report_) ++report_->quantized[q.scheme];
  }

  Weight finish(QuantizedMatrix q, const std::string& module) {
    q.module = module;
    const bool complete = !q.values.empty() && !q.scale.empty();
    note(q);
    if (!complete) return {};
    return Weight::quantized(std::move(q));
  }

  Weight unpacked(const std::string& module, std::int64_t out, std::int64_t in, DType stored) {
    const std::string name = module + ".weight";
    const bool fp8 = stored == DType::kF8E4M3;
    const QuantWeights& w = ct_scheme(name, module, fp8 ? "as F8_E4M3" : "as I8");
    if (fp8 != (w.format == "float-quantized") || (!fp8 && w.format != "int-quantized")) {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(name), ": tensor '", name, "' is ", dtype_name(stored),
                  " but its quantization_config group says ", w.describe());
    }
    QuantizedMatrix q;
    q.format = fp8 ? QuantFormat::kFp8 : QuantFormat::kInt8;
    q.bits = 8;
    q.rows = out;
    q.cols = in;
    q.scheme = w.describe();
    q.values = take_as(name, {stored}, Shape{out, in});
    ct_scale(module, w, q);
    for (const char* activation : {".input_scale", ".input_zero_point"}) {
      if (b_.use(module + activation) != nullptr && report_) ++report_->ignored_activation_scales;
    }
    return finish(std::move(q), module);
  }

  Weight packed(const std::string& module, std::int64_t out, std::int64_t in) {
    const std::string name = module + ".weight_packed";
    const QuantWeights& w = ct_scheme(name, module, "packed (weight_packed)");
    if (w.format != "pack-quantized") {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(name), ": tensor '", name,
                  "' is packed but its quantization_config group says ", w.describe());
    }
    QuantizedMatrix q;
    q.format = QuantFormat::kPacked;
    q.bits = w.num_bits;
    q.rows = out;
    q.cols = in;
    q.scheme = w.describe();
    q.values = take_as(name, {DType::kI32}, Shape{out, (in * q.bits + 31) / 32});
    ct_scale(module, w, q);
    // weight_shape holds [out, in]; it must agree with the config.
    const RawTensor shape = take_as(module + ".weight_shape", {DType::kI64, DType::kI32}, Shape{2});
    if (!shape.empty()) {
      const auto value = [&](int i) -> std::int64_t {
        std::int64_t v64 = 0;
        std::int32_t v32 = 0;
        if (shape.dtype == DType::kI64) {
          std::memcpy(&v64, shape.data + 8 * i, 8);
          return v64;
        }
        std::memcpy(&v32, shape.data + 4 * i, 4);
        return v32;
      };
      if (value(0) != out || value(1) != in) {
        b_.problem(module + ".weight_shape: [" + std::to_string(value(0)) + ", " + std::to_string(value(1)) +
                   "], expected [" + std::to_string(out) + ", " + std::to_string(in) + "]");
      }
    }
    if (!w.symmetric) {
      q.zero_point = take_as(module + ".weight_zero_point", {DType::kI32}, Shape{(out * q.bits + 31) / 32, q.groups()});
      if (q.zero_point.empty()) q.values = {};
    }
    return finish(std::move(q), module);
  }

  Weight gptq(const std::string& module, std::int64_t out, std::int64_t in) {
    const std::string name = module + ".qweight";
    if (qc_.method != QuantMethod::kGptq) {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(name), ": tensor '", name,
                  "' is GPTQ-packed, but config.json has no GPTQ quantization_config");
    }
    const GptqScheme scheme = qc_.gptq_scheme_of(module);
    if (scheme.excluded) {
      throw_error(StatusCode::kFormatError, b_.checkpoint().file_of(name), ": tensor '", name,
                  "' is GPTQ-packed, but quantization_config.dynamic excludes '", module, "' ('", scheme.rule, "')");
    }
    QuantizedMatrix q;
    q.format = QuantFormat::kGptq;
    q.bits = scheme.bits;
    q.rows = out;
    q.cols = in;
    q.group_size = scheme.group_size > 0 ? scheme.group_size : in;
    q.zero_offset = scheme.v1 ? 1 : 0;
    q.scheme = scheme.describe();
    const std::int64_t per = 32 / q.bits;
    if (in % per != 0) {
      b_.problem(name + ": " + std::to_string(in) + " input features do not fill whole 32-bit words of " +
                 std::to_string(q.bits) + "-bit values");
      return {};
    }
    const std::int64_t groups = (in + q.group_size - 1) / q.group_size;
    q.values = take_as(name, {DType::kI32}, Shape{in / per, out});
    q.scale = take_as(module + ".scales", {DType::kF16, DType::kBF16, DType::kF32}, Shape{groups, out});
    q.zero_point = take_as(module + ".qzeros", {DType::kI32}, Shape{groups, (out * q.bits + 31) / 32});
    if (b_.has(module + ".g_idx")) {
      q.g_idx = take_as(module + ".g_idx", {DType::kI32}, Shape{in});
      if (!q.g_idx.empty()) {
        for (std::int64_t i = 0; i < in; ++i) {
          std::int32_t g = 0;
          std::memcpy(&g, q.g_idx.data + 4 * i, 4);
          if (g != i / q.group_size) q.groups_in_order = false;
          if (g < 0 || g >= groups) {
            b_.problem(module + ".g_idx: entry " + std::to_string(i) + " is " + std::to_string(g) + ", outside [0, " +
                       std::to_string(groups) + ")");
            q.g_idx = {};
            q.values = {};
            break;
          }
        }
      }
    } else if (scheme.desc_act) {
      b_.missing(module + ".g_idx [" + std::to_string(in) + "] (desc_act is true)");
    }
    if (q.zero_point.empty()) q.values = {};
    return finish(std::move(q), module);
  }

  Binder& b_;
  const QuantizationConfig& qc_;
  BindReport* report_;
};

}  // namespace diffusion_gemma::io::detail
