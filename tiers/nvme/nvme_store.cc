#include "tiers/nvme/nvme_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <set>

#include "formats/bytes.h"
#include "formats/record.h"
#include "tiers/nvme/uring_device.h"
#include "testing/test_point.h"

namespace kvtier::tiers {

namespace {

constexpr uint32_t kMetaVersion1 = 1;   // one record size: dropped at open
constexpr size_t kStagingRecords = 256;  // headers per I/O chunk
constexpr size_t kEntryValueBytes = 1 + 4 + 8 + 8 + 8 + 16 + 8 + 4;

}  // namespace

namespace nvme_index {

std::string Key(const BlockId& id) {
  std::string k(25, '\0');
  k[0] = 'b';
  for (int i = 0; i < 8; ++i) k[1 + i] = static_cast<char>(id.contract >> (56 - 8 * i));
  id.key.ToCanonical(reinterpret_cast<uint8_t*>(&k[9]));
  return k;
}

bool ParseKey(std::string_view s, BlockId* id) {
  if (s.size() != 25 || s[0] != 'b') return false;
  id->contract = 0;
  for (int i = 0; i < 8; ++i) id->contract = (id->contract << 8) | static_cast<uint8_t>(s[1 + i]);
  id->key = Key128::FromCanonical(reinterpret_cast<const uint8_t*>(s.data() + 9));
  return true;
}

std::string EncodeEntry(const NvmeEntry& e) {
  ByteWriter w;
  w.PutU8(kEntryVersion);
  w.PutU32(e.record);
  w.PutU64(e.payload_len);
  w.PutU64(e.payload_xxh3);
  w.PutU64(e.header_xxh3);
  uint8_t p[16];
  e.parent.ToCanonical(p);
  w.PutRaw(p, 16);
  w.PutU64(e.sequence);
  w.PutU32(e.hits);
  return std::string(w.bytes().begin(), w.bytes().end());
}

bool DecodeEntry(std::string_view v, NvmeEntry* e) {
  if (v.size() != kEntryValueBytes) return false;
  ByteReader r(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
  uint8_t ver;
  uint8_t p[16];
  if (!r.GetU8(&ver) || ver != kEntryVersion) return false;
  bool ok = r.GetU32(&e->record) && r.GetU64(&e->payload_len) && r.GetU64(&e->payload_xxh3) &&
            r.GetU64(&e->header_xxh3) && r.GetRaw(p, 16) && r.GetU64(&e->sequence) &&
            r.GetU32(&e->hits);
  e->parent = Key128::FromCanonical(p);
  return ok;
}

std::string EncodeMeta(const NvmeGeometry& g) {
  ByteWriter w;
  w.PutU32(kVersion);
  w.PutU64(g.slab_bytes);
  w.PutU32(g.slabs_per_file);
  w.PutU32(g.num_slabs);
  w.PutU32(static_cast<uint32_t>(g.record_bytes.size()));
  for (uint64_t b : g.record_bytes) w.PutU64(b);
  return std::string(w.bytes().begin(), w.bytes().end());
}

uint32_t DecodeMeta(std::string_view v, NvmeGeometry* g) {
  ByteReader r(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
  uint32_t ver = 0, n = 0;
  if (!r.GetU32(&ver)) return 0;
  if (ver != kVersion) return ver;
  NvmeGeometry out;
  if (!r.GetU64(&out.slab_bytes) || !r.GetU32(&out.slabs_per_file) || !r.GetU32(&out.num_slabs) || !r.GetU32(&n) ||
      n > kMaxSlotClasses || v.size() != 24 + 8 * size_t{n}) {
    return 0;
  }
  out.record_bytes.resize(n);
  for (uint64_t& b : out.record_bytes) (void)r.GetU64(&b);  // sized above
  *g = std::move(out);
  return ver;
}

}  // namespace nvme_index

namespace {
// Exact sizes for the geometry's messages: "64 MiB", "580 KiB", "1444 KiB".
std::string Size(uint64_t b) {
  if (b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}
}  // namespace

std::string NvmeGeometry::ToString() const {
  std::string classes;
  for (uint64_t b : record_bytes) classes += (classes.empty() ? "" : ", ") + Size(b);
  if (record_bytes.empty()) classes = "the sizes of their blocks";
  return fmt::format("{} slabs of {} ({} a file), records of {}", num_slabs, Size(slab_bytes), slabs_per_file,
                     classes);
}

namespace {

Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return Status::Ok();
  if (s.IsCorruption()) return Status::Corrupt(std::string(what) + ": " + s.ToString());
  return Status::IoError(std::string(what) + ": " + s.ToString());
}

std::mutex g_wrapper_mu;
NvmeStore::DefaultWrapperFactory& WrapperFactory() {
  static NvmeStore::DefaultWrapperFactory f;
  return f;
}

NvmeStore::DeviceWrapper DefaultDeviceWrapper() {
  std::lock_guard<std::mutex> l(g_wrapper_mu);
  return WrapperFactory() ? WrapperFactory()() : nullptr;
}

}  // namespace

void NvmeStore::SetDefaultDeviceWrapper(DefaultWrapperFactory f) {
  std::lock_guard<std::mutex> l(g_wrapper_mu);
  WrapperFactory() = std::move(f);
}

Status NvmeStoreOptions::Validate() const {
  if (dir.empty()) return Status::Invalid("nvme: empty dir");
  if (slot_bytes == 0 || slot_bytes % kIoAlign) {
    return Status::Invalid("nvme: slot_bytes " + std::to_string(slot_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (records_by_size && !classes.empty()) {
    return Status::Invalid("nvme: record classes are listed and records are sized by their blocks: one or the other");
  }
  if (!classes.empty() && *std::max_element(classes.begin(), classes.end()) != slot_bytes) {
    return Status::Invalid("nvme: the largest record class is not slot_bytes (" + std::to_string(slot_bytes) + ")");
  }
  if (slab_bytes % kIoAlign != 0 || (slab_bytes != 0 && slab_bytes < slot_bytes + kIoAlign)) {
    return Status::Invalid("nvme: slab_bytes " + std::to_string(slab_bytes) +
                           " is not a 4096 multiple that holds a record of " + std::to_string(slot_bytes + kIoAlign) +
                           " bytes");
  }
  if (capacity_bytes < slot_bytes + kIoAlign) {
    return Status::Invalid("nvme: capacity_bytes " + std::to_string(capacity_bytes) +
                           " holds no record of " + std::to_string(slot_bytes + kIoAlign) + " bytes");
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::Invalid("nvme: queue_depth " + std::to_string(queue_depth) + " not in [1, 4096]");
  }
  if (file_bytes == 0) return Status::Invalid("nvme: file_bytes is 0");
  return Status::Ok();
}

namespace {

// The NVMe folder and its data/ and index/ folders: directories of the daemon's user that
// no other user can write, so that nobody else can plant a file or a link the daemon
// would then write through. Only the top folder may be reached through a link (a mount
// elsewhere); what the check sees is its target.
Status CheckPrivateDir(const std::string& dir, bool may_link) {
  struct stat st{};
  if ((may_link ? ::stat(dir.c_str(), &st) : ::lstat(dir.c_str(), &st)) != 0) {
    return Status::IoError("nvme: stat " + dir + ": " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) return Status::Invalid("nvme: " + dir + " is a symbolic link: refused");
  if (!S_ISDIR(st.st_mode)) return Status::Invalid("nvme: " + dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return Status::Invalid("nvme: " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                           ", not to the daemon's uid " + std::to_string(::geteuid()) +
                           ": chown it to the daemon's user");
  }
  if (st.st_mode & S_IWOTH) {
    return Status::Invalid("nvme: " + dir + " is writable by other users (mode " +
                           fmt::format("{:o}", st.st_mode & 07777) + "): chmod o-w it");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const NvmeStoreOptions& opts,
                                                     DeviceWrapper wrap) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  std::unique_ptr<NvmeStore> s(new NvmeStore());
  s->opts_ = opts;
  std::vector<uint64_t> classes = opts.classes.empty() ? std::vector<uint64_t>{opts.slot_bytes} : opts.classes;
  for (uint64_t& c : classes) c += kIoAlign;  // a record: its header's 4 KiB + the payload
  std::sort(classes.begin(), classes.end());
  if (opts.records_by_size) classes.clear();  // made as payload sizes come
  uint64_t slab = opts.slab_bytes;
  if (slab == 0 && opts.records_by_size) {
    slab = AutoSlabBytes(opts.capacity_bytes, opts.slot_bytes + kIoAlign, kIoAlign);
  } else if (slab == 0 && classes.size() == 1) {  // one class: a data file's worth of records
    const uint64_t rec = classes[0];
    slab = std::max<uint64_t>(1, std::min(opts.capacity_bytes, opts.file_bytes) / rec) * rec;
  } else if (slab == 0) {
    slab = kDefaultSlabBytes;
  }
  if (opts.capacity_bytes < slab) {
    return Status::Invalid("nvme: capacity_bytes " + std::to_string(opts.capacity_bytes) + " holds no slab of " +
                           std::to_string(slab) + " bytes");
  }
  const uint64_t slabs = opts.capacity_bytes / slab;
  if (slabs * slab / kIoAlign > UINT32_MAX) {
    return Status::Invalid("nvme: " + Size(slabs * slab) +
                           " of slabs is more than record ids (u32, 4 KiB units) reach: at most 16 TiB a store");
  }
  auto alloc = opts.records_by_size ? SlabAllocator::MakeOnGranule("nvme tier", slabs * slab, slab, kIoAlign)
                                    : SlabAllocator::Make("nvme tier", slabs * slab, slab, classes);
  if (!alloc.ok()) return alloc.status();
  s->alloc_ = std::move(*alloc);
  s->classes_.store(static_cast<int>(s->alloc_.num_classes()), std::memory_order_release);
  s->ids_per_granule_ = static_cast<uint32_t>(s->alloc_.granule() / kIoAlign);
  s->geo_.slab_bytes = slab;
  s->geo_.num_slabs = static_cast<uint32_t>(slabs);
  s->geo_.slabs_per_file = static_cast<uint32_t>(std::clamp<uint64_t>(opts.file_bytes / slab, 1, slabs));
  s->geo_.record_bytes = classes;
  s->num_files_ = (s->geo_.num_slabs + s->geo_.slabs_per_file - 1) / s->geo_.slabs_per_file;
  for (int c = 0; c < s->num_classes(); ++c) {
    const uint64_t tail = slab - s->alloc_.slots_per_slab(c) * classes[static_cast<size_t>(c)];
    if (tail * 50 >= slab) {  // 2%
      spdlog::warn("nvme: a slab of {} holds {} records of {} and leaves {} ({:.1f}%) unused", Size(slab),
                   s->alloc_.slots_per_slab(c), Size(classes[static_cast<size_t>(c)]), Size(tail),
                   100.0 * static_cast<double>(tail) / static_cast<double>(slab));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(opts.dir + "/data", ec);
  if (ec) return Status::IoError("nvme: create " + opts.dir + "/data: " + ec.message());
  KVTIER_RETURN_IF_ERROR(CheckPrivateDir(opts.dir, /*may_link=*/true));
  KVTIER_RETURN_IF_ERROR(CheckPrivateDir(opts.dir + "/data", /*may_link=*/false));
  if (std::filesystem::exists(std::filesystem::symlink_status(opts.dir + "/index"))) {
    KVTIER_RETURN_IF_ERROR(CheckPrivateDir(opts.dir + "/index", /*may_link=*/false));
  }

  // Index first: a folder made with another geometry is refused before any file changes.
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.compression = rocksdb::kNoCompression;
  ro.max_open_files = 256;
  ro.info_log_level = rocksdb::WARN_LEVEL;
  ro.keep_log_file_num = 2;
  // The index is small (about 100 bytes per block) but churns with every demotion and
  // eviction: RocksDB's default 64 MiB memtable (x2 while flushing) made the daemon's RSS
  // climb ~1 MiB/s under load (tests/reliability/soak_test.cc). 2 MiB (~20k entries)
  // flushes early and keeps RSS flat.
  ro.write_buffer_size = 2 << 20;
  rocksdb::DB* db = nullptr;
  KVTIER_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(ro, opts.dir + "/index", &db), "open RocksDB index"));
  s->db_.reset(db);
  const std::string meta = nvme_index::EncodeMeta(s->geo_);
  std::string have;
  rocksdb::Status gs = db->Get(rocksdb::ReadOptions(), "meta", &have);
  NvmeGeometry was;
  const uint32_t version = gs.ok() ? nvme_index::DecodeMeta(have, &was) : 0;
  if (gs.ok() && version == kMetaVersion1) {
    KVTIER_RETURN_IF_ERROR(s->DropVersion1Index());
  } else if (gs.ok() && version != nvme_index::kVersion) {
    return Status::Invalid("nvme: " + opts.dir + " has an index of version " + std::to_string(version) +
                           (version == 0 ? " (unreadable)" : "") + "; this build reads version " +
                           std::to_string(nvme_index::kVersion) + " (and empties one of version 1): use a new folder");
  } else if (gs.ok()) {
    if (have != meta) {
      return Status::Invalid("nvme: " + opts.dir + " was made with " + was.ToString() + "; the settings give " +
                             s->geo_.ToString() +
                             " (slot classes, slab size, capacity or file size changed): use a new folder or the old "
                             "settings");
    }
  }
  if (!gs.ok() && !gs.IsNotFound()) return FromRocks(gs, "read index meta");
  if (gs.IsNotFound() || version == kMetaVersion1) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    KVTIER_RETURN_IF_ERROR(FromRocks(db->Put(wo, "meta", meta), "write index meta"));
  }

  s->staging_ = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, kStagingRecords * kIoAlign));
  if (!s->staging_) return Status::IoError("nvme: staging allocation failed");
  std::memset(s->staging_, 0, kStagingRecords * kIoAlign);

  UringDeviceOptions dopts;
  for (uint32_t f = 0; f < s->num_files_; ++f) dopts.paths.push_back(s->DataPath(f));
  dopts.file_bytes = uint64_t{s->geo_.slabs_per_file} * slab;
  // The last file holds the slabs left over, and the files together no more than the tier's
  // slabs: the capacity bounds the disk used.
  const uint32_t last_slabs = s->geo_.num_slabs - (s->num_files_ - 1) * s->geo_.slabs_per_file;
  dopts.last_file_bytes = uint64_t{last_slabs} * slab;
  dopts.queue_depth = opts.queue_depth;
  dopts.fixed = opts.fixed;
  dopts.fixed.push_back({s->staging_, kStagingRecords * kIoAlign});
  auto dev = UringDevice::Open(dopts);
  if (!dev.ok()) return dev.status();
  if (!(*dev)->fixed_buffers()) spdlog::warn("nvme: running without registered buffers");
  s->dev_ = std::move(dev.value());
  if (!wrap) wrap = DefaultDeviceWrapper();  // test builds: fault injection
  if (wrap) s->dev_ = wrap(std::move(s->dev_));

  KVTIER_RETURN_IF_ERROR(s->LoadIndex());
  return s;
}

NvmeStore::~NvmeStore() {
  dev_.reset();
  if (db_) (void)db_->Close();
  db_.reset();
  std::free(staging_);
}

Status NvmeStore::DropVersion1Index() {
  uint64_t n = 0;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) ++n;
  KVTIER_RETURN_IF_ERROR(FromRocks(it->status(), "scan index"));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  KVTIER_RETURN_IF_ERROR(
      FromRocks(db_->DeleteRange(wo, db_->DefaultColumnFamily(), "b", "c"), "empty the index of version 1"));
  spdlog::warn("nvme: {} holds an index of version 1 (one record size): its {} entries are dropped and the tier "
               "starts empty in the layout of version {}",
               opts_.dir, n, nvme_index::kVersion);
  index_dropped_ += n;
  return Status::Ok();
}

std::optional<uint32_t> NvmeStore::IdOf(uint32_t record) const {
  if (record % ids_per_granule_ != 0) return std::nullopt;
  return record / ids_per_granule_;
}

Status NvmeStore::LoadIndex() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  rocksdb::WriteBatch drops;
  uint64_t dropped = 0, self_parent = 0;
  for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) {
    NvmeEntry e;
    bool ok = nvme_index::ParseKey(it->key().ToStringView(), &e.id) &&
              nvme_index::DecodeEntry(it->value().ToStringView(), &e) && e.payload_len > 0 &&
              e.payload_len <= opts_.slot_bytes;
    const bool own_parent = ok && e.parent == e.id.key;  // a block cannot be its own parent: never committed so
    // The record must be a record start of the class the payload takes, in a slab of it.
    const auto id = ok && !own_parent ? IdOf(e.record) : std::nullopt;
    // Records sized by their blocks: the class of this size, made if it is new.
    const auto cls = ok && !own_parent ? AddClassForLocked(e.payload_len) : StatusOr<int>(-1);
    ok = id && cls.ok() && alloc_.Restore(*id, *cls).ok();
    if (!ok) {
      drops.Delete(it->key());
      ++dropped;
      self_parent += own_parent ? 1 : 0;
      continue;
    }
    e.verified = false;
    next_seq_ = std::max(next_seq_, e.sequence + 1);
    at_.emplace(e.record, e.id);
    map_.emplace(e.id, e);
  }
  KVTIER_RETURN_IF_ERROR(FromRocks(it->status(), "scan index"));
  if (dropped) {
    spdlog::warn("nvme: dropped {} malformed, overlapping or misplaced index entries ({} naming their own block as "
                 "parent)",
                 dropped, self_parent);
    KVTIER_RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &drops), "drop bad entries"));
  }
  index_dropped_ += dropped;
  loaded_ = map_.size();
  return Status::Ok();
}

