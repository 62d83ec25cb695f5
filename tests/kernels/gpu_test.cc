// GPU kernels of kernels/include/kvtier/kernels.h against the CPU references
// (kernels/reference.h): quantize_append byte for byte against the codec, decode against
// float64 attention over the dequantized cache, dequantize_pages against PageValue.
// Every run draws fresh random inputs (never zeros), poisons outputs first, and leaves
// positions past each sequence's end full of random bytes so masking is tested too.
// Skips, saying why, where no CUDA device exists.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "formats/nvfp4.h"
#include "kernels/include/kvtier/kernels.h"
#include "kernels/reference.h"

namespace kvtier::kernels {
namespace {

bool GpuPresent(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    *why = "no CUDA device: cudaGetDeviceCount() = 0";
    return false;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  if (p.major < 9) {
    *why = "GPU " + std::string(p.name) + " is older than sm_90, which these kernels are built for";
    return false;
  }
  return true;
}

#define SKIP_WITHOUT_GPU()                          \
  do {                                              \
    std::string why;                                \
    if (!GpuPresent(&why)) GTEST_SKIP() << why;     \
  } while (0)

#define CUDA_OK(x)                                                       \
  do {                                                                   \
    const cudaError_t e_ = (x);                                          \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_);  \
  } while (0)

// Device buffer (RAII).
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) p = nullptr;
  }
  ~Dev() { if (p) cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  void Put(const void* src) { ASSERT_EQ(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice), cudaSuccess); }
  void Get(void* dst) const { ASSERT_EQ(cudaMemcpy(dst, p, n, cudaMemcpyDeviceToHost), cudaSuccess); }
};

Geometry G(uint32_t L, uint32_t H, uint32_t D, uint32_t T) {
  Geometry g;
  g.num_layers = L;
  g.num_kv_heads = H;
  g.head_dim = D;
  g.block_tokens = T;
  return g;
}

void FillRandom(std::vector<uint8_t>& v, std::mt19937_64& rng) {
  size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, 8);
  }
  for (; i < v.size(); ++i) v[i] = static_cast<uint8_t>(rng());
}

// A pool of random bytes, on the host (reference) and on the device. per_slab = 0: block-
// major, slot k at k * SlotBytes. per_slab = N: layer-major slabs of N slots (kvt_pool
// slab_bytes / class_bytes) whose slot-id stride is the class / granule_div, with
// tail_granules of unused bytes after a slab's N slots (as kvtierd's HBM arena); the k-th
// slot's id is Id(k) (k itself when granule_div is 1 and there is no tail).
struct TestPool {
  TestPool(KvFormat f, Geometry g, size_t slots, std::mt19937_64& rng, uint32_t per_slab = 0,
           uint32_t granule_div = 1, uint32_t tail_granules = 0) {
    hp.format = f;
    hp.geometry = g;
    size_t bytes = 0;
    if (per_slab == 0) {
      hp.num_slots = slots;
      hp.slot_bytes = SlotBytes(f, g);
      bytes = hp.slot_bytes * slots;
    } else {
      const size_t unit = 16 * granule_div;
      hp.class_bytes = (SlotBytes(f, g) + unit - 1) / unit * unit;
      hp.slot_bytes = hp.class_bytes / granule_div;
      hp.slab_bytes = per_slab * hp.class_bytes + tail_granules * hp.slot_bytes;
      per_slab_ = per_slab;
      const size_t slabs = (slots + per_slab - 1) / per_slab;
      bytes = slabs * hp.slab_bytes;
      hp.num_slots = bytes / hp.slot_bytes;
    }
    host.resize(bytes);
    FillRandom(host, rng);
    hp.base = host.data();
    dev = std::make_unique<Dev>(host.size());
    desc.base = dev->p;
    desc.slot_bytes = hp.slot_bytes;
    desc.num_slots = hp.num_slots;
    desc.num_layers = g.num_layers;
    desc.num_kv_heads = g.num_kv_heads;
    desc.head_dim = g.head_dim;
    desc.block_tokens = g.block_tokens;
    desc.format = static_cast<uint32_t>(f);
    desc.slab_bytes = hp.slab_bytes;
    desc.class_bytes = hp.class_bytes;
  }
  // The slot id of the k-th slot.
  int32_t Id(size_t k) const {
    if (per_slab_ == 0) return static_cast<int32_t>(k);
    return static_cast<int32_t>((k / per_slab_ * hp.slab_bytes + k % per_slab_ * hp.class_bytes) / hp.slot_bytes);
  }
  uint32_t per_slab_ = 0;
  void Upload() { dev->Put(host.data()); }
  HostPool hp;
  std::vector<uint8_t> host;
  std::unique_ptr<Dev> dev;
  kvt_pool desc{};
};

// ---- quantize_append ------------------------------------------------------------------

struct QuantCase {
  uint32_t D;
  uint32_t T;
  bool fp16;
  nvfp4::ScaleRule rule;
};

// Readable parameter names in test listings (ctest -N).
void PrintTo(const QuantCase& c, std::ostream* os) {
  *os << "D=" << c.D << " T=" << c.T << (c.fp16 ? " fp16" : " bf16")
      << (c.rule == nvfp4::ScaleRule::kMax6 ? " max6" : " 4over6");
}

class QuantizeAppend : public ::testing::TestWithParam<QuantCase> {};

// Values that hit every rounding path: normal data at many magnitudes, exact E2M1 ties,
// all-zero groups, equal magnitudes, groups far below the global scale, negative values
// rounding to -0.
float DrawValue(std::mt19937_64& rng, int group_kind, float mag) {
  std::normal_distribution<float> nd(0.f, 1.f);
  switch (group_kind) {
    case 0: return nd(rng) * mag;
    case 1: {  // multiples of mag/8: exact ties between E2M1 steps after scaling
      const int k = static_cast<int>(rng() % 49) - 24;
      return static_cast<float>(k) * mag / 8.0f;
    }
    case 2: return (rng() % 16 == 0) ? nd(rng) * mag : 0.0f;  // mostly zeros, some values
    case 3: return static_cast<float>(static_cast<int>(rng() % 3) - 1) * 0.75f * mag;  // equal magnitudes
    default: return nd(rng) * mag * 1e-3f;                      // tiny against the scale
  }
}

