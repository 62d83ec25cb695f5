#include "formats/contract.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "formats/bytes.h"
#include "formats/nvfp4.h"

namespace kvtier {

namespace {
constexpr char kMagic[4] = {'K', 'V', 'T', 'C'};
}

void ScaleContract::SetUnitScales() {
  k_scales.assign(geometry.num_layers, 1.0f);
  v_scales.assign(geometry.num_layers, 1.0f);
}

Status ScaleContract::Validate() const {
  if (model_id.empty()) return Status::Invalid("contract model_id is empty");
  if (model_id.size() > kMaxContractString || model_revision.size() > kMaxContractString ||
      tokenizer_revision.size() > kMaxContractString) {
    return Status::Invalid("contract strings are limited to 256 bytes");
  }
  KVTIER_RETURN_IF_ERROR(geometry.Validate(format));
  if (tp_size < 1 || tp_rank >= tp_size) {
    return Status::Invalid("tp_rank " + std::to_string(tp_rank) + " is not below tp_size " +
                           std::to_string(tp_size));
  }
  if (scale_rule != nvfp4::ScaleRule::kMax6 && scale_rule != nvfp4::ScaleRule::k4over6) {
    return Status::Invalid("unknown scale rule");
  }
  if (v_scale_swizzle && format != KvFormat::kNvfp4) {
    return Status::Invalid("v_scale_swizzle applies to nvfp4 only");
  }
  if (layout_version != kLayoutVersion) {
    return Status::Unsupported("layout_version " + std::to_string(layout_version) +
                               " (this build reads " + std::to_string(kLayoutVersion) + ")");
  }
  if (k_scales.size() != geometry.num_layers || v_scales.size() != geometry.num_layers) {
    return Status::Invalid("k_scales and v_scales need one entry per layer (" +
                           std::to_string(geometry.num_layers) + ")");
  }
  for (size_t i = 0; i < k_scales.size(); ++i) {
    if (!nvfp4::IsValidGlobalScale(k_scales[i]) || !nvfp4::IsValidGlobalScale(v_scales[i])) {
      return Status::Invalid("layer " + std::to_string(i) +
                             " global scale is not a finite positive normal float");
    }
  }
  return Status::Ok();
}

std::vector<uint8_t> ScaleContract::Serialize() const {
  ByteWriter w;
  w.PutRaw(kMagic, 4);
  w.PutU16(kContractSerialVersion);
  w.PutString(model_id);
  w.PutString(model_revision);
  w.PutString(tokenizer_revision);
  w.PutU32(geometry.num_layers);
  w.PutU32(geometry.num_kv_heads);
  w.PutU32(geometry.head_dim);
  w.PutU32(geometry.block_tokens);
  w.PutU32(tp_rank);
  w.PutU32(tp_size);
  w.PutU8(static_cast<uint8_t>(format));
  w.PutU8(static_cast<uint8_t>(scale_rule));
  w.PutU8(v_scale_swizzle ? 1 : 0);
  w.PutU8(0);
  w.PutU32(layout_version);
  for (float s : k_scales) w.PutF32(s);
  for (float s : v_scales) w.PutF32(s);
  return w.Take();
}

StatusOr<ScaleContract> ScaleContract::Deserialize(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  char magic[4];
  uint16_t version;
  if (!r.GetRaw(magic, 4) || std::memcmp(magic, kMagic, 4) != 0) {
    return Status::Invalid("contract bytes do not start with KVTC");
  }
  if (!r.GetU16(&version)) return Status::Invalid("contract truncated");
  if (version != kContractSerialVersion) {
    return Status::Unsupported("contract serialization version " + std::to_string(version));
  }
  ScaleContract c;
  uint8_t fmt, rule, swz, reserved;
  if (!r.GetString(&c.model_id, kMaxContractString) ||
      !r.GetString(&c.model_revision, kMaxContractString) ||
      !r.GetString(&c.tokenizer_revision, kMaxContractString) ||
      !r.GetU32(&c.geometry.num_layers) || !r.GetU32(&c.geometry.num_kv_heads) ||
      !r.GetU32(&c.geometry.head_dim) || !r.GetU32(&c.geometry.block_tokens) ||
      !r.GetU32(&c.tp_rank) || !r.GetU32(&c.tp_size) || !r.GetU8(&fmt) || !r.GetU8(&rule) ||
      !r.GetU8(&swz) || !r.GetU8(&reserved) || !r.GetU32(&c.layout_version)) {
    return Status::Invalid("contract truncated or a string is too long");
  }
  if (fmt > 2) return Status::Invalid("contract kv_format " + std::to_string(fmt) + " unknown");
  if (rule > 1) return Status::Invalid("contract scale_rule " + std::to_string(rule) + " unknown");
  if (swz > 1 || reserved != 0) return Status::Invalid("contract flag bytes malformed");
  c.format = static_cast<KvFormat>(fmt);
  c.scale_rule = static_cast<nvfp4::ScaleRule>(rule);
  c.v_scale_swizzle = swz != 0;
  const uint32_t L = c.geometry.num_layers;
  if (L == 0 || L > 1024 || r.remaining() != static_cast<size_t>(L) * 8) {
    return Status::Invalid("contract scale arrays do not match num_layers");
  }
  c.k_scales.resize(L);
  c.v_scales.resize(L);
  for (auto& s : c.k_scales) (void)r.GetF32(&s);
  for (auto& s : c.v_scales) (void)r.GetF32(&s);
  KVTIER_RETURN_IF_ERROR(c.Validate());
  return c;
}

uint64_t ScaleContract::Id() const {
  const auto bytes = Serialize();
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string ContractIdHex(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

bool ParseContractIdHex(std::string_view hex, uint64_t* id) {
  if (hex.size() != 16) return false;
  uint64_t v = 0;
  for (char ch : hex) {
    int d;
    if (ch >= '0' && ch <= '9') d = ch - '0';
    else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
    else return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *id = v;
  return true;
}

uint64_t SharedContractId(uint64_t contract_id) {
  uint8_t buf[24];
  std::memcpy(buf, "kvtier.shared\0\0\0", 16);
  std::memcpy(buf + 16, &contract_id, 8);
  const uint64_t h = XXH3_64bits(buf, sizeof buf);
  return h == 0 ? 1 : h;
}

}  // namespace kvtier
