// ClusterClient: a small Redis Cluster client (Debian ships no cluster client for C or
// C++), just what the remote tier needs, over Connection (connection.h: TCP or TLS,
// AUTH; hiredis formats the commands and parses the replies).
//
// - Routing: the slot map comes from CLUSTER SLOTS (asked of any reachable node: the
//   seeds first, then every node seen so far). A key's slot is CRC16-XMODEM of the key,
//   or of the part between the first '{' and the next '}' when that is non-empty (the
//   hash tag), modulo 16384: the algorithm of the Redis Cluster specification.
// - Redirects: MOVED updates that slot's owner at once, schedules a full topology refresh
//   and resends; ASK resends to the named node prefixed by ASKING, without touching the
//   map. At most max_redirects hops per command.
// - Batches: Exec() groups commands by node, pipelines each group on one connection
//   (every command of every node is written before any reply is read), then resends what
//   was redirected. One round trip per node per hop, whatever the batch size.
// - Connections: a pool per node (idle connections kept up to pool_size). A connection
//   that errs or times out is closed, never reused. Connect and every read/write are
//   bounded by the timeouts (SO_RCVTIMEO/SO_SNDTIMEO), so a down or stopped node costs at
//   most about connect + command timeout and turns into IoError results, never a hang. A
//   node that failed is skipped (its commands fail at once) for down_backoff_ms, and
//   the topology is refreshed (rate-limited) so that a promoted replica takes over.
// - Security: every connection, to a seed, to a node learned from CLUSTER SLOTS or to one
//   a MOVED/ASK redirect names, is made with the same TLS settings and AUTH. Open() fails
//   (Rejected) when a node answers but refuses us (AUTH refused, NOAUTH, certificate not
//   trusted) and none serves CLUSTER SLOTS: a wrong password or CA is an error at start,
//   while a cluster that is merely down is not.
//
// Threading: every method is thread-safe; concurrent Exec() calls use distinct
// connections. No exception leaves this class.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"

#include "tiers/remote/connection.h"
#include "tiers/remote/remote_options.h"

namespace kvtier::remote {

struct ClusterOptions {
  std::vector<std::string> nodes;   // seeds, "host:port" (at least one). Default: none
  uint32_t connect_timeout_ms = 200;  // per connection attempt. Default: 200
  uint32_t command_timeout_ms = 500;  // per socket read/write of a batch. Default: 500
  uint32_t pool_size = 4;             // idle connections kept per node. Default: 4
  uint32_t max_redirects = 5;         // MOVED/ASK hops per command. Default: 5
  uint32_t down_backoff_ms = 1000;    // skip a failed node this long. Default: 1000
  uint32_t refresh_interval_ms = 100;  // at most one topology refresh per interval. Default: 100
  std::string user;                   // ACL user for AUTH; "" = AUTH password only. Default: ""
  std::string password;               // the secret itself; "" = no AUTH. Default: ""
  TlsOptions tls;                     // Default: TLS off

  Status Validate() const;  // Invalid with a one-line reason
};

// "host:port" -> (host, port). Invalid on anything else.
Status ParseHostPort(std::string_view s, std::string* host, uint16_t* port);

// CRC16 slot of a key, honouring hash tags (0 .. 16383).
uint16_t KeySlot(std::string_view key);

// One command of a batch. argv[key_index] is the key that routes it.
struct Command {
  std::vector<std::string_view> argv;  // must outlive Exec()
  size_t key_index = 1;
  // Optional zero-copy sink for a GET of a large value: a string reply of exactly
  // sink_prefix + sink.size() bytes has its tail copied by the hiredis reader straight
  // from its input buffer into `sink` (no intermediate reply string), reply->str keeps
  // only the first sink_prefix bytes, and `sunk` is set. Other replies are untouched.
  // `sink` may be written even when the reply is then found invalid.
  std::span<uint8_t> sink;
  size_t sink_prefix = 0;
  bool sunk = false;
  // Results: status is Ok with a reply (which may be a nil or an integer reply), or
  // IoError (node down, timeout, too many redirects, error reply).
  Status status;
  Reply reply;
};

struct ClusterStats {
  uint64_t commands = 0, moved = 0, ask = 0, io_errors = 0, refreshes = 0, connects = 0;
};

class ClusterClient {
 public:
  static StatusOr<std::unique_ptr<ClusterClient>> Open(const ClusterOptions& opts);
  ~ClusterClient();

  // Runs every command; each gets its own status. Never blocks past roughly
  // (max_redirects + 1) * (connect + command timeout).
  void Exec(std::span<Command> cmds);

  // Asks a reachable node for CLUSTER SLOTS and replaces the slot map. IoError when none
  // answers. Exec() calls it itself after MOVED or a node failure (rate-limited).
  Status RefreshTopology();

  // The node that owns `slot` in the current map ("host:port"), or "" when unknown.
  std::string NodeForSlot(uint16_t slot) const;
  ClusterStats stats() const;
  const ClusterOptions& options() const;

 private:
  struct Impl;
  explicit ClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::remote
