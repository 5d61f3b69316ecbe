// SPDX-License-Identifier: Apache-2.0
// Caller-owned scratch memory, CUB style: the same code path measures a workspace (base ==
// nullptr: pointers stay null, only the size grows) and then carves the real one, so a
// launcher's workspace_bytes() can never disagree with what its launch uses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace diffusion_gemma::cuda {

class Carver {
 public:
  static constexpr std::size_t kAlignment = 256;  // cudaMalloc's alignment; keeps every carve 16-byte aligned

  explicit Carver(void* base = nullptr) : base_(static_cast<std::byte*>(base)) {}

  template <class T>
  T* take(std::size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(std::size_t bytes) {
    offset_ = (offset_ + kAlignment - 1) / kAlignment * kAlignment;
    void* p = base_ != nullptr ? static_cast<void*>(base_ + offset_) : nullptr;
    offset_ += bytes;
    return p;
  }
  // Bytes used so far, rounded up so that consecutive workspaces stay aligned.
  std::size_t bytes() const { return (offset_ + kAlignment - 1) / kAlignment * kAlignment; }
  bool measuring() const { return base_ == nullptr; }

 private:
  std::byte* base_;
  std::size_t offset_ = 0;
};

}  // namespace diffusion_gemma::cuda
