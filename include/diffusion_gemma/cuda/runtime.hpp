// SPDX-License-Identifier: Apache-2.0
// Host-side CUDA plumbing: errors turned into Status / Error with the failing call, file and line;
// RAII owners of device memory, pinned host memory, streams, events and cuBLAS handles. Compiles
// with the host compiler alone (links CUDA::cudart and CUDA::cublas): no kernels here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma::cuda {

// ---- errors ---------------------------------------------------------------------------------------

inline Status cuda_status(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return {};
  const StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError;
  return make_status(code, call, " failed at ", file, ":", line, ": ", cudaGetErrorName(err), ": ",
                     cudaGetErrorString(err));
}

inline Status cublas_status(cublasStatus_t err, const char* call, const char* file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return {};
  const StatusCode code = err == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfMemory : StatusCode::kCudaError;
  return make_status(code, call, " failed at ", file, ":", line, ": cuBLAS: ", cublasGetStatusString(err));
}

}  // namespace diffusion_gemma::cuda

// Throws diffusion_gemma::Error naming the call, file:line and CUDA's message (host conveniences).
#define DG_CUDA_CHECK(call) \
  ::diffusion_gemma::throw_if_error(::diffusion_gemma::cuda::cuda_status((call), #call, __FILE__, __LINE__))
#define DG_CUBLAS_CHECK(call) \
  ::diffusion_gemma::throw_if_error(::diffusion_gemma::cuda::cublas_status((call), #call, __FILE__, __LINE__))
// Returns the failure as a Status from the enclosing function (launchers and other no-throw paths).
#define DG_CUDA_TRY_AS(call, text)                                                                 \
  do {                                                                                             \
    ::diffusion_gemma::Status dg_status_ = ::diffusion_gemma::cuda::cuda_status((call), text, __FILE__, __LINE__); \
    if (!dg_status_.ok()) return dg_status_;                                                       \
  } while (0)
#define DG_CUDA_TRY(call) DG_CUDA_TRY_AS(call, #call)
// After a kernel launch: a bad launch configuration is reported by cudaGetLastError.
#define DG_CUDA_TRY_LAUNCH(kernel_name) DG_CUDA_TRY_AS(cudaGetLastError(), "launch of " kernel_name)
#define DG_CUBLAS_TRY(call)                                                                        \
  do {                                                                                             \
    ::diffusion_gemma::Status dg_status_ = ::diffusion_gemma::cuda::cublas_status((call), #call, __FILE__, __LINE__); \
    if (!dg_status_.ok()) return dg_status_;                                                       \
  } while (0)

namespace diffusion_gemma::cuda {

// ---- devices --------------------------------------------------------------------------------------

// Number of usable CUDA devices; 0 (never an exception) when there is no GPU or no driver.
inline int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: "no device" is an answer here, not a failure
    return 0;
  }
  return n;
}

// Throws a clear Error when no device can run kernels; called by every object that owns device memory.
inline void require_device() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    throw_error(StatusCode::kCudaError, "no CUDA device is available (cudaGetDeviceCount: ",
                err == cudaSuccess ? "0 devices" : cudaGetErrorString(err),
                "); the CUDA back-end needs an NVIDIA GPU and driver, use the CPU back-end otherwise");
  }
}

struct MemoryInfo {
  std::size_t free = 0, total = 0;
};

inline MemoryInfo memory_info() {
  MemoryInfo m;
  if (cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) (void)cudaGetLastError();
  return m;
}

inline std::string format_bytes(std::size_t b) {
  const double mib = static_cast<double>(b) / (1024.0 * 1024.0);
  return std::to_string(b) + " bytes (" + std::to_string(static_cast<long long>(mib + 0.5)) + " MiB)";
}

// Throws kOutOfMemory naming `what` and the bytes needed vs free, when `bytes` cannot fit.
inline void check_fits(const std::string& what, std::size_t bytes) {
  const MemoryInfo m = memory_info();
  if (m.total != 0 && bytes > m.free) {
    throw_error(StatusCode::kOutOfMemory, what, " needs ", format_bytes(bytes), " of device memory but only ",
                format_bytes(m.free), " of ", format_bytes(m.total), " are free");
  }
}

// ---- memory ---------------------------------------------------------------------------------------

// Owns `count` elements of T in device memory (uninitialised). Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t count, const std::string& name) : count_(count) {
    if (count == 0) return;
    require_device();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, count * sizeof(T));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      const MemoryInfo m = memory_info();
      throw_error(err == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
                  "cudaMalloc of '", name, "' failed (", cudaGetErrorString(err), "): needs ",
                  format_bytes(count * sizeof(T)), ", ", format_bytes(m.free), " free of ", format_bytes(m.total));
    }
    data_ = static_cast<T*>(p);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }

  // Synchronous copies for set-up and tests (the hot path uses cudaMemcpyAsync on a stream).
  // cudaMemcpy runs on the legacy default stream, which non-blocking streams (every Engine's) do
  // not wait for, and from pageable memory it may return before the data has landed: both copies
  // wait for the whole device, so that an upload is complete before any stream reads it and a
  // download sees what every stream has written.
  void upload(const T* host, std::size_t count, std::size_t offset = 0) {
    check_range(count, offset, "upload");
    if (count == 0) return;
    DG_CUDA_CHECK(cudaMemcpy(data_ + offset, host, count * sizeof(T), cudaMemcpyHostToDevice));
    DG_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void download(T* host, std::size_t count, std::size_t offset = 0) const {
    check_range(count, offset, "download");
    if (count == 0) return;
    DG_CUDA_CHECK(cudaDeviceSynchronize());
    DG_CUDA_CHECK(cudaMemcpy(host, data_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  void check_range(std::size_t count, std::size_t offset, const char* what) const {
    if (offset > count_ || count > count_ - offset) {
      throw_error(StatusCode::kOutOfRange, "DeviceBuffer::", what, " of ", count, " elements at ", offset,
                  " exceeds the buffer's ", count_);
    }
  }
  void reset() {
    if (data_ != nullptr) (void)cudaFree(data_);  // never throws from a destructor
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Page-locked host memory: the target of asynchronous device-to-host copies. Move-only.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : count_(count) {
    if (count == 0) return;
    void* p = nullptr;
    DG_CUDA_CHECK(cudaMallocHost(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) (void)cudaFreeHost(data_);
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// ---- streams, events, cuBLAS ---------------------------------------------------------------------

class Stream {
 public:
  Stream() {
    require_device();
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  cudaStream_t get() const { return stream_; }
  void synchronize() const { DG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { DG_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s) { DG_CUDA_CHECK(cudaEventRecord(event_, s)); }
  void synchronize() const { DG_CUDA_CHECK(cudaEventSynchronize(event_)); }
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const Event& start) const {
    float ms = 0.0f;
    DG_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() {
    require_device();
    DG_CUBLAS_CHECK(cublasCreate(&handle_));
    // FP32 GEMMs stay FP32 (no TF32 down-conversion): the FP32 mode is the exactness reference.
    DG_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  }
  ~CublasHandle() {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  CublasHandle(CublasHandle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept {
    if (this != &o) {
      if (handle_ != nullptr) (void)cublasDestroy(handle_);
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace diffusion_gemma::cuda
