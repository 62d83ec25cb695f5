// What libkvtier answers around the happy path, against a real kvtierd: ordinary
// mistakes are errors and never strikes, only corrupt requests count (and the count
// decays), and a client the daemon disconnects is told why.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.h"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

kvtier_client* ConnectClient(const std::string& socket, uint32_t timeout_ms = 0) {
  kvtier_connect_options o{};
  o.name = "semantics";
  o.timeout_ms = timeout_ms;
  kvtier_client* c = nullptr;
  if (kvtier_connect(socket.c_str(), &o, &c) != KVTIER_OK) return nullptr;
  return c;
}

std::string LastError() { return kvtier_last_error(); }

constexpr size_t kBlockBytes = 576;  // SmallContract(): 2 layers x 288 bytes

// A request libkvtier never sends: an unknown op (a broken frame).
wire::RequestEntry CorruptEntry(uint64_t tag) {
  wire::RequestEntry e;
  e.op = 77;
  e.tag = tag;
  e.out_off = 4096;
  e.out_len = 256;
  return e;
}

TEST(ClientSemantics, MistakesAreErrorsNotStrikes) {
  DaemonConfig cfg;
  cfg.max_bad_requests = 4;
  cfg.max_keys_per_request = 8;
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  std::vector<kvtier_key> keys(9);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = kvtier_key{7, i + 1};
  std::vector<kvtier_slot> slots(16);
  uint64_t lease = 0;
  // Far more mistakes than max_bad_requests: each is an error, none a strike.
  for (int round = 0; round < 5; ++round) {
    EXPECT_EQ(kvtier_release(c, 987654321), KVTIER_NOT_FOUND) << LastError();
    EXPECT_NE(LastError().find("not held"), std::string::npos) << LastError();
    EXPECT_EQ(kvtier_alloc(c, cid, 9, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_INVALID);
    EXPECT_NE(LastError().find("not in [1, 8]"), std::string::npos) << LastError();
    size_t got = 0;
    EXPECT_EQ(kvtier_acquire(c, cid, keys.data(), 9, KVTIER_TIER_HOST, &lease, slots.data(), &got), KVTIER_INVALID);
    EXPECT_EQ(kvtier_alloc(c, cid, 1, KVTIER_TIER_NVME, &lease, slots.data()), KVTIER_INVALID);
    EXPECT_NE(LastError().find("target tier"), std::string::npos) << LastError();
  }
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK) << LastError();
  kvtier_lookup_result r{};
  EXPECT_EQ(kvtier_lookup(c, cid, keys.data(), 8, &r, nullptr), KVTIER_OK) << LastError();
  EXPECT_EQ(r.hit_blocks, 0u);
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_clients_disconnected_total{reason=\"misbehaved\"}"), 0);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The empty and miss cases need no special code: lease 0 (what a miss returns) releases
// as a no-op, 0 keys are 0 hits; an unknown contract is NOT_FOUND, as kvtier.h says.
TEST(ClientSemantics, EmptyAndMissCases) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  // A miss: acquire of keys never stored gives lease 0, and releasing it is fine.
  kvtier_key k{42, 43};
  uint64_t lease = 77;
  size_t n = 9;
  kvtier_slot s{};
  ASSERT_EQ(kvtier_acquire(c, cid, &k, 1, KVTIER_TIER_HOST, &lease, &s, &n), KVTIER_OK) << LastError();
  EXPECT_EQ(lease, 0u);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
  EXPECT_STREQ(kvtier_last_error(), "");
  // 0 keys (a prompt shorter than a block): 0 hits, keys may be NULL.
  kvtier_lookup_result r{7, 1.0};
  EXPECT_EQ(kvtier_lookup(c, cid, nullptr, 0, &r, nullptr), KVTIER_OK) << LastError();
  EXPECT_EQ(r.hit_blocks, 0u);
  lease = 5;
  n = 5;
  EXPECT_EQ(kvtier_acquire(c, cid, nullptr, 0, KVTIER_TIER_HOST, &lease, nullptr, &n), KVTIER_OK);
  EXPECT_EQ(lease, 0u);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(kvtier_prefetch(c, cid, nullptr, 0, KVTIER_TIER_HOST), KVTIER_OK);
  // Lease 0 on the wire (a raw request) is a no-op too.
  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d.socket(), &reply));
  wire::RequestEntry e;
  e.op = static_cast<uint16_t>(wire::Op::kRelease);
  e.tag = 3;
  e.out_off = 4096;
  e.out_len = 256;
  wire::CompletionEntry done;
  ASSERT_TRUE(raw.Submit(e, &done));
  EXPECT_EQ(done.status, 0);
  // An unknown contract is NOT_FOUND and says what to do.
  EXPECT_EQ(kvtier_lookup(c, 0x1234, &k, 1, &r, nullptr), KVTIER_NOT_FOUND);
  EXPECT_NE(LastError().find("register it first"), std::string::npos) << LastError();
  EXPECT_EQ(kvtier_acquire(c, 0x1234, &k, 1, KVTIER_TIER_HOST, &lease, &s, &n), KVTIER_NOT_FOUND);
  EXPECT_EQ(kvtier_alloc(c, 0x1234, 1, KVTIER_TIER_HOST, &lease, &s), KVTIER_NOT_FOUND);
  // A lease never held is still NOT_FOUND (a real mistake, answered, not a strike).
  EXPECT_EQ(kvtier_release(c, 123456789), KVTIER_NOT_FOUND);
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The token-level calls: the block size from the contract, the "last prompt token is
// recomputed" rule, parents filled in, and requests longer than max_keys_per_request (4
// here) split by the library.
TEST(ClientSemantics, TokenLevelCalls) {
  DaemonConfig cfg;
  cfg.max_keys_per_request = 4;
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();  // 16 tokens, 576 bytes a block
  uint64_t cid = 0;
  std::vector<uint32_t> tokens(16 * 10 + 5);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(1000 + i * 7);
  size_t cached = 99;
  kvtier_key key{};
  size_t n = 0;
  // Unregistered by this client: the block size is unknown, NOT_FOUND says so.
  EXPECT_EQ(kvtier_key_chain_tokens(c, 0x77, tokens.data(), tokens.size(), &key, 1, &n), KVTIER_NOT_FOUND);
  EXPECT_NE(LastError().find("not registered by this client"), std::string::npos) << LastError();
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  uint32_t bt = 0;
  ASSERT_EQ(kvtier_contract_block_tokens(c, cid, &bt), KVTIER_OK);
  EXPECT_EQ(bt, 16u);
  std::vector<kvtier_key> keys(10), want(10);
  ASSERT_EQ(kvtier_key_chain_tokens(c, cid, tokens.data(), tokens.size(), keys.data(), keys.size(), &n), KVTIER_OK);
  ASSERT_EQ(n, 10u);
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, want.data(), want.size(), &n), KVTIER_OK);
  for (size_t i = 0; i < 10; ++i) EXPECT_TRUE(keys[i].hi == want[i].hi && keys[i].lo == want[i].lo) << i;
  ASSERT_EQ(kvtier_lookup_tokens(c, cid, tokens.data(), tokens.size(), &cached), KVTIER_OK) << LastError();
  EXPECT_EQ(cached, 0u);
  // Store after prefill: 10 blocks in 3 leases of at most 4.
  std::vector<std::vector<uint8_t>> bytes(12, std::vector<uint8_t>(kBlockBytes));
  std::vector<const void*> ptrs(12);
  for (size_t i = 0; i < 12; ++i) {
    for (size_t j = 0; j < kBlockBytes; ++j) bytes[i][j] = static_cast<uint8_t>(i * 13 + j);
    ptrs[i] = bytes[i].data();
  }
  size_t stored = 0;
  ASSERT_EQ(kvtier_store_tokens(c, cid, tokens.data(), tokens.size(), ptrs.data(), &stored), KVTIER_OK) << LastError();
  EXPECT_EQ(stored, 10u);
  // Parents are the chain's: block i's parent is block i - 1, the first has none.
  for (size_t i = 0; i < 10; ++i) {
    kvtier_block_info info{};
    ASSERT_EQ(kvtier_inspect(c, cid, keys[i], &info), KVTIER_OK) << LastError();
    const kvtier_key p = i ? keys[i - 1] : kvtier_key{0, 0};
    EXPECT_TRUE(info.parent.hi == p.hi && info.parent.lo == p.lo) << i;
  }
  // 10 cached blocks under a 4-key limit: lookup splits itself.
  kvtier_lookup_result r{};
  ASSERT_EQ(kvtier_lookup(c, cid, keys.data(), keys.size(), &r, nullptr), KVTIER_OK) << LastError();
  EXPECT_EQ(r.hit_blocks, 10u);
  // The recompute rule: never the block of the last prompt token.
  auto lookup_tokens = [&](size_t n_tokens) {
    size_t got = 12345;
    EXPECT_EQ(kvtier_lookup_tokens(c, cid, tokens.data(), n_tokens, &got), KVTIER_OK) << LastError();
    return got;
  };
  EXPECT_EQ(lookup_tokens(tokens.size()), 160u);  // 165 tokens: all 10 blocks
  EXPECT_EQ(lookup_tokens(160), 144u);            // exactly 10 blocks: the 10th is recomputed
  EXPECT_EQ(lookup_tokens(17), 16u);
  EXPECT_EQ(lookup_tokens(16), 0u);
  EXPECT_EQ(lookup_tokens(0), 0u);
  // Storing again stores nothing; a longer prompt stores only its new blocks (the
  // cached prefix's entries are not read).
  ASSERT_EQ(kvtier_store_tokens(c, cid, tokens.data(), tokens.size(), ptrs.data(), &stored), KVTIER_OK);
  EXPECT_EQ(stored, 0u);
  std::vector<uint32_t> longer = tokens;
  for (uint32_t i = 0; i < 32; ++i) longer.push_back(5000 + i);
  std::vector<const void*> tail(12, nullptr);
  tail[10] = ptrs[10];
  tail[11] = ptrs[11];
  ASSERT_EQ(kvtier_store_tokens(c, cid, longer.data(), longer.size(), tail.data(), &stored), KVTIER_OK) << LastError();
  EXPECT_EQ(stored, 2u);
  // Load on the next request: a 4-block prompt plus one token pins 4 blocks, bytes intact.
  std::vector<kvtier_slot> slots(4);
  uint64_t lease = 0;
  ASSERT_EQ(kvtier_load_tokens(c, cid, tokens.data(), 65, KVTIER_TIER_HOST, &lease, slots.data(), slots.size(), &cached),
            KVTIER_OK) << LastError();
  EXPECT_EQ(cached, 64u);
  ASSERT_NE(lease, 0u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(kvtier_host_slot(c, slots[i].slot), bytes[i].data(), kBlockBytes), 0) << i;
  }
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  // A miss: a prompt never stored.
  std::vector<uint32_t> other(40, 3);
  ASSERT_EQ(kvtier_load_tokens(c, cid, other.data(), other.size(), KVTIER_TIER_HOST, &lease, slots.data(), slots.size(),
                               &cached), KVTIER_OK);
  EXPECT_EQ(cached, 0u);
  EXPECT_EQ(lease, 0u);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  // One lease cannot be split: a load over max_keys_per_request is refused with the limit.
  std::vector<kvtier_slot> many(12);
  EXPECT_EQ(kvtier_load_tokens(c, cid, longer.data(), longer.size(), KVTIER_TIER_HOST, &lease, many.data(),
                               many.size(), &cached), KVTIER_INVALID);
  EXPECT_NE(LastError().find("not in [1, 4]"), std::string::npos) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Strikes decay: corrupt requests spread out wider than the decay never reach the
