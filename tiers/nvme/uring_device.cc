#include "tiers/nvme/uring_device.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>

namespace kvtier::tiers {

namespace {
constexpr uint64_t kMaxFixedRegion = uint64_t{1} << 30;  // kernel limit per registered buffer
constexpr int kMaxResubmitsPerOp = 10000;
std::string Errno(int e) { return std::strerror(e); }
}  // namespace

Status UringDeviceOptions::Validate() const {
  if (paths.empty()) return Status::Invalid("uring device: no files");
  if (file_bytes == 0 || file_bytes % kIoAlign) {
    return Status::Invalid("uring device: file_bytes " + std::to_string(file_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (last_file_bytes % kIoAlign || last_file_bytes > file_bytes) {
    return Status::Invalid("uring device: last_file_bytes " + std::to_string(last_file_bytes) +
                           " is not a multiple of 4096 up to file_bytes " + std::to_string(file_bytes));
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::Invalid("uring device: queue_depth " + std::to_string(queue_depth) +
                           " not in [1, 4096]");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<UringDevice>> UringDevice::Open(const UringDeviceOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  std::unique_ptr<UringDevice> d(
      new UringDevice(static_cast<uint32_t>(opts.paths.size()), opts.file_bytes, opts.last_file_bytes));
  for (uint32_t f = 0; f < opts.paths.size(); ++f) {
    const std::string& p = opts.paths[f];
    // Never through a link: a planted symlink would make the daemon preallocate and write
    // its target. An existing file is opened as it is; a missing one is created here and
    // nowhere else (O_EXCL).
    int fd = open(p.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) fd = open(p.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == ELOOP) return Status::Invalid("nvme data file " + p + " is a symbolic link: refused");
    if (fd < 0) return Status::IoError("open " + p + " O_DIRECT: " + Errno(errno));
    d->fds_.push_back(fd);
    struct stat st{};
    if (fstat(fd, &st) != 0) return Status::IoError("fstat " + p + ": " + Errno(errno));
    if (!S_ISREG(st.st_mode)) return Status::Invalid("nvme data file " + p + " is not a regular file: refused");
    const uint64_t size = d->file_size(f);
    if (static_cast<uint64_t>(st.st_size) < size) {
      // Preallocate so that writes never allocate blocks (and never fail ENOSPC later).
      int r = posix_fallocate(fd, 0, static_cast<off_t>(size));
      if (r != 0) return Status::IoError("fallocate " + p + ": " + Errno(r));
    }
  }
  int r = io_uring_queue_init(opts.queue_depth, &d->ring_, 0);
  if (r < 0) return Status::IoError("io_uring_queue_init(" + std::to_string(opts.queue_depth) + "): " + Errno(-r));
  d->ring_ok_ = true;
  d->depth_ = opts.queue_depth;
  if (io_uring_register_files(&d->ring_, d->fds_.data(), static_cast<unsigned>(d->fds_.size())) == 0) {
    d->files_registered_ = true;
  }
  std::vector<iovec> regions;
  for (const iovec& v : opts.fixed) {
    auto* b = static_cast<uint8_t*>(v.iov_base);
    for (uint64_t off = 0; off < v.iov_len; off += kMaxFixedRegion) {
      regions.push_back({b + off, std::min<uint64_t>(kMaxFixedRegion, v.iov_len - off)});
    }
  }
  if (!regions.empty()) {
    r = io_uring_register_buffers(&d->ring_, regions.data(), static_cast<unsigned>(regions.size()));
    if (r == 0) {
      d->fixed_ = std::move(regions);
    } else {
      spdlog::warn("nvme: io_uring_register_buffers refused ({}); using unregistered I/O", Errno(-r));
    }
  }
  return d;
}

UringDevice::~UringDevice() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  for (int fd : fds_) close(fd);
}

int UringDevice::FixedIndex(const void* p, uint64_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < fixed_.size(); ++i) {
    auto b = reinterpret_cast<uintptr_t>(fixed_[i].iov_base);
    if (a >= b && a + len <= b + fixed_[i].iov_len) return static_cast<int>(i);
  }
  return -1;
}

bool UringDevice::BatchStreamImpl(std::span<IoOp> ops, const IoDone& done) {
  std::lock_guard<std::mutex> l(mu_);
  struct Pending {
    IoOp* op;
    uint64_t done = 0;
    int resubmits = 0;
  };
  std::vector<Pending> pend;
  pend.reserve(ops.size());
  for (IoOp& op : ops) {
    if (op.result.ok()) pend.push_back({&op});
  }
  size_t next = 0;
  std::deque<size_t> again;  // short or -EAGAIN ops, resubmitted first
  uint32_t inflight = 0;
  std::vector<size_t> finished;  // ops done in this round, reported after the CQ advance
  while (next < pend.size() || !again.empty() || inflight > 0) {
    bool queued = false;
    while (inflight < depth_ && (!again.empty() || next < pend.size())) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      size_t idx;
      if (!again.empty()) {
        idx = again.front();
        again.pop_front();
      } else {
        idx = next++;
      }
      Pending& p = pend[idx];
      IoOp& op = *p.op;
      uint8_t* buf = static_cast<uint8_t*>(op.buf) + p.done;
      const auto len = static_cast<unsigned>(op.len - p.done);
      const uint64_t off = op.offset + p.done;
      const int fd = files_registered_ ? static_cast<int>(op.file) : fds_[op.file];
      const int bi = FixedIndex(buf, len);
      if (op.kind == IoOp::Kind::kRead) {
        if (bi >= 0) io_uring_prep_read_fixed(sqe, fd, buf, len, off, bi);
        else io_uring_prep_read(sqe, fd, buf, len, off);
      } else {
        if (bi >= 0) io_uring_prep_write_fixed(sqe, fd, buf, len, off, bi);
        else io_uring_prep_write(sqe, fd, buf, len, off);
      }
      if (files_registered_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(static_cast<uintptr_t>(idx)));
      ++inflight;
      queued = true;
    }
    // Submit first, then run the callbacks of the previous round while the device works,
    // then wait: a caller's per-op work (checksums) overlaps the queued I/O.
    int r = done && !finished.empty() ? io_uring_submit(&ring_) : io_uring_submit_and_wait(&ring_, inflight > 0 ? 1 : 0);
    if (done && !finished.empty()) {
      for (size_t idx : finished) done(*pend[idx].op);
      finished.clear();
      if (r >= 0 && inflight > 0) {
        io_uring_cqe* w;
        int wr = io_uring_wait_cqe(&ring_, &w);
        if (wr < 0 && wr != -EINTR && wr != -EAGAIN) r = wr;
      }
    }
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // The ring itself failed: every op not yet completed fails with it.
      for (Pending& p : pend) {
        if (p.op->result.ok() && p.done < p.op->len) {
          p.op->result = Status::IoError("io_uring_submit: " + Errno(-r));
          p.done = p.op->len;
          finished.push_back(static_cast<size_t>(&p - pend.data()));
        }
      }
      break;
    }
    if (r < 0 && !queued) std::this_thread::yield();
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      --inflight;
      const size_t idx = static_cast<size_t>(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
      Pending& p = pend[idx];
      const int res = cqe->res;
      const bool rd = p.op->kind == IoOp::Kind::kRead;
      if (res == -EAGAIN || res == -EINTR) {
        if (++p.resubmits > kMaxResubmitsPerOp) {
          p.op->result = Status::IoError("io: gave up after repeated EAGAIN");
          finished.push_back(idx);
        } else {
          ++resubmits_;
          again.push_back(idx);
        }
      } else if (res < 0) {
        p.op->result = Status::IoError(std::string(rd ? "read" : "write") + " file " +
                                       std::to_string(p.op->file) + " at " +
                                       std::to_string(p.op->offset + p.done) + ": " + Errno(-res));
        finished.push_back(idx);
      } else if (res == 0) {
        p.op->result = Status::IoError(std::string(rd ? "read" : "write") + " returned 0 bytes at " +
                                       std::to_string(p.op->offset + p.done));
        finished.push_back(idx);
      } else {
        p.done += static_cast<uint64_t>(res);
        if (p.done < p.op->len) {
          ++resubmits_;
          again.push_back(idx);  // short transfer: continue from where it stopped
        } else {
          finished.push_back(idx);
        }
      }
    }
    io_uring_cq_advance(&ring_, seen);
  }
  if (done) {
    for (size_t idx : finished) done(*pend[idx].op);
  }
  return true;
}

Status UringDevice::SyncImpl(std::span<const uint32_t> files) {
  std::lock_guard<std::mutex> l(mu_);
  Status first;
  // Issued through the ring so several files sync in parallel.
  size_t i = 0;
  while (i < files.size()) {
    unsigned n = 0;
    while (i < files.size() && n < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      const int fd = files_registered_ ? static_cast<int>(files[i]) : fds_[files[i]];
      io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
      if (files_registered_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, nullptr);
      ++i;
      ++n;
    }
    unsigned got = 0;
    while (got < n) {
      int r = io_uring_submit_and_wait(&ring_, n - got);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        return Status::IoError("io_uring fsync submit: " + Errno(-r));
      }
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (cqe->res < 0 && first.ok()) first = Status::IoError("fdatasync: " + Errno(-cqe->res));
      }
      io_uring_cq_advance(&ring_, seen);
      got += seen;
    }
  }
  return first;
}

}  // namespace kvtier::tiers
