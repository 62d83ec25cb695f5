// Fault injection behind the real NVMe store of a running kvtierd: the daemon is
// started with KVTIER_TEST_FAULTS (tiers/nvme/fault_device.h), so its io_uring device is
// wrapped by a FaultDevice that fails, tears or flips a share of every kind of operation.
// A client stores blocks (small host tier: they are demoted to NVMe at once) and reads
// random ones back (promotions from NVMe). Every block served is byte-checked; each fault
// must be logged and end as a miss or a refused NVMe write; the daemon must keep serving.
// A clean restart then reads everything back (header flips are caught there).
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <regex>
#include <thread>

#include "tests/reliability/reliability_util.h"

namespace kvtier::reliability {
namespace {

using testing::DaemonConfig;
using testing::DaemonProcess;

size_t CountLines(const std::string& log, const std::string& needle) {
  size_t n = 0, p = 0;
  while ((p = log.find(needle, p)) != std::string::npos) {
    ++n;
    p += needle.size();
  }
  return n;
}

TEST(FaultInjection, DaemonServesOnlyRightBytesUnderNvmeFaults) {
#if !KVTIER_TEST_POINTS
  GTEST_SKIP() << "built without KVTIER_TEST_POINTS: KVTIER_TEST_FAULTS is compiled out";
#endif
  const long blocks = EnvInt("KVTIER_FAULT_BLOCKS", 1500);
  DaemonConfig cfg;
  cfg.nvme_capacity = "4MiB";  // 512 records
  cfg.binary = "kvtierd-test";  // the daemon that reads KVTIER_TEST_FAULTS
  DaemonProcess d(cfg);
  bool started;
  {
    ScopedEnv f("KVTIER_TEST_FAULTS",
                "read_error=0.03,short_read=0.03,write_error=0.02,short_write=0.02,enospc=0.02,"
                "flip_payload=0.02,flip_header=0.02,seed=" + std::to_string(EnvInt("KVTIER_FAULT_SEED", 7)));
    started = d.Start();
  }
  ASSERT_TRUE(started) << d.log();

  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::mt19937_64 rng(1);
  std::vector<kvtier_key> stored;
  uint64_t ops = 0, errors = 0, served = 0, wrong = 0, misses = 0, backpressure = 0;
  for (long i = 0; i < blocks; i += 4) {
    std::vector<kvtier_key> keys;
    for (int j = 0; j < 4; ++j) keys.push_back(MakeKey(2, static_cast<uint64_t>(i + j)));
    size_t done = 0;
    // RETRY is back-pressure (the host tier's blocks are still being written to NVMe, and
    // this client stores faster than the faulty disk takes them): wait and retry, as a
    // client must. Anything else, or RETRY for 5 s, is an error.
    kvtier_status s = KVTIER_RETRY;
    for (int t = 0; t < 500 && s == KVTIER_RETRY; ++t) {
      if (t > 0) {
        ++backpressure;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      s = c.Store(keys, [](const kvtier_key&) {}, &done);
    }
    ++ops;
    if (s != KVTIER_OK) {
      ++errors;
      ADD_FAILURE() << "store: " << kvtier_status_name(s) << ": " << kvtier_last_error();
    }
    for (auto& k : keys) stored.push_back(k);
    for (int r = 0; r < 3; ++r) {
      bool sv = false, w = false;
      s = c.Check(stored[rng() % stored.size()], &sv, &w);
      ++ops;
      if (s != KVTIER_OK) {
        ++errors;
        ADD_FAILURE() << "check: " << kvtier_status_name(s) << ": " << kvtier_last_error();
      }
      (sv ? served : misses)++;
      if (w) ++wrong;
    }
  }
  ASSERT_TRUE(d.Alive()) << "kvtierd died under faults\n" << d.log();
  const std::string log = d.log();
  const char* kinds[] = {"read error (EIO)", "short read", "write error (EIO)", "short write",
                         "ENOSPC", "payload bit flip", "header bit flip"};
  bench::Report r("reliability: fault injection behind the NVMe store of a running kvtierd",
                  "build/bin/reliability_test --gtest_filter='FaultInjection.*' (KVTIER_FAULT_BLOCKS=" +
                      std::to_string(blocks) + ")");
  r.SetColumns({"figure", "value"});
  size_t injected = 0;
  for (const char* k : kinds) {
    const size_t n = CountLines(log, std::string("fault injected: ") + k + " ");
    injected += n;
    r.AddRow({std::string("faults injected: ") + k, std::to_string(n)});
    EXPECT_GT(n, 0u) << "no " << k << " was injected; raise KVTIER_FAULT_BLOCKS";
  }
  // What the store made of them: corruption caught on read (and dropped), refused writes.
  const size_t caught = CountLines(log, "nvme: nvme payload checksum mismatch") +
                        CountLines(log, "nvme: nvme record header");
  const size_t refused = CountLines(log, "nvme: write of block");
  const size_t read_failed = CountLines(log, "nvme: read of block");
  EXPECT_GT(caught, 0u) << "no corrupt read was logged";
  EXPECT_GT(refused, 0u) << "no refused NVMe write was logged";
  EXPECT_GT(read_failed, 0u) << "no failed NVMe read was logged";

  // A clean restart (no faults): what was flipped or torn on disk is caught and dropped;
  // everything served is right.
  EXPECT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start()) << d.log();
  c.Close();
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK);
  uint64_t served2 = 0, held = 0;
  for (const auto& k : stored) {
    bool sv = false, w = false;
    kvtier_status s = c.Check(k, &sv, &w);
    ++ops;
    if (s != KVTIER_OK) ++errors;
    if (sv) ++served2;
    if (w) ++wrong;
    if (sv && ++held % 32 == 0) {  // keep few leases open: reconnect releases them
      c.Close();
      ASSERT_EQ(c.Open(d.socket()), KVTIER_OK);
    }
  }
  const std::string log2 = d.log().substr(log.size() < d.log().size() ? log.size() : 0);
  const size_t caught2 = CountLines(log2, "nvme: nvme payload checksum mismatch") +
                         CountLines(log2, "nvme: nvme record header");
  EXPECT_TRUE(d.Alive());
  r.AddRow({"faults injected (total)", std::to_string(injected)});
  r.AddRow({"corrupt records caught while running (miss + dropped)", std::to_string(caught)});
  r.AddRow({"NVMe writes refused (logged)", std::to_string(refused)});
  r.AddRow({"NVMe reads failed (logged, miss)", std::to_string(read_failed)});
  r.AddRow({"corrupt records caught after a clean restart", std::to_string(caught2)});
  r.AddRow({"client operations", std::to_string(ops)});
  r.AddRow({"blocks served and byte-checked (running / after restart)",
            std::to_string(served) + " / " + std::to_string(served2)});
  r.AddRow({"misses while running", std::to_string(misses)});
  r.AddRow({"back-pressure answers (RETRY, retried after 10 ms)", std::to_string(backpressure)});
  r.AddRow({"client errors", std::to_string(errors)});
  r.AddRow({"wrong blocks served", std::to_string(wrong)});
  r.AddRow({"daemon crashes", "0"});
  EmitReport(r);
  std::printf("RELIABILITY faults: injected %zu, caught corrupt %zu (+%zu after restart), refused writes %zu, "
              "failed reads %zu, served %llu/%llu, wrong %llu, errors %llu\n",
              injected, caught, caught2, refused, read_failed, (unsigned long long)served,
              (unsigned long long)served2, (unsigned long long)wrong, (unsigned long long)errors);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(errors, 0u);
  EXPECT_GT(served, 0u);
}

}  // namespace
}  // namespace kvtier::reliability
