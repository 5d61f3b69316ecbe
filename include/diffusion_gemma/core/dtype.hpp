// SPDX-License-Identifier: Apache-2.0
// Element types of checkpoint and data tensors, with their safetensors spellings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>

namespace diffusion_gemma {

// I8 and F8_E4M3 appear only inside quantized weights (model/quantized_matrix.hpp).
enum class DType { kF32, kF16, kBF16, kI32, kI64, kU8, kBool, kI8, kF8E4M3, kSentinel };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kBool: return 1;
    case DType::kI8: return 1;
    case DType::kF8E4M3: return 1;
    case DType::kSentinel: break;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
    case DType::kI8: return "I8";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kSentinel: break;
  }
  return "?";
}

// Spellings the safetensors format defines but this library does not read.
inline bool is_known_unsupported_dtype(const std::string& s) {
  return s == "F64" || s == "I16" || s == "U16" || s == "U32" || s == "U64" || s == "F8_E5M2" || s == "F8_E8M0" || s == "F4" || s == "F6_E2M3" ||
         s == "F6_E3M2" || s == "C64";
}

inline bool parse_dtype(const std::string& s, DType* out) {
  for (int i = 0; i < static_cast<int>(DType::kSentinel); ++i) {
    const auto t = static_cast<DType>(i);
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::kF32; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::kF16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::kBF16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::kI32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::kI64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::kI8; };

}  // namespace diffusion_gemma
