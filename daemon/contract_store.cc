#include "daemon/contract_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace kvtier::daemon {

namespace {
Status Errno(const std::string& what, const std::string& path) {
  return Status::IoError(what + " " + path + ": " + std::strerror(errno));
}
bool WriteFully(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::write(fd, b, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
}  // namespace

StatusOr<size_t> ParseContractFile(std::span<const uint8_t> bytes, const std::string& name,
                                   std::vector<ScaleContract>* out) {
  if (bytes.size() < sizeof(ContractFileHeader)) return size_t{0};
  ContractFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kContractFileMagic) return Status::Corrupt(name + " is not a kvtier contract file (magic)");
  if (h.version != kContractFileVersion) {
    return Status::Unsupported(name + " has contract file version " + std::to_string(h.version) +
                               "; this kvtierd reads version " + std::to_string(kContractFileVersion));
  }
  std::unordered_set<uint64_t> ids;
  size_t pos = sizeof h;
  while (pos < bytes.size()) {
    ContractRecordHeader r;
    if (bytes.size() - pos < sizeof r) break;
    std::memcpy(&r, bytes.data() + pos, sizeof r);
    if (r.magic != kContractRecordMagic || r.length > kMaxContractRecordBytes ||
        bytes.size() - pos - sizeof r < r.length ||
        XXH3_64bits(bytes.data() + pos + sizeof r, r.length) != r.xxh3) {
      break;
    }
    auto c = ScaleContract::Deserialize(bytes.subspan(pos + sizeof r, r.length));
    if (!c.ok()) break;  // a checksummed record this build cannot read: keep what came before
    if (ids.insert(c->Id()).second) out->push_back(std::move(*c));
    pos += sizeof r + r.length;
  }
  return pos;
}

StatusOr<std::unique_ptr<ContractStore>> ContractStore::Open(const std::string& path,
                                                             std::vector<ScaleContract>* out,
                                                             uint64_t* dropped_bytes) {
  if (dropped_bytes) *dropped_bytes = 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open", path);
  std::unique_ptr<ContractStore> s(new ContractStore(path, fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  if (!bytes.empty() && ::pread(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    return Errno("cannot read", path);
  }
  if (bytes.size() < sizeof(ContractFileHeader)) {
    // New (or cut short before its header was whole): start it afresh.
    ContractFileHeader h;
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
        ::fdatasync(fd) != 0) {
      return Errno("cannot write", path);
    }
    if (dropped_bytes) *dropped_bytes = bytes.size();
    ::lseek(fd, 0, SEEK_END);
    return s;
  }
  const size_t first = out->size();
  auto parsed = ParseContractFile(bytes, path, out);
  if (!parsed.ok()) return parsed.status();
  const size_t pos = *parsed;
  for (size_t i = first; i < out->size(); ++i) s->ids_.insert((*out)[i].Id());
  if (pos < bytes.size()) {
    if (dropped_bytes) *dropped_bytes = bytes.size() - pos;
    if (::ftruncate(fd, static_cast<off_t>(pos)) != 0 || ::fdatasync(fd) != 0) return Errno("cannot truncate", path);
  }
  ::lseek(fd, 0, SEEK_END);
  return s;
}

ContractStore::~ContractStore() { ::close(fd_); }

Status ContractStore::Add(const ScaleContract& c) {
  std::lock_guard<std::mutex> l(mu_);
  if (ids_.count(c.Id())) return Status::Ok();
  const std::vector<uint8_t> payload = c.Serialize();
  ContractRecordHeader r;
  r.length = static_cast<uint32_t>(payload.size());
  r.xxh3 = XXH3_64bits(payload.data(), payload.size());
  std::vector<uint8_t> rec(reinterpret_cast<const uint8_t*>(&r), reinterpret_cast<const uint8_t*>(&r) + sizeof r);
  rec.insert(rec.end(), payload.begin(), payload.end());
  if (!WriteFully(fd_, rec.data(), rec.size()) || ::fdatasync(fd_) != 0) return Errno("cannot append to", path_);
  ids_.insert(c.Id());
  return Status::Ok();
}

}  // namespace kvtier::daemon
