#include "tiers/slab_allocator.h"

#include <algorithm>
#include <numeric>

namespace kvtier::tiers {

uint64_t AutoGranule(uint64_t arena_bytes) {
  uint64_t g = kMinGranule;
  while (g < kMaxGranule && arena_bytes / g > kMaxGranuleIds) g *= 2;
  return g;
}

uint64_t AutoSlabBytes(uint64_t arena_bytes, uint64_t max_block, uint64_t granule) {
  if (granule == 0) return 0;
  const uint64_t block = (std::max<uint64_t>(max_block, 1) + granule - 1) / granule * granule;
  if (arena_bytes / (4 * block) >= 16) return 4 * block;
  if (arena_bytes / (2 * block) >= 4) return 2 * block;
  if (arena_bytes >= block) return block;
  return arena_bytes / granule * granule;
}

StatusOr<SlabAllocator> SlabAllocator::Make(const std::string& what, uint64_t arena_bytes, uint64_t slab_bytes,
                                            std::vector<uint64_t> class_bytes) {
  if (class_bytes.empty() || class_bytes.size() > kMaxSlotClasses) {
    return Status::Invalid(what + ": " + std::to_string(class_bytes.size()) + " slot classes; 1 to " +
                           std::to_string(kMaxSlotClasses) + " are supported");
  }
  if (slab_bytes == 0 || slab_bytes % 4096 != 0) {
    return Status::Invalid(what + ": slab size " + std::to_string(slab_bytes) +
                           " is not a positive multiple of 4096");
  }
  std::sort(class_bytes.begin(), class_bytes.end());
  uint64_t g = slab_bytes;
  for (size_t i = 0; i < class_bytes.size(); ++i) {
    const uint64_t sz = class_bytes[i];
    if (sz == 0 || sz % 4096 != 0) {
      return Status::Invalid(what + ": slot class " + std::to_string(sz) + " is not a positive multiple of 4096");
    }
    if (i > 0 && sz == class_bytes[i - 1]) {
      return Status::Invalid(what + ": slot class " + std::to_string(sz) + " is listed twice");
    }
    if (sz > slab_bytes) {
      return Status::Invalid(what + ": slot class " + std::to_string(sz) + " is larger than a slab (" +
                             std::to_string(slab_bytes) + " bytes)");
    }
    g = std::gcd(g, sz);
  }
  const uint64_t n = arena_bytes / slab_bytes;
  if (n == 0) {
    return Status::Invalid(what + ": " + std::to_string(arena_bytes) + " bytes hold no slab of " +
                           std::to_string(slab_bytes) + " bytes");
  }
  if (n * slab_bytes / g > UINT32_MAX) return Status::Invalid(what + ": more than 2^32 slot ids");
  SlabAllocator a;
  a.granule_ = g;
  a.slab_bytes_ = slab_bytes;
  for (uint64_t sz : class_bytes) {
    Class c;
    c.bytes = sz;
    c.per_slab = static_cast<uint32_t>(slab_bytes / sz);
    a.classes_.push_back(std::move(c));
  }
  a.classes_.reserve(kMaxArenaClasses);  // AddClass never moves a class (readers of the geometry hold no lock)
  a.slabs_.resize(n);
  for (uint32_t s = 0; s < n; ++s) a.pool_.insert(s);
  return a;
}

StatusOr<int> SlabAllocator::AddClass(uint64_t bytes, uint64_t page_bytes) {
  const int made = ClassOfBytes(bytes);
  if (made < 0) return Status::Invalid("slot class of " + std::to_string(bytes) + " bytes is not one of the arena's");
  if (page_bytes == 0 || page_bytes % 16 != 0 || page_bytes > bytes) {
    return Status::Invalid("page of " + std::to_string(page_bytes) + " bytes for a slot of " + std::to_string(bytes) +
                           ": want a positive multiple of 16 no larger than the slot");
  }
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (classes_[c].page_bytes != 0 && classes_[c].bytes == bytes && classes_[c].page_bytes == page_bytes) {
      return static_cast<int>(c);
    }
  }
  if (classes_.size() >= kMaxArenaClasses) {
    return Status::Invalid("the arena holds " + std::to_string(kMaxArenaClasses) +
                           " slot classes already (one per size and page geometry of the contracts it holds); "
                           "a contract with pages of " + std::to_string(page_bytes) + " bytes in slots of " +
                           std::to_string(bytes) + " cannot take one");
  }
  Class k;
  k.bytes = bytes;
  k.page_bytes = page_bytes;
  k.per_slab = classes_[static_cast<size_t>(made)].per_slab;
  classes_.push_back(std::move(k));
  return static_cast<int>(classes_.size() - 1);
}

