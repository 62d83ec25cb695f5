#include "daemon/contract_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
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
std::vector<uint8_t> Frame(uint32_t magic, const std::vector<uint8_t>& payload) {
  ContractRecordHeader r;
  r.magic = magic;
  r.length = static_cast<uint32_t>(payload.size());
  r.xxh3 = XXH3_64bits(payload.data(), payload.size());
  std::vector<uint8_t> rec(sizeof r + payload.size());
  std::memcpy(rec.data(), &r, sizeof r);
  if (!payload.empty()) std::memcpy(rec.data() + sizeof r, payload.data(), payload.size());
  return rec;
}

void AppendName(std::vector<uint8_t>* payload, const std::string& ns) {
  const uint32_t n = static_cast<uint32_t>(ns.size());
  const size_t at = payload->size();
  payload->resize(at + sizeof n);
  std::memcpy(payload->data() + at, &n, sizeof n);
  payload->insert(payload->end(), ns.begin(), ns.end());
}

std::vector<uint8_t> EncodeRecord(const StoredContract& sc) {
  std::vector<uint8_t> payload;
  if (!sc.ns.empty()) AppendName(&payload, sc.ns);
  const std::vector<uint8_t> body = sc.contract.Serialize();
  payload.insert(payload.end(), body.begin(), body.end());
  return Frame(sc.ns.empty() ? kContractRecordMagic : kContractNsRecordMagic, payload);
}

std::vector<uint8_t> EncodeDeletion(const std::string& ns, uint64_t id) {
  std::vector<uint8_t> payload;
  AppendName(&payload, ns);
  const size_t at = payload.size();
  payload.resize(at + sizeof id);
  std::memcpy(payload.data() + at, &id, sizeof id);
  return Frame(kContractDelRecordMagic, payload);
}

std::string KeyOf(const std::string& ns, uint64_t id) { return ns + '\0' + std::to_string(id); }

// One record at `pos` of a file of `version`, if it is an intact one.
struct Record {
  uint32_t magic = 0;
  std::span<const uint8_t> payload;
  size_t end = 0;  // the offset after it
};
bool RecordAt(std::span<const uint8_t> bytes, size_t pos, uint32_t version, Record* rec) {
  ContractRecordHeader r;
  if (pos > bytes.size() || bytes.size() - pos < sizeof r) return false;
  std::memcpy(&r, bytes.data() + pos, sizeof r);
  const bool known = r.magic == kContractRecordMagic || (r.magic == kContractNsRecordMagic && version >= 2) ||
                     (r.magic == kContractDelRecordMagic && version >= 3);
  if (!known || r.length > kMaxContractRecordBytes || bytes.size() - pos - sizeof r < r.length ||
      XXH3_64bits(bytes.data() + pos + sizeof r, r.length) != r.xxh3) {
    return false;
  }
  rec->magic = r.magic;
  rec->payload = bytes.subspan(pos + sizeof r, r.length);
  rec->end = pos + sizeof r + r.length;
  return true;
}

// A namespace name at the start of a payload: "" and the rest for a 0 length (deletion
// records of the implicit tenant), false for one that does not hold.
bool TakeName(std::span<const uint8_t>* payload, std::string* ns, bool allow_empty) {
  uint32_t n = 0;
  if (payload->size() < sizeof n) return false;
  std::memcpy(&n, payload->data(), sizeof n);
  if ((n == 0 && !allow_empty) || n > kMaxContractNsBytes || payload->size() - sizeof n < n) return false;
  ns->assign(reinterpret_cast<const char*>(payload->data() + sizeof n), n);
  *payload = payload->subspan(sizeof n + n);
  return true;
}

}  // namespace

