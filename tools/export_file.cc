#include "tools/export_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "tools/cli.h"

namespace kvtier {

namespace ef = exportfile;

StatusOr<std::unique_ptr<ExportWriter>> ExportWriter::Create(const std::string& path,
                                                             const ScaleContract& contract,
                                                             int zstd_level) {
  KVTIER_RETURN_IF_ERROR(contract.Validate());
  std::unique_ptr<ExportWriter> w(new ExportWriter());
  w->path_ = path;
  w->contract_ = contract;
  w->contract_id_ = contract.Id();
  w->level_ = zstd_level;
  int fd = -1;
  // An export is the prompts of its contract in another form: 0600 (less the umask),
  // whatever the umask lets others read.
  KVTIER_RETURN_IF_ERROR(cli::CreateTempBeside(path, &w->tmp_, &fd, 0600));
  w->f_ = ::fdopen(fd, "wb");
  if (!w->f_) {
    const int e = errno;
    ::close(fd);
    return Status::IoError("cannot create " + w->tmp_ + ": " + std::strerror(e));
  }
  const auto hdr = ef::EncodeFileHeader(contract, static_cast<uint64_t>(std::time(nullptr)));
  KVTIER_RETURN_IF_ERROR(w->Write(hdr.data(), hdr.size()));
  return w;
}

ExportWriter::~ExportWriter() {
  if (f_) std::fclose(f_);
  if (!finished_ && !tmp_.empty()) {
    ::unlink(tmp_.c_str());
    cli::ForgetTemp(tmp_);
  }
}

Status ExportWriter::Write(const void* p, size_t n) {
  if (std::fwrite(p, 1, n, f_) != n) return Status::IoError("write to " + tmp_ + " failed: " + std::strerror(errno));
  return Status::Ok();
}

Status ExportWriter::Add(const Key128& key, const Key128& parent, std::span<const uint8_t> payload) {
  if (finished_) return Status::Invalid("export already finished");
  if (payload.empty() || payload.size() > contract_.block_bytes()) {
    return Status::Invalid("payload of " + std::to_string(payload.size()) + " bytes does not fit the contract's block");
  }
  uint64_t sum;
  bool z;
  const auto frame = ef::EncodeFrame(contract_id_, key, parent, payload, level_, &sum, &z);
  KVTIER_RETURN_IF_ERROR(Write(frame.data(), frame.size()));
  sums_.push_back(sum);
  raw_bytes_ += payload.size();
  stored_bytes_ += frame.size() - ef::kFrameHeaderSize - kRecordHeaderSize;
  compressed_ += z;
  return Status::Ok();
}

Status ExportWriter::Finish() {
  if (finished_) return Status::Ok();
  const auto t = ef::EncodeTrailer(sums_);
  KVTIER_RETURN_IF_ERROR(Write(t.data(), t.size()));
  if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0) return Status::IoError("cannot flush " + tmp_);
  std::fclose(f_);
  f_ = nullptr;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return Status::IoError("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno));
  }
  cli::ForgetTemp(tmp_);
  finished_ = true;
  return Status::Ok();
}

StatusOr<std::unique_ptr<ExportReader>> ExportReader::Open(const std::string& path) {
  std::unique_ptr<ExportReader> r(new ExportReader());
  r->f_ = std::fopen(path.c_str(), "rb");
  if (!r->f_) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fileno(r->f_), &st) != 0) return Status::IoError("cannot stat " + path);
  r->file_bytes_ = static_cast<uint64_t>(st.st_size);
  uint8_t fixed[ef::kFileHeaderSize];
  if (std::fread(fixed, 1, sizeof fixed, r->f_) != sizeof fixed) {
    return Status::Corrupt(path + ": too short for a kvtier export file");
  }
  uint32_t clen;
  ef::FileHeader h;
  KVTIER_RETURN_IF_ERROR(ef::DecodeFixedHeader(fixed, &clen, &h));
  std::vector<uint8_t> cbytes(clen);
  if (std::fread(cbytes.data(), 1, clen, r->f_) != clen) return Status::Corrupt(path + ": contract truncated");
  auto c = ef::DecodeContract(fixed, cbytes, h);
  if (!c.ok()) return c.status();
  r->contract_ = std::move(*c);
  r->contract_id_ = h.contract_id;
  r->data_start_ = ef::kFileHeaderSize + clen;
  r->max_payload_ = r->contract_.block_bytes();
  return r;
}