uint64_t SlabAllocator::PageOffset(uint32_t id, int c, uint32_t layer) const {
  const Class& k = classes_[static_cast<size_t>(c)];
  const uint64_t off = Offset(id), in = off % slab_bytes_;
  return off - in + (uint64_t{layer} * k.per_slab + in / k.bytes) * k.page_bytes;
}

int SlabAllocator::ClassFor(uint64_t bytes) const {
  int best = -1;
  for (size_t c = 0; c < classes_.size(); ++c) {
    const Class& k = classes_[c];
    if (k.page_bytes == 0 && k.bytes >= bytes && (best < 0 || k.bytes < class_bytes(best))) best = static_cast<int>(c);
  }
  return best;
}

int SlabAllocator::ClassOfBytes(uint64_t bytes) const {
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (classes_[c].page_bytes == 0 && classes_[c].bytes == bytes) return static_cast<int>(c);
  }
  return -1;
}

uint64_t SlabAllocator::largest() const {
  uint64_t m = 0;
  for (const Class& k : classes_) {
    if (k.page_bytes == 0) m = std::max(m, k.bytes);
  }
  return m;
}

StatusOr<int> SlabAllocator::AddClass(uint64_t bytes) {
  if (bytes == 0 || bytes % granule_ != 0 || bytes > slab_bytes_) {
    return Status::Invalid("slot class of " + std::to_string(bytes) + " bytes: want a positive multiple of the granule (" +
                           std::to_string(granule_) + " bytes) no larger than a slab (" + std::to_string(slab_bytes_) +
                           " bytes)");
  }
  const int have = ClassOfBytes(bytes);
  if (have >= 0) return have;
  if (classes_.size() >= kMaxArenaClasses) {
    return Status::Invalid("the arena holds " + std::to_string(kMaxArenaClasses) +
                           " slot classes already (one per slot size and HBM page geometry of the contracts it "
                           "holds); a contract whose blocks take slots of " + std::to_string(bytes) +
                           " bytes cannot take one: forget contracts of other sizes first, or restart the daemon");
  }
  Class k;
  k.bytes = bytes;
  k.per_slab = static_cast<uint32_t>(slab_bytes_ / bytes);
  classes_.push_back(std::move(k));
  return static_cast<int>(classes_.size() - 1);
}

StatusOr<SlabAllocator> SlabAllocator::MakeOnGranule(const std::string& what, uint64_t arena_bytes,
                                                     uint64_t slab_bytes, uint64_t granule,
                                                     std::vector<uint64_t> class_bytes) {
  if (granule < kMinGranule || granule % kMinGranule != 0 || ((granule / kMinGranule) & (granule / kMinGranule - 1)) != 0) {
    return Status::Invalid(what + ": granule " + std::to_string(granule) + " is not 4096 x a power of two");
  }
  if (slab_bytes == 0 || slab_bytes % granule != 0) {
    return Status::Invalid(what + ": slab size " + std::to_string(slab_bytes) + " is not a positive multiple of the granule (" +
                           std::to_string(granule) + ")");
  }
  if (class_bytes.size() > kMaxArenaClasses) {
    return Status::Invalid(what + ": " + std::to_string(class_bytes.size()) + " slot classes; at most " +
                           std::to_string(kMaxArenaClasses));
  }
  const uint64_t n = arena_bytes / slab_bytes;
  if (n == 0) {
    return Status::Invalid(what + ": " + std::to_string(arena_bytes) + " bytes hold no slab of " +
                           std::to_string(slab_bytes) + " bytes");
  }
  if (n * slab_bytes / granule > UINT32_MAX) return Status::Invalid(what + ": more than 2^32 slot ids");
  SlabAllocator a;
  a.granule_ = granule;
  a.slab_bytes_ = slab_bytes;
  a.classes_.reserve(kMaxArenaClasses);  // AddClass never moves a class (readers of the geometry hold no lock)
  a.slabs_.resize(n);
  for (uint32_t s = 0; s < n; ++s) a.pool_.insert(s);
  std::sort(class_bytes.begin(), class_bytes.end());
  for (uint64_t sz : class_bytes) {
    if (a.ClassOfBytes(sz) >= 0) return Status::Invalid(what + ": slot class " + std::to_string(sz) + " is listed twice");
    auto c = a.AddClass(sz);
    if (!c.ok()) return Status::Invalid(what + ": " + c.status().message());
  }
  return a;
}

