// SPDX-License-Identifier: Apache-2.0
// Errors. Host code that a user can drive into a bad state throws `Error` (a std::runtime_error
// carrying a `StatusCode`); launchers and other no-throw paths return `Status`. Messages name the
// file, tensor, key or option at fault and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace diffusion_gemma {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // a caller-supplied value is out of range or malformed
  kNotFound,         // a file, tensor or key does not exist
  kIoError,          // the operating system refused a read, write or map
  kFormatError,      // a file exists but its contents are not what the format requires
  kUnsupported,      // well-formed, but a feature this library does not implement
  kOutOfRange,       // a request exceeds a limit (context, positions, memory budget)
  kOutOfMemory,
  kCudaError,
  kCancelled,        // a callback asked to stop
  kInternal,
  kUnavailable,      // busy right now (a full request queue): retry later
  kSentinel
};

template <class E>
constexpr bool enum_valid(E e) {
  return static_cast<int>(e) >= 0 && static_cast<int>(e) < static_cast<int>(E::kSentinel);
}

inline const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kFormatError: return "format error";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kSentinel: break;
  }
  return "unknown status";
}

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  explicit Error(const Status& status) : Error(status.code(), status.message()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Builds the message from its parts, so call sites read like sentences:
//   throw_error(StatusCode::kFormatError, path, ": tensor '", name, "' has ", n, " bytes");
template <class... Args>
[[noreturn]] void throw_error(StatusCode code, Args&&... parts) {
  throw Error(code, detail::concat(std::forward<Args>(parts)...));
}

template <class... Args>
Status make_status(StatusCode code, Args&&... parts) {
  return Status(code, detail::concat(std::forward<Args>(parts)...));
}

inline void throw_if_error(const Status& status) {
  if (!status.ok()) throw Error(status);
}

}  // namespace diffusion_gemma