std::string NvmeStore::DataPath(uint32_t file) const {
  char name[32];
  std::snprintf(name, sizeof(name), "kvtier-%04u.dat", file);
  return opts_.dir + "/data/" + name;
}

void NvmeStore::RecordLocation(uint32_t record, uint32_t* file, uint64_t* offset) const {
  const uint64_t at = uint64_t{record} * kIoAlign, file_bytes = uint64_t{geo_.slabs_per_file} * geo_.slab_bytes;
  *file = static_cast<uint32_t>(at / file_bytes);
  *offset = at % file_bytes;
}

int NvmeStore::ClassFor(uint64_t payload_len) const {
  const uint64_t rec = RoundUp4K(payload_len) + kIoAlign;
  if (!opts_.records_by_size) return alloc_.ClassFor(rec);
  for (int c = 0, n = num_classes(); c < n; ++c) {
    if (alloc_.class_bytes(c) == rec) return c;
  }
  return -1;
}

StatusOr<int> NvmeStore::AddClassFor(uint64_t payload_len) {
  std::lock_guard<std::mutex> l(mu_);
  return AddClassForLocked(payload_len);
}

StatusOr<int> NvmeStore::AddClassForLocked(uint64_t payload_len) {
  if (payload_len == 0 || payload_len > opts_.slot_bytes) {
    return Status::Invalid("nvme: a payload of " + std::to_string(payload_len) + " bytes (records hold 1 to " +
                           std::to_string(opts_.slot_bytes) + ")");
  }
  const int have = ClassFor(payload_len);
  if (have >= 0 || !opts_.records_by_size) {
    if (have < 0) return Status::Invalid("nvme: no record class holds " + std::to_string(payload_len) + " bytes");
    return have;
  }
  auto c = alloc_.AddClass(RoundUp4K(payload_len) + kIoAlign);
  if (!c.ok()) return Status::Invalid("nvme tier: " + c.status().message());
  classes_.store(static_cast<int>(alloc_.num_classes()), std::memory_order_release);
  return *c;
}
uint32_t NvmeStore::slots_per_slab(int cls) const { return alloc_.slots_per_slab(cls); }
uint32_t NvmeStore::records_total() const {
  if (num_classes() > 0) {
    int smallest = 0;
    for (int c = 1; c < num_classes(); ++c) smallest = class_bytes(c) < class_bytes(smallest) ? c : smallest;
    return most(smallest);
  }
  return num_slabs() * static_cast<uint32_t>(geo_.slab_bytes / (opts_.slot_bytes + kIoAlign));  // none made yet
}
uint32_t NvmeStore::SlabOf(uint32_t record) const {
  return static_cast<uint32_t>(uint64_t{record} * kIoAlign / geo_.slab_bytes);
}

