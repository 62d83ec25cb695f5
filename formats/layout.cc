#include "formats/layout.h"

#include <cstring>
#include <string>

namespace kvtier {

const char* KvFormatName(KvFormat f) {
  switch (f) {
    case KvFormat::kNvfp4: return "nvfp4";
    case KvFormat::kFp8: return "fp8";
    case KvFormat::kBf16: return "bf16";
  }
  return "unknown";
}

bool ParseKvFormat(const char* s, KvFormat* out) {
  if (std::strcmp(s, "nvfp4") == 0) { *out = KvFormat::kNvfp4; return true; }
  if (std::strcmp(s, "fp8") == 0) { *out = KvFormat::kFp8; return true; }
  if (std::strcmp(s, "bf16") == 0) { *out = KvFormat::kBf16; return true; }
  return false;
}

Status Geometry::Validate(KvFormat format) const {
  if (num_layers < 1 || num_layers > 1024) {
    return Status::Invalid("num_layers must be in [1, 1024], got " + std::to_string(num_layers));
  }
  if (num_kv_heads < 1 || num_kv_heads > 256) {
    return Status::Invalid("num_kv_heads must be in [1, 256], got " + std::to_string(num_kv_heads));
  }
  if (head_dim < 16 || head_dim > 1024 || head_dim % 16 != 0) {
    return Status::Invalid("head_dim must be a multiple of 16 in [16, 1024], got " +
                           std::to_string(head_dim));
  }
  if (block_tokens < 1 || block_tokens > 1024) {
    return Status::Invalid("block_tokens must be in [1, 1024], got " + std::to_string(block_tokens));
  }
  if (format != KvFormat::kNvfp4 && format != KvFormat::kFp8 && format != KvFormat::kBf16) {
    return Status::Invalid("unknown KV format");
  }
  if (BlockBytes(format, *this) >= (size_t{1} << 32)) {
    return Status::Invalid("block of " + std::to_string(BlockBytes(format, *this)) +
                           " bytes is too large (limit 4 GiB)");
  }
  return Status::Ok();
}

PageLayout MakePageLayout(KvFormat format, const Geometry& g) {
  const size_t values = static_cast<size_t>(g.num_kv_heads) * g.block_tokens * g.head_dim;
  PageLayout p;
  switch (format) {
    case KvFormat::kNvfp4:
      p.k_data = 0;
      p.k_scale = values / 2;
      p.v_data = p.k_scale + values / 16;
      p.v_scale = p.v_data + values / 2;
      p.page_bytes = p.v_scale + values / 16;
      break;
    case KvFormat::kFp8:
      p.k_data = 0;
      p.k_scale = p.v_data = values;
      p.v_scale = p.page_bytes = 2 * values;
      break;
    case KvFormat::kBf16:
      p.k_data = 0;
      p.k_scale = p.v_data = 2 * values;
      p.v_scale = p.page_bytes = 4 * values;
      break;
  }
  return p;
}

size_t PageBytes(KvFormat format, const Geometry& g) { return MakePageLayout(format, g).page_bytes; }

size_t BlockBytes(KvFormat format, const Geometry& g) {
  return PageBytes(format, g) * g.num_layers;
}

size_t SlotBytes(KvFormat format, const Geometry& g) {
  return AlignUp(BlockBytes(format, g), kSlotAlignment);
}

size_t BlockScaleBytes(KvFormat format, const Geometry& g) {
  if (format != KvFormat::kNvfp4) return 0;
  const size_t values = static_cast<size_t>(g.num_kv_heads) * g.block_tokens * g.head_dim;
  return 2 * (values / 16) * g.num_layers;
}

}  // namespace kvtier
