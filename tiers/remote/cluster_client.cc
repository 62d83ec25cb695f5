// ClusterClient implementation. See cluster_client.h for the behaviour.
#include "tiers/remote/cluster_client.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <sys/time.h>

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

timeval Tv(uint32_t ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
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

void ReplyDeleter::operator()(redisReply* r) const {
  if (r) freeReplyObject(r);
}

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
  return Status::Ok();
}

struct ClusterClient::Impl {
  ClusterOptions opts;
  mutable std::mutex mu;  // guards everything below
  std::array<std::string, kSlots> slot_owner;  // "host:port" or ""
  std::map<std::string, std::vector<redisContext*>> idle;  // per node
  std::unordered_map<std::string, Clock::time_point> down_until;
  std::vector<std::string> known;  // every node seen (seeds + CLUSTER SLOTS)
  Clock::time_point last_refresh{};
  bool refresh_wanted = false;
  ClusterStats st;

  ~Impl() {
    for (auto& [n, v] : idle) {
      for (redisContext* c : v) redisFree(c);
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

  // A connection to node, from the pool or new; nullptr (and the node marked down) when
  // it cannot connect.
  redisContext* Take(const std::string& node) {
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = idle.find(node);
      if (it != idle.end() && !it->second.empty()) {
        redisContext* c = it->second.back();
        it->second.pop_back();
        return c;
      }
    }
    if (IsDown(node)) return nullptr;
    std::string host;
    uint16_t port = 0;
    if (!ParseHostPort(node, &host, &port).ok()) return nullptr;
    redisContext* c = redisConnectWithTimeout(host.c_str(), port, Tv(opts.connect_timeout_ms));
    if (!c || c->err) {
      spdlog::debug("remote: connect {} failed: {}", node, c ? c->errstr : "out of memory");
      if (c) redisFree(c);
      MarkDown(node);
      return nullptr;
    }
    if (redisSetTimeout(c, Tv(opts.command_timeout_ms)) != REDIS_OK) {
      redisFree(c);
      MarkDown(node);
      return nullptr;
    }
    c->reader->maxbuf = 0;  // keep the read buffer: values are ~1.4 MiB
    c->reader->fn = SinkFunctions(c->reader->fn);
    std::lock_guard<std::mutex> l(mu);
    ++st.connects;
    return c;
  }
  void Give(const std::string& node, redisContext* c, bool ok) {
    if (!ok || c->err) {
      redisFree(c);
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    auto& v = idle[node];
    if (v.size() < opts.pool_size) {
      v.push_back(c);
    } else {
      redisFree(c);
    }
  }
  void DropIdle(const std::string& node) {
    std::vector<redisContext*> v;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = idle.find(node);
      if (it == idle.end()) return;
      v.swap(it->second);
    }
    for (redisContext* c : v) redisFree(c);
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
  for (const std::string& node : cands) {
    redisContext* c = Take(node);
    if (!c) continue;
    Reply r(static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS")));
    if (!r || r->type != REDIS_REPLY_ARRAY) {
      Give(node, c, false);
      if (!r) MarkDown(node);
      continue;
    }
    Give(node, c, true);
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
  return Status::IoError("remote: no cluster node answered CLUSTER SLOTS");
}

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() = default;

StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Open(const ClusterOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  auto c = std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
  // A cluster that is down at start is not an error: every command is a miss until a
  // refresh succeeds.
  Status s = c->impl_->Refresh();
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
      redisContext* ctx;
      std::vector<Route> routes;
      bool ok;
    };
    std::vector<Conn> conns;
    for (auto& [node, routes] : by_node) {
      redisContext* ctx = I.Take(node);
      if (!ctx) {
        for (const Route& r : routes) cmds[r.idx].status = Status::IoError("remote: node " + node + " is down");
        continue;
      }
      bool ok = true;
      for (const Route& r : routes) {
        const Command& c = cmds[r.idx];
        if (r.asking) ok = ok && redisAppendCommand(ctx, "ASKING") == REDIS_OK;
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (auto a : c.argv) {
          argv.push_back(a.data());
          lens.push_back(a.size());
        }
        ok = ok && redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data()) == REDIS_OK;
      }
      // Flush the output buffer now so that every node works in parallel.
      int done = 0;
      while (ok && !done) ok = redisBufferWrite(ctx, &done) == REDIS_OK;
      conns.push_back({node, ctx, std::move(routes), ok});
    }
    // Phase 2: read the replies, in order, per node.
    for (Conn& cn : conns) {
      for (const Route& r : cn.routes) {
        Command& c = cmds[r.idx];
        if (!cn.ok) {
          c.status = Status::IoError("remote: node " + cn.node + ": " + (cn.ctx->err ? cn.ctx->errstr : "write failed"));
          continue;
        }
        if (r.asking) {
          void* a = nullptr;
          if (redisGetReply(cn.ctx, &a) != REDIS_OK) {
            cn.ok = false;
            c.status = Status::IoError("remote: node " + cn.node + ": " + cn.ctx->errstr);
            continue;
          }
          freeReplyObject(a);
        }
        void* raw = nullptr;
        c.sunk = false;
        cn.ctx->reader->privdata = &c;
        const int rc = redisGetReply(cn.ctx, &raw);
        cn.ctx->reader->privdata = nullptr;
        if (rc != REDIS_OK || !raw) {
          cn.ok = false;
          c.status = Status::IoError("remote: node " + cn.node + ": " + (cn.ctx->err ? cn.ctx->errstr : "no reply"));
          continue;
        }
        Reply rep(static_cast<redisReply*>(raw));
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
          // CLUSTERDOWN, TRYAGAIN, LOADING...: a miss for now, and look again.
          c.status = Status::IoError("remote: node " + cn.node + ": " + std::string(e));
          std::lock_guard<std::mutex> l(I.mu);
          I.refresh_wanted = true;
          continue;
        }
        c.status = Status::Ok();
        c.reply = std::move(rep);
      }
      if (!cn.ok) {
        I.MarkDown(cn.node);
        I.DropIdle(cn.node);  // the other idle connections to it are suspect too
      }
      I.Give(cn.node, cn.ctx, cn.ok);
    }
  }
  I.MaybeRefresh();
}

}  // namespace kvtier::remote