ExportReader::~ExportReader() {
  if (f_) std::fclose(f_);
}

Status ExportReader::Rewind() {
  if (std::fseek(f_, static_cast<long>(data_start_), SEEK_SET) != 0) return Status::IoError("seek failed");
  sums_.clear();
  done_ = false;
  return Status::Ok();
}

Status ExportReader::Next(RecordHeader* rec, std::vector<uint8_t>* payload, bool* eof) {
  *eof = false;
  if (done_) {
    *eof = true;
    return Status::Ok();
  }
  uint8_t head[ef::kFrameHeaderSize];
  const size_t got = std::fread(head, 1, 4, f_);
  if (got != 4) return Status::Corrupt("export file truncated: no trailer after " + std::to_string(sums_.size()) + " records");
  if (ef::IsTrailer(std::span<const uint8_t>(head, 4))) {
    uint8_t t[ef::kTrailerSize];
    std::memcpy(t, head, 4);
    const size_t n = std::fread(t + 4, 1, ef::kTrailerSize - 4, f_);
    KVTIER_RETURN_IF_ERROR(ef::CheckTrailer(std::span<const uint8_t>(t, 4 + n), sums_));
    if (std::fgetc(f_) != EOF) return Status::Corrupt("export file: bytes after the trailer");
    done_ = true;
    *eof = true;
    return Status::Ok();
  }
  if (std::fread(head + 4, 1, ef::kFrameHeaderSize - 4, f_) != ef::kFrameHeaderSize - 4) {
    return Status::Corrupt("export file truncated inside a frame header");
  }
  ef::FrameHeader fh;
  KVTIER_RETURN_IF_ERROR(ef::DecodeFrameHeader(head, &fh));
  const uint64_t pos = static_cast<uint64_t>(std::ftell(f_));
  if (fh.stored_len + kRecordHeaderSize > file_bytes_ - std::min(file_bytes_, pos)) {
    return Status::Corrupt("export file truncated inside record " + std::to_string(sums_.size()));
  }
  std::vector<uint8_t> body(kRecordHeaderSize + fh.stored_len);
  if (std::fread(body.data(), 1, body.size(), f_) != body.size()) return Status::Corrupt("export file truncated");
  KVTIER_RETURN_IF_ERROR(ef::DecodeFrameBody(fh, body, contract_id_, max_payload_, rec, payload));
  sums_.push_back(fh.checksum);
  return Status::Ok();
}

Status ExportReader::VerifyAll(const std::function<void(uint64_t, uint64_t)>& progress, uint64_t* records) {
  KVTIER_RETURN_IF_ERROR(Rewind());
  RecordHeader rec;
  std::vector<uint8_t> payload;
  bool eof = false;
  uint64_t n = 0;
  while (true) {
    Status s = Next(&rec, &payload, &eof);
    if (!s.ok()) {
      // Back to the first record either way: a caller that reads on after a failed
      // verification must meet the same bad record again, not continue mid-file (the
      // fuzzer found a file whose tail, read from the failure point, looked whole).
      (void)Rewind();
      return Status(s.code(), s.message());
    }
    if (eof) break;
    if (rec.parent == rec.key) {
      (void)Rewind();
      return Status::Invalid("record " + std::to_string(n) + ": block " + rec.key.ToHex() +
                             " names itself as its parent");
    }
    ++n;
    if (progress) progress(static_cast<uint64_t>(std::ftell(f_)), file_bytes_);
  }
  if (records) *records = n;
  return Rewind();
}

}  // namespace kvtier