#define KVTIER_LOCKED_(expr)            \
  std::lock_guard<std::mutex> l(mu_); \
  return expr

uint32_t NvmeStore::used() const { KVTIER_LOCKED_(alloc_.used()); }
uint32_t NvmeStore::used(int cls) const { KVTIER_LOCKED_(alloc_.used(cls)); }
uint64_t NvmeStore::used_bytes() const { KVTIER_LOCKED_(alloc_.used_bytes()); }
uint32_t NvmeStore::free_count(int cls) const { KVTIER_LOCKED_(alloc_.free_count(cls)); }
uint32_t NvmeStore::capacity(int cls) const { KVTIER_LOCKED_(alloc_.capacity(cls)); }
uint32_t NvmeStore::slabs(int cls) const { KVTIER_LOCKED_(alloc_.slabs(cls)); }
int NvmeStore::SlabClass(uint32_t slab) const { KVTIER_LOCKED_(alloc_.SlabClass(slab)); }
bool NvmeStore::Draining(uint32_t slab) const { KVTIER_LOCKED_(alloc_.Draining(slab)); }

#undef KVTIER_LOCKED_

std::vector<uint32_t> NvmeStore::TakenSlots(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<uint32_t> v = alloc_.TakenSlots(slab);
  for (uint32_t& id : v) id = RecordOf(id);
  return v;
}