TEST_P(QuantizeAppend, BitIdenticalToCodec) {
  SKIP_WITHOUT_GPU();
  const QuantCase c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  const uint32_t H = 2 + static_cast<uint32_t>(rng() % 3);
  const Geometry g = G(3, H, c.D, c.T);
  const size_t slots = 11;
  TestPool pool(KvFormat::kNvfp4, g, slots, rng);
  pool.Upload();
  // Distinct (slot, position) pairs in random order; some tokens write layer 2.
  std::vector<int32_t> all(slots * c.T);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const int n = 1 + static_cast<int>(rng() % (slots * c.T));
  std::vector<int32_t> sl(n), ps(n);
  for (int i = 0; i < n; ++i) {
    sl[i] = all[i] / static_cast<int32_t>(c.T);
    ps[i] = all[i] % static_cast<int32_t>(c.T);
  }
  const size_t row = static_cast<size_t>(H) * c.D;
  // bf16: a third of the runs scale values and global scales by 2^40 or 2^-40 (exact), so
  // that the scales leave the range where the 4over6 path divides by a reciprocal
  // (LadderScaleHasRcp) and it takes the division instead.
  const int shift = !c.fp16 && rng() % 3 == 0 ? (rng() % 2 ? 40 : -40) : 0;
  std::vector<float> kf(n * row), vf(n * row);
  std::vector<uint16_t> k16(n * row), v16(n * row);
  for (int side = 0; side < 2; ++side) {
    auto& f = side ? vf : kf;
    auto& b = side ? v16 : k16;
    for (size_t gi = 0; gi < f.size() / 16; ++gi) {
      const int kind = static_cast<int>(rng() % 5);
      const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 12) - 6);
      for (int i = 0; i < 16; ++i) {
        const float x = std::ldexp(DrawValue(rng, kind, mag), shift);
        b[gi * 16 + i] = c.fp16 ? FloatToFp16(x) : FloatToBf16(x);
        f[gi * 16 + i] = c.fp16 ? Fp16ToFloat(b[gi * 16 + i]) : Bf16ToFloat(b[gi * 16 + i]);
      }
    }
  }
  const float k_scale = std::ldexp(1.0f, static_cast<int>(rng() % 10) - 12 + shift) * 1.37f;
  const float v_scale = std::ldexp(1.0f, static_cast<int>(rng() % 10) - 12 + shift) * 0.71f;
  const uint32_t layer = static_cast<uint32_t>(rng() % 3);

  Dev dk(k16.size() * 2), dv(v16.size() * 2), ds(n * 4), dp(n * 4), flag(4);
  dk.Put(k16.data());
  dv.Put(v16.data());
  ds.Put(sl.data());
  dp.Put(ps.data());
  CUDA_OK(cudaMemset(flag.p, 0, 4));
  kvt_quantize_params q{};
  q.k = dk.p;
  q.v = dv.p;
  q.dtype = c.fp16 ? KVT_DTYPE_FP16 : KVT_DTYPE_BF16;
  q.num_tokens = n;
  q.slot_ids = ds.as<int32_t>();
  q.positions = dp.as<int32_t>();
  q.slot_ids_host = sl.data();
  q.positions_host = ps.data();
  q.layer = layer;
  q.k_scale = k_scale;
  q.v_scale = v_scale;
  q.scale_rule = static_cast<uint32_t>(c.rule);
  q.error_flag = flag.as<int32_t>();
  ASSERT_EQ(kvt_quantize_append(&pool.desc, &q, nullptr), KVT_OK) << kvt_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(QuantizeAppendRef(pool.hp, kf, vf, sl, ps, layer, k_scale, v_scale, c.rule).ok());
  std::vector<uint8_t> got(pool.host.size());
  pool.dev->Get(got.data());
  size_t first_diff = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pool.host[i]) {
      first_diff = i;
      break;
    }
  }
  EXPECT_EQ(first_diff, got.size()) << "first differing pool byte at offset " << first_diff;
  int32_t f = -1;
  flag.Get(&f);
  EXPECT_EQ(f, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantizeAppend,
    ::testing::Values(QuantCase{64, 16, false, nvfp4::ScaleRule::kMax6},
                      QuantCase{128, 16, false, nvfp4::ScaleRule::kMax6},
                      QuantCase{128, 64, true, nvfp4::ScaleRule::kMax6},
                      QuantCase{256, 32, false, nvfp4::ScaleRule::kMax6},
                      QuantCase{128, 16, false, nvfp4::ScaleRule::k4over6},
                      QuantCase{64, 32, true, nvfp4::ScaleRule::k4over6},
                      QuantCase{128, 64, true, nvfp4::ScaleRule::k4over6},
                      QuantCase{256, 16, false, nvfp4::ScaleRule::k4over6},
                      QuantCase{64, 64, false, nvfp4::ScaleRule::k4over6}),
    [](const auto& info) {
      const QuantCase& c = info.param;
      return "D" + std::to_string(c.D) + "_T" + std::to_string(c.T) + (c.fp16 ? "_fp16" : "_bf16") +
             (c.rule == nvfp4::ScaleRule::kMax6 ? "_max6" : "_4over6");
    });

TEST(QuantizeAppendGuards, RefusesOutOfRangeAndSkipsNonFinite) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Geometry g = G(1, 1, 64, 16);
  TestPool pool(KvFormat::kNvfp4, g, 2, rng);
  pool.Upload();
  std::vector<uint16_t> k(3 * 64), v(3 * 64);
  for (auto& x : k) x = FloatToBf16(std::normal_distribution<float>(0.f, 1.f)(rng));
  for (auto& x : v) x = FloatToBf16(std::normal_distribution<float>(0.f, 1.f)(rng));
  std::vector<int32_t> sl = {0, 1, 2}, ps = {0, 1, 2};  // slot 2 does not exist
  Dev dk(k.size() * 2), dv(v.size() * 2), ds(12), dp(12), flag(4);
  dk.Put(k.data());
  dv.Put(v.data());
  ds.Put(sl.data());
  dp.Put(ps.data());
  CUDA_OK(cudaMemset(flag.p, 0, 4));
  kvt_quantize_params q{};
  q.k = dk.p;
  q.v = dv.p;
  q.num_tokens = 3;
  q.slot_ids = ds.as<int32_t>();
  q.positions = dp.as<int32_t>();
  q.slot_ids_host = sl.data();
  q.positions_host = ps.data();
  q.k_scale = q.v_scale = 0.01f;
  q.error_flag = flag.as<int32_t>();
  // Host copies: refused before launch, pool unchanged.
  EXPECT_EQ(kvt_quantize_append(&pool.desc, &q, nullptr), KVT_INVALID);
  EXPECT_NE(std::string(kvt_last_error()).find("out of range"), std::string::npos) << kvt_last_error();
  // Without host copies: the kernel skips the bad token and raises the flag.
  q.slot_ids_host = q.positions_host = nullptr;
  ASSERT_EQ(kvt_quantize_append(&pool.desc, &q, nullptr), KVT_OK) << kvt_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  int32_t f = 0;
  flag.Get(&f);
  EXPECT_NE(f & 1, 0);
  // Non-finite value in token 0's first K group: that group is skipped (bytes unchanged).
  CUDA_OK(cudaMemset(flag.p, 0, 4));
  pool.Upload();
  k[3] = 0x7F80;  // +inf in bf16
  dk.Put(k.data());
  sl = {0, 1, 1};
  ps = {0, 1, 2};
  ds.Put(sl.data());
  ASSERT_EQ(kvt_quantize_append(&pool.desc, &q, nullptr), KVT_OK) << kvt_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  flag.Get(&f);
  EXPECT_NE(f & 2, 0);
  std::vector<uint8_t> got(pool.host.size());
  pool.dev->Get(got.data());
  const PageLayout pl = MakePageLayout(KvFormat::kNvfp4, g);
  EXPECT_EQ(0, std::memcmp(got.data() + Nvfp4DataOffset(g, pl.k_data, 0, 0, 0),
                           pool.host.data() + Nvfp4DataOffset(g, pl.k_data, 0, 0, 0), 8));
  // Bad arguments are refused with a reason.
  kvt_quantize_params bad = q;
  bad.k_scale = 0.f;
  EXPECT_EQ(kvt_quantize_append(&pool.desc, &bad, nullptr), KVT_INVALID);
  bad = q;
  bad.layer = 1;
  EXPECT_EQ(kvt_quantize_append(&pool.desc, &bad, nullptr), KVT_INVALID);
}

