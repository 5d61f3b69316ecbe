// SPDX-License-Identifier: Apache-2.0
// Writes .safetensors files: SafetensorsWriter holds the tensors in memory (parity outputs, test
// inputs); SafetensorsStream writes the header first and then each tensor's bytes as they are
// made, so a tool can write a file larger than memory (dgemma quantize).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <sys/stat.h>

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
    int error = ok ? 0 : errno;
    struct stat written {};
    const bool have_written = ::fstat(::fileno(f), &written) == 0;
    if (std::fclose(f) != 0 && ok) {
      ok = false;
      error = errno;
    }
    if (!ok) {
      // A cut file is no safetensors file: it is removed rather than left to be read, but only
      // when `path` itself is that regular file (not a link to it, nor a device reached through one).
      struct stat named {};
      const bool removable = have_written && S_ISREG(written.st_mode) && ::lstat(path.c_str(), &named) == 0 &&
                             S_ISREG(named.st_mode) && named.st_dev == written.st_dev && named.st_ino == written.st_ino;
      if (removable && std::remove(path.c_str()) == 0) {
        throw_error(StatusCode::kIoError, path, ": write failed (", std::strerror(error), "); nothing was kept");
      }
      throw_error(StatusCode::kIoError, path, ": write failed (", std::strerror(error), "); what it holds is cut");
    }
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

// A tensor announced in a SafetensorsStream header.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::uint64_t nbytes() const { return static_cast<std::uint64_t>(shape.numel()) * dtype_size(dtype); }
};

class SafetensorsStream {
 public:
  // Opens `path` and writes the header for `tensors`, whose bytes must then come through
  // append() in this order.
  SafetensorsStream(const std::string& path, const std::vector<TensorSpec>& tensors) : path_(path), tensors_(tensors) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    std::uint64_t offset = 0;
    for (const auto& t : tensors_) {
      std::vector<std::int64_t> dims(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.rank);
      header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", dims}, {"data_offsets", {offset, offset + t.nbytes()}}};
      offset += t.nbytes();
    }
    total_ = offset;
    std::string text = header.dump();
    while (text.size() % 8 != 0) text.push_back(' ');
    f_ = std::fopen(path.c_str(), "wb");
    if (f_ == nullptr) throw_error(StatusCode::kIoError, path, ": cannot open for writing: ", std::strerror(errno));
    unsigned char len[8];
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    put(len, 8);
    put(text.data(), text.size());
  }
  SafetensorsStream(const SafetensorsStream&) = delete;
  SafetensorsStream& operator=(const SafetensorsStream&) = delete;
  ~SafetensorsStream() {
    if (f_ != nullptr) std::fclose(f_);
  }

  // The next bytes of the current tensor (a whole tensor, or a piece of one: a tensor is done
  // when its announced size has been appended).
  void append(const void* data, std::uint64_t bytes) {
    while (next_ < tensors_.size() && tensors_[next_].nbytes() == 0) ++next_;
    if (next_ >= tensors_.size() || written_ + bytes > tensors_[next_].nbytes()) {
      throw_error(StatusCode::kInternal, path_, ": tensor ", next_ < tensors_.size() ? tensors_[next_].name : "(none)",
                  " got ", written_ + bytes, " bytes, announced ", next_ < tensors_.size() ? tensors_[next_].nbytes() : 0);
    }
    put(data, bytes);
    written_ += bytes;
    if (written_ == tensors_[next_].nbytes()) {
      ++next_;
      written_ = 0;
    }
  }
  // Closes the file; every announced tensor must have been appended.
  void finish() {
    while (next_ < tensors_.size() && tensors_[next_].nbytes() == 0) ++next_;
    if (next_ != tensors_.size()) {
      throw_error(StatusCode::kInternal, path_, ": ", tensors_.size() - next_, " announced tensors were not written");
    }
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok) throw_error(StatusCode::kIoError, path_, ": write failed: ", std::strerror(errno));
  }
  std::uint64_t data_bytes() const { return total_; }

 private:
  void put(const void* data, std::size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, f_) != n) {
      throw_error(StatusCode::kIoError, path_, ": write failed: ", std::strerror(errno));
    }
  }
  std::string path_;
  std::vector<TensorSpec> tensors_;
  std::size_t next_ = 0;
  std::uint64_t written_ = 0;  // of tensor next_
  std::uint64_t total_ = 0;
  std::FILE* f_ = nullptr;
};

}  // namespace diffusion_gemma::io
