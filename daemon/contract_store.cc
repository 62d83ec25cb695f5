#include "daemon/contract_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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

// One record (header and payload) as the file holds it.
std::vector<uint8_t> EncodeRecord(const StoredContract& sc) {
  std::vector<uint8_t> payload;
  if (!sc.ns.empty()) {
    const uint32_t n = static_cast<uint32_t>(sc.ns.size());
    payload.resize(sizeof n);
    std::memcpy(payload.data(), &n, sizeof n);
    payload.insert(payload.end(), sc.ns.begin(), sc.ns.end());
  }
  const std::vector<uint8_t> body = sc.contract.Serialize();
  payload.insert(payload.end(), body.begin(), body.end());
  ContractRecordHeader r;
  r.magic = sc.ns.empty() ? kContractRecordMagic : kContractNsRecordMagic;
  r.length = static_cast<uint32_t>(payload.size());
  r.xxh3 = XXH3_64bits(payload.data(), payload.size());
  std::vector<uint8_t> rec(sizeof r + payload.size());
  std::memcpy(rec.data(), &r, sizeof r);
  if (!payload.empty()) std::memcpy(rec.data() + sizeof r, payload.data(), payload.size());
  return rec;
}

}  // namespace

StatusOr<size_t> ParseContractRecords(std::span<const uint8_t> bytes, const std::string& name,
                                      std::vector<StoredContract>* out) {
  if (bytes.size() < sizeof(ContractFileHeader)) return size_t{0};
  ContractFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kContractFileMagic) return Status::Corrupt(name + " is not a kvtier contract file (magic)");
  if (h.version != 1 && h.version != kContractFileVersion) {
    return Status::Unsupported(name + " has contract file version " + std::to_string(h.version) +
                               "; this kvtierd reads versions 1 to " + std::to_string(kContractFileVersion));
  }
  std::unordered_set<std::string> seen;
  size_t pos = sizeof h;
  while (pos < bytes.size()) {
    ContractRecordHeader r;
    if (bytes.size() - pos < sizeof r) break;
    std::memcpy(&r, bytes.data() + pos, sizeof r);
    const bool ns_record = r.magic == kContractNsRecordMagic && h.version >= 2;
    if ((r.magic != kContractRecordMagic && !ns_record) || r.length > kMaxContractRecordBytes ||
        bytes.size() - pos - sizeof r < r.length ||
        XXH3_64bits(bytes.data() + pos + sizeof r, r.length) != r.xxh3) {
      break;
    }
    std::span<const uint8_t> payload = bytes.subspan(pos + sizeof r, r.length);
    StoredContract sc;
    if (ns_record) {
      uint32_t n = 0;
      if (payload.size() < sizeof n) break;
      std::memcpy(&n, payload.data(), sizeof n);
      if (n == 0 || n > kMaxContractNsBytes || payload.size() - sizeof n < n) break;
      sc.ns.assign(reinterpret_cast<const char*>(payload.data() + sizeof n), n);
      payload = payload.subspan(sizeof n + n);
    }
    auto c = ScaleContract::Deserialize(payload);
    if (!c.ok()) break;  // a checksummed record this build cannot read: keep what came before
    sc.contract = std::move(*c);
    if (seen.insert(sc.ns + '\0' + std::to_string(sc.contract.Id())).second) out->push_back(std::move(sc));
    pos += sizeof r + r.length;
  }
  return pos;
}

StatusOr<size_t> ParseContractFile(std::span<const uint8_t> bytes, const std::string& name,
                                   std::vector<ScaleContract>* out) {
  std::vector<StoredContract> all;
  auto r = ParseContractRecords(bytes, name, &all);
  if (r.ok() && out != nullptr) {
    for (auto& sc : all) out->push_back(std::move(sc.contract));
  }
  return r;
}

StatusOr<std::unique_ptr<ContractStore>> ContractStore::Open(const std::string& path,
                                                             std::vector<ScaleContract>* out,
                                                             uint64_t* dropped_bytes) {
  std::vector<StoredContract> all;
  auto s = Open(path, &all, dropped_bytes);
  if (s.ok()) {
    for (auto& sc : all) out->push_back(std::move(sc.contract));
  }
  return s;
}

