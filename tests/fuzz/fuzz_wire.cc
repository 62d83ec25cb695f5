// Fuzz target: the daemon's validation of everything a client puts in its ring or on its
// socket (formats/wire.h): ValidateRingRequest, ValidateSocketRequest,
// ValidateControlHeader, CheckRingHeader, the consumer side of a ring whose indices
// the peer controls, and the attach (CheckAttachHeader, ParseAttach). Input: a
// RequestEntry (64 bytes), then limits, a control header, a ring region header, ring
// indices, then an attach: its control header, a payload length byte and the payload. Whatever is accepted must satisfy the promises the
// daemon relies on (regions inside the data area, aligned, lengths equal to what the op
// needs, no overflow).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/wire.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kvtier::wire;

namespace {
template <typename T>
bool Take(const uint8_t*& p, size_t& n, T* out) {
  if (n < sizeof(T)) return false;
  std::memcpy(out, p, sizeof(T));
  p += sizeof(T);
  n -= sizeof(T);
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* p = data;
  size_t n = size;
  RequestEntry req;
  if (!Take(p, n, &req)) return 0;
  uint32_t data_kib = 0, max_keys = 0;
  (void)Take(p, n, &data_kib);
  (void)Take(p, n, &max_keys);
  RequestLimits lim;
  lim.data_bytes = (uint64_t{data_kib} % (1u << 18) + 1) * 4096;  // up to 1 GiB
  if (max_keys != 0) lim.max_keys = max_keys % (1u << 20) + 1;

  if (ValidateRingRequest(req, lim).ok()) {
    FUZZ_CHECK(req.op >= 1 && req.op <= kMaxOp);
    // The one flag: kRequestShared, on a contract registration only.
    FUZZ_CHECK(req.flags == 0 ||
               (req.op == static_cast<uint16_t>(Op::kRegisterContract) && req.flags == kRequestShared));
    FUZZ_CHECK(req.in_len == RequiredInBytes(req));
    FUZZ_CHECK(req.out_len >= RequiredOutBytes(req));
    if (req.in_len) FUZZ_CHECK(req.in_off % 8 == 0 && uint64_t{req.in_off} + req.in_len <= lim.data_bytes);
    if (req.out_len) FUZZ_CHECK(req.out_off % 8 == 0 && uint64_t{req.out_off} + req.out_len <= lim.data_bytes);
    const Op op = static_cast<Op>(req.op);
    if (op == Op::kLookup || op == Op::kAcquire || op == Op::kAlloc || op == Op::kCommit || op == Op::kPrefetch) {
      FUZZ_CHECK(req.count >= 1 && req.count <= lim.max_keys);
    }
    if (op == Op::kAcquire || op == Op::kAlloc || op == Op::kPrefetch) FUZZ_CHECK(req.tier <= kTierHost);
    if (op == Op::kCommit) FUZZ_CHECK(req.lease_id != 0);  // release of lease 0 is a no-op
  }
  // A request that passes has a sound frame; a broken frame never passes (only broken
  // frames are strikes against a client).
  if (!CheckRingFrame(req, lim).ok()) FUZZ_CHECK(!ValidateRingRequest(req, lim).ok());
  {
    const uint32_t v = NegotiateProtocol(req.count, static_cast<uint32_t>(req.lease_id));
    if (v != 0) FUZZ_CHECK(v >= kMinProtocolVersion && v <= kProtocolVersion && v <= req.lease_id);
  }
  uint32_t inline_bytes = 0;
  (void)Take(p, n, &inline_bytes);
  if (ValidateSocketRequest(req, inline_bytes, lim).ok()) {
    FUZZ_CHECK(inline_bytes == RequiredInBytes(req));
    FUZZ_CHECK(req.out_len <= kMaxControlPayload - sizeof(CompletionEntry));
  }
  ControlHeader ch;
  if (Take(p, n, &ch) && ValidateControlHeader(ch).ok()) {
    FUZZ_CHECK(ch.magic == kControlMagic && ch.reserved == 0 && ch.length <= kMaxControlPayload);
  }
  RingRegionHeader rh;
  uint64_t mapped = 0;
  if (Take(p, n, &rh) && Take(p, n, &mapped) && CheckRingHeader(rh, mapped).ok()) {
    FUZZ_CHECK(rh.total_bytes == mapped);
    FUZZ_CHECK((rh.entries & (rh.entries - 1)) == 0 && rh.entries >= kMinRingEntries);
    FUZZ_CHECK(rh.req_offset >= kRingHeaderBytes);
    FUZZ_CHECK(rh.req_offset + sizeof(RingControl) + uint64_t{rh.entries} * sizeof(RequestEntry) <= rh.cmp_offset);
    FUZZ_CHECK(rh.cmp_offset + sizeof(RingControl) + uint64_t{rh.entries} * sizeof(CompletionEntry) <= rh.data_offset);
    FUZZ_CHECK(rh.data_offset + rh.data_bytes == rh.total_bytes);
  }
  // A ring whose indices came from the peer: Available refuses impossible ones, and a
  // pop never reads outside the slots.
  uint32_t head = 0, tail = 0;
  if (Take(p, n, &head) && Take(p, n, &tail)) {
    constexpr uint32_t kEntries = 8;
    struct alignas(64) Mem {
      RingControl ctl;
      RequestEntry slots[kEntries];
    };
    static Mem mem;
    mem.ctl.head = head;
    mem.ctl.tail = tail;
    RingView<RequestEntry> ring(&mem.ctl, mem.slots, kEntries);
    uint32_t avail = 0;
    if (ring.Available(&avail)) {
      FUZZ_CHECK(avail <= kEntries);
      for (uint32_t i = 0; i < avail; ++i) {
        RequestEntry e;
        ring.Pop(&e);
      }
      FUZZ_CHECK(ring.Available(&avail) && avail == 0);
    }
  }
  // An attach: only a payload of exactly an AttachRequest is read, and what is accepted
  // speaks a version both ends know and carries only known flags.
  ControlHeader ah;
  uint8_t len = 0;
  if (Take(p, n, &ah) && Take(p, n, &len)) {
    if (CheckAttachHeader(ah).ok()) FUZZ_CHECK(ah.length == sizeof(AttachRequest));
    const size_t plen = std::min<size_t>(len, n);
    AttachRequest a;
    uint32_t v = 0;
    if (ParseAttach(ah, p, plen, &a, &v).ok()) {
      FUZZ_CHECK(plen == sizeof(AttachRequest));
      FUZZ_CHECK(v >= kMinProtocolVersion && v <= kProtocolVersion && v <= a.protocol_version);
      FUZZ_CHECK(v == NegotiateProtocol(a.min_protocol_version, a.protocol_version));
      FUZZ_CHECK(ah.version == a.protocol_version);
      FUZZ_CHECK((a.flags & ~kAttachHasGpu) == 0);
    }
  }
  return 0;
}
