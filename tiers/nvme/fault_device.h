// FaultDevice: fault injection behind the real NVMe store (CacheLib's MockDevice,
// RocksDB's FaultInjectionTestFS, reduced to what tiers/nvme needs).
//
// It wraps the real device (UringDevice) through Device's *Impl split, so alignment,
// bounds and the statistics of the public Batch() stay the real ones. Each operation the
// store submits is, with the probability set per kind, turned into one of these faults;
// everything else goes to the real device unchanged:
//   read_error    the read fails with IoError (EIO); nothing is read.
//   short_read    only the first half (4 KiB-rounded down) is read, the rest of the
//                 buffer is poisoned, and the op reports Ok: a device that lies. The
//                 store's payload checksum (or header check) must catch it.
//   write_error   the write fails with IoError (EIO); nothing is written.
//   short_write   only the first half is written (a torn write) and the op reports Ok.
//   enospc        the write fails with IoError "No space left on device (ENOSPC)".
//   flip_payload  one random bit of a payload write is flipped on its way to the disk
//                 (the caller's buffer is left alone); the op reports Ok.
//   flip_header   the same for a record-header write (the 4 KiB at the start of a record).
// A header op is one the store marks (IoOp::header), or, with record_bytes set (a caller
// of one record size that does not mark its ops), one at offset % record_bytes == 0 of
// len == 4 KiB.
//
// Every injected fault is counted (counts()) and logged as one warn line starting with
// "fault injected:", so an integration test can count them in a daemon's log.
//
// Test hook: the test daemon kvtierd-test (built with KVTIER_TEST_POINTS, linked with
// tiers/test_point_env.cc) picks up a spec from the environment variable
// KVTIER_TEST_FAULTS ("read_error=0.01,enospc=0.02,seed=7"; see ParseFaultSpec) and
// NvmeStore::Open then wraps its device with a FaultDevice (EnvironmentDeviceWrapper).
// This file is compiled into the test-only library kvtier_fault: the kvtierd that
// scripts/run.sh starts cannot be made to inject faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

#include "tiers/nvme/device.h"

namespace kvtier::tiers {

struct FaultOptions {
  double read_error = 0;    // probability per read op. Default: 0
  double short_read = 0;    // probability per read op. Default: 0
  double write_error = 0;   // probability per write op. Default: 0
  double short_write = 0;   // probability per write op. Default: 0
  double enospc = 0;        // probability per write op. Default: 0
  double flip_payload = 0;  // probability per payload write op. Default: 0
  double flip_header = 0;   // probability per header write op. Default: 0
  uint64_t record_bytes = 0;  // bytes of one record (4096 + slot_bytes), to tell
                              // header ops from payload ops by position; 0 = only the
                              // ops marked IoOp::header are. Default: 0
  uint64_t seed = 1;        // of the fault choices (deterministic per seed). Default: 1

  // Invalid unless every probability is in [0, 1] and the read (write) probabilities sum
  // to at most 1, and record_bytes is 0 or a kIoAlign multiple.
  Status Validate() const;
};

struct FaultCounts {
  uint64_t read_errors = 0, short_reads = 0, write_errors = 0, short_writes = 0, enospc = 0,
           payload_flips = 0, header_flips = 0;
  uint64_t total() const {
    return read_errors + short_reads + write_errors + short_writes + enospc + payload_flips +
           header_flips;
  }
};

class FaultDevice : public Device {
 public:
  FaultDevice(std::unique_ptr<Device> real, const FaultOptions& opts);

  FaultCounts counts() const;
  // Faults are injected only while enabled (the default); disabling lets a test read
  // back what was stored without new faults.
  void set_enabled(bool on) { enabled_.store(on); }
  Device* real() { return real_.get(); }

 protected:
  void BatchImpl(std::span<IoOp> ops) override;
  Status SyncImpl(std::span<const uint32_t> files) override { return real_->Sync(files); }

 private:
  enum class Fault : uint8_t { kNone, kReadError, kShortRead, kWriteError, kShortWrite, kEnospc,
                               kFlipPayload, kFlipHeader };
  Fault Choose(const IoOp& op);

  std::unique_ptr<Device> real_;
  const FaultOptions opts_;
  std::atomic<bool> enabled_{true};
  std::mutex rng_mu_;  // guards rng_
  std::mt19937_64 rng_;
  std::atomic<uint64_t> read_errors_{0}, short_reads_{0}, write_errors_{0}, short_writes_{0},
      enospc_{0}, payload_flips_{0}, header_flips_{0};
};

// Parses "key=value,key=value": keys are the FaultOptions field names (probabilities as
// decimals, record_bytes and seed as integers). Invalid naming the key on anything else.
StatusOr<FaultOptions> ParseFaultSpec(std::string_view spec);

// The wrapper tiers/test_point_env.cc installs as NvmeStore's default (the one Open
// applies when its caller passed none): a FaultDevice when the build has
// KVTIER_TEST_POINTS and KVTIER_TEST_FAULTS is set (an unparsable spec aborts
// the process with a message: a test that asked for faults must not run without them),
// else an empty function.
std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)> EnvironmentDeviceWrapper();

}  // namespace kvtier::tiers