StatusOr<std::vector<uint32_t>> NvmeStore::BeginMove(uint32_t slab, int cls) {
  std::lock_guard<std::mutex> l(mu_);
  auto v = alloc_.BeginMove(slab, cls);
  if (!v.ok()) return v.status();
  for (uint32_t& id : *v) id = RecordOf(id);
  return v;
}

std::optional<BlockId> NvmeStore::BlockAt(uint32_t record) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = at_.find(record);
  if (it == at_.end()) return std::nullopt;
  return it->second;
}

Status NvmeStore::WriteBatch(std::span<NvmeWrite> writes) {
  std::lock_guard<std::mutex> iol(io_mu_);
  Status first;
  for (size_t base = 0; base < writes.size(); base += kStagingRecords) {
    const size_t n = std::min(kStagingRecords, writes.size() - base);
    std::vector<NvmeEntry> ents(n);
    std::vector<bool> active(n, false);
    std::vector<IoOp> ops;
    ops.reserve(2 * n);
    std::vector<size_t> op_owner;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (size_t i = 0; i < n; ++i) {
        NvmeWrite& w = writes[base + i];
        w.result = Status::Ok();
        if (w.len == 0 || w.len > opts_.slot_bytes || w.payload == nullptr) {
          w.result = Status::Invalid("nvme write: payload of " + std::to_string(w.len) +
                                     " bytes (slot holds " + std::to_string(opts_.slot_bytes) + ")");
          continue;
        }
        if (map_.count(w.id)) continue;  // already stored: keep the old record
        const auto made = AddClassForLocked(w.len);
        if (!made.ok()) {
          w.result = made.status();
          continue;
        }
        const int cls = *made;
        auto rec = alloc_.Alloc(cls);
        if (!rec) {
          w.result = Status::Rejected("nvme store full: no free record of " + Size(class_bytes(cls)));
          continue;
        }
        NvmeEntry& e = ents[i];
        e.id = w.id;
        e.parent = w.parent;
        e.record = RecordOf(*rec);
        e.payload_len = w.len;
        e.sequence = next_seq_++;
        active[i] = true;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      NvmeWrite& w = writes[base + i];
      NvmeEntry& e = ents[i];
      e.payload_xxh3 = PayloadChecksum(std::span<const uint8_t>(w.payload, w.len));
      RecordHeader h;
      h.contract_id = w.id.contract;
      h.key = w.id.key;
      h.parent = w.parent;
      h.payload_len = w.len;
      h.payload_xxh3 = e.payload_xxh3;
      h.sequence = e.sequence;
      uint8_t* hb = staging_ + i * kIoAlign;
      std::memset(hb, 0, kIoAlign);
      h.Encode(hb);
      std::memcpy(&e.header_xxh3, hb + kRecordHeaderChecksummed, 8);
      e.verified = true;
      uint32_t file;
      uint64_t off;
      RecordLocation(e.record, &file, &off);
      ops.push_back({IoOp::Kind::kWrite, file, off, kIoAlign, hb, i, true, {}});
      op_owner.push_back(i);
      ops.push_back({IoOp::Kind::kWrite, file, off + kIoAlign, RoundUp4K(w.len),
                     const_cast<uint8_t*>(w.payload), i, false, {}});
      op_owner.push_back(i);
    }
    if (ops.empty()) {
      for (size_t i = 0; i < n; ++i) {
        if (!writes[base + i].result.ok() && first.ok()) first = writes[base + i].result;
      }
      continue;
    }
    (void)dev_->Batch(ops);
    for (size_t k = 0; k < ops.size(); ++k) {
      const size_t i = op_owner[k];
      if (!ops[k].result.ok() && writes[base + i].result.ok()) writes[base + i].result = ops[k].result;
    }
    // Durable payloads before any index entry points at them.
    std::set<uint32_t> files;
    for (size_t i = 0; i < n; ++i) {
      if (active[i] && writes[base + i].result.ok()) {
        uint32_t f;
        uint64_t o;
        RecordLocation(ents[i].record, &f, &o);
        files.insert(f);
      }
    }
    std::vector<uint32_t> fv(files.begin(), files.end());
    Status ss = fv.empty() ? Status::Ok() : dev_->Sync(fv);
    KVTIER_TEST_POINT("NvmeStore::WriteBatch:AfterPayloadSync");
    rocksdb::WriteBatch wb;
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      if (!ss.ok() && writes[base + i].result.ok()) writes[base + i].result = ss;
      if (writes[base + i].result.ok()) wb.Put(nvme_index::Key(ents[i].id), nvme_index::EncodeEntry(ents[i]));
    }
    Status is = Status::Ok();
    if (wb.Count() > 0) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      is = FromRocks(db_->Write(wo, &wb), "index write");
    }
    KVTIER_TEST_POINT("NvmeStore::WriteBatch:AfterIndex");
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      NvmeWrite& w = writes[base + i];
      if (!is.ok() && w.result.ok()) w.result = is;
      if (w.result.ok()) {
        at_.emplace(ents[i].record, ents[i].id);
        map_.emplace(ents[i].id, ents[i]);
        ++blocks_written_;
        bytes_written_ += RoundUp4K(w.len) + kIoAlign;
      } else {
        spdlog::warn("nvme: write of block {} failed: {}; not stored", w.id.key.ToHex(), w.result.message());
        (void)alloc_.Free(*IdOf(ents[i].record));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!writes[base + i].result.ok() && first.ok()) first = writes[base + i].result;
    }
  }
  return first;
}