// ---- decode ---------------------------------------------------------------------------

struct DecodeCase {
  KvFormat fmt;
  uint32_t D, T;
  int group;
  int H;
  int batch;        // 0: random 1..6
  int max_len;      // longest sequence; lengths are ragged below it
  int splits;       // -1: random choice (0 = auto, 1, or 2..9)
};

std::string CaseName(const DecodeCase& c) {
  return std::string(KvFormatName(c.fmt)) + "_D" + std::to_string(c.D) + "_T" + std::to_string(c.T) +
         "_G" + std::to_string(c.group) + "_H" + std::to_string(c.H) + "_B" + std::to_string(c.batch) +
         "_L" + std::to_string(c.max_len);
}

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << CaseName(c) << " splits=" << c.splits; }

// Writes token t of (slot, layer) in `pool` with fresh random K and V values.
void WriteToken(TestPool& pool, size_t slot, uint32_t layer, uint32_t t, float ks, float vs,
                std::mt19937_64& rng, float kmag, float vmag) {
  const Geometry& g = pool.hp.geometry;
  const PageLayout pl = MakePageLayout(pool.hp.format, g);
  uint8_t* page = pool.hp.Page(slot, layer);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(g.head_dim);
  for (int side = 0; side < 2; ++side) {
    const float mag = side ? vmag : kmag;
    const float gs = side ? vs : ks;
    const size_t base = side ? pl.v_data : pl.k_data;
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      // Per-token magnitude varies so block scales differ.
      const float tok_mag = mag * std::exp(0.5f * nd(rng));
      for (auto& v : x) v = nd(rng) * tok_mag;
      const size_t idx = (static_cast<size_t>(h) * g.block_tokens + t) * g.head_dim;
      switch (pool.hp.format) {
        case KvFormat::kNvfp4:
          for (uint32_t d = 0; d < g.head_dim; d += 16) {
            page[Nvfp4ScaleOffset(g, base, h, t, d)] =
                nvfp4::QuantizeGroup(x.data() + d, gs, nvfp4::ScaleRule::kMax6,
                                     page + Nvfp4DataOffset(g, base, h, t, d));
          }
          break;
        case KvFormat::kFp8:
          for (uint32_t d = 0; d < g.head_dim; ++d) page[base + idx + d] = nvfp4::FloatToE4M3(x[d] / gs);
          break;
        case KvFormat::kBf16:
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint16_t b = FloatToBf16(x[d]);
            std::memcpy(page + base + 2 * (idx + d), &b, 2);
          }
          break;
      }
    }
  }
}

struct DecodeSetup {
  std::unique_ptr<TestPool> pool;
  std::vector<int32_t> bt, lens;
  std::vector<uint16_t> q16;
  std::vector<float> qf;
  int batch = 0, hq = 0, max_blocks = 0, max_len = 0;
  uint32_t layer = 1;
  float ks = 1.f, vs = 1.f, softmax_scale = 1.f;
};

// `nvfp4_scale` > 0 fixes the NVFP4 global scales (otherwise one of three regimes).
// per_slab > 0: a layer-major pool of per_slab slots per slab, the slot-id stride half a
// class, a granule of tail per slab (TestPool).
void MakeSetup(const DecodeCase& c, std::mt19937_64& rng, DecodeSetup* s, float nvfp4_scale = 0.f,
               uint32_t per_slab = 0) {
  s->batch = c.batch > 0 ? c.batch : 1 + static_cast<int>(rng() % 6);
  s->hq = c.H * c.group;
  s->lens.resize(s->batch);
  for (int b = 0; b < s->batch; ++b) {
    s->lens[b] = b == 0 ? c.max_len : 1 + static_cast<int>(rng() % c.max_len);
  }
  std::shuffle(s->lens.begin(), s->lens.end(), rng);
  s->max_len = c.max_len;
  s->max_blocks = (c.max_len + static_cast<int>(c.T) - 1) / static_cast<int>(c.T) + static_cast<int>(rng() % 3);
  int used = 0;
  for (int l : s->lens) used += (l + static_cast<int>(c.T) - 1) / static_cast<int>(c.T);
  const size_t slots = static_cast<size_t>(used) + 3;
  const Geometry g = G(2, static_cast<uint32_t>(c.H), c.D, c.T);
  s->pool = per_slab == 0 ? std::make_unique<TestPool>(c.fmt, g, slots, rng)
                          : std::make_unique<TestPool>(c.fmt, g, slots, rng, per_slab, 2, 1);
  // Slots in random order; unused table entries hold random (possibly invalid) values.
  std::vector<int32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s->bt.assign(static_cast<size_t>(s->batch) * s->max_blocks, 0);
  for (auto& e : s->bt) e = static_cast<int32_t>(rng() % 100000) - 50000;
  std::normal_distribution<float> nd(0.f, 1.f);
  // Global scales: calibrated-like for FP8; for NVFP4 one of several regimes, including
  // scale 1 (block scales then small, decoded values deep in fp16's subnormals).
  if (c.fmt == KvFormat::kNvfp4) {
    const float choices[] = {1.0f, 0.05f, 4.0f / (448.f * 6.f)};
    s->ks = nvfp4_scale > 0.f ? nvfp4_scale : choices[rng() % 3];
    s->vs = nvfp4_scale > 0.f ? nvfp4_scale : choices[rng() % 3];
  } else if (c.fmt == KvFormat::kFp8) {
    s->ks = 8.f / 448.f * (0.5f + static_cast<float>(rng() % 100) / 100.f);
    s->vs = 8.f / 448.f * (0.5f + static_cast<float>(rng() % 100) / 100.f);
  }
  const float kmag = 0.5f + static_cast<float>(rng() % 100) / 100.f;
  const float vmag = 0.5f + static_cast<float>(rng() % 100) / 100.f;
  int next = 0;
  for (int b = 0; b < s->batch; ++b) {
    const int nblk = (s->lens[b] + static_cast<int>(c.T) - 1) / static_cast<int>(c.T);
    for (int blk = 0; blk < nblk; ++blk) {
      const int32_t slot = s->pool->Id(static_cast<size_t>(perm[next++]));
      s->bt[static_cast<size_t>(b) * s->max_blocks + blk] = slot;
      const int toks = std::min<int>(static_cast<int>(c.T), s->lens[b] - blk * static_cast<int>(c.T));
      for (int t = 0; t < toks; ++t) {
        WriteToken(*s->pool, slot, s->layer, static_cast<uint32_t>(t), s->ks, s->vs, rng, kmag, vmag);
      }
    }
  }
  s->pool->Upload();
  s->q16.resize(static_cast<size_t>(s->batch) * s->hq * c.D);
  s->qf.resize(s->q16.size());
  for (size_t i = 0; i < s->q16.size(); ++i) {
    s->q16[i] = FloatToBf16(nd(rng));
    s->qf[i] = Bf16ToFloat(s->q16[i]);
  }
  // From flat to peaked attention.
  s->softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.D)) * (0.5f + static_cast<float>(rng() % 350) / 100.f);
}

