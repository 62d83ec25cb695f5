// Little-endian byte writer/reader used by every canonical serialization in formats/.
// The reader never reads past its end: each Get* returns false once the input runs out.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// Fixed-offset little-endian store/load into a buffer the caller has sized (the fixed
// layouts of the record header and the remote envelope).
template <typename T>
inline void PutAt(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}
template <typename T>
inline T GetAt(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

class ByteWriter {
 public:
  void PutU8(uint8_t v) { buf_.push_back(v); }
  void PutU16(uint16_t v) { PutRaw(&v, 2); }
  void PutU32(uint32_t v) { PutRaw(&v, 4); }
  void PutU64(uint64_t v) { PutRaw(&v, 8); }
  void PutF32(float v) { PutRaw(&v, 4); }  // IEEE bits, little-endian
  void PutString(std::string_view s) {
    PutU32(static_cast<uint32_t>(s.size()));
    PutRaw(s.data(), s.size());
  }
  void PutRaw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> Take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  bool GetU8(uint8_t* v) { return GetRaw(v, 1); }
  bool GetU16(uint16_t* v) { return GetRaw(v, 2); }
  bool GetU32(uint32_t* v) { return GetRaw(v, 4); }
  bool GetU64(uint64_t* v) { return GetRaw(v, 8); }
  bool GetF32(float* v) { return GetRaw(v, 4); }
  // Strings longer than max_len are refused (a corrupt length must not allocate GiBs).
  bool GetString(std::string* s, size_t max_len) {
    uint32_t n;
    if (!GetU32(&n) || n > max_len || n > remaining()) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool GetRaw(void* out, size_t n) {
    if (n > remaining()) return false;
    std::memcpy(out, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace kvtier
