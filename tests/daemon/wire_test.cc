// formats/wire.h: ring layout, request validation (every field, overflow-proof bounds),
// and the SPSC ring under a real producer and consumer thread pair.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstddef>
#include <thread>

#include "formats/wire.h"

namespace kvtier::wire {
namespace {

TEST(Wire, RingLayout) {
  RingRegionHeader h;
  ASSERT_TRUE(MakeRingLayout(256, 4 << 20, &h).ok());
  EXPECT_EQ(h.req_offset, kRingHeaderBytes);
  EXPECT_EQ(h.req_offset % kCacheLine, 0u);
  EXPECT_GE(h.cmp_offset, h.req_offset + sizeof(RingControl) + 256 * sizeof(RequestEntry));
  EXPECT_EQ(h.data_offset % 4096, 0u);
  EXPECT_EQ(h.total_bytes, h.data_offset + (4u << 20));
  EXPECT_TRUE(CheckRingHeader(h, h.total_bytes).ok());
  EXPECT_FALSE(CheckRingHeader(h, h.total_bytes - 4096).ok());
  RingRegionHeader bad = h;
  bad.data_offset += 4096;
  EXPECT_FALSE(CheckRingHeader(bad, h.total_bytes).ok());
  EXPECT_FALSE(MakeRingLayout(100, 4096, &h).ok());
  EXPECT_FALSE(MakeRingLayout(4, 4096, &h).ok());
  EXPECT_FALSE(MakeRingLayout(64, 1000, &h).ok());
}

// The consumer's CPU hint lives in the padding of the consumer's cache line (the layout of
// protocol 1 is unchanged) and reads as unknown until a consumer writes it.
TEST(Wire, ConsumerCpuHintInPadding) {
  static_assert(offsetof(RingControl, consumer_cpu) == 2 * kCacheLine + sizeof(uint32_t));
  static_assert(sizeof(RingControl) == 3 * kCacheLine);
  alignas(kCacheLine) RingControl ctl{};
  RingView<RequestEntry> v(&ctl, nullptr, 8);
  EXPECT_EQ(v.ConsumerCpu(), -1);
  v.SetConsumerCpu(0);
  EXPECT_EQ(v.ConsumerCpu(), 0);
  EXPECT_EQ(ctl.consumer_cpu, 1u);
  v.SetConsumerCpu(17);
  EXPECT_EQ(v.ConsumerCpu(), 17);
  v.SetConsumerCpu(-1);  // sched_getcpu failed
  EXPECT_EQ(v.ConsumerCpu(), -1);
  EXPECT_EQ(ctl.sleeping, 0u);
  EXPECT_EQ(ctl.tail, 0u);
}

RequestEntry Lookup(uint32_t count) {
  RequestEntry e;
  e.op = static_cast<uint16_t>(Op::kLookup);
  e.count = count;
  e.contract_id = 1;
  e.in_off = 0;
  e.in_len = count * 16;
  e.out_off = count * 16;
  e.out_len = count;
  return e;
}

TEST(Wire, ValidateRingRequest) {
  RequestLimits lim;
  lim.data_bytes = 1 << 20;
  lim.max_keys = 1000;
  EXPECT_TRUE(ValidateRingRequest(Lookup(10), lim).ok());
  auto bad = [&](RequestEntry e, const char* what) {
    Status s = ValidateRingRequest(e, lim);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_TRUE(s.IsInvalid()) << what;
  };
  RequestEntry e = Lookup(10);
  e.op = 0;
  bad(e, "op 0");
  e.op = 200;
  bad(e, "op 200");
  e = Lookup(10);
  e.flags = 1;
  bad(e, "flags");
  e = Lookup(10);
  e.reserved[15] = 1;
  bad(e, "reserved");
  bad(Lookup(0), "count 0");
  bad(Lookup(1001), "count over max");
  e = Lookup(10);
  e.in_len = 159;
  bad(e, "in_len mismatch");
  e = Lookup(10);
  e.out_len = 9;
  bad(e, "out too small");
  e = Lookup(10);
  e.in_off = 4;
  bad(e, "unaligned in");
  e = Lookup(10);
  e.in_off = (1 << 20) - 8;
  bad(e, "in past end");
  e = Lookup(10);
  e.in_off = 0xFFFFFFF8u;  // would wrap in 32 bits
  bad(e, "in offset overflow");
  e = Lookup(10);
  e.out_off = 0xFFFFFFF8u;
  bad(e, "out offset overflow");
  e = Lookup(10);
  e.tier = 1;
  bad(e, "tier on lookup");
  RequestEntry a = Lookup(10);
  a.op = static_cast<uint16_t>(Op::kAcquire);
  a.out_len = 80;
  a.tier = kTierHost;
  EXPECT_TRUE(ValidateRingRequest(a, lim).ok());
  a.tier = kTierNvme;
  bad(a, "acquire into nvme");
  RequestEntry r;
  r.op = static_cast<uint16_t>(Op::kRelease);
  EXPECT_TRUE(ValidateRingRequest(r, lim).ok()) << "release of lease 0 is a no-op, not an error";
  r.lease_id = 5;
  EXPECT_TRUE(ValidateRingRequest(r, lim).ok());
  r.count = 1;
  bad(r, "release with count");
}

TEST(Wire, ValidateControlHeader) {
  ControlHeader h;
  h.type = static_cast<uint16_t>(ControlType::kAttach);
  h.length = sizeof(AttachRequest);
  EXPECT_TRUE(ValidateControlHeader(h).ok());
  ControlHeader b = h;
  b.magic = 0;
  EXPECT_FALSE(ValidateControlHeader(b).ok());
  b = h;
  b.type = 77;
  EXPECT_FALSE(ValidateControlHeader(b).ok());
  b = h;
  b.length = kMaxControlPayload + 1;
  EXPECT_FALSE(ValidateControlHeader(b).ok());
}

TEST(Wire, SpscRingAcrossThreads) {
  RingRegionHeader h;
  ASSERT_TRUE(MakeRingLayout(8, 4096, &h).ok());
  void* p = ::mmap(nullptr, h.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(p);
  std::memcpy(base, &h, sizeof h);
  auto prod = RequestRing(base, h);
  auto cons = RequestRing(base, h);
  constexpr uint64_t kN = 20000;   // wraps the 8-entry ring and the indices many times
  std::thread t([&] {
    for (uint64_t i = 0; i < kN; ++i) {
      RequestEntry e;
      e.tag = i;
      e.contract_id = ~i;
      while (!prod.TryPush(e)) std::this_thread::yield();
    }
  });
  uint64_t next = 0;
  while (next < kN) {
    uint32_t n = 0;
    ASSERT_TRUE(cons.Available(&n));
    ASSERT_LE(n, 8u);
    for (uint32_t k = 0; k < n; ++k) {
      RequestEntry e;
      cons.Pop(&e);
      ASSERT_EQ(e.tag, next);
      ASSERT_EQ(e.contract_id, ~next);
      ++next;
    }
  }
  t.join();
  // Impossible indices are detected.
  prod.control()->tail = prod.control()->head + 9;
  uint32_t n = 0;
  EXPECT_FALSE(cons.Available(&n));
  ::munmap(p, h.total_bytes);
}

}  // namespace
}  // namespace kvtier::wire
