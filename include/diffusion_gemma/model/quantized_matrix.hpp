// SPDX-License-Identifier: Apache-2.0
// How one quantized [out, in] matrix is stored (docs/quantization.md). The tensors are views into
// the memory-mapped checkpoint, exactly as the file holds them: nothing is unpacked at load.
// io/quantization.hpp builds these after checking every shape and dtype; cpu/kernels/dequantize.hpp
// turns blocks of rows back into numbers for the product kernels.
#pragma once

#include <cstdint>
#include <string>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>

namespace diffusion_gemma {

enum class QuantFormat {
  kFp8,     // compressed-tensors float-quantized: `weight` F8_E4M3 [out, in]
  kInt8,    // compressed-tensors int-quantized: `weight` I8 [out, in]
  kPacked,  // compressed-tensors pack-quantized: `weight_packed` I32 [out, ceil(in*bits/32)]
  kGptq,    // GPTQ: `qweight` I32 [in*bits/32, out], `qzeros`, `scales`, `g_idx`
  kSentinel
};

struct QuantizedMatrix {
  QuantFormat format = QuantFormat::kSentinel;
  int bits = 8;
  std::int64_t rows = 0, cols = 0;  // out, in
  // Input columns per scale; 0: one scale per output row (channel); -1: one scale (tensor).
  std::int64_t group_size = 0;
  RawTensor values;      // weight / weight_packed / qweight
  RawTensor scale;       // weight_scale [out, groups] or [out, 1] or [1]; GPTQ scales [groups, out]
  RawTensor zero_point;  // empty when symmetric; packed: [ceil(out*bits/32), groups]; GPTQ qzeros
  RawTensor g_idx;       // GPTQ: the group of each input column
  int zero_offset = 0;   // GPTQ v1 stores zero - 1: the stored value plus this is the zero point
  // GPTQ: g_idx is absent or puts input c in group c / group_size (no activation order), so groups
  // are runs of consecutive inputs as in the other formats.
  bool groups_in_order = true;
  std::string scheme;    // in words, e.g. "int4 group 32 asymmetric (pack-quantized)"
  std::string module;    // the checkpoint's module name, e.g. "model.decoder.layers.0.mlp.down_proj"

  DType scale_dtype() const { return scale.dtype; }
  std::int64_t groups() const {
    if (format == QuantFormat::kGptq) return scale.shape[0];
    return group_size > 0 ? (cols + group_size - 1) / group_size : 1;
  }
  std::size_t nbytes() const { return values.nbytes + scale.nbytes + zero_point.nbytes + g_idx.nbytes; }
  template <class F>
  void for_each_tensor(F&& f) const {
    for (const RawTensor* t : {&values, &scale, &zero_point, &g_idx}) {
      if (!t->empty()) f(*t);
    }
  }
};

}  // namespace diffusion_gemma
