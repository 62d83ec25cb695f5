#include "tools/quality/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace kvtier::quality {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors limit
using Json = nlohmann::json;
}  // namespace

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

bool ParseDType(std::string_view s, DType* out) {
  std::string u(s);
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "F32" || u == "FP32" || u == "FLOAT32") *out = DType::kF32;
  else if (u == "F16" || u == "FP16" || u == "FLOAT16") *out = DType::kF16;
  else if (u == "BF16" || u == "BFLOAT16") *out = DType::kBF16;
  else return false;
  return true;
}

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float F16ToFloat(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}

uint16_t FloatToF16(float f) {
  const _Float16 v = static_cast<_Float16>(f);  // IEEE RNE
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

StatusOr<SafetensorsView> SafetensorsView::Parse(std::span<const uint8_t> file) {
  if (file.size() < 8) {
    return Status::Invalid("safetensors: file is " + std::to_string(file.size()) +
                           " bytes, too short for the 8-byte header length");
  }
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  if (n > kMaxHeaderBytes || n > file.size() - 8) {
    return Status::Invalid("safetensors: bad header length " + std::to_string(n) + " (file has " +
                           std::to_string(file.size() - 8) + " bytes after it, limit 100 MB)");
  }
  if (n < 2 || file[8] != '{') {
    return Status::Invalid("safetensors: header does not start with a JSON object");
  }
  const char* hb = reinterpret_cast<const char*>(file.data() + 8);
  Json j = Json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Invalid("safetensors: header is not a well-formed JSON object");
  }
  SafetensorsView v;
  v.data_ = file.subspan(8 + n);
  const uint64_t data_size = v.data_.size();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) return Status::Invalid("safetensors: __metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) {
          return Status::Invalid("safetensors: __metadata__." + m.key() + " is not a string");
        }
        v.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "safetensors: tensor '" + name + "': ";
    if (!e.is_object()) return Status::Invalid(where + "entry is not an object");
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string()) return Status::Invalid(where + "missing string dtype");
    if (sh == e.end() || !sh->is_array()) return Status::Invalid(where + "missing shape array");
    if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return Status::Invalid(where + "data_offsets must be two non-negative integers");
    }
    TensorInfo t;
    t.name = name;
    const std::string dts = dt->get<std::string>();
    if (dts == "F32") t.dtype = DType::kF32;
    else if (dts == "F16") t.dtype = DType::kF16;
    else if (dts == "BF16") t.dtype = DType::kBF16;
    else {
      return Status::Unsupported(where + "dtype " + dts + " is not supported (BF16, F16, F32)");
    }
    uint64_t numel = 1;
    for (const Json& d : *sh) {
      if (!d.is_number_unsigned()) {
        return Status::Invalid(where + "shape entries must be non-negative integers");
      }
      const uint64_t dim = d.get<uint64_t>();
      if (__builtin_mul_overflow(numel, dim, &numel)) {
        return Status::Invalid(where + "shape product overflows");
      }
      t.shape.push_back(dim);
    }
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size) {
      return Status::Invalid(where + "data_offsets [" + std::to_string(t.begin) + ", " +
                             std::to_string(t.end) + ") out of range (data section is " +
                             std::to_string(data_size) + " bytes)");
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, DTypeSize(t.dtype), &bytes) || bytes != t.end - t.begin) {
      return Status::Invalid(where + "shape mismatch: " + std::to_string(numel) + " " + dts +
                             " values need " + std::to_string(numel * DTypeSize(t.dtype)) +
                             " bytes, data_offsets span " + std::to_string(t.end - t.begin));
    }
    v.tensors_[name] = std::move(t);
  }
  std::vector<const TensorInfo*> by_begin;
  for (const auto& [name, t] : v.tensors_) {
    if (t.end > t.begin) by_begin.push_back(&t);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    if (by_begin[i]->begin < by_begin[i - 1]->end) {
      return Status::Invalid("safetensors: tensors '" + by_begin[i - 1]->name + "' and '" +
                             by_begin[i]->name + "' overlap");
    }
  }
  return v;
}