// limit; max_bad_requests of them inside the window disconnect, with the reason sent.
TEST(ClientSemantics, StrikesDecayAndTheDisconnectSaysWhy) {
  DaemonConfig cfg;
  cfg.max_bad_requests = 4;
  cfg.bad_request_decay_ms = 1500;
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  uint64_t tag = 1;
  auto strike = [&] {
    wire::CompletionEntry c;
    ASSERT_TRUE(raw.Submit(CorruptEntry(++tag), &c));
    EXPECT_EQ(c.status, static_cast<int>(StatusCode::kInvalid));
  };
  auto nop_ok = [&] {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kNop);
    e.tag = ++tag;
    wire::CompletionEntry c;
    return raw.Submit(e, &c) && c.status == 0 && c.tag == e.tag;
  };
  for (int i = 0; i < 3; ++i) strike();
  std::this_thread::sleep_for(std::chrono::milliseconds(5000));  // forgives 3 strikes
  for (int i = 0; i < 3; ++i) strike();
  EXPECT_TRUE(nop_ok()) << "6 corrupt requests, but never 4 within the decay window";
  strike();  // the 4th inside the window
  const std::string why = raw.ReadGoodbye(5000);
  EXPECT_NE(why.find("corrupt ring requests"), std::string::npos) << why;
  EXPECT_NE(why.find("op 77 unknown"), std::string::npos) << why;
  EXPECT_TRUE(raw.WaitSocketClosed(5000));
  EXPECT_GE(MetricValue(d.Metrics(), "kvtier_clients_disconnected_total{reason=\"misbehaved\"}"), 1);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A client made before fork() is the parent's: the child's calls fail at once (they would
// share the parent's ring), and the parent carries on.
TEST(ClientSemantics, ForkedChildIsRefusedParentUnaffected) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket(), 3000);
  ASSERT_NE(c, nullptr) << LastError();
  ASSERT_EQ(kvtier_ping(c), KVTIER_OK);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const kvtier_status s = kvtier_ping(c);
    const std::string msg = std::to_string(static_cast<int>(s)) + " " + kvtier_last_error();
    (void)!::write(fds[1], msg.data(), msg.size());
    kvtier_close(c);  // the child's copies only: the parent's connection stays
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(k));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_EQ(got.substr(0, 2), "6 ") << got;
  EXPECT_NE(got.find("used after fork: connect again in the child"), std::string::npos) << got;
  for (int i = 0; i < 20; ++i) ASSERT_EQ(kvtier_ping(c), KVTIER_OK) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// After a daemon restart: DISCONNECTED, then kvtier_reconnect attaches again and
