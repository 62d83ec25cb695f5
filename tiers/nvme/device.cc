#include "tiers/nvme/device.h"

#include <string>
#include <vector>

namespace kvtier::tiers {

Status Device::Batch(std::span<IoOp> ops, const IoDone& done) {
  bool any = false;
  for (IoOp& op : ops) {
    op.result = Status::Ok();
    const auto addr = reinterpret_cast<uintptr_t>(op.buf);
    if (op.file >= num_files_) {
      op.result = Status::Invalid("io: file " + std::to_string(op.file) + " out of range");
    } else if (op.len == 0 || op.len % kIoAlign || op.offset % kIoAlign || addr % kIoAlign) {
      op.result = Status::Invalid("io: offset/length/buffer not 4 KiB aligned (offset " +
                                  std::to_string(op.offset) + ", len " + std::to_string(op.len) + ")");
    } else if (op.offset + op.len > file_size(op.file)) {
      op.result = Status::Invalid("io: [" + std::to_string(op.offset) + ", +" +
                                  std::to_string(op.len) + ") past the end of the file");
    } else {
      any = true;
    }
  }
  if (done) {
    for (const IoOp& op : ops) {
      if (!op.result.ok()) done(op);  // refused before the device saw it
    }
  }
  if (any) {
    if (!done) {
      BatchImpl(ops);
    } else if (!BatchStreamImpl(ops, done)) {
      std::vector<bool> active(ops.size());
      for (size_t i = 0; i < ops.size(); ++i) active[i] = ops[i].result.ok();
      BatchImpl(ops);
      for (size_t i = 0; i < ops.size(); ++i) {
        if (active[i]) done(ops[i]);
      }
    }
  }
  Status first;
  for (const IoOp& op : ops) {
    const bool rd = op.kind == IoOp::Kind::kRead;
    if (op.result.ok()) {
      (rd ? reads_ : writes_).fetch_add(1, std::memory_order_relaxed);
      (rd ? bytes_read_ : bytes_written_).fetch_add(op.len, std::memory_order_relaxed);
    } else {
      (rd ? read_errors_ : write_errors_).fetch_add(1, std::memory_order_relaxed);
      if (first.ok()) first = op.result;
    }
  }
  return first;
}

Status Device::Read(uint32_t file, uint64_t offset, uint64_t len, void* buf) {
  IoOp op{IoOp::Kind::kRead, file, offset, len, buf, 0, false, {}};
  return Batch(std::span<IoOp>(&op, 1));
}

Status Device::Write(uint32_t file, uint64_t offset, uint64_t len, const void* buf) {
  IoOp op{IoOp::Kind::kWrite, file, offset, len, const_cast<void*>(buf), 0, false, {}};
  return Batch(std::span<IoOp>(&op, 1));
}

Status Device::Sync(std::span<const uint32_t> files) {
  for (uint32_t f : files) {
    if (f >= num_files_) return Status::Invalid("sync: file " + std::to_string(f) + " out of range");
  }
  syncs_.fetch_add(1, std::memory_order_relaxed);
  return SyncImpl(files);
}

DeviceStats Device::stats() const {
  DeviceStats s;
  s.reads = reads_.load();
  s.writes = writes_.load();
  s.bytes_read = bytes_read_.load();
  s.bytes_written = bytes_written_.load();
  s.read_errors = read_errors_.load();
  s.write_errors = write_errors_.load();
  s.syncs = syncs_.load();
  return s;
}

}  // namespace kvtier::tiers
