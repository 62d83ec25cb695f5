// ClusterClient implementation. See cluster_client.h for the behaviour.
#include "tiers/remote/cluster_client.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace kvtier::remote {

namespace {

constexpr uint16_t kSlots = 16384;

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, no reflection. The Redis Cluster
// key hash (cluster spec, "Keys distribution model"); its test vector "123456789" ->
// 0x31C3 is checked in tests/remote.
constexpr std::array<uint16_t, 256> MakeCrcTable() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t c = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) c = (c & 0x8000) ? static_cast<uint16_t>((c << 1) ^ 0x1021) : static_cast<uint16_t>(c << 1);
    t[static_cast<size_t>(i)] = c;
  }
  return t;
}
constexpr auto kCrcTable = MakeCrcTable();

uint16_t Crc16(std::string_view s) {
  uint16_t crc = 0;
  for (unsigned char ch : s) crc = static_cast<uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ ch) & 0xff]);
  return crc;
}

using Clock = std::chrono::steady_clock;

// The reader's default reply functions, with createString replaced by one that honours
// Command::sink (the command being read is the reader's privdata). Copied by value from
// the library's own table, so every other function stays hiredis's.
redisReplyObjectFunctions g_default_fns;
void* SinkCreateString(const redisReadTask* task, char* str, size_t len) {
  auto* cmd = static_cast<Command*>(task->privdata);
  if (cmd && task->parent == nullptr && task->type == REDIS_REPLY_STRING && !cmd->sink.empty() &&
      len == cmd->sink_prefix + cmd->sink.size()) {
    std::memcpy(cmd->sink.data(), str + cmd->sink_prefix, cmd->sink.size());
    cmd->sunk = true;
    return g_default_fns.createString(task, str, cmd->sink_prefix);
  }
  return g_default_fns.createString(task, str, len);
}
redisReplyObjectFunctions* SinkFunctions(const redisReplyObjectFunctions* defaults) {
  static redisReplyObjectFunctions fns = [&] {
    g_default_fns = *defaults;
    redisReplyObjectFunctions f = *defaults;
    f.createString = SinkCreateString;
    return f;
  }();
  return &fns;
}

}  // namespace

uint16_t KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) & (kSlots - 1);
}

// "s" in quotes. (Built with append: GCC 12 at -O3 reports a false -Wrestrict in
// `"\"" + std::string(s) + ...`, GCC bug 105329, which -Werror turns into a build failure.)
static std::string Quoted(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q += '"';
  q.append(s);
  q += '"';
  return q;
}

Status ParseHostPort(std::string_view s, std::string* host, uint16_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) {
    return Status::Invalid(Quoted(s) + " is not host:port");
  }
  unsigned v = 0;
  const char* b = s.data() + colon + 1;
  const char* e = s.data() + s.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e || v == 0 || v > 65535) {
    return Status::Invalid(Quoted(s) + ": port is not in [1, 65535]");
  }
  *host = std::string(s.substr(0, colon));
  *port = static_cast<uint16_t>(v);
  return Status::Ok();
}

Status ClusterOptions::Validate() const {
  if (nodes.empty()) return Status::Invalid("no nodes");
  for (const auto& n : nodes) {
    std::string h;
    uint16_t p;
    KVTIER_RETURN_IF_ERROR(ParseHostPort(n, &h, &p));
  }
  if (connect_timeout_ms == 0 || connect_timeout_ms > 60000) return Status::Invalid("connect_timeout_ms not in [1, 60000]");
  if (command_timeout_ms == 0 || command_timeout_ms > 60000) return Status::Invalid("command_timeout_ms not in [1, 60000]");
  if (pool_size == 0 || pool_size > 256) return Status::Invalid("pool_size not in [1, 256]");
  if (max_redirects > 16) return Status::Invalid("max_redirects not in [0, 16]");
  if (!user.empty() && password.empty()) return Status::Invalid("a user needs a password");
  if (!tls.enabled && (!tls.ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty() ||
                       !tls.server_name.empty())) {
    return Status::Invalid("TLS files or a server name are set while TLS is off");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Status::Invalid("a TLS client certificate needs both its certificate and its key file");
  }
  return Status::Ok();
}

// A connection a Take() handed out; back to the pool with Give().
using ConnPtr = std::unique_ptr<Connection>;

// Errors that say "the node does not accept us" rather than "the node is not there".
bool IsRefusal(std::string_view reply_error) {
  return reply_error.rfind("NOAUTH", 0) == 0 || reply_error.rfind("WRONGPASS", 0) == 0 ||
         reply_error.rfind("NOPERM", 0) == 0;
}

