// SPDX-License-Identifier: Apache-2.0
// Writes .safetensors files (F32, BF16, F16, I32, I64): parity outputs, test inputs, tools.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>

namespace diffusion_gemma::io {

class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const Shape& shape, const void* data) {
    if (name.empty() || name == "__metadata__") {
      throw_error(StatusCode::kInvalidArgument, "safetensors writer: invalid tensor name '", name, "'");
    }
    for (const auto& t : tensors_) {
      if (t.name == name) throw_error(StatusCode::kInvalidArgument, "safetensors writer: tensor '", name, "' added twice");
    }
    Pending p;
    p.name = name;
    p.dtype = dtype;
    p.shape = shape;
    const std::size_t n = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
    p.bytes.resize(n);
    if (n) std::memcpy(p.bytes.data(), data, n);
    tensors_.push_back(std::move(p));
  }
  template <class T>
  void add(const std::string& name, const Shape& shape, const T* data) {
    add(name, dtype_of<T>::value, shape, data);
  }
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  void write(const std::string& path) const {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      std::vector<std::int64_t> dims(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.rank);
      header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", dims}, {"data_offsets", {offset, offset + t.bytes.size()}}};
      offset += t.bytes.size();
    }
    std::string text = header.dump();
    while (text.size() % 8 != 0) text.push_back(' ');  // keeps the data section 8-byte aligned
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) throw_error(StatusCode::kIoError, path, ": cannot open for writing: ", std::strerror(errno));
    unsigned char len[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    for (const auto& t : tensors_) {
      if (!ok) break;
      if (!t.bytes.empty()) ok = std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) throw_error(StatusCode::kIoError, path, ": write failed");
  }

 private:
  struct Pending {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<unsigned char> bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace diffusion_gemma::io
