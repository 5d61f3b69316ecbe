// SPDX-License-Identifier: Apache-2.0
// A read-only memory map of a whole file (POSIX). Checkpoint tensors are views into it, so a
// 50 GB checkpoint costs page cache, not heap.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma::io {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO in place of a checkpoint must not wait for a writer (the type is
    // checked right after; for a regular file the flag changes nothing).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      throw_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, path,
                  ": cannot open: ", std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw_error(StatusCode::kIoError, path, ": cannot stat: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw_error(StatusCode::kIoError, path, ": not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw_error(StatusCode::kIoError, path, ": cannot map ", size_, " bytes: ", std::strerror(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }
  ~MappedFile() { reset(); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      path_ = std::move(o.path_);
    }
    return *this;
  }

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace diffusion_gemma::io
