// Status: the error value every data-path function of kvtier returns.
//
// A small value type (a code and, for failures, a message). No exceptions cross the
// data path or the C ABI; exceptions are kept for start-up and config parsing only.
// [[nodiscard]] makes an ignored Status a compiler warning (and with -Werror, an error),
// which is how kvtier gets most of what RocksDB's "must check Status" debug mode gives.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

enum class StatusCode : int {
  kOk = 0,
  kNotFound = 1,     // key, slot or contract not present (a cache miss)
  kRejected = 2,     // valid request refused by policy (admission, budget, full)
  kRetry = 3,        // transient (queue full, EAGAIN); the same call may succeed later
  kIoError = 4,      // the OS or device said no
  kCorrupt = 5,      // checksum or structure mismatch in stored bytes: treat as a miss
  kInvalid = 6,      // malformed input from a caller, a file or the config
  kUnsupported = 7,  // a valid request kvtier does not implement (geometry, arch, version)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status Rejected(std::string msg) { return Status(StatusCode::kRejected, std::move(msg)); }
  static Status Retry(std::string msg) { return Status(StatusCode::kRetry, std::move(msg)); }
  static Status IoError(std::string msg) { return Status(StatusCode::kIoError, std::move(msg)); }
  static Status Corrupt(std::string msg) { return Status(StatusCode::kCorrupt, std::move(msg)); }
  static Status Invalid(std::string msg) { return Status(StatusCode::kInvalid, std::move(msg)); }
  static Status Unsupported(std::string msg) {
    return Status(StatusCode::kUnsupported, std::move(msg));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsCorrupt() const { return code_ == StatusCode::kCorrupt; }
  bool IsInvalid() const { return code_ == StatusCode::kInvalid; }

  // "Corrupt: header checksum mismatch" (or "OK").
  std::string ToString() const;

  Status(StatusCode code, std::string msg) : code_(code), msg_(std::move(msg)) {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
};

// Status plus a value. value() may only be read when ok().
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status s) : status_(std::move(s)) {}  // NOLINT: implicit by design
  StatusOr(T v) : value_(std::move(v)) {}        // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }
  T& operator*() { return value_; }
  const T& operator*() const { return value_; }

 private:
  Status status_;
  T value_{};
};

}  // namespace kvtier

#define KVTIER_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::kvtier::Status _kvt_s = (expr);       \
    if (!_kvt_s.ok()) return _kvt_s;        \
  } while (0)