StatusOr<size_t> ParseContractRecords(std::span<const uint8_t> bytes, const std::string& name,
                                      std::vector<StoredContract>* out, ContractParseReport* report) {
  ContractParseReport local;
  ContractParseReport& rep = report ? *report : local;
  rep = ContractParseReport{};
  if (bytes.size() < sizeof(ContractFileHeader)) return size_t{0};
  ContractFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kContractFileMagic) return Status::Corrupt(name + " is not a kvtier contract file (magic)");
  if (h.version < 1 || h.version > kContractFileVersion) {
    return Status::Unsupported(name + " has contract file version " + std::to_string(h.version) +
                               "; this kvtierd reads versions 1 to " + std::to_string(kContractFileVersion));
  }
  // Live records by key, with the order of the record that made each live.
  std::unordered_map<std::string, std::pair<uint64_t, StoredContract>> live;
  uint64_t seq = 0;
  size_t pos = sizeof h;
  size_t readable = pos;
  while (pos < bytes.size()) {
    Record rec;
    bool ok = RecordAt(bytes, pos, h.version, &rec);
    StoredContract sc;
    uint64_t del_id = 0;
    if (ok) {
      std::span<const uint8_t> payload = rec.payload;
      if (rec.magic == kContractDelRecordMagic) {
        ok = TakeName(&payload, &sc.ns, /*allow_empty=*/true) && payload.size() == sizeof del_id;
        if (ok) std::memcpy(&del_id, payload.data(), sizeof del_id);
      } else {
        if (rec.magic == kContractNsRecordMagic) ok = TakeName(&payload, &sc.ns, /*allow_empty=*/false);
        if (ok) {
          auto c = ScaleContract::Deserialize(payload);
          ok = c.ok();
          if (ok) sc.contract = std::move(*c);
        }
      }
    }
    if (!ok) {
      // Corruption when an intact record follows (skip to it), else a torn tail.
      size_t next = pos + 1;
      Record probe;
      while (next + sizeof(ContractRecordHeader) <= bytes.size() && !RecordAt(bytes, next, h.version, &probe)) ++next;
      if (next + sizeof(ContractRecordHeader) > bytes.size()) break;
      ++rep.corrupt_records;
      rep.corrupt_bytes += next - pos;
      pos = next;
      continue;
    }
    if (rec.magic == kContractDelRecordMagic) {
      if (live.erase(KeyOf(sc.ns, del_id)) > 0) ++rep.dead_records;
      ++rep.dead_records;
    } else {
      const std::string key = KeyOf(sc.ns, sc.contract.Id());
      if (live.count(key) == 0) {
        live.emplace(key, std::make_pair(seq++, std::move(sc)));
      } else {
        ++rep.dead_records;  // a repeat (never written by this build): dead weight
      }
    }
    pos = rec.end;
    readable = pos;
  }
  std::vector<std::pair<uint64_t, StoredContract>> ordered;
  ordered.reserve(live.size());
  for (auto& [k, v] : live) ordered.push_back(std::move(v));
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [q, sc] : ordered) out->push_back(std::move(sc));
  return readable;
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
                                                             uint64_t* dropped_bytes, ContractParseReport* report) {
  if (dropped_bytes) *dropped_bytes = 0;
  if (report) *report = ContractParseReport{};
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
  ContractParseReport rep;
  auto parsed = ParseContractRecords(bytes, path, &got, &rep);
  if (!parsed.ok()) return parsed.status();
  if (report) *report = rep;
  const size_t pos = *parsed;
  ContractFileHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  s->version_ = h.version;
  for (auto& sc : got) {
    const std::string key = Key(sc.ns, sc.contract.Id());
    s->live_.emplace(key, std::make_pair(s->next_seq_++, sc));
  }
  s->dead_ = rep.dead_records;
  out->insert(out->end(), got.begin(), got.end());
  if (pos < bytes.size()) {
    if (dropped_bytes) *dropped_bytes = bytes.size() - pos;
    if (::ftruncate(fd, static_cast<off_t>(pos)) != 0 || ::fdatasync(fd) != 0) return Errno("cannot truncate", path);
  }
  ::lseek(fd, 0, SEEK_END);
  if (rep.corrupt_records > 0 || s->ShouldCompactLocked()) {
    std::lock_guard<std::mutex> l(s->mu_);
    KVTIER_RETURN_IF_ERROR(s->RewriteLocked());
  }
  return s;
}

ContractStore::~ContractStore() { ::close(fd_); }

Status ContractStore::RaiseVersionLocked(uint32_t v) {
  if (version_ >= v) return Status::Ok();
  if (::pwrite(fd_, &v, sizeof v, offsetof(ContractFileHeader, version)) != static_cast<ssize_t>(sizeof v) ||
      ::fdatasync(fd_) != 0) {
    return Errno("cannot write the header of", path_);
  }
  version_ = v;
  return Status::Ok();
}

Status ContractStore::Add(const ScaleContract& c, const std::string& ns) {
  if (ns.size() > kMaxContractNsBytes) return Status::Invalid("contract store: namespace name too long");
  std::lock_guard<std::mutex> l(mu_);
  const std::string key = Key(ns, c.Id());
  if (live_.count(key)) return Status::Ok();
  StoredContract sc{c, ns};
  // The first namespace record: the file becomes version 2 (before the record is there).
  if (!ns.empty()) KVTIER_RETURN_IF_ERROR(RaiseVersionLocked(2));
  const std::vector<uint8_t> rec = EncodeRecord(sc);
  if (!WriteFully(fd_, rec.data(), rec.size()) || ::fdatasync(fd_) != 0) return Errno("cannot append to", path_);
  live_.emplace(key, std::make_pair(next_seq_++, std::move(sc)));
  return Status::Ok();
}

Status ContractStore::Remove(const std::string& ns, std::span<const uint64_t> ids) {
  if (ns.size() > kMaxContractNsBytes) return Status::Invalid("contract store: namespace name too long");
  std::lock_guard<std::mutex> l(mu_);
  std::vector<uint8_t> recs;
  std::vector<std::string> gone;
  for (uint64_t id : ids) {
    const std::string key = Key(ns, id);
    if (live_.count(key) == 0 || std::find(gone.begin(), gone.end(), key) != gone.end()) continue;
    const std::vector<uint8_t> rec = EncodeDeletion(ns, id);
    recs.insert(recs.end(), rec.begin(), rec.end());
    gone.push_back(key);
  }
  if (gone.empty()) return Status::Ok();
  KVTIER_RETURN_IF_ERROR(RaiseVersionLocked(3));
  // No fdatasync: a deletion lost in a crash brings the contract back, which the daemon
  // forgets again; an append cut short is a torn tail.
  if (!WriteFully(fd_, recs.data(), recs.size())) return Errno("cannot append to", path_);
  for (const auto& k : gone) live_.erase(k);
  dead_ += 2 * gone.size();
  if (ShouldCompactLocked()) return RewriteLocked();
  return Status::Ok();
}

Status ContractStore::RewriteLocked() {
  ContractFileHeader h;
  h.version = 1;
  std::vector<const std::pair<uint64_t, StoredContract>*> ordered;
  ordered.reserve(live_.size());
  for (const auto& [k, v] : live_) {
    ordered.push_back(&v);
    if (!v.second.ns.empty()) h.version = 2;
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  std::vector<uint8_t> bytes(sizeof h);
  std::memcpy(bytes.data(), &h, sizeof h);
  for (const auto* v : ordered) {
    const std::vector<uint8_t> rec = EncodeRecord(v->second);
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
  dead_ = 0;
  ++compactions_;
  return Status::Ok();
}

}  // namespace kvtier::daemon