struct DecodeRun {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  int32_t flag = 0;
};

// The decode parameters of `s` over these device buffers (no host copies, no workspace).
kvt_decode_params DecodeParams(const DecodeSetup& s, int splits, const Dev& dq, const Dev& dout, const Dev& dlse,
                               const Dev& dbt, const Dev& dlen, const Dev& flag) {
  kvt_decode_params p{};
  p.q = dq.p;
  p.out = dout.p;
  p.lse = dlse.as<float>();
  p.block_table = dbt.as<int32_t>();
  p.seq_lens = dlen.as<int32_t>();
  p.batch = s.batch;
  p.num_q_heads = s.hq;
  p.max_blocks = s.max_blocks;
  p.max_seq_len = s.max_len;
  p.layer = s.layer;
  p.k_scale = s.ks;
  p.v_scale = s.vs;
  p.softmax_scale = s.softmax_scale;
  p.num_splits = splits;
  p.error_flag = flag.as<int32_t>();
  return p;
}

// Runs kvt_decode with poisoned outputs. Returns the kvt status.
// With `probe`, runs kvt_decode_read_probe instead (which must leave the outputs alone).
int RunDecode(DecodeSetup& s, int splits, bool host_copies, DecodeRun* r, std::string* err,
              bool probe = false) {
  const kvt_pool& pool = s.pool->desc;
  const uint32_t D = pool.head_dim;
  Dev dq(s.q16.size() * 2), dout(s.q16.size() * 2), dlse(static_cast<size_t>(s.batch) * s.hq * 4),
      dbt(s.bt.size() * 4), dlen(s.lens.size() * 4), flag(4);
  dq.Put(s.q16.data());
  dbt.Put(s.bt.data());
  dlen.Put(s.lens.data());
  cudaMemset(dout.p, 0xFF, dout.n);  // NaN in bf16
  cudaMemset(dlse.p, 0xFF, dlse.n);  // NaN in f32
  cudaMemset(flag.p, 0, 4);
  kvt_decode_params p = DecodeParams(s, splits, dq, dout, dlse, dbt, dlen, flag);
  p.block_table_host = host_copies ? s.bt.data() : nullptr;
  p.seq_lens_host = host_copies ? s.lens.data() : nullptr;
  const uint64_t ws = kvt_decode_workspace_bytes(&pool, &p);
  Dev dws(ws);
  p.workspace = ws ? dws.p : nullptr;
  p.workspace_bytes = ws;
  const int rc = probe ? kvt_decode_read_probe(&pool, &p, nullptr) : kvt_decode(&pool, &p, nullptr);
  *err = kvt_last_error();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    *err = std::string("cuda: ") + cudaGetErrorString(e);
    return KVT_CUDA_ERROR;
  }
  r->out.resize(s.q16.size());
  r->lse.resize(static_cast<size_t>(s.batch) * s.hq);
  dout.Get(r->out.data());
  dlse.Get(r->lse.data());
  flag.Get(&r->flag);
  (void)D;
  return rc;
}

class Decode : public ::testing::TestWithParam<DecodeCase> {};

// Checks a decode's outputs `r` for `s` against float64 attention over the dequantized
// cache: relative L2 of the output <= 5e-3, LSE within 2e-3, nothing left unwritten.
void ExpectMatchesReference(const DecodeSetup& s, const DecodeRun& r, const std::string& what) {
  DecodeRefArgs a;
  a.q = s.qf;
  a.block_table = s.bt;
  a.seq_lens = s.lens;
  a.batch = s.batch;
  a.num_q_heads = s.hq;
  a.max_blocks = s.max_blocks;
  a.layer = s.layer;
  a.k_scale = s.ks;
  a.v_scale = s.vs;
  a.softmax_scale = s.softmax_scale;
  std::vector<double> ref, ref_lse;
  ASSERT_TRUE(DecodeRef(s.pool->hp, a, &ref, &ref_lse).ok());
  double num = 0, den = 0;
  size_t nonfinite = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = Bf16ToFloat(r.out[i]);
    if (!std::isfinite(got)) ++nonfinite;
    num += (got - ref[i]) * (got - ref[i]);
    den += ref[i] * ref[i];
  }
  ASSERT_EQ(nonfinite, 0u) << "outputs left unwritten (poison) or NaN, " << what;
  const double rel = std::sqrt(num / den);
  EXPECT_LE(rel, 5e-3) << "relative L2 error, " << what << " batch=" << s.batch;
  double lse_err = 0;
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    lse_err = std::max(lse_err, std::fabs(static_cast<double>(r.lse[i]) - ref_lse[i]) /
                                    std::max(1.0, std::fabs(ref_lse[i])));
  }
  EXPECT_LE(lse_err, 2e-3) << "log-sum-exp error, " << what;
  ::testing::Test::RecordProperty("rel_l2", std::to_string(rel));
}

// Runs the decode on `s` and checks it against the reference.
void CheckDecodeAgainstReference(DecodeSetup& s, int splits) {
  DecodeRun r;
  std::string err;
  ASSERT_EQ(RunDecode(s, splits, true, &r, &err), KVT_OK) << err;
  EXPECT_EQ(r.flag, 0);
  ExpectMatchesReference(s, r, "splits=" + std::to_string(splits));
}

TEST_P(Decode, MatchesFloat64ReferenceOverDequantizedCache) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  DecodeSetup s;
  MakeSetup(c, rng, &s);
  int splits = c.splits;
  if (splits < 0) {
    const int pick = static_cast<int>(rng() % 3);
    splits = pick == 0 ? 0 : (pick == 1 ? 1 : 2 + static_cast<int>(rng() % 8));
  }
  CheckDecodeAgainstReference(s, splits);
}