struct ClusterClient::Impl {
  ClusterOptions opts;
  ConnectSettings conn;  // the same for every node: timeouts, AUTH, TLS
  mutable std::mutex mu;  // guards everything below
  std::array<std::string, kSlots> slot_owner;  // "host:port" or ""
  std::map<std::string, std::vector<ConnPtr>> idle;  // per node
  std::unordered_map<std::string, Clock::time_point> down_until;
  std::vector<std::string> known;  // every node seen (seeds + CLUSTER SLOTS)
  Clock::time_point last_refresh{};
  bool refresh_wanted = false;
  ClusterStats st;
  Status last_refusal;  // the latest Rejected of a connect or AUTH (Ok when none)
  Clock::time_point last_refusal_log{};

  // A refusal after start (a password rotated on the cluster, an expired certificate):
  // each one is a miss like a node down; the log says why, at most every 10 s.
  void NoteRefusal(const Status& s) {
    std::lock_guard<std::mutex> l(mu);
    last_refusal = s;
    const auto now = Clock::now();
    if (now - last_refusal_log >= std::chrono::seconds(10)) {
      last_refusal_log = now;
      spdlog::warn("remote tier: {} (its keys are misses)", s.message());
    }
  }

  bool IsDown(const std::string& node) {
    std::lock_guard<std::mutex> l(mu);
    auto it = down_until.find(node);
    return it != down_until.end() && Clock::now() < it->second;
  }
  void MarkDown(const std::string& node) {
    std::lock_guard<std::mutex> l(mu);
    down_until[node] = Clock::now() + std::chrono::milliseconds(opts.down_backoff_ms);
    refresh_wanted = true;
    ++st.io_errors;
  }

  // A connection to node (connected, TLS, AUTH done), from the pool or new; nullptr (and
  // the node marked down) when it cannot connect; *why says why.
  ConnPtr Take(const std::string& node, Status* why = nullptr) {
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = idle.find(node);
      if (it != idle.end() && !it->second.empty()) {
        ConnPtr c = std::move(it->second.back());
        it->second.pop_back();
        return c;
      }
    }
    if (IsDown(node)) {
      if (why) *why = Status::IoError("node " + node + " is down");
      return nullptr;
    }
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(node, &host, &port); !s.ok()) {
      if (why) *why = s;
      return nullptr;
    }
    auto c = Connection::Open(host, port, conn);
    if (!c.ok()) {
      spdlog::debug("remote: connect {} failed: {}", node, c.status().message());
      if (c.status().code() == StatusCode::kRejected) NoteRefusal(c.status());
      if (why) *why = c.status();
      MarkDown(node);
      return nullptr;
    }
    redisReader* r = c.value()->reader();
    r->fn = SinkFunctions(r->fn);
    std::lock_guard<std::mutex> l(mu);
    ++st.connects;
    return std::move(c.value());
  }
  void Give(const std::string& node, ConnPtr c, bool ok) {
    if (!ok || c->broken()) return;
    std::lock_guard<std::mutex> l(mu);
    auto& v = idle[node];
    if (v.size() < opts.pool_size) v.push_back(std::move(c));
  }
  void DropIdle(const std::string& node) {
    std::vector<ConnPtr> v;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = idle.find(node);
      if (it == idle.end()) return;
      v.swap(it->second);
    }
  }

  std::string Owner(uint16_t slot) const {
    std::lock_guard<std::mutex> l(mu);
    return slot_owner[slot];
  }

  Status Refresh();
  void MaybeRefresh() {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!refresh_wanted) return;
      if (Clock::now() - last_refresh < std::chrono::milliseconds(opts.refresh_interval_ms)) return;
    }
    (void)Refresh();
  }
};

