// The C++ wrapper (kvtier/kvtier.hpp) from an installed kvtier: attach, ping, and look up
// a prompt that is not cached. Usage: kvtier-consumer-cxx SOCKET; prints "consumer-cxx: ok".
#include <cstdio>
#include <cstring>
#include <vector>

#include <kvtier/kvtier.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  kvtier::client::Client c;
  auto fail = [](const char* what, const kvtier::client::Error& e) {
    std::fprintf(stderr, "consumer-cxx: %s: %s: %s\n", what, kvtier_status_name(e.status), e.message.c_str());
    return 1;
  };
  if (auto e = c.Connect(argv[1]); !e) return fail("connect", e);
  if (auto e = c.Ping(); !e) return fail("ping", e);
  kvtier_contract_desc d{};
  d.model_id = "consumer/cxx-model";
  d.num_layers = 2;
  d.num_kv_heads = 1;
  d.head_dim = 128;
  d.block_tokens = 16;
  uint64_t cid = 0;
  if (auto e = c.RegisterContract(d, &cid); !e) return fail("register", e);
  std::vector<uint32_t> tokens(48, 7);
  const auto keys = kvtier::client::KeyChain(cid, tokens, 16);
  kvtier::client::LookupResult r;
  if (auto e = c.Lookup(cid, keys, &r); !e) return fail("lookup", e);
  if (keys.size() != 3 || r.hit_blocks != 0) {
    std::fprintf(stderr, "consumer-cxx: %zu keys, %zu hits; expected 3 keys and no hit\n", keys.size(), r.hit_blocks);
    return 1;
  }
  if (std::strcmp(kvtier_version(), KVTIER_VERSION_STRING) != 0) {
    std::fprintf(stderr, "consumer-cxx: library %s, header %s\n", kvtier_version(), KVTIER_VERSION_STRING);
    return 1;
  }
  std::printf("consumer-cxx: ok\n");
  return 0;
}
