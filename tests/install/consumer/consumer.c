/* A program outside the kvtier tree, built against an installed kvtier (pkg-config or
 * find_package): it attaches to a running kvtierd and stores and restores two blocks
 * through lookup, alloc, commit and acquire. Usage: kvtier-consumer SOCKET
 * Exit 0 and "consumer: ok" on success; 1 and a line naming the failed step otherwise. */
#include <stdio.h>
#include <string.h>

#include <kvtier/kvtier.h>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    kvtier_status s_ = (call);                                                         \
    if (s_ != KVTIER_OK) {                                                             \
      fprintf(stderr, "consumer: %s: %s: %s\n", #call, kvtier_status_name(s_), kvtier_last_error()); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

#define EXPECT(cond)                                          \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "consumer: expected %s\n", #cond);      \
      return 1;                                               \
    }                                                         \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  /* The header and the loaded library are the same release. */
  EXPECT(strcmp(kvtier_version(), KVTIER_VERSION_STRING) == 0);
  EXPECT(KVTIER_VERSION == KVTIER_VERSION_MAJOR * 10000 + KVTIER_VERSION_MINOR * 100 + KVTIER_VERSION_PATCH);
  printf("consumer: libkvtier %s (header %s)\n", kvtier_version(), KVTIER_VERSION_STRING);

  kvtier_connect_options opts = {"consumer", 0, 10000, 0};
  kvtier_client* c = NULL;
  CHECK(kvtier_connect(argv[1], &opts, &c));

  kvtier_contract_desc d;
  memset(&d, 0, sizeof d);
  d.model_id = "consumer/test-model";
  d.num_layers = 2;
  d.num_kv_heads = 1;
  d.head_dim = 128;
  d.block_tokens = 16;
  uint64_t cid = 0;
  CHECK(kvtier_register_contract(c, &d, &cid));

  uint32_t tokens[32];
  for (uint32_t i = 0; i < 32; ++i) tokens[i] = 1000 + i;
  kvtier_key keys[2];
  size_t n_keys = 0;
  CHECK(kvtier_key_chain(cid, tokens, 32, 16, keys, 2, &n_keys));
  EXPECT(n_keys == 2);

  kvtier_lookup_result r;
  CHECK(kvtier_lookup(c, cid, keys, 2, &r, NULL));
  EXPECT(r.hit_blocks == 0);

  uint64_t arena_bytes = 0;
  EXPECT(kvtier_host_arena(c, &arena_bytes) != NULL && kvtier_slot_bytes(c) > 0);

  uint64_t lease = 0;
  kvtier_slot slots[2];
  CHECK(kvtier_alloc(c, cid, 2, KVTIER_TIER_HOST, &lease, slots));
  kvtier_commit_item items[2];
  memset(items, 0, sizeof items);
  for (int i = 0; i < 2; ++i) {
    unsigned char* w = (unsigned char*)kvtier_host_slot_write(c, slots[i].slot);
    EXPECT(w != NULL);
    memset(w, 0x40 + i, 4096);
    items[i].slot = slots[i];
    items[i].key = keys[i];
    if (i > 0) items[i].parent = keys[i - 1];
  }
  size_t committed = 0;
  CHECK(kvtier_commit(c, cid, lease, items, 2, &committed));
  EXPECT(committed == 2);
  CHECK(kvtier_release(c, lease));

  CHECK(kvtier_lookup(c, cid, keys, 2, &r, NULL));
  EXPECT(r.hit_blocks == 2);

  uint64_t lease2 = 0;
  kvtier_slot got[2];
  size_t n_got = 0;
  CHECK(kvtier_acquire(c, cid, keys, 2, KVTIER_TIER_HOST, &lease2, got, &n_got));
  EXPECT(n_got == 2);
  for (int i = 0; i < 2; ++i) {
    const unsigned char* p = (const unsigned char*)kvtier_host_slot(c, got[i].slot);
    EXPECT(p != NULL);
    for (int b = 0; b < 4096; ++b) EXPECT(p[b] == 0x40 + i);
  }
  CHECK(kvtier_release(c, lease2));
  kvtier_close(c);
  printf("consumer: ok\n");
  return 0;
}