Status ClusterClient::Impl::Refresh() {
  std::vector<std::string> cands;
  {
    std::lock_guard<std::mutex> l(mu);
    last_refresh = Clock::now();
    cands = opts.nodes;
    for (const auto& k : known) {
      if (std::find(cands.begin(), cands.end(), k) == cands.end()) cands.push_back(k);
    }
    ++st.refreshes;
  }
  Status refused;  // the first node that answered but refused us
  for (const std::string& node : cands) {
    Status why;
    ConnPtr c = Take(node, &why);
    if (!c) {
      if (refused.ok() && why.code() == StatusCode::kRejected) refused = why;
      continue;
    }
    Reply r;
    const std::string_view argv[] = {"CLUSTER", "SLOTS"};
    Status s = c->Command(argv, &r);
    if (!s.ok() || r->type != REDIS_REPLY_ARRAY) {
      if (s.ok() && r->type == REDIS_REPLY_ERROR && IsRefusal(std::string_view(r->str, r->len))) {
        s = Status::Rejected("CLUSTER SLOTS refused by " + node + ": " + std::string(r->str, r->len));
        NoteRefusal(s);
      }
      if (refused.ok() && s.code() == StatusCode::kRejected) refused = s;
      Give(node, std::move(c), false);
      if (!s.ok()) MarkDown(node);
      continue;
    }
    Give(node, std::move(c), true);
    std::array<std::string, kSlots> owner;
    std::vector<std::string> seen;
    size_t covered = 0;
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) continue;
      const redisReply* m = e->element[2];
      if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
          m->type != REDIS_REPLY_ARRAY || m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
          m->element[1]->type != REDIS_REPLY_INTEGER) {
        continue;
      }
      std::string host(m->element[0]->str, m->element[0]->len);
      if (host.empty() || host == "?") host = node.substr(0, node.rfind(':'));  // "announce" unknown
      const std::string addr = host + ":" + std::to_string(m->element[1]->integer);
      const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
      if (lo < 0 || hi >= kSlots || lo > hi) continue;
      for (long long s = lo; s <= hi; ++s) owner[static_cast<size_t>(s)] = addr;
      covered += static_cast<size_t>(hi - lo + 1);
      for (size_t j = 2; j < e->elements; ++j) {  // master and replicas
        const redisReply* n = e->element[j];
        if (n->type == REDIS_REPLY_ARRAY && n->elements >= 2 && n->element[0]->type == REDIS_REPLY_STRING &&
            n->element[1]->type == REDIS_REPLY_INTEGER) {
          std::string h(n->element[0]->str, n->element[0]->len);
          if (h.empty() || h == "?") h = host;
          seen.push_back(h + ":" + std::to_string(n->element[1]->integer));
        }
      }
    }
    std::lock_guard<std::mutex> l(mu);
    slot_owner = std::move(owner);
    for (const auto& s : seen) {
      if (std::find(known.begin(), known.end(), s) == known.end()) known.push_back(s);
    }
    refresh_wanted = covered < kSlots;  // a slot without owner: ask again later
    return Status::Ok();
  }
  std::lock_guard<std::mutex> l(mu);
  refresh_wanted = true;
  if (!refused.ok()) return Status::Rejected("remote tier: " + refused.message());
  return Status::IoError("remote: no cluster node answered CLUSTER SLOTS");
}

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() = default;

StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Open(const ClusterOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->conn.connect_timeout_ms = opts.connect_timeout_ms;
  impl->conn.command_timeout_ms = opts.command_timeout_ms;
  impl->conn.user = opts.user;
  impl->conn.password = opts.password;
  if (opts.tls.enabled) {
    auto t = TlsContext::Create(opts.tls);
    if (!t.ok()) return Status::Invalid("remote tier: " + t.status().message());
    impl->conn.tls = std::move(t.value());
    if (!opts.tls.verify) spdlog::warn("remote tier: TLS without certificate verification (tls_verify = false)");
  }
  auto c = std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
  // A cluster that is down at start is not an error: every command is a miss until a
  // refresh succeeds. A node that answers and refuses us is: nothing would ever be served.
  Status s = c->impl_->Refresh();
  if (s.code() == StatusCode::kRejected) return s;
  if (!s.ok()) spdlog::warn("remote tier: {} (will retry)", s.message());
  return c;
}

Status ClusterClient::RefreshTopology() { return impl_->Refresh(); }
std::string ClusterClient::NodeForSlot(uint16_t slot) const { return impl_->Owner(slot & (kSlots - 1)); }
ClusterStats ClusterClient::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->st;
}
const ClusterOptions& ClusterClient::options() const { return impl_->opts; }

