#include "tiers/nvme/fault_device.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvtier::tiers {

Status FaultOptions::Validate() const {
  const double ps[] = {read_error, short_read, write_error, short_write, enospc, flip_payload, flip_header};
  for (double p : ps) {
    if (!(p >= 0.0 && p <= 1.0)) return Status::Invalid("fault probability " + std::to_string(p) + " not in [0, 1]");
  }
  if (read_error + short_read > 1.0) return Status::Invalid("read fault probabilities sum over 1");
  if (write_error + short_write + enospc + std::max(flip_payload, flip_header) > 1.0) {
    return Status::Invalid("write fault probabilities sum over 1");
  }
  if (record_bytes % kIoAlign != 0) return Status::Invalid("fault record_bytes not a 4 KiB multiple");
  return Status::Ok();
}

FaultDevice::FaultDevice(std::unique_ptr<Device> real, const FaultOptions& opts)
    : Device(real->num_files(), real->file_bytes(), real->last_file_bytes()),
      real_(std::move(real)),
      opts_(opts),
      rng_(opts.seed) {}

FaultCounts FaultDevice::counts() const {
  FaultCounts c;
  c.read_errors = read_errors_;
  c.short_reads = short_reads_;
  c.write_errors = write_errors_;
  c.short_writes = short_writes_;
  c.enospc = enospc_;
  c.payload_flips = payload_flips_;
  c.header_flips = header_flips_;
  return c;
}

FaultDevice::Fault FaultDevice::Choose(const IoOp& op) {
  if (!enabled_.load()) return Fault::kNone;
  double u;
  {
    std::lock_guard<std::mutex> l(rng_mu_);
    u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
  if (op.kind == IoOp::Kind::kRead) {
    if (u < opts_.read_error) return Fault::kReadError;
    u -= opts_.read_error;
    if (u < opts_.short_read) return Fault::kShortRead;
    return Fault::kNone;
  }
  if (u < opts_.write_error) return Fault::kWriteError;
  u -= opts_.write_error;
  if (u < opts_.short_write) return Fault::kShortWrite;
  u -= opts_.short_write;
  if (u < opts_.enospc) return Fault::kEnospc;
  u -= opts_.enospc;
  const bool header =
      op.header || (opts_.record_bytes != 0 && op.offset % opts_.record_bytes == 0 && op.len == kIoAlign);
  if (header) return u < opts_.flip_header ? Fault::kFlipHeader : Fault::kNone;
  return u < opts_.flip_payload ? Fault::kFlipPayload : Fault::kNone;
}

namespace {
struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
const char* FaultName(int f) {
  static const char* names[] = {"none", "read error (EIO)", "short read", "write error (EIO)",
                                "short write", "ENOSPC", "payload bit flip", "header bit flip"};
  return names[f];
}
}  // namespace

void FaultDevice::BatchImpl(std::span<IoOp> ops) {
  std::vector<IoOp> pass;      // what goes to the real device (possibly shortened/copied)
  std::vector<size_t> where;   // pass[k] is ops[where[k]]
  std::vector<std::unique_ptr<uint8_t, AlignedFree>> copies;  // flipped write buffers
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].result.ok()) continue;  // refused by Device::Batch already
    IoOp op = ops[i];
    const Fault f = Choose(op);
    if (f != Fault::kNone) {
      spdlog::warn("fault injected: {} on file {} offset {} len {}", FaultName(static_cast<int>(f)),
                   op.file, op.offset, op.len);
    }
    const uint64_t half = op.len / 2 / kIoAlign * kIoAlign;
    switch (f) {
      case Fault::kNone: break;
      case Fault::kReadError:
        ++read_errors_;
        ops[i].result = Status::IoError("io: read failed: Input/output error (EIO, injected)");
        continue;
      case Fault::kWriteError:
        ++write_errors_;
        ops[i].result = Status::IoError("io: write failed: Input/output error (EIO, injected)");
        continue;
      case Fault::kEnospc:
        ++enospc_;
        ops[i].result = Status::IoError("io: write failed: No space left on device (ENOSPC, injected)");
        continue;
      case Fault::kShortRead:
        ++short_reads_;
        std::memset(static_cast<uint8_t*>(op.buf) + half, 0xA5, op.len - half);
        op.len = half;
        break;
      case Fault::kShortWrite:
        ++short_writes_;
        op.len = half;
        break;
      case Fault::kFlipPayload:
      case Fault::kFlipHeader: {
        (f == Fault::kFlipHeader ? header_flips_ : payload_flips_)++;
        auto* p = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, op.len));
        copies.emplace_back(p);
        std::memcpy(p, op.buf, op.len);
        uint64_t bit;
        {
          std::lock_guard<std::mutex> l(rng_mu_);
          // A header flip lands in the 96 meaningful bytes; a payload flip anywhere.
          const uint64_t span = f == Fault::kFlipHeader ? 96 * 8 : op.len * 8;
          bit = std::uniform_int_distribution<uint64_t>(0, span - 1)(rng_);
        }
        p[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        op.buf = p;
        break;
      }
    }
    if (op.len == 0) {
      ops[i].result = Status::Ok();
      continue;
    }
    op.result = Status::Ok();
    pass.push_back(op);
    where.push_back(i);
  }
  if (!pass.empty()) (void)real_->Batch(pass);
  for (size_t k = 0; k < pass.size(); ++k) ops[where[k]].result = pass[k].result;
}

StatusOr<FaultOptions> ParseFaultSpec(std::string_view spec) {
  FaultOptions o;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return Status::Invalid("fault spec: '" + std::string(item) + "' has no '='");
    const std::string key(item.substr(0, eq)), val(item.substr(eq + 1));
    char* end = nullptr;
    if (key == "seed" || key == "record_bytes") {
      const unsigned long long v = std::strtoull(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0') return Status::Invalid("fault spec: " + key + ": bad integer '" + val + "'");
      (key == "seed" ? o.seed : o.record_bytes) = v;
      continue;
    }
    const double v = std::strtod(val.c_str(), &end);
    if (val.empty() || *end != '\0') return Status::Invalid("fault spec: " + key + ": bad number '" + val + "'");
    if (key == "read_error") o.read_error = v;
    else if (key == "short_read") o.short_read = v;
    else if (key == "write_error") o.write_error = v;
    else if (key == "short_write") o.short_write = v;
    else if (key == "enospc") o.enospc = v;
    else if (key == "flip_payload") o.flip_payload = v;
    else if (key == "flip_header") o.flip_header = v;
    else return Status::Invalid("fault spec: unknown key '" + key + "'");
  }
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)> EnvironmentDeviceWrapper() {
#if KVTIER_TEST_POINTS
  const char* spec = std::getenv("KVTIER_TEST_FAULTS");
  if (spec == nullptr || *spec == '\0') return nullptr;
  auto o = ParseFaultSpec(spec);
  if (!o.ok()) {
    std::fprintf(stderr, "KVTIER_TEST_FAULTS: %s\n", o.status().message().c_str());
    std::abort();
  }
  FaultOptions fo = *o;
  spdlog::warn("nvme: fault injection on (KVTIER_TEST_FAULTS={}): test build only", spec);
  return [fo](std::unique_ptr<Device> real) -> std::unique_ptr<Device> {
    return std::make_unique<FaultDevice>(std::move(real), fo);
  };
#else
  return nullptr;
#endif
}

}  // namespace kvtier::tiers
