/* Seed 003's two requests through the tiers, the scenario every binding repeats (see
 * bindings/{rust,python,go}); all print the same lines, and a test compares them.
 *
 * Request A "Hello, world!" is computed, registered and offloaded to G2. G1 is then
 * evicted. Request B "Hello, world! How are you?" shares A's prefix: it misses in G1, finds
 * the prefix in G2, onboards it into G1 and sees the same bytes A computed.
 * One token per character, 4 tokens per block; a block's bytes derive from its hash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kvt_status s_ = (call);                                                              \
    if (s_ != KVT_OK) {                                                                  \
      fprintf(stderr, "%s: %s: %s\n", #call, kvt_status_str(s_), kvt_last_error());     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

enum { PAGE = 4, G1_BLOCKS = 8 };

static size_t tokenize(uint32_t *out, const char *text) {
  size_t n = strlen(text);
  for (size_t i = 0; i < n; ++i) out[i] = (unsigned char)text[i];
  return n;
}

static unsigned char kv_byte(uint64_t hash, size_t i) {
  return (unsigned char)((hash >> (8 * (i % 8))) ^ i);
}

int main(void) {
  kvt_manager_config cfg;
  kvt_manager_config_init(&cfg);
  cfg.page_size = PAGE;
  cfg.num_layers = 1;
  cfg.num_outer = 2;
  cfg.chunk_bytes = 64;
  cfg.g1_blocks = G1_BLOCKS;
  cfg.g2_blocks = 16;
  cfg.g3_blocks = 0;
  cfg.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m;
  CHECK(kvt_manager_create(&m, &cfg));
  uint64_t salt;
  CHECK(kvt_hash_salt(&salt, "kvtier-scenario", 15));

  /* Request A: compute, register, offload to G2, finish. */
  uint32_t tokens[64];
  uint64_t a_hash[16], b_hash[16];
  size_t a_tokens = tokenize(tokens, "Hello, world!"), a_full;
  CHECK(kvt_hash_tokens(a_hash, 16, &a_full, salt, tokens, a_tokens, PAGE));
  kvt_block a[16];
  CHECK(kvt_block_alloc(a, a_full, m, KVT_TIER_G1));
  for (size_t i = 0; i < a_full; ++i) {
    unsigned char *p;
    size_t len;
    CHECK(kvt_block_data((void **)&p, &len, m, a[i]));
    for (size_t j = 0; j < len; ++j) p[j] = kv_byte(a_hash[i], j);
  }
  CHECK(kvt_block_register_hashes(a, m, a, a_hash, a_full, 0));
  kvt_xfer *x;
  uint64_t moved = 0;
  CHECK(kvt_xfer_offload(&x, m, a, a_full, KVT_TIER_G2, NULL, 1));
  CHECK(kvt_xfer_wait(x, -1));
  CHECK(kvt_xfer_status(NULL, NULL, &moved, x));
  kvt_xfer_release(x);
  CHECK(kvt_block_release(m, a, a_full));
  printf("request A: %zu tokens, %zu full blocks, computed %zu, offloaded %llu to G2\n",
         a_tokens, a_full, a_full, (unsigned long long)moved);
  printf("request A: first block hash 0x%016llx\n", (unsigned long long)a_hash[0]);

  /* Evict G1: allocating all of it evicts A's inactive blocks. */
  kvt_event ev[64];
  while (kvt_manager_poll(m, ev, 64) > 0) {
  }
  kvt_block all[G1_BLOCKS];
  CHECK(kvt_block_alloc(all, G1_BLOCKS, m, KVT_TIER_G1));
  CHECK(kvt_block_release(m, all, G1_BLOCKS));
  size_t removed = 0, n;
  while ((n = kvt_manager_poll(m, ev, 64)) > 0)
    for (size_t i = 0; i < n; ++i)
      removed += ev[i].type == KVT_EVENT_BLOCK_REMOVED && ev[i].tier == KVT_TIER_G1;
  printf("G1 evicted: %zu blocks removed\n", removed);

  /* Request B: miss in G1, hit in G2, onboard, compare. */
  size_t b_tokens = tokenize(tokens, "Hello, world! How are you?"), b_full, g1_hit, g2_hit;
  CHECK(kvt_hash_tokens(b_hash, 16, &b_full, salt, tokens, b_tokens, PAGE));
  kvt_block g1[16], g2[16];
  CHECK(kvt_tier_match_prefix(&g1_hit, g1, m, KVT_TIER_G1, b_hash, b_full));
  CHECK(kvt_tier_match_prefix(&g2_hit, g2, m, KVT_TIER_G2, b_hash + g1_hit, b_full - g1_hit));
  CHECK(kvt_block_alloc(g1 + g1_hit, g2_hit, m, KVT_TIER_G1));
  CHECK(kvt_xfer_onboard(&x, m, g2, g1 + g1_hit, g2_hit, NULL, 2));
  CHECK(kvt_xfer_wait(x, -1));
  CHECK(kvt_xfer_status(NULL, NULL, &moved, x));
  CHECK(kvt_xfer_blocks(g1 + g1_hit, g2_hit, x));
  kvt_xfer_release(x);
  int same = 1;
  for (size_t i = 0; i < g1_hit + g2_hit; ++i) {
    unsigned char *p;
    size_t len;
    CHECK(kvt_block_data((void **)&p, &len, m, g1[i]));
    for (size_t j = 0; j < len; ++j) same &= p[j] == kv_byte(a_hash[i], j);
  }
  CHECK(kvt_block_release(m, g2, g2_hit));
  CHECK(kvt_block_release(m, g1, g1_hit + g2_hit));
  printf("request B: %zu tokens, %zu full blocks, G1 hit %zu, G2 hit %zu, onboarded %llu\n",
         b_tokens, b_full, g1_hit, g2_hit, (unsigned long long)moved);
  printf("request B: onboarded bytes equal request A's: %s\n", same ? "yes" : "no");
  CHECK(kvt_manager_check(m));
  kvt_manager_destroy(m);
  return same ? 0 : 1;
}