Status NvmeStore::ReadBatch(std::span<NvmeRead> reads, const std::function<void(size_t)>& on_ready) {
  std::lock_guard<std::mutex> iol(io_mu_);
  Status first;
  for (size_t base = 0; base < reads.size(); base += kStagingRecords) {
    const size_t n = std::min(kStagingRecords, reads.size() - base);
    std::vector<NvmeEntry> ents(n);
    std::vector<bool> active(n, false), check_header(n, false);
    std::vector<IoOp> ops;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (size_t i = 0; i < n; ++i) {
        NvmeRead& r = reads[base + i];
        r.result = Status::Ok();
        auto it = map_.find(r.id);
        if (it == map_.end()) {
          r.result = Status::NotFound("nvme: block not stored");
          continue;
        }
        ents[i] = it->second;
        if (RoundUp4K(ents[i].payload_len) > r.dst_capacity || r.dst == nullptr) {
          r.result = Status::Invalid("nvme read: destination holds " + std::to_string(r.dst_capacity) +
                                     " bytes, record needs " +
                                     std::to_string(RoundUp4K(ents[i].payload_len)));
          continue;
        }
        active[i] = true;
        check_header[i] = opts_.verify_on_restart && !ents[i].verified;
      }
    }
    std::vector<uint8_t> outstanding(n, 0);
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      uint32_t file;
      uint64_t off;
      RecordLocation(ents[i].record, &file, &off);
      if (check_header[i]) {
        ops.push_back({IoOp::Kind::kRead, file, off, kIoAlign, staging_ + i * kIoAlign, i, true, {}});
        ++outstanding[i];
      }
      ops.push_back({IoOp::Kind::kRead, file, off + kIoAlign, RoundUp4K(ents[i].payload_len),
                     reads[base + i].dst, i, false, {}});
      ++outstanding[i];
    }
    std::vector<bool> corrupt(n, false);
    // Verifies block i once its last op finished: runs while later reads are in flight.
    auto verify = [&](size_t i) {
      NvmeRead& r = reads[base + i];
      const NvmeEntry& e = ents[i];
      if (r.result.ok() && check_header[i]) {
        auto h = RecordHeader::Decode(std::span<const uint8_t>(staging_ + i * kIoAlign, kRecordHeaderSize));
        uint64_t hx;
        std::memcpy(&hx, staging_ + i * kIoAlign + kRecordHeaderChecksummed, 8);
        if (!h.ok()) {
          r.result = Status::Corrupt("nvme record header: " + h.status().message());
        } else if (h->contract_id != e.id.contract || h->key != e.id.key ||
                   h->payload_len != e.payload_len || h->payload_xxh3 != e.payload_xxh3 ||
                   hx != e.header_xxh3) {
          r.result = Status::Corrupt("nvme record header does not match its index entry");
        }
      }
      if (r.result.ok() && PayloadChecksum(std::span<const uint8_t>(r.dst, e.payload_len)) != e.payload_xxh3) {
        r.result = Status::Corrupt("nvme payload checksum mismatch (record " + std::to_string(e.record) + ")");
      }
      if (r.result.IsCorrupt()) corrupt[i] = true;
      if (r.result.ok()) r.len = e.payload_len;
      if (on_ready) on_ready(base + i);
    };
    if (!ops.empty()) {
      (void)dev_->Batch(ops, [&](const IoOp& op) {
        const size_t i = op.user;
        NvmeRead& r = reads[base + i];
        if (!op.result.ok() && r.result.ok()) r.result = op.result;
        if (--outstanding[i] == 0) verify(i);
      });
    }
    for (size_t i = 0; i < n; ++i) {  // refused before any I/O: report them too
      if (!active[i] && on_ready) on_ready(base + i);
    }
    rocksdb::WriteBatch wb;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (size_t i = 0; i < n; ++i) {
        if (!active[i]) continue;
        NvmeRead& r = reads[base + i];
        auto it = map_.find(r.id);
        if (it == map_.end() || it->second.record != ents[i].record) continue;
        if (corrupt[i]) {
          ++checksum_failures_;
          spdlog::warn("nvme: {} (block {}); dropped", r.result.message(), r.id.key.ToHex());
          wb.Delete(nvme_index::Key(r.id));
          (void)alloc_.Free(*IdOf(it->second.record));
          at_.erase(it->second.record);
          map_.erase(it);
        } else if (r.result.ok()) {
          it->second.verified = true;
          ++it->second.hits;
          wb.Put(nvme_index::Key(r.id), nvme_index::EncodeEntry(it->second));
          ++blocks_read_;
          bytes_read_ += RoundUp4K(r.len);
        } else {
          spdlog::warn("nvme: read of block {} failed: {}; a miss", r.id.key.ToHex(), r.result.message());
        }
      }
    }
    if (wb.Count() > 0) (void)db_->Write(rocksdb::WriteOptions(), &wb);  // hit counts: best effort
    for (size_t i = 0; i < n; ++i) {
      if (!reads[base + i].result.ok() && first.ok()) first = reads[base + i].result;
    }
  }
  return first;
}