// registers the client's contracts again, so that its calls work at once; with automatic
// reconnect on, the call after the failed one does that by itself.
TEST(ClientSemantics, ReconnectAfterRestartRegistersContractsAgain) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket(), 3000);
  kvtier_client* a = ConnectClient(d.socket(), 3000);
  ASSERT_TRUE(c != nullptr && a != nullptr) << LastError();
  ASSERT_EQ(kvtier_set_auto_reconnect(a, 1), KVTIER_OK);
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_register_contract(a, &desc, &cid), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_attach_generation(c), 1u);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_key k{1, 2};
  kvtier_lookup_result r{};
  EXPECT_EQ(kvtier_lookup(c, cid, &k, 1, &r, nullptr), KVTIER_DISCONNECTED);
  EXPECT_EQ(kvtier_ping(c), KVTIER_DISCONNECTED);
  EXPECT_NE(LastError().find("kvtier_reconnect attaches again"), std::string::npos) << LastError();
  ASSERT_EQ(kvtier_reconnect(c), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_attach_generation(c), 2u);
  EXPECT_EQ(kvtier_lookup(c, cid, &k, 1, &r, nullptr), KVTIER_OK) << LastError();  // registered again
  EXPECT_EQ(r.hit_blocks, 0u);
  uint32_t bt = 0;
  EXPECT_EQ(kvtier_contract_block_tokens(c, cid, &bt), KVTIER_OK);
  // Automatic: the call that finds the connection gone fails, the next one reconnects.
  EXPECT_NE(kvtier_ping(a), KVTIER_OK);
  EXPECT_EQ(kvtier_lookup(a, cid, &k, 1, &r, nullptr), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_attach_generation(a), 2u);
  kvtier_close(c);
  kvtier_close(a);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A hung daemon: TIMEOUT says the connection is given up and how to recover; once the
