#include "formats/status.h"

namespace kvtier {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kRejected: return "Rejected";
    case StatusCode::kRetry: return "Retry";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kCorrupt: return "Corrupt";
    case StatusCode::kInvalid: return "Invalid";
    case StatusCode::kUnsupported: return "Unsupported";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s = StatusCodeName(code_);
  if (!msg_.empty()) {
    s += ": ";
    s += msg_;
  }
  return s;
}

}  // namespace kvtier
