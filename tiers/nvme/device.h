// Device: the block device under the NVMe store, shaped after CacheLib navy's Device.
//
// The public methods are non-virtual: they check alignment (O_DIRECT needs every buffer,
// offset and length on a 4 KiB boundary), bounds, and keep the statistics. Subclasses
// implement only the *Impl methods. That split is what lets the reliability work wrap a
// real device with fault injection (a subclass whose BatchImpl fails, truncates or flips
// chosen operations and forwards the rest) without touching alignment or accounting.
//
// The device is a set of equal-size files (file index, byte offset). A batch is a mix of
// reads and writes submitted together; each operation gets its own Status, so one failed
// write does not poison its neighbours. Batch is synchronous for its caller (the mover
// thread); inside, the io_uring implementation keeps up to queue_depth operations in flight.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>

#include "formats/status.h"

namespace kvtier::tiers {

inline constexpr uint64_t kIoAlign = 4096;

struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  uint32_t file = 0;      // file index, < num_files()
  uint64_t offset = 0;    // byte offset in the file; kIoAlign multiple
  uint64_t len = 0;       // bytes; positive kIoAlign multiple
  void* buf = nullptr;    // kIoAlign-aligned memory of len bytes
  uint64_t user = 0;      // caller's tag, untouched by the device
  bool header = false;    // the op is a record header's 4 KiB (fault injection tells them apart)
  Status result;          // set by Batch
};

// Called once per op as it finishes (ok or not), on the thread that called Batch, while
// later ops are still in flight: lets callers verify or forward a block without waiting
// for the whole batch.
using IoDone = std::function<void(const IoOp& op)>;

struct DeviceStats {
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t read_errors = 0, write_errors = 0, syncs = 0;
};

class Device {
 public:
  // file_bytes: every file's size and the stride of record addresses; last_file_bytes: the
  // last file's size where it holds fewer slabs (0: file_bytes).
  Device(uint32_t num_files, uint64_t file_bytes, uint64_t last_file_bytes = 0)
      : num_files_(num_files),
        file_bytes_(file_bytes),
        last_file_bytes_(last_file_bytes ? last_file_bytes : file_bytes) {}
  virtual ~Device() = default;

  // Runs every op; returns the first failure (each op also carries its own result).
  // Misaligned or out-of-range ops fail Invalid without touching the device.
  Status Batch(std::span<IoOp> ops, const IoDone& done = nullptr);
  Status Read(uint32_t file, uint64_t offset, uint64_t len, void* buf);
  Status Write(uint32_t file, uint64_t offset, uint64_t len, const void* buf);
  // Makes every completed write to the given files durable (fdatasync).
  Status Sync(std::span<const uint32_t> files);

  uint32_t num_files() const { return num_files_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t last_file_bytes() const { return last_file_bytes_; }
  // The size of file f (< num_files()).
  uint64_t file_size(uint32_t f) const { return f + 1 == num_files_ ? last_file_bytes_ : file_bytes_; }
  DeviceStats stats() const;

 protected:
  // Performs ops whose Status is still Ok (already validated); sets each op's result.
  virtual void BatchImpl(std::span<IoOp> ops) = 0;
  // Optional streaming form: performs the ops like BatchImpl and calls done(op) as each
  // one finishes; returns true. The default returns false without doing anything, and
  // Batch then runs BatchImpl and reports every op at the end (a wrapper such as a fault
  // injector only needs BatchImpl).
  virtual bool BatchStreamImpl(std::span<IoOp> ops, const IoDone& done) { return false; }
  virtual Status SyncImpl(std::span<const uint32_t> files) = 0;

 private:
  const uint32_t num_files_;
  const uint64_t file_bytes_;
  const uint64_t last_file_bytes_;
  std::atomic<uint64_t> reads_{0}, writes_{0}, bytes_read_{0}, bytes_written_{0};
  std::atomic<uint64_t> read_errors_{0}, write_errors_{0}, syncs_{0};
};

}  // namespace kvtier::tiers