// daemon runs again, kvtier_reconnect brings the client back.
TEST(ClientSemantics, TimeoutGivesUpAndSaysHowToRecover) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket(), 300);
  ASSERT_NE(c, nullptr) << LastError();
  ASSERT_EQ(kvtier_ping(c), KVTIER_OK);
  ASSERT_EQ(::kill(d.pid(), SIGSTOP), 0);
  // Wait until the kernel reports it stopped (state T): the stop is not instantaneous.
  for (int i = 0; i < 500; ++i) {
    const std::string stat = ReadText("/proc/" + std::to_string(d.pid()) + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && stat.size() > paren + 2 && stat[paren + 2] == 'T') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(kvtier_ping(c), KVTIER_TIMEOUT);
  EXPECT_NE(LastError().find("the connection is given up"), std::string::npos) << LastError();
  EXPECT_NE(LastError().find("kvtier_reconnect"), std::string::npos) << LastError();
  EXPECT_EQ(kvtier_ping(c), KVTIER_DISCONNECTED);  // at once, and it says why
  EXPECT_NE(LastError().find("no completion within 300 ms"), std::string::npos) << LastError();
  ASSERT_EQ(::kill(d.pid(), SIGCONT), 0);
  ASSERT_EQ(kvtier_reconnect(c), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// alloc answers REJECTED, with the numbers, when the caller's own leases fill the tier
// (waiting cannot help); RETRY when other clients' pins do (it passes); and
// kvtier_alloc_wait waits that out.
TEST(ClientSemantics, AllocRejectsOwnPinsRetriesPassingPressure) {
  DaemonConfig cfg;  // host tier: 64 slots of 4 KiB, every one of them for one client
  cfg.daemon_extra = "max_tier_share_per_client = 1.0\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* a = ConnectClient(d.socket());
  kvtier_client* b = ConnectClient(d.socket());
  ASSERT_TRUE(a != nullptr && b != nullptr) << LastError();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(a, &desc, &cid), KVTIER_OK) << LastError();
  std::vector<kvtier_slot> slots(64);
  uint64_t held = 0, lease = 0;
  ASSERT_EQ(kvtier_alloc(a, cid, 60, KVTIER_TIER_HOST, &held, slots.data()), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_alloc(a, cid, 8, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_REJECTED);
  EXPECT_NE(LastError().find("host tier has 64 slots; this client holds 60 of them in 1 leases and asks for 8"),
            std::string::npos) << LastError();
  EXPECT_NE(LastError().find("release leases first"), std::string::npos) << LastError();
  // The waiting variant does not wait for what cannot come.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(kvtier_alloc_wait(a, cid, 8, KVTIER_TIER_HOST, 2000, &lease, slots.data()), KVTIER_REJECTED);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  // Another client's view: someone else's pins, pressure that passes.
  EXPECT_EQ(kvtier_alloc(b, cid, 8, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_RETRY);
  EXPECT_NE(LastError().find("this client holds 0 of them"), std::string::npos) << LastError();
  EXPECT_EQ(kvtier_alloc_wait(b, cid, 8, KVTIER_TIER_HOST, 100, &lease, slots.data()), KVTIER_RETRY);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (void)kvtier_release(a, held);
  });
  EXPECT_EQ(kvtier_alloc_wait(b, cid, 8, KVTIER_TIER_HOST, 5000, &lease, slots.data()), KVTIER_OK) << LastError();
  releaser.join();
  EXPECT_NE(lease, 0u);
  EXPECT_EQ(kvtier_release(b, lease), KVTIER_OK);
  kvtier_close(a);
  kvtier_close(b);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The daemon keeps registrations next to the NVMe tier: after a restart the blocks
// restored from NVMe answer lookups and operator calls before anyone registers again; a
// torn tail of the file is dropped; a file of another format is refused by name.
TEST(ClientSemantics, RegistrationsOutliveRestarts) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  std::vector<uint32_t> tokens(16 * 3);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + 9);
  std::vector<uint8_t> block(kBlockBytes, 0x5a);
  const void* blocks[3] = {block.data(), block.data(), block.data()};
  size_t stored = 0;
  ASSERT_EQ(kvtier_store_tokens(c, cid, tokens.data(), tokens.size(), blocks, &stored), KVTIER_OK) << LastError();
  ASSERT_EQ(stored, 3u);
  ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << LastError();  // to NVMe, which outlives the restart
  std::vector<kvtier_key> keys(3);
  size_t n = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), 3, &n), KVTIER_OK);
  kvtier_close(c);
  auto restart_and_check = [&](const char* when) {
    ASSERT_EQ(d.Stop(), 0) << d.log();
    ASSERT_TRUE(d.Start()) << d.log();
    kvtier_client* fresh = ConnectClient(d.socket());  // never registers anything
    ASSERT_NE(fresh, nullptr) << LastError();
    kvtier_lookup_result r{};
    EXPECT_EQ(kvtier_lookup(fresh, cid, keys.data(), keys.size(), &r, nullptr), KVTIER_OK) << when << LastError();
    EXPECT_EQ(r.hit_blocks, 3u) << when;
    kvtier_close(fresh);
  };
  restart_and_check("after a clean restart");
  // A torn append (a crash mid-write) at the end: dropped, the rest still read.
  const std::string file = d.dir() + "/nvme/contracts.kvc";
  {
    std::ofstream f(file, std::ios::app | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    f.write("KVCR\x40\0\0\0torn", 12);
  }
  restart_and_check("after a torn tail");
  EXPECT_NE(d.log().find("dropped a torn tail of 12 bytes"), std::string::npos);
  kvtier_client* op = ConnectClient(d.socket());
  ASSERT_NE(op, nullptr);
  uint64_t evicted = 0, skipped = 0;
  EXPECT_EQ(kvtier_evict_contract(op, cid, &evicted, &skipped), KVTIER_OK) << LastError();
  EXPECT_EQ(evicted, 3u);
  kvtier_close(op);
  // Another format in its place: the daemon refuses to start and names the file.
  ASSERT_EQ(d.Stop(), 0) << d.log();
  WriteText(file, "not a contract file at all");
  EXPECT_FALSE(d.Start());
  EXPECT_NE(d.log().find("contracts.kvc is not a kvtier contract file"), std::string::npos) << d.log();
}