Status NvmeStore::Remove(const BlockId& id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return Status::NotFound("nvme: block not stored");
  KVTIER_RETURN_IF_ERROR(FromRocks(db_->Delete(rocksdb::WriteOptions(), nvme_index::Key(id)), "index delete"));
  (void)alloc_.Free(*IdOf(it->second.record));
  at_.erase(it->second.record);
  map_.erase(it);
  return Status::Ok();
}

bool NvmeStore::Contains(const BlockId& id) const {
  std::lock_guard<std::mutex> l(mu_);
  return map_.count(id) != 0;
}

std::optional<NvmeEntry> NvmeStore::Find(const BlockId& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::vector<NvmeEntry> NvmeStore::Entries() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<NvmeEntry> v;
  v.reserve(map_.size());
  for (const auto& [k, e] : map_) v.push_back(e);
  return v;
}

NvmeStoreStats NvmeStore::Stats() const {
  NvmeStoreStats s;
  s.records_total = records_total();
  uint64_t smallest = 0;
  for (int c = 0; c < num_classes(); ++c) smallest = smallest == 0 ? class_bytes(c) : std::min(smallest, class_bytes(c));
  s.record_bytes = smallest != 0 ? smallest : opts_.slot_bytes + kIoAlign;
  s.capacity_bytes = arena_bytes();
  {
    std::lock_guard<std::mutex> l(mu_);
    s.records_used = alloc_.used();
    s.used_bytes = alloc_.used_bytes();
  }
  s.blocks_written = blocks_written_;
  s.blocks_read = blocks_read_;
  s.bytes_written = bytes_written_;
  s.bytes_read = bytes_read_;
  s.checksum_failures = checksum_failures_;
  s.index_entries_dropped = index_dropped_;
  s.loaded_at_open = loaded_;
  return s;
}

}  // namespace kvtier::tiers
