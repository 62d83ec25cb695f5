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

  bool enabled() const { return !nodes.empty(); }
};

}  // namespace kvtier::remote