std::vector<DecodeCase> AllDecodeCases() {
  std::vector<DecodeCase> v;
  for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
    for (uint32_t D : {64u, 128u, 256u}) {
      if (D == 256 && f != KvFormat::kNvfp4) continue;
      for (uint32_t T : {16u, 32u, 64u}) {
        for (int grp : {1, 2, 4, 8}) v.push_back({f, D, T, grp, 2, 0, 700, -1});
      }
    }
  }
  // Batch 64, short and ragged; batch 1 at 32K and 128K; context 1.
  v.push_back({KvFormat::kNvfp4, 128, 16, 4, 8, 64, 300, -1});
  v.push_back({KvFormat::kFp8, 128, 16, 4, 8, 64, 200, -1});
  v.push_back({KvFormat::kBf16, 128, 64, 4, 8, 64, 200, -1});
  v.push_back({KvFormat::kNvfp4, 128, 64, 4, 2, 1, 32768, 0});
  v.push_back({KvFormat::kNvfp4, 128, 16, 8, 1, 1, 131072, 0});
  v.push_back({KvFormat::kNvfp4, 128, 64, 4, 1, 1, 131072, 0});
  v.push_back({KvFormat::kFp8, 128, 16, 4, 1, 1, 65536, 0});
  // More than 8192 splits: the merge computes its weights per thread, not in shared memory.
  v.push_back({KvFormat::kNvfp4, 64, 16, 2, 1, 1, 140000, 8750});
  // 257..8192 partials per row (625 splits of 32 tokens, not a multiple of 4): the merge
  // keeps the weights in shared memory and makes two passes.
  v.push_back({KvFormat::kNvfp4, 128, 16, 4, 1, 1, 20000, 625});
  v.push_back({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 1, -1});
  v.push_back({KvFormat::kNvfp4, 64, 32, 2, 4, 5, 17, -1});
  // Split counts that are multiples of the warps per CTA: the CTA merges its warps' splits
  // (4 splits: the CTA writes the output itself, no merge kernel); ragged lengths leave
  // some of a CTA's splits empty.
  v.push_back({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 2000, 4});
  v.push_back({KvFormat::kNvfp4, 128, 64, 8, 2, 5, 3000, 8});
  v.push_back({KvFormat::kNvfp4, 256, 32, 1, 2, 2, 1500, 12});
  v.push_back({KvFormat::kFp8, 128, 16, 4, 2, 3, 2000, 12});
  v.push_back({KvFormat::kBf16, 64, 32, 2, 2, 3, 2000, 16});
  // 64 and 40 splits: 16 and 10 CTA partials per row for the merge kernel.
  v.push_back({KvFormat::kNvfp4, 128, 16, 4, 2, 2, 8000, 64});
  v.push_back({KvFormat::kFp8, 64, 16, 2, 4, 2, 5000, 40});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Decode, ::testing::ValuesIn(AllDecodeCases()),
                         [](const auto& info) { return CaseName(info.param); });

// Scores that pass the running max late in a split: sequence 0's "spike" tokens give the
// first query of each KV head a score about 6, then 26, then 90 log2 units above every
// score before it (K = A * sign(q), measured against the random tokens' max). Random
// scores take the lazy max's slow path after a split's first pair only by chance; here it
// must rescale a running O and l mid-split every time (26 and 90 log2 units: weights far
// outside fp16 if the max did not move), and a 6-unit rise must not disturb the kept max.
// The spikes sit well after the first 32 tokens of their split (splits 1 and 4). With the
// O rescale removed from the slow path (mutation check, docs/kernels.md), all 13 cases
// fail, and 36 of the 48 random NVFP4 Decode cases.
class DecodeJumps : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeJumps, LateScoreJumpsMatchReference) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  DecodeSetup s;
  MakeSetup(c, rng, &s, 0.05f);
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const Geometry& g = s.pool->hp.geometry;
  const int b = static_cast<int>(std::max_element(s.lens.begin(), s.lens.end()) - s.lens.begin());
  ASSERT_EQ(s.lens[b], c.max_len);
  const double to_log2 = s.softmax_scale / std::log(2.0);
  std::vector<float> x(c.D);
  for (int h = 0; h < c.H; ++h) {
    const float* q = s.qf.data() + (static_cast<size_t>(b) * s.hq + static_cast<size_t>(h) * c.group) * c.D;
    // The random tokens' max score of this query (float64 over the dequantized cache).
    double qabs = 0;
    for (uint32_t d = 0; d < c.D; ++d) qabs += std::fabs(q[d]);
    double top = -1e300;
    for (int t = 0; t < c.max_len; ++t) {
      const int32_t slot = s.bt[static_cast<size_t>(b) * s.max_blocks + t / static_cast<int>(c.T)];
      double dot = 0;
      for (uint32_t d = 0; d < c.D; ++d) {
        dot += static_cast<double>(q[d]) * PageValue(s.pool->hp, static_cast<size_t>(slot), s.layer, 0,
                                                     static_cast<uint32_t>(h),
                                                     static_cast<uint32_t>(t % static_cast<int>(c.T)), d, s.ks);
      }
      top = std::max(top, dot);
    }
    double level = top;
    const int pos[3] = {300, 1500, 3000};
    const double jump[3] = {6, 26, 90};
    for (int i = 0; i < 3; ++i) {
      level += jump[i] / to_log2;
      const float A = static_cast<float>(level / qabs);
      for (uint32_t d = 0; d < c.D; ++d) x[d] = q[d] < 0.f ? -A : A;
      const int t = pos[i];
      const int32_t slot = s.bt[static_cast<size_t>(b) * s.max_blocks + t / static_cast<int>(c.T)];
      uint8_t* page = s.pool->hp.Page(static_cast<size_t>(slot), s.layer);
      const PageLayout pl = MakePageLayout(KvFormat::kNvfp4, g);
      const uint32_t tt = static_cast<uint32_t>(t % static_cast<int>(c.T));
      for (uint32_t d = 0; d < c.D; d += 16) {
        page[Nvfp4ScaleOffset(g, pl.k_data, static_cast<uint32_t>(h), tt, d)] = nvfp4::QuantizeGroup(
            x.data() + d, s.ks, nvfp4::ScaleRule::kMax6, page + Nvfp4DataOffset(g, pl.k_data, static_cast<uint32_t>(h), tt, d));
      }
    }
  }
  s.pool->Upload();
  CheckDecodeAgainstReference(s, c.splits);
}

std::vector<DecodeCase> JumpCases() {
  std::vector<DecodeCase> v;
  for (uint32_t D : {64u, 128u, 256u}) {
    for (uint32_t T : {16u, 64u}) {
      for (int splits : {1, 4}) v.push_back({KvFormat::kNvfp4, D, T, 4, 2, 1, 4096, splits});
    }
  }
  v.push_back({KvFormat::kNvfp4, 128, 16, 8, 2, 1, 4096, 1});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Spikes, DecodeJumps, ::testing::ValuesIn(JumpCases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) {
                           return CaseName(i.param) + "_S" + std::to_string(i.param.splits);
                         });