const TensorInfo* SafetensorsView::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsView::ReadFloat(const TensorInfo& t, std::vector<float>* out) const {
  const uint64_t n = t.numel();
  out->resize(n);
  const uint8_t* p = data_.data() + t.begin;
  float* o = out->data();
  if (t.dtype == DType::kF32) {
    std::memcpy(o, p, n * 4);
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      o[i] = t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(o[i])) {
      return Status::Invalid("tensor '" + t.name + "' value " + std::to_string(i) +
                             " is not finite");
    }
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IoError(path + " is not a regular file");
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      return Status::IoError("cannot map " + path + ": " + err);
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

StatusOr<std::vector<uint8_t>> SerializeSafetensors(
    const std::vector<TensorOut>& tensors, const std::map<std::string, std::string>& metadata) {
  Json h = Json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    if (n != t.values.size()) {
      return Status::Invalid("tensor '" + t.name + "' has " + std::to_string(t.values.size()) +
                             " values for a shape of " + std::to_string(n));
    }
    if (h.contains(t.name)) return Status::Invalid("tensor '" + t.name + "' given twice");
    const uint64_t bytes = n * DTypeSize(t.dtype);
    h[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');
  std::vector<uint8_t> out(8 + hs.size() + off);
  const uint64_t hn = hs.size();
  std::memcpy(out.data(), &hn, 8);
  std::memcpy(out.data() + 8, hs.data(), hs.size());
  uint8_t* p = out.data() + 8 + hs.size();
  for (const auto& t : tensors) {
    for (float f : t.values) {
      if (t.dtype == DType::kF32) {
        std::memcpy(p, &f, 4);
        p += 4;
      } else {
        const uint16_t b = t.dtype == DType::kBF16 ? FloatToBf16(f) : FloatToF16(f);
        std::memcpy(p, &b, 2);
        p += 2;
      }
    }
  }
  return out;
}

namespace {
// "layers.{i}.{k|v|q}" -> i and the letter; false for any other name.
bool ParseKvName(const std::string& name, int* layer, char* kind) {
  constexpr std::string_view kPrefix = "layers.";
  if (name.rfind(kPrefix, 0) != 0 || name.size() < kPrefix.size() + 3) return false;
  const size_t dot = name.size() - 2;
  if (name[dot] != '.') return false;
  const char c = name.back();
  if (c != 'k' && c != 'v' && c != 'q') return false;
  const std::string num = name.substr(kPrefix.size(), dot - kPrefix.size());
  if (num.empty() || num.size() > 6) return false;
  for (char ch : num) {
    if (ch < '0' || ch > '9') return false;
  }
  if (num.size() > 1 && num[0] == '0') return false;
  *layer = std::stoi(num);
  *kind = c;
  return true;
}

std::string ShapeStr(const std::vector<uint64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
}  // namespace

StatusOr<KvDumpIndex> IndexKvDump(const SafetensorsView& f, const std::vector<int>& only) {
  std::map<int, std::array<const TensorInfo*, 3>> found;  // k, v, q
  for (const auto& [name, t] : f.tensors()) {
    int layer;
    char kind;
    if (!ParseKvName(name, &layer, &kind)) continue;
    found[layer][kind == 'k' ? 0 : kind == 'v' ? 1 : 2] = &t;
  }
  if (found.empty()) {
    return Status::Invalid("no KV tensors: expected names layers.{i}.k and layers.{i}.v");
  }
  KvDumpIndex idx;
  for (const auto& [layer, kvq] : found) {
    if (!only.empty() && std::find(only.begin(), only.end(), layer) == only.end()) continue;
    idx.layers.push_back(layer);
  }
  for (int l : only) {
    if (!found.count(l)) return Status::Invalid("layer " + std::to_string(l) + " is not in the file");
  }
  bool first = true, all_q = true;
  for (int layer : idx.layers) {
    const auto& kvq = found[layer];
    const std::string ln = "layers." + std::to_string(layer);
    if (!kvq[0] || !kvq[1]) {
      return Status::Invalid(ln + (kvq[0] ? ".v" : ".k") + " is missing (each layer needs k and v)");
    }
    for (int s = 0; s < 2; ++s) {
      const TensorInfo* t = kvq[s];
      if (t->shape.size() != 3) {
        return Status::Invalid(t->name + " has shape " + ShapeStr(t->shape) +
                               ", expected [tokens, kv_heads, head_dim]");
      }
      const KvShape sh{t->shape[0], t->shape[1], t->shape[2]};
      if (first) {
        idx.shape = sh;
        first = false;
      } else if (sh.tokens != idx.shape.tokens || sh.kv_heads != idx.shape.kv_heads ||
                 sh.head_dim != idx.shape.head_dim) {
        return Status::Invalid(t->name + " has shape " + ShapeStr(t->shape) +
                               ", unlike the other KV tensors [" + std::to_string(idx.shape.tokens) +
                               ", " + std::to_string(idx.shape.kv_heads) + ", " +
                               std::to_string(idx.shape.head_dim) + "]");
      }
    }
    all_q &= kvq[2] != nullptr;
  }
  if (idx.shape.tokens == 0 || idx.shape.kv_heads == 0) {
    return Status::Invalid("KV tensors are empty (tokens and kv_heads must be positive)");
  }
  if (idx.shape.head_dim == 0 || idx.shape.head_dim % 32 != 0 || idx.shape.head_dim > 1024) {
    return Status::Unsupported("head_dim " + std::to_string(idx.shape.head_dim) +
                               " is not a multiple of 32 in [32, 1024] (MXFP4 blocks are 32 values)");
  }
  if (all_q) {
    bool qfirst = true;
    for (int layer : idx.layers) {
      const TensorInfo* q = found[layer][2];
      if (q->shape.size() != 3 || q->shape[2] != idx.shape.head_dim || q->shape[0] == 0 ||
          q->shape[1] == 0 || q->shape[1] % idx.shape.kv_heads != 0) {
        return Status::Invalid(q->name + " has shape " + ShapeStr(q->shape) +
                               ", expected [queries, q_heads, head_dim] with q_heads a multiple "
                               "of kv_heads");
      }
      if (qfirst) {
        idx.queries = q->shape[0];
        idx.q_heads = q->shape[1];
        qfirst = false;
      } else if (q->shape[0] != idx.queries || q->shape[1] != idx.q_heads) {
        return Status::Invalid(q->name + " has shape " + ShapeStr(q->shape) +
                               ", unlike the other query tensors");
      }
    }
    idx.has_queries = true;
  }
  return idx;
}

StatusOr<std::vector<int>> ParseLayerList(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  auto bad = [&] { return Status::Invalid("bad layer list '" + s + "' (expected e.g. 0,2,5-7)"); };
  if (s.empty()) return bad();
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    auto num = [](const std::string& t, int* v) {
      if (t.empty() || t.size() > 6) return false;
      for (char c : t) {
        if (c < '0' || c > '9') return false;
      }
      *v = std::stoi(t);
      return true;
    };
    int a, b;
    if (dash == std::string::npos) {
      if (!num(item, &a)) return bad();
      b = a;
    } else if (!num(item.substr(0, dash), &a) || !num(item.substr(dash + 1), &b) || b < a) {
      return bad();
    }
    if (b - a > 100000) return bad();
    for (int i = a; i <= b; ++i) {
      if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
    }
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kvtier::quality