uint32_t SlabAllocator::SlotId(uint32_t slab, uint32_t i) const {
  const uint64_t off = uint64_t{slab} * slab_bytes_ + uint64_t{i} * class_bytes(slabs_[slab].cls);
  return static_cast<uint32_t>(off / granule_);
}

int64_t SlabAllocator::IndexOf(uint32_t id) const {
  if (id >= id_space()) return -1;
  const Slab& s = slabs_[SlabOf(id)];
  if (s.cls < 0) return -1;
  const uint64_t in = Offset(id) % slab_bytes_;
  const uint64_t sz = class_bytes(s.cls);
  if (in % sz != 0 || in / sz >= classes_[static_cast<size_t>(s.cls)].per_slab) return -1;
  return static_cast<int64_t>(in / sz);
}

int SlabAllocator::ClassOfSlot(uint32_t id) const {
  const int64_t i = IndexOf(id);
  if (i < 0) return -1;
  const Slab& s = slabs_[SlabOf(id)];
  return s.slots.IsTaken(static_cast<uint32_t>(i)) ? s.cls : -1;
}

void SlabAllocator::Assign(uint32_t slab, int c) {
  Slab& s = slabs_[slab];
  Class& k = classes_[static_cast<size_t>(c)];
  s.cls = c;
  s.move_to = kNoMove;
  s.slots.Reset(k.per_slab);
  ++k.slabs;
  k.open_free += k.per_slab;
  k.open.insert(slab);
}

void SlabAllocator::Release(uint32_t slab) {
  Slab& s = slabs_[slab];
  s.cls = -1;
  s.move_to = kNoMove;
  s.slots.Reset(0);
  pool_.insert(slab);
}

std::optional<uint32_t> SlabAllocator::Alloc(int c) {
  if (c < 0 || static_cast<size_t>(c) >= classes_.size()) return std::nullopt;
  Class& k = classes_[static_cast<size_t>(c)];
  if (k.open.empty()) {
    if (pool_.empty()) return std::nullopt;
    const uint32_t slab = *pool_.begin();
    pool_.erase(pool_.begin());
    Assign(slab, c);
  }
  const uint32_t slab = *k.open.begin();
  Slab& s = slabs_[slab];
  const uint32_t i = *s.slots.Alloc();  // an open slab has a free slot
  ++k.used;
  --k.open_free;
  if (s.slots.free_count() == 0) k.open.erase(slab);
  return SlotId(slab, i);
}

bool SlabAllocator::Free(uint32_t id) {
  const int64_t i = IndexOf(id);
  if (i < 0) return false;
  const uint32_t slab = SlabOf(id);
  Slab& s = slabs_[slab];
  if (!s.slots.Free(static_cast<uint32_t>(i))) return false;
  Class& k = classes_[static_cast<size_t>(s.cls)];
  --k.used;
  if (s.move_to != kNoMove) {
    if (s.slots.used() == 0) {
      --k.slabs;
      HandOver(slab, s.move_to);
    }
    return true;
  }
  ++k.open_free;
  if (s.slots.used() == 0) {
    k.open.erase(slab);
    k.open_free -= k.per_slab;
    --k.slabs;
    Release(slab);
  } else {
    k.open.insert(slab);
  }
  return true;
}