TEST(DecodeGuards, OutOfRangeBlockTableIsRefusedNotRead) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  DecodeSetup s;
  MakeSetup({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 500, 0}, rng, &s);
  // Corrupt one used entry of sequence `bad_b`.
  int bad_b = 0;
  for (int b = 0; b < s.batch; ++b) {
    if (s.lens[b] > 16) bad_b = b;
  }
  s.bt[static_cast<size_t>(bad_b) * s.max_blocks + 1] = static_cast<int32_t>(s.pool->desc.num_slots);
  DecodeRun r;
  std::string err;
  // With host copies: refused before launch, outputs untouched (still poison).
  EXPECT_EQ(RunDecode(s, 0, true, &r, &err), KVT_INVALID);
  EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  for (uint16_t x : r.out) ASSERT_EQ(x, 0xFFFF);
  // Without host copies: a huge entry is met by the kernel, which skips it, flags it
  // and writes NaN for that sequence; the other sequences are still right.
  s.bt[static_cast<size_t>(bad_b) * s.max_blocks + 1] = 1 << 30;
  ASSERT_EQ(RunDecode(s, 0, false, &r, &err), KVT_OK) << err;
  EXPECT_NE(r.flag & 1, 0);
  const size_t per_b = static_cast<size_t>(s.hq) * s.pool->desc.head_dim;
  for (int b = 0; b < s.batch; ++b) {
    for (size_t i = 0; i < per_b; ++i) {
      const float v = Bf16ToFloat(r.out[b * per_b + i]);
      if (b == bad_b) {
        ASSERT_TRUE(std::isnan(v)) << "sequence with a refused entry must not produce numbers";
      } else {
        ASSERT_TRUE(std::isfinite(v));
      }
    }
  }
  // The same through the CTA merge of 4 and 8 splits (one partial per CTA, or the output
  // written by the CTA itself): NaN must reach that sequence's outputs, and only those.
  for (int splits : {4, 8}) {
    ASSERT_EQ(RunDecode(s, splits, false, &r, &err), KVT_OK) << err;
    EXPECT_NE(r.flag & 1, 0);
    for (int b = 0; b < s.batch; ++b) {
      for (size_t i = 0; i < per_b; ++i) {
        const float v = Bf16ToFloat(r.out[b * per_b + i]);
        ASSERT_EQ(std::isnan(v), b == bad_b) << "splits=" << splits << " b=" << b;
      }
    }
  }
  // The page-read probe walks the same table: it flags the entry, writes nothing.
  ASSERT_EQ(RunDecode(s, 0, false, &r, &err, /*probe=*/true), KVT_OK) << err;
  EXPECT_NE(r.flag & 1, 0);
  for (uint16_t x : r.out) ASSERT_EQ(x, 0xFFFF);
  // Negative entry, same.
  s.bt[static_cast<size_t>(bad_b) * s.max_blocks + 1] = -5;
  EXPECT_EQ(RunDecode(s, 3, true, &r, &err), KVT_INVALID);
  // Sequence longer than max_seq_len: refused on the host.
  s.bt[static_cast<size_t>(bad_b) * s.max_blocks + 1] = 0;
  s.lens[0] = s.max_len + 1;
  EXPECT_EQ(RunDecode(s, 0, true, &r, &err), KVT_INVALID);
}

TEST(DecodeReadProbe, ReadsTheDecodePagesAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (int splits : {0, 1, 4, 5}) {
    DecodeSetup s;
    MakeSetup({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 3000, splits}, rng, &s);
    DecodeRun r;
    std::string err;
    ASSERT_EQ(RunDecode(s, splits, true, &r, &err, /*probe=*/true), KVT_OK) << err;
    EXPECT_EQ(r.flag, 0);
    for (uint16_t x : r.out) ASSERT_EQ(x, 0xFFFF) << "the probe must not write outputs";
    for (float x : r.lse) ASSERT_TRUE(std::isnan(x)) << "the probe must not write lse";
    // The decode itself over the same setup writes every output.
    ASSERT_EQ(RunDecode(s, splits, true, &r, &err), KVT_OK) << err;
    for (uint16_t x : r.out) ASSERT_TRUE(std::isfinite(Bf16ToFloat(x)));
  }
  // Other formats are refused with a reason, and nothing runs.
  DecodeSetup s;
  MakeSetup({KvFormat::kFp8, 128, 16, 4, 2, 1, 100, 0}, rng, &s);
  DecodeRun r;
  std::string err;
  EXPECT_EQ(RunDecode(s, 0, true, &r, &err, /*probe=*/true), KVT_UNSUPPORTED);
  EXPECT_NE(err.find("NVFP4"), std::string::npos) << err;
}

// The automatic split count is a multiple of the warps per CTA (4) whenever it is above 4,
// so that every CTA can merge its warps' splits, and never more than the context allows.
TEST(DecodeSplits, AutomaticCountsAreMultiplesOfTheCtaWarps) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
    TestPool pool(f, G(1, 8, 128, 16), 2, rng);
    Dev buf(1 << 16);
    for (int batch : {1, 2, 3, 5, 7, 9, 11, 13, 16, 19, 23, 37, 64}) {
      for (int len : {16, 1000, 4096, 8192, 20000, 65536, 131072}) {
        kvt_decode_params p{};
        p.q = p.out = buf.p;
        p.block_table = p.seq_lens = buf.as<int32_t>();
        p.batch = batch;
        p.num_q_heads = 32;
        p.max_blocks = (len + 15) / 16;
        p.max_seq_len = len;
        p.k_scale = p.v_scale = 1.f;
        p.softmax_scale = 1.f;
        const int splits = kvt_decode_num_splits(&pool.desc, &p);
        ASSERT_GE(splits, 1) << kvt_last_error();
        EXPECT_LE(splits, (len + 15) / 16) << "batch " << batch << " len " << len;
        EXPECT_TRUE(splits <= 4 || splits % 4 == 0)
            << KvFormatName(f) << " batch " << batch << " len " << len << ": " << splits << " splits";
      }
    }
  }
}

