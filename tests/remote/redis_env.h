// Helpers of the remote-tier tests: the shared cluster (started by the ctest fixture
// remote_cluster_start, scripts/redis-cluster.sh on ports 7400..7405), private clusters
// for tests that kill nodes, a plain hiredis connection for admin commands, and the
// secure cluster (remote_cluster_secure_start, ports 7410..7415) with its admin connection.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tiers/remote/connection.h"

namespace kvtier::remote::testing {

inline bool HaveRedis() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

inline bool Answers(const std::string& hostport);

// Seeds of the shared cluster (the ctest fixture's ports); empty when it is not running.
inline std::vector<std::string> SharedNodes() {
  std::vector<std::string> out;
  std::stringstream ss(KVTIER_REDIS_NODES);
  std::string n;
  while (std::getline(ss, n, ',')) out.push_back(n);
  if (out.empty() || !Answers(out[0])) out.clear();
  return out;
}
inline std::string SharedDir() { return KVTIER_REDIS_DIR; }

#define KVTIER_REQUIRE_REDIS()                                                                 \
  do {                                                                                         \
    if (!::kvtier::remote::testing::HaveRedis())                                              \
      GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server redis-tools)"; \
  } while (0)

#define KVTIER_REQUIRE_SHARED_CLUSTER()                                                        \
  do {                                                                                         \
    KVTIER_REQUIRE_REDIS();                                                                    \
    if (::kvtier::remote::testing::SharedNodes().empty())                                      \
      GTEST_SKIP() << "the shared cluster (" KVTIER_REDIS_NODES ") is not running: run through ctest (fixture remote_cluster_start)"; \
  } while (0)

struct RedisConn {
  redisContext* c = nullptr;
  RedisConn(const std::string& host, int port) {
    timeval tv{2, 0};
    c = redisConnectWithTimeout(host.c_str(), port, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
  }
  explicit RedisConn(const std::string& hostport)
      : RedisConn(hostport.substr(0, hostport.rfind(':')), std::stoi(hostport.substr(hostport.rfind(':') + 1))) {}
  ~RedisConn() {
    if (c) redisFree(c);
  }
  bool ok() const { return c && !c->err; }
  // One command; the reply as text (status/string/error: its text; integer: decimal;
  // nil: "(nil)"), or "(io error)".
  std::string Cmd(const std::vector<std::string>& argv) {
    std::vector<const char*> a;
    std::vector<size_t> l;
    for (const auto& s : argv) a.push_back(s.data()), l.push_back(s.size());
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data()));
    if (!r) return "(io error)";
    std::string out;
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS:
      case REDIS_REPLY_ERROR: out.assign(r->str, r->len); break;
      case REDIS_REPLY_INTEGER: out = std::to_string(r->integer); break;
      case REDIS_REPLY_NIL: out = "(nil)"; break;
      default: out = "(array)"; break;
    }
    freeReplyObject(r);
    return out;
  }
};

// A private 6-node cluster under a temp folder, for tests that kill or stop nodes.
class PrivateCluster {
 public:
  explicit PrivateCluster(int base_port) : base_(base_port) {
    char tmpl[] = "/tmp/kvtier-redis-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string cmd = std::string(KVTIER_SOURCE_DIR) + "/scripts/redis-cluster.sh start " + dir_ + " " +
                            std::to_string(base_) + " >" + dir_ + ".log 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
  }
  ~PrivateCluster() {
    const std::string cmd = std::string(KVTIER_SOURCE_DIR) + "/scripts/redis-cluster.sh stop " + dir_;
    (void)!std::system(cmd.c_str());
    (void)!std::system(("rm -f " + dir_ + ".log").c_str());
  }
  bool ok() const { return ok_; }
  std::string log() const {
    std::ifstream f(dir_ + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::vector<std::string> nodes() const {
    std::vector<std::string> v;
    for (int i = 0; i < 6; ++i) v.push_back("127.0.0.1:" + std::to_string(base_ + i));
    return v;
  }
  pid_t pid(int port) const {
    std::ifstream f(dir_ + "/" + std::to_string(port) + "/redis.pid");
    pid_t p = 0;
    f >> p;
    return p;
  }

 private:
  int base_;
  std::string dir_;
  bool ok_ = false;
};

inline bool Answers(const std::string& hostport) {
  RedisConn c(hostport);
  return c.ok() && c.Cmd({"PING"}) == "PONG";
}

// Port of the node serving `slot` as master, read with CLUSTER SLOTS through `seed`.
inline int MasterPortOfSlot(const std::string& seed, int slot) {
  RedisConn c(seed);
  auto* r = static_cast<redisReply*>(redisCommand(c.c, "CLUSTER SLOTS"));
  int port = -1;
  if (r && r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; ++i) {
      auto* e = r->element[i];
      if (e->element[0]->integer <= slot && slot <= e->element[1]->integer) {
        port = static_cast<int>(e->element[2]->element[1]->integer);
      }
    }
  }
  if (r) freeReplyObject(r);
  return port;
}

// The --secure cluster of the fixture remote_cluster_secure_start (TLS only, ACL users
// admin and kvtier; scripts/redis-cluster.sh says what it makes under its folder).
inline std::string SecureDir() { return KVTIER_REDIS_SECURE_DIR; }
inline std::vector<std::string> SecureNodeList() {
  std::vector<std::string> out;
  std::stringstream ss(KVTIER_REDIS_SECURE_NODES);
  std::string n;
  while (std::getline(ss, n, ',')) out.push_back(n);
  return out;
}
// TLS options that the secure cluster trusts (its CA, the client certificate).
inline TlsOptions SecureTls() {
  TlsOptions t;
  t.enabled = true;
  t.ca_file = SecureDir() + "/tls/ca.crt";
  t.cert_file = SecureDir() + "/tls/client.crt";
  t.key_file = SecureDir() + "/tls/client.key";
  return t;
}
inline std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}
// An admin connection to one node of the secure cluster; null when it does not answer.
inline std::unique_ptr<Connection> SecureAdmin(const std::string& hostport) {
  ConnectSettings s;
  s.connect_timeout_ms = 1000;
  s.command_timeout_ms = 5000;
  s.user = "admin";
  s.password = ReadFirstLine(SecureDir() + "/admin.password");
  auto t = TlsContext::Create(SecureTls());
  if (!t.ok() || s.password.empty()) return nullptr;
  s.tls = std::move(t.value());
  const size_t colon = hostport.rfind(':');
  auto c = Connection::Open(hostport.substr(0, colon), static_cast<uint16_t>(std::stoi(hostport.substr(colon + 1))), s);
  return c.ok() ? std::move(c.value()) : nullptr;
}
// One command; the reply as text, as RedisConn::Cmd.
inline std::string Cmd(Connection& c, const std::vector<std::string>& argv) {
  std::vector<std::string_view> a(argv.begin(), argv.end());
  Reply r;
  if (!c.Command(a, &r).ok()) return "(io error)";
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR: return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "(nil)";
    default: return "(array)";
  }
}

#define KVTIER_REQUIRE_SECURE_CLUSTER()                                                        \
  do {                                                                                         \
    KVTIER_REQUIRE_REDIS();                                                                    \
    if (!::kvtier::remote::testing::SecureAdmin(::kvtier::remote::testing::SecureNodeList()[0])) \
      GTEST_SKIP() << "the secure cluster (" KVTIER_REDIS_SECURE_NODES ") is not running: run through ctest (fixture remote_cluster_secure_start)"; \
  } while (0)

}  // namespace kvtier::remote::testing
