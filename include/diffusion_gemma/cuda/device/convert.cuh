// SPDX-License-Identifier: Apache-2.0
// Storage types of activations and weights on the device: float (the FP32 exactness mode) or
// bfloat16 (the default; same bits as __nv_bfloat16 and CUDA_R_16BF). Arithmetic is always fp32;
// these helpers widen on load and round to nearest even on store.
#pragma once

#include <type_traits>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma::cuda {

DG_HOST_DEVICE float as_float(float x) { return x; }
DG_HOST_DEVICE float as_float(bfloat16 x) { return x.to_float(); }

template <class T>
DG_HOST_DEVICE T from_float(float x) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>, "from_float<T>: T is float or bfloat16");
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return bfloat16::from_float(x);
  }
}

// The one choke point from a runtime storage dtype to a compile-time type: calls f(float{}) or
// f(bfloat16{}) (host only).
template <class F>
decltype(auto) dispatch_storage(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bfloat16{});
    default: break;
  }
  throw_error(StatusCode::kUnsupported, "CUDA back-end: storage dtype ", dtype_name(dtype),
              " is not supported (BF16 or F32)");
}

}  // namespace diffusion_gemma::cuda