// Engines (vLLM, SGLang) capture their decode step in a CUDA graph and replay it with
// new inputs in the same buffers. kvt_decode is captured here in global capture mode (no
// unsafe API call may happen on this thread meanwhile), in this process's first decode
// when the test runs alone (ctest), with the split merge's programmatic launch edge inside
// the graph. Each replay gets fresh queries and sequence lengths, poisoned outputs, and
// must match the reference. Splits 0 (the library's choice), 4 (the CTA writes the output,
// no merge kernel) and 32 (8 CTA partials per row for the merge kernel).
TEST(DecodeGraph, CapturedDecodeReplaysWithNewInputs) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (int splits : {32, 4, 0}) {
    DecodeSetup s;
    MakeSetup({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 3000, splits}, rng, &s);
    const kvt_pool& pool = s.pool->desc;
    Dev dq(s.q16.size() * 2), dout(s.q16.size() * 2), dlse(static_cast<size_t>(s.batch) * s.hq * 4),
        dbt(s.bt.size() * 4), dlen(s.lens.size() * 4), flag(4);
    dbt.Put(s.bt.data());
    kvt_decode_params p = DecodeParams(s, splits, dq, dout, dlse, dbt, dlen, flag);
    const uint64_t ws = kvt_decode_workspace_bytes(&pool, &p);
    Dev dws(ws);
    p.workspace = ws ? dws.p : nullptr;
    p.workspace_bytes = ws;
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const int rc = kvt_decode(&pool, &p, st);
    const std::string err = kvt_last_error();
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    ASSERT_EQ(rc, KVT_OK) << "kvt_decode under stream capture: " << err;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<int32_t> lens0 = s.lens;
    for (int replay = 0; replay < 3; ++replay) {
      // New queries and lengths (<= max_seq_len, the captured plan's bound) in the same buffers.
      std::normal_distribution<float> nd(0.f, 1.f);
      for (size_t i = 0; i < s.q16.size(); ++i) {
        s.q16[i] = FloatToBf16(nd(rng));
        s.qf[i] = Bf16ToFloat(s.q16[i]);
      }
      // Only tokens MakeSetup wrote: at most each sequence's first length (replay 0 keeps them).
      for (int b = 0; b < s.batch && replay > 0; ++b) {
        s.lens[b] = 1 + static_cast<int>(rng() % static_cast<uint32_t>(lens0[b]));
      }
      CUDA_OK(cudaMemcpyAsync(dq.p, s.q16.data(), dq.n, cudaMemcpyHostToDevice, st));
      CUDA_OK(cudaMemcpyAsync(dlen.p, s.lens.data(), dlen.n, cudaMemcpyHostToDevice, st));
      CUDA_OK(cudaMemsetAsync(dout.p, 0xFF, dout.n, st));
      CUDA_OK(cudaMemsetAsync(dlse.p, 0xFF, dlse.n, st));
      CUDA_OK(cudaMemsetAsync(flag.p, 0, 4, st));
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      DecodeRun r;
      r.out.resize(s.q16.size());
      r.lse.resize(static_cast<size_t>(s.batch) * s.hq);
      dout.Get(r.out.data());
      dlse.Get(r.lse.data());
      flag.Get(&r.flag);
      EXPECT_EQ(r.flag, 0);
      ExpectMatchesReference(s, r, "graph replay " + std::to_string(replay) + ", splits=" + std::to_string(splits));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

TEST(DecodeGuards, UnsupportedShapesAreRefused) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  struct Bad {
    KvFormat f;
    uint32_t D, T;
    int group;
  };
  for (const Bad& b : {Bad{KvFormat::kNvfp4, 96, 16, 4}, Bad{KvFormat::kNvfp4, 128, 8, 4},
                       Bad{KvFormat::kNvfp4, 128, 128, 4}, Bad{KvFormat::kNvfp4, 128, 16, 3},
                       Bad{KvFormat::kNvfp4, 128, 16, 16}, Bad{KvFormat::kFp8, 256, 16, 4},
                       Bad{KvFormat::kBf16, 32, 16, 1}}) {
    TestPool pool(b.f, G(1, 2, b.D, b.T), 2, rng);
    Dev buf(1 << 16);
    kvt_decode_params p{};
    p.q = p.out = buf.p;
    p.block_table = p.seq_lens = buf.as<int32_t>();
    p.batch = 1;
    p.num_q_heads = 2 * b.group;
    p.max_blocks = 1;
    p.max_seq_len = 1;
    p.k_scale = p.v_scale = 1.f;
    p.softmax_scale = 1.f;
    EXPECT_EQ(kvt_decode(&pool.desc, &p, nullptr), KVT_UNSUPPORTED)
        << "D=" << b.D << " T=" << b.T << " group=" << b.group << ": " << kvt_last_error();
    EXPECT_GT(std::string(kvt_last_error()).size(), 10u);
  }
}

// ---- dequantize_pages -----------------------------------------------------------------

TEST(DequantizePages, MatchesPageValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
    const Geometry g = G(2, 3, 128, 16);
    TestPool pool(f, g, 4, rng);
    const float ks = f == KvFormat::kBf16 ? 1.f : 0.013f, vs = f == KvFormat::kBf16 ? 1.f : 0.021f;
    for (size_t slot = 0; slot < 4; ++slot) {
      for (uint32_t t = 0; t < 16; ++t) WriteToken(pool, slot, 0, t, ks, vs, rng, 1.f, 2.f);
    }
    pool.Upload();
    const int n = 40;
    std::vector<int32_t> sl(n), ps(n);
    for (int i = 0; i < n; ++i) {
      sl[i] = static_cast<int32_t>(rng() % 4);
      ps[i] = static_cast<int32_t>(rng() % 16);
    }
    Dev ds(n * 4), dp(n * 4), out(static_cast<size_t>(n) * 3 * 128 * 2);
    ds.Put(sl.data());
    dp.Put(ps.data());
    for (uint32_t side = 0; side < 2; ++side) {
      CUDA_OK(cudaMemset(out.p, 0xFF, out.n));
      kvt_dequant_params p{};
      p.out = out.p;
      p.num_tokens = n;
      p.slot_ids = ds.as<int32_t>();
      p.positions = dp.as<int32_t>();
      p.slot_ids_host = sl.data();
      p.positions_host = ps.data();
      p.layer = 0;
      p.side = side;
      p.scale = side ? vs : ks;
      ASSERT_EQ(kvt_dequantize_pages(&pool.desc, &p, nullptr), KVT_OK) << kvt_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint16_t> got(out.n / 2);
      out.Get(got.data());
      const std::vector<double> ref = DequantizeRef(pool.hp, sl, ps, 0, static_cast<int>(side), p.scale);
      for (size_t i = 0; i < ref.size(); ++i) {
        const double v = Bf16ToFloat(got[i]);
        ASSERT_TRUE(std::isfinite(v)) << KvFormatName(f) << " element " << i;
        ASSERT_LE(std::fabs(v - ref[i]), std::fabs(ref[i]) * (1.0 / 128) + 1e-30)
            << KvFormatName(f) << " element " << i << " got " << v << " want " << ref[i];
      }
    }
  }
}

// ---- layer-major pools (kvt_pool.slab_bytes) -------------------------------------------

// The decode over a layer-major pool (slot-id stride half a class, a granule of tail per
// slab, 1 to 7 slots per slab) against the float64 reference, which reads the same image
// through HostPool::Page.
struct LayerMajorCase {
  DecodeCase c;
  uint32_t per_slab;
};
class DecodeLayerMajor : public ::testing::TestWithParam<LayerMajorCase> {};

TEST_P(DecodeLayerMajor, MatchesFloat64Reference) {
  SKIP_WITHOUT_GPU();
  const LayerMajorCase lc = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  DecodeSetup s;
  MakeSetup(lc.c, rng, &s, 0.f, lc.per_slab);
  ASSERT_NE(s.pool->desc.slab_bytes, 0u);
  CheckDecodeAgainstReference(s, lc.c.splits < 0 ? static_cast<int>(rng() % 6) : lc.c.splits);
}

std::vector<LayerMajorCase> LayerMajorCases() {
  std::vector<LayerMajorCase> v;
  uint32_t n = 0;
  const uint32_t per_slab[] = {1, 3, 7, 2};
  for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
    for (uint32_t T : {16u, 32u, 64u}) {
      v.push_back({{f, 128, T, 4, 2, 0, 900, -1}, per_slab[n++ % 4]});
    }
  }
  v.push_back({{KvFormat::kNvfp4, 64, 16, 8, 2, 3, 5000, 0}, 5});
  v.push_back({{KvFormat::kNvfp4, 128, 16, 4, 2, 2, 20000, 0}, 64});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeLayerMajor, ::testing::ValuesIn(LayerMajorCases()),
                         [](const auto& info) {
                           return CaseName(info.param.c) + "_N" + std::to_string(info.param.per_slab);
                         });

