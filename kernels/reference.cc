#include "kernels/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "formats/nvfp4.h"

namespace kvtier::kernels {

Status HostPool::Validate() const {
  if (base == nullptr) return Status::Invalid("pool base is null");
  if (Status s = geometry.Validate(format); !s.ok()) return s;
  if (num_slots == 0) return Status::Invalid("pool has no slots");
  // slot_bytes is the stride of slot ids (kernels.h): a block may span several strides.
  if (slot_bytes == 0 || num_slots > SIZE_MAX / slot_bytes || num_slots * slot_bytes < BlockBytes(format, geometry)) {
    return Status::Invalid("pool of " + std::to_string(num_slots) + " x " + std::to_string(slot_bytes) +
                           " bytes holds no block of " + std::to_string(BlockBytes(format, geometry)) + " bytes");
  }
  if (slab_bytes != 0 || class_bytes != 0) {
    if (slab_bytes == 0 || class_bytes == 0 || slab_bytes % slot_bytes != 0 || class_bytes % slot_bytes != 0 ||
        class_bytes < BlockBytes(format, geometry) || class_bytes > slab_bytes || num_slots * slot_bytes < slab_bytes) {
      return Status::Invalid("layer-major pool: slab and class bytes must be multiples of slot_bytes, a class "
                             "must hold a block and a slab a class, the image a slab");
    }
  }
  return Status::Ok();
}

size_t HostPool::usable_slots() const {
  if (slab_bytes != 0) return (num_slots * slot_bytes / slab_bytes) * (slab_bytes / slot_bytes);
  const size_t block = BlockBytes(format, geometry);
  return slot_bytes >= block ? num_slots : (num_slots * slot_bytes - block) / slot_bytes + 1;
}

bool HostPool::SlotValid(int64_t s) const {
  if (s < 0 || static_cast<size_t>(s) >= usable_slots()) return false;
  if (slab_bytes == 0) return true;
  return (static_cast<size_t>(s) * slot_bytes % slab_bytes) / class_bytes < slab_bytes / class_bytes;
}

uint8_t* HostPool::Page(size_t slot, uint32_t layer) const {
  if (slab_bytes == 0) return base + slot * slot_bytes + PageOffset(format, geometry, layer);
  const size_t off = slot * slot_bytes, n = slab_bytes / class_bytes, page = PageBytes(format, geometry);
  return base + (off - off % slab_bytes) + layer * n * page + (off % slab_bytes) / class_bytes * page;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToFp16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float Fp16ToFloat(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

namespace {

Status CheckMapping(const HostPool& pool, std::span<const int32_t> slot_ids,
                    std::span<const int32_t> positions, uint32_t layer) {
  if (slot_ids.size() != positions.size()) return Status::Invalid("slot_ids/positions size");
  if (layer >= pool.geometry.num_layers) return Status::Invalid("layer out of range");
  for (size_t i = 0; i < slot_ids.size(); ++i) {
    if (!pool.SlotValid(slot_ids[i])) {
      return Status::Invalid("token " + std::to_string(i) + ": slot id " +
                             std::to_string(slot_ids[i]) + " out of range");
    }
    if (positions[i] < 0 || static_cast<uint32_t>(positions[i]) >= pool.geometry.block_tokens) {
      return Status::Invalid("token " + std::to_string(i) + ": position " +
                             std::to_string(positions[i]) + " out of range");
    }
  }
  return Status::Ok();
}

}  // namespace

Status QuantizeAppendRef(const HostPool& pool, std::span<const float> k, std::span<const float> v,
                         std::span<const int32_t> slot_ids, std::span<const int32_t> positions,
                         uint32_t layer, float k_scale, float v_scale, nvfp4::ScaleRule rule) {
  if (Status s = pool.Validate(); !s.ok()) return s;
  if (pool.format != KvFormat::kNvfp4) return Status::Invalid("pool is not NVFP4");
  const Geometry& g = pool.geometry;
  const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  if (k.size() != slot_ids.size() * row || v.size() != slot_ids.size() * row) {
    return Status::Invalid("k/v size does not match num_tokens * H * D");
  }
  if (!nvfp4::IsValidGlobalScale(k_scale) || !nvfp4::IsValidGlobalScale(v_scale)) {
    return Status::Invalid("bad global scale");
  }
  if (Status s = CheckMapping(pool, slot_ids, positions, layer); !s.ok()) return s;
  if (Status s = nvfp4::CheckFinite(k); !s.ok()) return s;
  if (Status s = nvfp4::CheckFinite(v); !s.ok()) return s;
  const PageLayout pl = MakePageLayout(KvFormat::kNvfp4, g);
  for (size_t i = 0; i < slot_ids.size(); ++i) {
    uint8_t* page = pool.Page(slot_ids[i], layer);
    const uint32_t t = static_cast<uint32_t>(positions[i]);
    for (int side = 0; side < 2; ++side) {
      const float* x = (side == 0 ? k.data() : v.data()) + i * row;
      const size_t base = side == 0 ? pl.k_data : pl.v_data;
      const float gs = side == 0 ? k_scale : v_scale;
      for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; d += nvfp4::kGroupSize) {
          uint8_t* data = page + Nvfp4DataOffset(g, base, h, t, d);
          uint8_t* sf = page + Nvfp4ScaleOffset(g, base, h, t, d);
          *sf = nvfp4::QuantizeGroup(x + h * g.head_dim + d, gs, rule, data);
        }
      }
    }
  }
  return Status::Ok();
}

double PageValue(const HostPool& pool, size_t slot, uint32_t layer, int side, uint32_t h,
                 uint32_t t, uint32_t d, float scale) {
  const Geometry& g = pool.geometry;
  const PageLayout pl = MakePageLayout(pool.format, g);
  const uint8_t* page = pool.Page(slot, layer);
  const size_t idx = (static_cast<size_t>(h) * g.block_tokens + t) * g.head_dim + d;
  switch (pool.format) {
    case KvFormat::kNvfp4: {
      const size_t base = side == 0 ? pl.k_data : pl.v_data;
      const uint8_t byte = page[Nvfp4DataOffset(g, base, h, t, d)];
      const uint8_t code = (d & 1) ? (byte >> 4) : (byte & 0xF);
      const uint8_t sf = page[Nvfp4ScaleOffset(g, base, h, t, d)];
      return static_cast<double>(nvfp4::E2M1ToFloat(code)) *
             static_cast<double>(nvfp4::E4M3ToFloat(sf)) * static_cast<double>(scale);
    }
    case KvFormat::kFp8: {
      const uint8_t b = page[(side == 0 ? pl.k_data : pl.v_data) + idx];
      return static_cast<double>(nvfp4::E4M3ToFloat(b)) * static_cast<double>(scale);
    }
    case KvFormat::kBf16: {
      uint16_t b;
      std::memcpy(&b, page + (side == 0 ? pl.k_data : pl.v_data) + 2 * idx, 2);
      return Bf16ToFloat(b);
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::vector<double> DequantizeRef(const HostPool& pool, std::span<const int32_t> slot_ids,
                                  std::span<const int32_t> positions, uint32_t layer, int side,
                                  float scale) {
  const Geometry& g = pool.geometry;
  std::vector<double> out(slot_ids.size() * g.num_kv_heads * g.head_dim);
  size_t o = 0;
  for (size_t i = 0; i < slot_ids.size(); ++i) {
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        out[o++] = PageValue(pool, slot_ids[i], layer, side, h, positions[i], d, scale);
      }
    }
  }
  return out;
}

Status DecodeRef(const HostPool& pool, const DecodeRefArgs& a, std::vector<double>* out,
                 std::vector<double>* lse) {
  if (Status s = pool.Validate(); !s.ok()) return s;
  const Geometry& g = pool.geometry;
  const int H = static_cast<int>(g.num_kv_heads);
  const int D = static_cast<int>(g.head_dim);
  const int T = static_cast<int>(g.block_tokens);
  if (a.batch < 1 || a.num_q_heads < H || a.num_q_heads % H != 0) {
    return Status::Invalid("bad batch or head counts");
  }
  if (a.q.size() != static_cast<size_t>(a.batch) * a.num_q_heads * D ||
      a.seq_lens.size() != static_cast<size_t>(a.batch) ||
      a.block_table.size() != static_cast<size_t>(a.batch) * a.max_blocks) {
    return Status::Invalid("array sizes do not match the shape");
  }
  if (a.layer >= g.num_layers) return Status::Invalid("layer out of range");
  const int group = a.num_q_heads / H;
  out->assign(static_cast<size_t>(a.batch) * a.num_q_heads * D, 0.0);
  lse->assign(static_cast<size_t>(a.batch) * a.num_q_heads,
              -std::numeric_limits<double>::infinity());
  std::vector<double> kv;  // dequantized K then V of one (b, h): [2][len][D]
  std::vector<double> scores;
  for (int b = 0; b < a.batch; ++b) {
    const int len = a.seq_lens[b];
    if (len < 0 || len > a.max_blocks * T) return Status::Invalid("sequence length out of range");
    for (int blk = 0; blk < (len + T - 1) / T; ++blk) {
      const int32_t slot = a.block_table[static_cast<size_t>(b) * a.max_blocks + blk];
      if (!pool.SlotValid(slot)) {
        return Status::Invalid("block table entry out of range");
      }
    }
    if (len == 0) continue;
    for (int h = 0; h < H; ++h) {
      kv.assign(2 * static_cast<size_t>(len) * D, 0.0);
      for (int t = 0; t < len; ++t) {
        const int32_t slot = a.block_table[static_cast<size_t>(b) * a.max_blocks + t / T];
        for (int d = 0; d < D; ++d) {
          kv[static_cast<size_t>(t) * D + d] = PageValue(pool, slot, a.layer, 0, h, t % T, d, a.k_scale);
          kv[(static_cast<size_t>(len) + t) * D + d] =
              PageValue(pool, slot, a.layer, 1, h, t % T, d, a.v_scale);
        }
      }
      for (int gi = 0; gi < group; ++gi) {
        const int hq = h * group + gi;
        const float* q = a.q.data() + (static_cast<size_t>(b) * a.num_q_heads + hq) * D;
        scores.assign(len, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int t = 0; t < len; ++t) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += static_cast<double>(q[d]) * kv[static_cast<size_t>(t) * D + d];
          s *= static_cast<double>(a.softmax_scale);
          scores[t] = s;
          mx = std::max(mx, s);
        }
        double sum = 0.0;
        for (int t = 0; t < len; ++t) {
          scores[t] = std::exp(scores[t] - mx);
          sum += scores[t];
        }
        double* o = out->data() + (static_cast<size_t>(b) * a.num_q_heads + hq) * D;
        for (int t = 0; t < len; ++t) {
          const double p = scores[t] / sum;
          const double* vr = kv.data() + (static_cast<size_t>(len) + t) * D;
          for (int d = 0; d < D; ++d) o[d] += p * vr[d];
        }
        (*lse)[static_cast<size_t>(b) * a.num_q_heads + hq] = mx + std::log(sum);
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvtier::kernels