// The attach names a range of protocol versions: a client that also speaks this
// daemon's version is served with it; ranges that do not meet are refused, by name.
TEST(ClientSemantics, AttachNegotiatesAProtocolRange) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  auto attach = [&](uint32_t min, uint32_t max, wire::AttachReply* reply) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", d.socket().c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    wire::ControlHeader h;
    h.version = static_cast<uint16_t>(max);
    h.type = static_cast<uint16_t>(wire::ControlType::kAttach);
    h.length = sizeof(wire::AttachRequest);
    wire::AttachRequest r;
    r.protocol_version = max;
    r.min_protocol_version = min;
    uint8_t msg[sizeof h + sizeof r];
    std::memcpy(msg, &h, sizeof h);
    std::memcpy(msg + sizeof h, &r, sizeof r);
    uint8_t buf[sizeof(wire::ControlHeader) + sizeof(wire::AttachReply)];
    const bool ok = ::write(fd, msg, sizeof msg) == static_cast<ssize_t>(sizeof msg) &&
                    ::recv(fd, buf, sizeof buf, MSG_WAITALL) == static_cast<ssize_t>(sizeof buf);
    if (ok) std::memcpy(reply, buf + sizeof(wire::ControlHeader), sizeof *reply);
    ::close(fd);
    return ok;
  };
  wire::AttachReply reply;
  const uint32_t v = wire::kProtocolVersion;
  ASSERT_TRUE(attach(v, v + 3, &reply));  // a newer client that still speaks ours
  EXPECT_EQ(reply.status, 0) << reply.message;
  EXPECT_EQ(reply.protocol_version, v);
  ASSERT_TRUE(attach(0, v, &reply));  // an older client: one version
  EXPECT_EQ(reply.status, 0) << reply.message;
  ASSERT_TRUE(attach(v + 1, v + 3, &reply));
  EXPECT_EQ(reply.status, static_cast<int32_t>(StatusCode::kUnsupported));
  EXPECT_NE(std::string(reply.message).find("this daemon speaks"), std::string::npos) << reply.message;
  ASSERT_TRUE(attach(0, wire::kMinProtocolVersion - 1, &reply));
  EXPECT_EQ(reply.status, static_cast<int32_t>(StatusCode::kUnsupported));
  EXPECT_EQ(wire::NegotiateProtocol(1, 9), v);
  EXPECT_EQ(wire::NegotiateProtocol(0, v + 1), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The start of this process's mapping of a client's ring region (memfd "kvtier-ring-N").
uint8_t* MappedRingRegion() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:kvtier-ring-") == std::string::npos) continue;
    unsigned long long start = 0;
    if (std::sscanf(line.c_str(), "%llx-", &start) == 1) return reinterpret_cast<uint8_t*>(start);
  }
  return nullptr;
}

// A libkvtier client whose ring the daemon can no longer read is disconnected, and its
// calls say why in the daemon's words, not just "closed".
TEST(ClientSemantics, DisconnectedClientShowsTheDaemonsReason) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket(), 3000);
  ASSERT_NE(c, nullptr) << LastError();
  ASSERT_EQ(kvtier_ping(c), KVTIER_OK);
  uint8_t* region = MappedRingRegion();
  ASSERT_NE(region, nullptr);
  wire::RingRegionHeader h;
  std::memcpy(&h, region, sizeof h);
  auto* ctl = reinterpret_cast<wire::RingControl*>(region + h.req_offset);
  std::atomic_ref<uint32_t>(ctl->tail).fetch_add(100000);  // impossible indices
  EXPECT_EQ(kvtier_ping(c), KVTIER_DISCONNECTED) << LastError();
  EXPECT_NE(LastError().find("request ring indices are corrupt"), std::string::npos) << LastError();
  EXPECT_EQ(kvtier_ping(c), KVTIER_DISCONNECTED);
  EXPECT_NE(LastError().find("connection to kvtierd is closed"), std::string::npos) << LastError();
  EXPECT_NE(LastError().find("request ring indices are corrupt"), std::string::npos) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace kvtier::testing
