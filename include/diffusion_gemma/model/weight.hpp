// SPDX-License-Identifier: Apache-2.0
// Weight: one parameter tensor as a back-end computes with it. It keeps the checkpoint's own
// dtype (F32, BF16 or F16) and row-major layout, and either borrows the bytes of the memory-mapped
// file (no copy: the pages are shared with the page cache and count once) or owns bytes made at
// load, in which case `owner` keeps them alive. Matrices are [out, in] like torch Linear weights;
// expert weights are [experts, out, in]; norms and scales are vectors.
//
// Two more kinds come from quantized checkpoints (docs/quantization.md):
//   quantized  `quant` describes the stored integers or FP8 values and their scales; `data` and
//              `dtype` are those of the stored values.
//   split      `parts` holds the pieces the checkpoint stores separately: for a [groups, out, in]
//              weight one matrix per group (experts stored one by one), for an [out, in] matrix
//              blocks of rows stacked in order (an expert's gate rows, then its up rows). Each
//              part may itself be quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>
#include <diffusion_gemma/model/quantized_matrix.hpp>

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
  std::shared_ptr<const QuantizedMatrix> quant;  // set for a quantized matrix
  std::shared_ptr<const std::vector<Weight>> parts;  // set for a split weight
  // The same dense matrix also packed as pair tiles (cpu/tile_pack.hpp): made once per model for
  // the engines whose products read that form (AMX tiles, the AVX2 kernel on BF16); this view
  // starts `tile_offset` elements into it.
  std::shared_ptr<const std::uint16_t[]> tiles;
  std::size_t tile_offset = 0;

  static Weight borrow(const RawTensor& t) {
    Weight w;
    w.data = t.data;
    w.dtype = t.dtype;
    w.shape = t.shape;
    return w;
  }

  static Weight quantized(QuantizedMatrix q) {
    Weight w;
    w.data = q.values.data;
    w.dtype = q.values.dtype;
    w.shape = Shape{q.rows, q.cols};
    w.quant = std::make_shared<const QuantizedMatrix>(std::move(q));
    return w;
  }
  // A weight of `shape` made of `pieces` (see the kinds above).
  static Weight split(Shape shape, std::vector<Weight> pieces) {
    Weight w;
    w.shape = shape;
    w.dtype = pieces.empty() ? DType::kF32 : pieces.front().dtype;
    w.data = pieces.empty() ? nullptr : pieces.front().data;
    w.parts = std::make_shared<const std::vector<Weight>>(std::move(pieces));
    return w;
  }

  bool empty() const { return data == nullptr; }
  bool borrowed() const { return data != nullptr && owner == nullptr; }
  bool is_quantized() const { return quant != nullptr; }
  bool is_split() const { return parts != nullptr; }
  // Stored as plain F32/BF16/F16 numbers in one row-major block.
  bool is_dense() const { return !is_quantized() && !is_split(); }
  const std::uint16_t* tile_data() const { return tiles ? tiles.get() + tile_offset : nullptr; }
  // Elements of one [out, in] matrix in the tile layout: 16 outputs x 32 inputs per tile, padded.
  std::size_t tile_elements_per_group() const {
    return static_cast<std::size_t>((rows() + 15) / 16 * 16) * static_cast<std::size_t>((cols() + 31) / 32 * 32);
  }
  std::int64_t numel() const { return shape.numel(); }
  // Bytes as stored, scales and zero points included.
  std::size_t nbytes() const {
    if (quant) return quant->nbytes();
    if (parts) {
      std::size_t n = 0;
      for (const Weight& p : *parts) n += p.nbytes();
      return n;
    }
    return static_cast<std::size_t>(numel()) * dtype_size(dtype);
  }
  // Calls f(data, bytes) for every block of stored bytes this weight reads.
  template <class F>
  void for_each_buffer(F&& f) const {
    if (quant) {
      quant->for_each_tensor([&](const RawTensor& t) { f(t.data, t.nbytes); });
    } else if (parts) {
      for (const Weight& p : *parts) p.for_each_buffer(f);
    } else if (data != nullptr) {
      f(data, nbytes());
    }
  }
  // Output and input features of a matrix (the last two dimensions); groups = the rest.
  std::int64_t rows() const { return shape.rank >= 2 ? shape[shape.rank - 2] : 1; }
  std::int64_t cols() const { return shape.rank >= 1 ? shape[shape.rank - 1] : 0; }
  std::int64_t groups() const { return shape.rank == 3 ? shape[0] : 1; }

  // Slice g of a [groups, out, in] weight, as an [out, in] view sharing the owner.
  Weight group(std::int64_t g) const {
    if (parts) return (*parts)[static_cast<std::size_t>(g)];
    Weight w = *this;
    w.shape = Shape{rows(), cols()};
    w.data = data + static_cast<std::size_t>(g) * static_cast<std::size_t>(rows() * cols()) * dtype_size(dtype);
    if (tiles) w.tile_offset = tile_offset + static_cast<std::size_t>(g) * tile_elements_per_group();
    return w;
  }
  // Rows [r0, r0 + n) of an [out, in] matrix.
  Weight row_range(std::int64_t r0, std::int64_t n) const {
    if (!is_dense()) throw_error(StatusCode::kUnsupported, "Weight::row_range: the weight is quantized or split");
    Weight w = *this;
    w.shape = Shape{n, cols()};
    w.data = data + static_cast<std::size_t>(r0 * cols()) * dtype_size(dtype);
    if (tiles && r0 % 16 == 0) {
      w.tile_offset = tile_offset + static_cast<std::size_t>(r0 / 16) * 16 * static_cast<std::size_t>((cols() + 31) / 32 * 32);
    } else {
      w.tiles.reset();  // a range that does not start on a tile: the row-major kernels
      w.tile_offset = 0;
    }
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
