// SPDX-License-Identifier: Apache-2.0
// Non-owning views over memory somebody else owns (a mapped checkpoint, a cache, a buffer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <string>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma {

struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<std::int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) {
    for (auto v : d) {
      if (rank < kMaxRank) dims[rank++] = v;
    }
  }
  std::int64_t operator[](int i) const { return dims[i]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::ostringstream s;
    s << '[';
    for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << dims[i];
    s << ']';
    return s.str();
  }
};

// A typed view with row-major strides (in elements). Rank up to 4.
template <class T>
struct TensorView {
  T* data = nullptr;
  Shape shape;
  std::array<std::int64_t, Shape::kMaxRank> strides{};

  TensorView() = default;
  TensorView(T* d, Shape s) : data(d), shape(s) {
    std::int64_t stride = 1;
    for (int i = shape.rank - 1; i >= 0; --i) {
      strides[i] = stride;
      stride *= shape.dims[i];
    }
  }
  std::int64_t numel() const { return shape.numel(); }
  std::int64_t dim(int i) const { return shape.dims[i]; }
  T* row(std::int64_t i) const { return data + i * strides[0]; }
  T& operator()(std::int64_t i) const { return data[i * strides[0]]; }
  T& operator()(std::int64_t i, std::int64_t j) const { return data[i * strides[0] + j * strides[1]]; }
  T& operator()(std::int64_t i, std::int64_t j, std::int64_t k) const {
    return data[i * strides[0] + j * strides[1] + k * strides[2]];
  }
};

// An untyped, read-only view of a tensor as stored in a file: the element type is runtime data.
struct RawTensor {
  const std::byte* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  std::size_t nbytes = 0;

  bool empty() const { return data == nullptr; }
  template <class T>
  TensorView<const T> as() const {
    return TensorView<const T>(reinterpret_cast<const T*>(data), shape);
  }
};

// Widens element i of a stored tensor to float, whatever its stored type.
inline float load_as_float(const RawTensor& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, t.data + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      std::uint16_t b;
      std::memcpy(&b, t.data + i * 2, 2);
      return bfloat16::from_bits(b).to_float();
    }
    case DType::kF16: {
      std::uint16_t b;
      std::memcpy(&b, t.data + i * 2, 2);
      return float16::from_bits(b).to_float();
    }
    default: return 0.0f;
  }
}

}  // namespace diffusion_gemma