// quantize_append into a layer-major pool writes exactly the bytes the CPU reference
// writes through HostPool::Page, and nothing else; dequantize reads them back.
TEST(LayerMajor, QuantizeAppendAndDequantizeMatchTheReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Geometry g = G(4, 2, 128, 16);
  const size_t slots = 10;
  TestPool pool(KvFormat::kNvfp4, g, slots, rng, 3, 4, 3);
  pool.Upload();
  const int n = 60;
  std::vector<int32_t> sl(n), ps(n), all(slots * 16);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (int i = 0; i < n; ++i) {
    sl[i] = pool.Id(static_cast<size_t>(all[i] / 16));
    ps[i] = all[i] % 16;
  }
  const size_t row = 2 * 128;
  std::vector<float> kf(n * row), vf(n * row);
  std::vector<uint16_t> k16(n * row), v16(n * row);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < kf.size(); ++i) {
    k16[i] = FloatToBf16(nd(rng));
    v16[i] = FloatToBf16(nd(rng) * 2.f);
    kf[i] = Bf16ToFloat(k16[i]);
    vf[i] = Bf16ToFloat(v16[i]);
  }
  const uint32_t layer = 1 + static_cast<uint32_t>(rng() % 3);
  Dev dk(k16.size() * 2), dv(v16.size() * 2), ds(n * 4), dp(n * 4), flag(4);
  dk.Put(k16.data());
  dv.Put(v16.data());
  ds.Put(sl.data());
  dp.Put(ps.data());
  CUDA_OK(cudaMemset(flag.p, 0, 4));
  kvt_quantize_params q{};
  q.k = dk.p;
  q.v = dv.p;
  q.num_tokens = n;
  q.slot_ids = ds.as<int32_t>();
  q.positions = dp.as<int32_t>();
  q.slot_ids_host = sl.data();
  q.positions_host = ps.data();
  q.layer = layer;
  q.k_scale = 0.02f;
  q.v_scale = 0.03f;
  q.error_flag = flag.as<int32_t>();
  ASSERT_EQ(kvt_quantize_append(&pool.desc, &q, nullptr), KVT_OK) << kvt_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(QuantizeAppendRef(pool.hp, kf, vf, sl, ps, layer, q.k_scale, q.v_scale, nvfp4::ScaleRule::kMax6).ok());
  std::vector<uint8_t> got(pool.host.size());
  pool.dev->Get(got.data());
  size_t first_diff = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pool.host[i]) {
      first_diff = i;
      break;
    }
  }
  ASSERT_EQ(first_diff, got.size()) << "first differing pool byte at offset " << first_diff;
  int32_t f = -1;
  flag.Get(&f);
  EXPECT_EQ(f, 0);
  // The pages of `layer` of the written slots lie dense: slot j of a slab at j * P from
  // the layer's start (a spot check of the layout itself, not only of the agreement).
  const size_t P = PageBytes(KvFormat::kNvfp4, g);
  EXPECT_EQ(pool.hp.Page(static_cast<size_t>(pool.Id(4)), layer) - pool.hp.Page(static_cast<size_t>(pool.Id(3)), layer),
            static_cast<std::ptrdiff_t>(P));
  Dev out(static_cast<size_t>(n) * row * 2);
  kvt_dequant_params p{};
  p.out = out.p;
  p.num_tokens = n;
  p.slot_ids = ds.as<int32_t>();
  p.positions = dp.as<int32_t>();
  p.slot_ids_host = sl.data();
  p.positions_host = ps.data();
  p.layer = layer;
  p.side = 1;
  p.scale = q.v_scale;
  ASSERT_EQ(kvt_dequantize_pages(&pool.desc, &p, nullptr), KVT_OK) << kvt_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> dq(out.n / 2);
  out.Get(dq.data());
  const std::vector<double> ref = DequantizeRef(pool.hp, sl, ps, layer, 1, p.scale);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_LE(std::fabs(Bf16ToFloat(dq[i]) - ref[i]), std::fabs(ref[i]) * (1.0 / 128) + 1e-30) << "element " << i;
  }
}

// Ids in a slab's tail (past its N slots) name no slot: refused with host copies, skipped
// and flagged without; layer-major fields that would put a page outside the pool are
// refused by kvt_check_pool.
TEST(LayerMajor, TailIdsAndBadGeometryAreRefused) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  DecodeSetup s;
  MakeSetup({KvFormat::kNvfp4, 128, 16, 4, 2, 3, 500, 0}, rng, &s, 0.f, 3);
  const kvt_pool good = s.pool->desc;
  // Slab 0's tail: ids 6 (3 slots of 2 ids each) is the tail granule.
  int bad_b = 0;
  for (int b = 0; b < s.batch; ++b) {
    if (s.lens[b] > 16) bad_b = b;
  }
  s.bt[static_cast<size_t>(bad_b) * s.max_blocks + 1] = 6;
  DecodeRun r;
  std::string err;
  EXPECT_EQ(RunDecode(s, 0, true, &r, &err), KVT_INVALID);
  EXPECT_NE(err.find("tail"), std::string::npos) << err;
  for (uint16_t x : r.out) ASSERT_EQ(x, 0xFFFF);
  ASSERT_EQ(RunDecode(s, 0, false, &r, &err), KVT_OK) << err;
  EXPECT_NE(r.flag & 1, 0);
  const size_t per_b = static_cast<size_t>(s.hq) * good.head_dim;
  for (int b = 0; b < s.batch; ++b) {
    for (size_t i = 0; i < per_b; ++i) {
      ASSERT_EQ(std::isnan(Bf16ToFloat(r.out[b * per_b + i])), b == bad_b) << "b=" << b;
    }
  }
  EXPECT_EQ(kvt_check_pool(&good), KVT_OK) << kvt_last_error();
  kvt_pool bad = good;
  bad.class_bytes = 0;  // one without the other
  EXPECT_EQ(kvt_check_pool(&bad), KVT_INVALID);
  bad = good;
  bad.class_bytes = good.slot_bytes;  // a class below the block's bytes
  EXPECT_EQ(kvt_check_pool(&bad), KVT_INVALID);
  bad = good;
  bad.slab_bytes = good.slab_bytes + 16;  // not on a slot-id boundary
  EXPECT_EQ(kvt_check_pool(&bad), KVT_INVALID);
  bad = good;
  bad.class_bytes = good.slab_bytes + good.slot_bytes;  // larger than the slab
  EXPECT_EQ(kvt_check_pool(&bad), KVT_INVALID);
  bad = good;
  bad.num_slots = good.slab_bytes / good.slot_bytes - 1;  // less than a slab
  EXPECT_EQ(kvt_check_pool(&bad), KVT_INVALID);
  EXPECT_NE(std::string(kvt_last_error()).find("layer-major"), std::string::npos) << kvt_last_error();
}

}  // namespace
}  // namespace kvtier::kernels
