// UringDevice: the real Device. A set of preallocated files opened O_DIRECT, one
// io_uring with a deep queue (queue_depth), registered files, and registered ("fixed")
// buffers for the memory regions the caller names (the host arena, the store's header
// staging area), so reads and writes into them skip the per-I/O page pinning.
//
// What the kernel may do and this code handles instead of assuming away:
//   - short reads/writes: the remainder is resubmitted from where it stopped;
//   - -EAGAIN / -EINTR completions and submit-time -EAGAIN/-EBUSY: resubmitted (bounded);
//   - a fixed-buffer registration refused (RLIMIT_MEMLOCK, old kernel): logged once, and
//     plain READ/WRITE ops are used instead.
// One batch at a time owns the ring (a mutex); the store calls it from the mover thread.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tiers/nvme/device.h"

namespace kvtier::tiers {

struct UringDeviceOptions {
  std::vector<std::string> paths;  // one per file; created if missing. Default: none (refused)
  uint64_t file_bytes = 0;         // size of every file, kIoAlign multiple. Default: 0 (refused)
  uint64_t last_file_bytes = 0;    // the last file's, a kIoAlign multiple <= file_bytes. Default: 0 (file_bytes)
  uint32_t queue_depth = 64;       // io_uring SQ entries, 1..4096. Default: 64
  std::vector<iovec> fixed;        // memory to register as fixed buffers. Default: none

  Status Validate() const;
};

class UringDevice : public Device {
 public:
  static StatusOr<std::unique_ptr<UringDevice>> Open(const UringDeviceOptions& opts);
  ~UringDevice() override;

  bool fixed_buffers() const { return !fixed_.empty(); }
  uint64_t resubmits() const { return resubmits_; }

 protected:
  void BatchImpl(std::span<IoOp> ops) override { (void)BatchStreamImpl(ops, nullptr); }
  bool BatchStreamImpl(std::span<IoOp> ops, const IoDone& done) override;
  Status SyncImpl(std::span<const uint32_t> files) override;

 private:
  UringDevice(uint32_t n, uint64_t bytes, uint64_t last_bytes) : Device(n, bytes, last_bytes) {}
  int FixedIndex(const void* p, uint64_t len) const;

  std::mutex mu_;  // one batch or sync at a time on the ring
  io_uring ring_{};
  bool ring_ok_ = false;
  uint32_t depth_ = 0;
  std::vector<int> fds_;
  bool files_registered_ = false;
  std::vector<iovec> fixed_;  // registered regions, each <= 1 GiB (kernel limit)
  uint64_t resubmits_ = 0;
};

}  // namespace kvtier::tiers