StatusOr<std::unique_ptr<ContractStore>> ContractStore::Open(const std::string& path,
                                                             std::vector<StoredContract>* out,
                                                             uint64_t* dropped_bytes) {
  if (dropped_bytes) *dropped_bytes = 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Errno("cannot open", path);
  std::unique_ptr<ContractStore> s(new ContractStore(path, fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  if (!bytes.empty() && ::pread(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    return Errno("cannot read", path);
  }
  if (bytes.size() < sizeof(ContractFileHeader)) {
    // New (or cut short before its header was whole): start it afresh, as version 1 (the
    // version of a file without namespace records).
    ContractFileHeader h;
    h.version = 1;
    s->version_ = 1;
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
        ::fdatasync(fd) != 0) {
      return Errno("cannot write", path);
    }
    if (dropped_bytes) *dropped_bytes = bytes.size();
    ::lseek(fd, 0, SEEK_END);
    return s;
  }
  std::vector<StoredContract> got;
  auto parsed = ParseContractRecords(bytes, path, &got);
  if (!parsed.ok()) return parsed.status();
  const size_t pos = *parsed;
  ContractFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  s->version_ = h.version;
  for (const auto& sc : got) s->keys_.insert(Key(sc.ns, sc.contract.Id()));
  s->records_ = got;
  out->insert(out->end(), got.begin(), got.end());
  if (pos < bytes.size()) {
    if (dropped_bytes) *dropped_bytes = bytes.size() - pos;
    if (::ftruncate(fd, static_cast<off_t>(pos)) != 0 || ::fdatasync(fd) != 0) return Errno("cannot truncate", path);
  }
  ::lseek(fd, 0, SEEK_END);
  return s;
}

ContractStore::~ContractStore() { ::close(fd_); }

Status ContractStore::Add(const ScaleContract& c, const std::string& ns) {
  if (ns.size() > kMaxContractNsBytes) return Status::Invalid("contract store: namespace name too long");
  std::lock_guard<std::mutex> l(mu_);
  const std::string key = Key(ns, c.Id());
  if (keys_.count(key)) return Status::Ok();
  StoredContract sc{c, ns};
  if (!ns.empty() && version_ < 2) {  // the first namespace record: the file becomes version 2
    records_.push_back(sc);
    Status s = RewriteLocked();
    if (!s.ok()) {
      records_.pop_back();
      return s;
    }
    keys_.insert(key);
    return Status::Ok();
  }
  const std::vector<uint8_t> rec = EncodeRecord(sc);
  if (!WriteFully(fd_, rec.data(), rec.size()) || ::fdatasync(fd_) != 0) return Errno("cannot append to", path_);
  records_.push_back(std::move(sc));
  keys_.insert(key);
  return Status::Ok();
}

Status ContractStore::Remove(const std::string& ns, std::span<const uint64_t> ids) {
  std::lock_guard<std::mutex> l(mu_);
  std::unordered_set<std::string> gone;
  for (uint64_t id : ids) {
    if (keys_.count(Key(ns, id))) gone.insert(Key(ns, id));
  }
  if (gone.empty()) return Status::Ok();
  std::vector<StoredContract> kept;
  kept.reserve(records_.size());
  for (const auto& sc : records_) {
    if (!gone.count(Key(sc.ns, sc.contract.Id()))) kept.push_back(sc);
  }
  std::swap(records_, kept);
  Status s = RewriteLocked();
  if (!s.ok()) {
    std::swap(records_, kept);  // the file is as it was
    return s;
  }
  for (const auto& k : gone) keys_.erase(k);
  return Status::Ok();
}

Status ContractStore::RewriteLocked() {
  ContractFileHeader h;
  h.version = 1;
  for (const auto& sc : records_) {
    if (!sc.ns.empty()) h.version = kContractFileVersion;
  }
  std::vector<uint8_t> bytes(sizeof h);
  std::memcpy(bytes.data(), &h, sizeof h);
  for (const auto& sc : records_) {
    const std::vector<uint8_t> rec = EncodeRecord(sc);
    bytes.insert(bytes.end(), rec.begin(), rec.end());
  }
  const std::string tmp = path_ + ".tmp";
  ::unlink(tmp.c_str());  // a leftover of a rewrite cut short
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  if (!WriteFully(fd, bytes.data(), bytes.size()) || ::fdatasync(fd) != 0) {
    Status s = Errno("cannot write", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    Status s = Errno("cannot rename " + tmp + " to", path_);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  ::close(fd_);
  fd_ = fd;
  ::lseek(fd_, 0, SEEK_END);
  version_ = h.version;
  return Status::Ok();
}

}  // namespace kvtier::daemon