Status SlabAllocator::Restore(uint32_t id, int c) {
  if (c < 0 || static_cast<size_t>(c) >= classes_.size()) {
    return Status::Invalid("slot class " + std::to_string(c) + " is out of range");
  }
  if (id >= id_space()) return Status::Invalid("slot id " + std::to_string(id) + " is out of range");
  const uint32_t slab = SlabOf(id);
  Slab& s = slabs_[slab];
  const uint64_t in = Offset(id) % slab_bytes_;
  const Class& want = classes_[static_cast<size_t>(c)];
  if (in % want.bytes != 0 || in / want.bytes >= want.per_slab) {
    return Status::Invalid("slot id " + std::to_string(id) + " is not a slot start of class " +
                           std::to_string(want.bytes) + " B");
  }
  if (s.cls >= 0 && s.cls != c) {
    return Status::Invalid("slot id " + std::to_string(id) + ": slab " + std::to_string(slab) +
                           " belongs to class " + std::to_string(class_bytes(s.cls)) + " B");
  }
  if (s.move_to != kNoMove) return Status::Invalid("slab " + std::to_string(slab) + " is moving");
  const auto i = static_cast<uint32_t>(in / want.bytes);
  if (s.cls >= 0 && s.slots.IsTaken(i)) return Status::Invalid("slot id " + std::to_string(id) + " is taken");
  if (s.cls < 0) {
    pool_.erase(slab);
    Assign(slab, c);
  }
  (void)s.slots.Take(i);  // free: checked above
  Class& k = classes_[static_cast<size_t>(c)];
  ++k.used;
  --k.open_free;
  if (s.slots.free_count() == 0) k.open.erase(slab);
  return Status::Ok();
}

StatusOr<std::vector<uint32_t>> SlabAllocator::BeginMove(uint32_t slab, int to) {
  if (slab >= slabs_.size()) return Status::Invalid("slab " + std::to_string(slab) + " is out of range");
  if (to < -1 || to >= static_cast<int>(classes_.size())) {
    return Status::Invalid("slot class " + std::to_string(to) + " is out of range");
  }
  Slab& s = slabs_[slab];
  if (s.cls < 0) return Status::Invalid("slab " + std::to_string(slab) + " is free");
  if (s.move_to != kNoMove) return Status::Invalid("slab " + std::to_string(slab) + " is already moving");
  if (s.cls == to) return Status::Invalid("slab " + std::to_string(slab) + " already belongs to that class");
  std::vector<uint32_t> taken = TakenSlots(slab);
  Class& k = classes_[static_cast<size_t>(s.cls)];
  k.open.erase(slab);
  k.open_free -= k.per_slab - s.slots.used();
  if (s.slots.used() == 0) {  // unreachable for a slab of a class (an empty one is in the pool)
    --k.slabs;
    HandOver(slab, to);
    return taken;
  }
  s.move_to = to;
  return taken;
}

void SlabAllocator::CancelMove(uint32_t slab) {
  if (slab >= slabs_.size()) return;
  Slab& s = slabs_[slab];
  if (s.cls < 0 || s.move_to == kNoMove) return;
  s.move_to = kNoMove;
  Class& k = classes_[static_cast<size_t>(s.cls)];
  k.open_free += k.per_slab - s.slots.used();
  if (s.slots.free_count() > 0) k.open.insert(slab);
}

std::vector<uint32_t> SlabAllocator::TakenSlots(uint32_t slab) const {
  std::vector<uint32_t> out;
  if (slab >= slabs_.size()) return out;
  const Slab& s = slabs_[slab];
  if (s.cls < 0) return out;
  const uint32_t n = classes_[static_cast<size_t>(s.cls)].per_slab;
  for (uint32_t i = 0; i < n; ++i) {
    if (s.slots.IsTaken(i)) out.push_back(SlotId(slab, i));
  }
  return out;
}

uint32_t SlabAllocator::free_count(int c) const {
  const Class& k = classes_[static_cast<size_t>(c)];
  return k.open_free + static_cast<uint32_t>(pool_.size()) * k.per_slab;
}

uint32_t SlabAllocator::used() const {
  uint32_t u = 0;
  for (const auto& k : classes_) u += k.used;
  return u;
}

uint64_t SlabAllocator::used_bytes() const {
  uint64_t b = 0;
  for (const auto& k : classes_) b += uint64_t{k.used} * k.bytes;
  return b;
}

}  // namespace kvtier::tiers