void ClusterClient::Exec(std::span<Command> cmds) {
  Impl& I = *impl_;
  I.MaybeRefresh();
  struct Route {
    size_t idx;
    std::string node;
    bool asking;
  };
  std::vector<Route> todo;
  todo.reserve(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    Command& c = cmds[i];
    c.reply.reset();
    c.status = Status::IoError("remote: not run");
    if (c.key_index >= c.argv.size()) {
      c.status = Status::Invalid("remote: command without key");
      continue;
    }
    std::string node = I.Owner(KeySlot(c.argv[c.key_index]));
    if (node.empty()) {
      c.status = Status::IoError("remote: no node owns the slot (cluster unreachable?)");
      continue;
    }
    todo.push_back({i, std::move(node), false});
  }
  {
    std::lock_guard<std::mutex> l(I.mu);
    I.st.commands += cmds.size();
  }
  for (uint32_t hop = 0; hop <= I.opts.max_redirects && !todo.empty(); ++hop) {
    std::map<std::string, std::vector<Route>> by_node;
    for (auto& r : todo) by_node[r.node].push_back(std::move(r));
    todo.clear();
    // Phase 1: write every command of every node.
    struct Conn {
      std::string node;
      ConnPtr ctx;
      std::vector<Route> routes;
      Status st;  // Ok while the connection is healthy
    };
    std::vector<Conn> conns;
    for (auto& [node, routes] : by_node) {
      Status why;
      ConnPtr ctx = I.Take(node, &why);
      if (!ctx) {
        for (const Route& r : routes) cmds[r.idx].status = Status::IoError("remote: " + why.message());
        continue;
      }
      Status st;
      static constexpr std::string_view kAsking[] = {"ASKING"};
      for (const Route& r : routes) {
        if (r.asking && st.ok()) st = ctx->Append(kAsking);
        if (st.ok()) st = ctx->Append(cmds[r.idx].argv);
      }
      // Write everything now so that every node works in parallel.
      if (st.ok()) st = ctx->Flush();
      conns.push_back({node, std::move(ctx), std::move(routes), st});
    }
    // Phase 2: read the replies, in order, per node.
    for (Conn& cn : conns) {
      for (const Route& r : cn.routes) {
        Command& c = cmds[r.idx];
        if (!cn.st.ok()) {
          c.status = Status::IoError("remote: " + cn.st.message());
          continue;
        }
        if (r.asking) {
          Reply a;
          cn.st = cn.ctx->Read(&a);
          if (!cn.st.ok()) {
            c.status = Status::IoError("remote: " + cn.st.message());
            continue;
          }
        }
        Reply rep;
        c.sunk = false;
        cn.ctx->reader()->privdata = &c;
        cn.st = cn.ctx->Read(&rep);
        cn.ctx->reader()->privdata = nullptr;
        if (!cn.st.ok()) {
          c.status = Status::IoError("remote: " + cn.st.message());
          continue;
        }
        if (rep->type == REDIS_REPLY_ERROR) {
          std::string_view e(rep->str, rep->len);
          const bool moved = e.rfind("MOVED ", 0) == 0, ask = e.rfind("ASK ", 0) == 0;
          if (moved || ask) {
            // "MOVED 3999 127.0.0.1:6381"
            const size_t sp1 = e.find(' '), sp2 = e.find(' ', sp1 + 1);
            std::string target = sp2 == std::string_view::npos ? "" : std::string(e.substr(sp2 + 1));
            unsigned slot = 0;
            std::from_chars(e.data() + sp1 + 1, e.data() + (sp2 == std::string_view::npos ? e.size() : sp2), slot);
            if (!target.empty() && target[0] == ':') target = cn.node.substr(0, cn.node.rfind(':')) + target;
            std::lock_guard<std::mutex> l(I.mu);
            if (moved) {
              ++I.st.moved;
              if (slot < kSlots && !target.empty()) I.slot_owner[slot] = target;
              I.refresh_wanted = true;
            } else {
              ++I.st.ask;
            }
            if (target.empty()) {
              c.status = Status::IoError("remote: bad redirect \"" + std::string(e) + "\"");
            } else {
              c.status = Status::IoError("remote: too many redirects");
              todo.push_back({r.idx, target, ask});
            }
            continue;
          }
          // CLUSTERDOWN, TRYAGAIN, LOADING...: a miss for now, and look again. NOAUTH,
          // NOPERM (an ACL that does not cover the key prefix): a miss, and said in the log.
          c.status = Status::IoError("remote: node " + cn.node + ": " + std::string(e));
          if (IsRefusal(e)) I.NoteRefusal(Status::Rejected("node " + cn.node + ": " + std::string(e)));
          std::lock_guard<std::mutex> l(I.mu);
          I.refresh_wanted = true;
          continue;
        }
        c.status = Status::Ok();
        c.reply = std::move(rep);
      }
      const bool ok = cn.st.ok();
      if (!ok) {
        if (cn.st.code() == StatusCode::kRejected) I.NoteRefusal(cn.st);
        I.MarkDown(cn.node);
        I.DropIdle(cn.node);  // the other idle connections to it are suspect too
      }
      I.Give(cn.node, std::move(cn.ctx), ok);
    }
  }
  I.MaybeRefresh();
}

}  // namespace kvtier::remote
