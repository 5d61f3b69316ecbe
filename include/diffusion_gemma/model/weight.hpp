// SPDX-License-Identifier: Apache-2.0
// Weight: one parameter tensor as a back-end computes with it. It keeps the checkpoint's own
// dtype (F32, BF16 or F16) and row-major layout, and either borrows the bytes of the memory-mapped
// file (no copy: the pages are shared with the page cache and count once) or owns bytes made at
// load, in which case `owner` keeps them alive. Matrices are [out, in] like torch Linear weights;
// expert weights are [experts, out, in]; norms and scales are vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>

namespace diffusion_gemma {

enum class WeightLayout {
  kRowMajor,  // the checkpoint's order: the last dimension is contiguous
  kSentinel
};

struct Weight {
  const std::byte* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  WeightLayout layout = WeightLayout::kRowMajor;
  std::shared_ptr<const void> owner;  // empty when the bytes belong to the mapped checkpoint

  static Weight borrow(const RawTensor& t) {
    Weight w;
    w.data = t.data;
    w.dtype = t.dtype;
    w.shape = t.shape;
    return w;
  }

  bool empty() const { return data == nullptr; }
  bool borrowed() const { return data != nullptr && owner == nullptr; }
  std::int64_t numel() const { return shape.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // Output and input features of a matrix (the last two dimensions); groups = the rest.
  std::int64_t rows() const { return shape.rank >= 2 ? shape[shape.rank - 2] : 1; }
  std::int64_t cols() const { return shape.rank >= 1 ? shape[shape.rank - 1] : 0; }
  std::int64_t groups() const { return shape.rank == 3 ? shape[0] : 1; }

  // Slice g of a [groups, out, in] weight, as an [out, in] view sharing the owner.
  Weight group(std::int64_t g) const {
    Weight w = *this;
    w.shape = Shape{rows(), cols()};
    w.data = data + static_cast<std::size_t>(g) * static_cast<std::size_t>(rows() * cols()) * dtype_size(dtype);
    return w;
  }
  // Rows [r0, r0 + n) of an [out, in] matrix.
  Weight row_range(std::int64_t r0, std::int64_t n) const {
    Weight w = *this;
    w.shape = Shape{n, cols()};
    w.data = data + static_cast<std::size_t>(r0 * cols()) * dtype_size(dtype);
    return w;
  }

  RawTensor raw() const {
    RawTensor t;
    t.data = data;
    t.dtype = dtype;
    t.shape = shape;
    t.nbytes = nbytes();
    return t;
  }
  float at(std::int64_t i) const { return load_as_float(raw(), i); }
};

}  // namespace diffusion_gemma
