// Options of the remote tier (a Redis Cluster shared by a fleet of daemons), kept apart
// from remote_tier.h so that tiers/tier_manager.h can hold them without pulling in hiredis.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::remote {

// When a block is written to the remote tier.
enum class RemoteWrite : uint8_t {
  kOff = 0,           // never: this daemon only reads the remote tier
  kOnDemote = 1,      // when the block leaves the host tier (demoted to NVMe or dropped)
  kWriteThrough = 2,  // at commit (host commits; HBM commits when they reach host)
};

// TLS to the cluster's nodes (OpenSSL; docs/remote.md "Authentication and TLS").
struct TlsOptions {
  bool enabled = false;     // TLS on every connection. Default: false
  std::string ca_file;      // PEM bundle of the CAs that sign the nodes' certificates;
                            // "" = the system's trust store. Default: ""
  std::string cert_file;    // client certificate chain (PEM), for nodes that ask for one
                            // (tls-auth-clients); "" = none. Default: ""
  std::string key_file;     // its private key (PEM); set with cert_file. Default: ""
  std::string server_name;  // name the certificates must carry (and the SNI sent);
                            // "" = the node's host as addressed (IP or DNS name). Default: ""
  bool verify = true;       // verify the node's certificate chain and name. Default: true

  bool operator==(const TlsOptions&) const = default;
};

// The default key prefix: keys are kvt:{<contract>:<key>}, as before prefixes existed.
inline constexpr const char* kDefaultKeyPrefix = "kvt:";

struct RemoteOptions {
  std::vector<std::string> nodes;       // seed nodes "host:port"; empty = no remote tier. Default: none
  uint32_t connect_timeout_ms = 200;    // Default: 200
  uint32_t command_timeout_ms = 500;    // Default: 500
  uint32_t pool_size = 4;               // idle connections per node. Default: 4
  RemoteWrite write = RemoteWrite::kOnDemote;  // Default: on-demote
  bool compress = true;                 // zstd when it saves >= 1/8. Default: true
  uint32_t batch = 16;                  // blocks per pipelined GET/SET batch. Default: 16
  uint64_t write_queue_bytes = 256ull << 20;  // pending writes beyond this are dropped. Default: 256MiB
  double read_gbps = 1.0;               // restore bandwidth until measured. Default: 1.0
  // AUTH on every connection: `AUTH user password`, or `AUTH password` with no user.
  std::string user;                     // Redis ACL user; "" = the default user. Default: ""
  // File holding the password (its first line; the file must not be readable or writable
  // by others). Read once by RemoteTier::Open; "" = no AUTH. Default: ""
  std::string password_file;
  TlsOptions tls;
  // Put before every key: <key_prefix>[<namespace>:]{<contract>:<key>}. Printable ASCII
  // without spaces or braces, at most 64 bytes. Default: "kvt:"
  std::string key_prefix = kDefaultKeyPrefix;

  // What a running daemon cannot change (a reload must keep them).
  bool SameConnection(const RemoteOptions& o) const {
    return nodes == o.nodes && connect_timeout_ms == o.connect_timeout_ms &&
           command_timeout_ms == o.command_timeout_ms && pool_size == o.pool_size && user == o.user &&
           password_file == o.password_file && tls == o.tls && key_prefix == o.key_prefix;
  }

  bool enabled() const { return !nodes.empty(); }
};

}  // namespace kvtier::remote
