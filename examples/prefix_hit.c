/* Seed 003's scenario on the core API: request A "Hello, world!" is computed and
 * registered; request B "Hello, world! How are you?" shares its prefix, finds A's blocks
 * and reads A's bytes instead of computing them.
 *
 * A toy tokenizer makes one token per character, and pages hold 4 tokens, so A has three
 * full blocks ("Hell", "o, w", "orld") and B's first three blocks are the same. "Computing"
 * a block writes bytes derived from its tokens and position into its KV memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define CHECK(call)                                                                     \
  do {                                                                                  \
    kvt_status s_ = (call);                                                             \
    if (s_ != KVT_OK) {                                                                 \
      fprintf(stderr, "%s failed: %s: %s\n", #call, kvt_status_str(s_), kvt_last_error()); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

enum { PAGE = 4, MAX_BLOCKS = 16 };

struct request {
  const char *name, *text;
  size_t n_tokens;
  uint32_t tokens[64];
  uint64_t hashes[MAX_BLOCKS];
  size_t n_full, n_hit;
  kvt_block blocks[MAX_BLOCKS]; /* the request's block table */
  size_t n_blocks;
};

/* The KV bytes the model would produce for tokens [first, first + n) of a request. */
static void fill_kv(unsigned char *kv, size_t len, const uint32_t *tokens, size_t first, size_t n) {
  for (size_t i = 0; i < len; ++i) kv[i] = (unsigned char)(tokens[first + i % n] * 31 + first + i);
}

static void tokenize(struct request *r) {
  r->n_tokens = strlen(r->text);
  for (size_t i = 0; i < r->n_tokens; ++i) r->tokens[i] = (unsigned char)r->text[i];
}

/* Match the prefix in G1, then compute every block after it through the token path. */
static void run(kvt_manager *m, uint64_t salt, struct request *r, int verify_against_tokens) {
  tokenize(r);
  CHECK(kvt_hash_tokens(r->hashes, MAX_BLOCKS, &r->n_full, salt, r->tokens, r->n_tokens, PAGE));
  CHECK(kvt_tier_match_prefix(&r->n_hit, r->blocks, m, KVT_TIER_G1, r->hashes, r->n_full));
  r->n_blocks = (r->n_tokens + PAGE - 1) / PAGE;
  int same = 1;
  for (size_t b = 0; b < r->n_hit && verify_against_tokens; ++b) {
    void *p;
    size_t len;
    unsigned char want[4096];
    CHECK(kvt_block_data(&p, &len, m, r->blocks[b]));
    fill_kv(want, len, r->tokens, b * PAGE, PAGE);
    same &= memcmp(p, want, len) == 0;
  }
  CHECK(kvt_block_alloc(r->blocks + r->n_hit, r->n_blocks - r->n_hit, m, KVT_TIER_G1));
  for (size_t b = r->n_hit; b < r->n_blocks; ++b) {
    size_t first = b * PAGE, n = r->n_tokens - first < PAGE ? r->n_tokens - first : PAGE;
    void *p;
    size_t len;
    CHECK(kvt_block_init(m, r->blocks[b], salt, b == 0 ? 0 : r->hashes[b - 1]));
    CHECK(kvt_block_append(m, r->blocks[b], r->tokens + first, n));
    CHECK(kvt_block_schedule(m, r->blocks[b]));
    CHECK(kvt_block_data(&p, &len, m, r->blocks[b]));
    fill_kv(p, len, r->tokens, first, n); /* the forward pass */
    CHECK(kvt_block_compute_done(m, r->blocks[b]));
    if (n == PAGE) CHECK(kvt_block_register(&r->blocks[b], m, r->blocks[b]));
  }
  printf("request %s: %zu tokens, %zu full blocks, prefix hit %zu blocks (%zu tokens), computed %zu blocks\n",
         r->name, r->n_tokens, r->n_full, r->n_hit, r->n_hit * PAGE, r->n_blocks - r->n_hit);
  if (verify_against_tokens)
    printf("request %s: hit blocks hold the bytes request A computed: %s\n", r->name, same ? "yes" : "NO");
}

int main(void) {
  kvt_manager_config cfg;
  kvt_manager_config_init(&cfg);
  cfg.page_size = PAGE;
  cfg.num_layers = 2;
  cfg.num_outer = 2;
  cfg.chunk_bytes = 256;
  cfg.g1_blocks = 16;
  cfg.g2_blocks = 16;
  cfg.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m = NULL;
  CHECK(kvt_manager_create(&m, &cfg));
  uint64_t salt;
  CHECK(kvt_hash_salt(&salt, "example-model", strlen("example-model")));
  printf("kvtier %s, page size %d tokens\n", kvt_version(), PAGE);

  struct request a = {.name = "A", .text = "Hello, world!"};
  struct request b = {.name = "B", .text = "Hello, world! How are you?"};
  run(m, salt, &a, 0);
  CHECK(kvt_block_release(m, a.blocks, a.n_blocks)); /* A finishes; its full blocks stay matchable */
  run(m, salt, &b, 1);
  CHECK(kvt_block_release(m, b.blocks, b.n_blocks));

  kvt_event ev[64];
  size_t n = kvt_manager_poll(m, ev, 64), stored = 0, removed = 0;
  for (size_t i = 0; i < n; ++i) {
    stored += ev[i].type == KVT_EVENT_BLOCK_STORED;
    removed += ev[i].type == KVT_EVENT_BLOCK_REMOVED;
  }
  kvt_tier_stats st = {.struct_size = sizeof st};
  CHECK(kvt_tier_stats_get(&st, m, KVT_TIER_G1));
  printf("events: %zu BLOCK_STORED, %zu BLOCK_REMOVED\n", stored, removed);
  printf("G1: %llu registered, %llu inactive, %llu free of %llu; prefix hits %llu of %llu hashes asked\n",
         (unsigned long long)st.registered, (unsigned long long)st.inactive,
         (unsigned long long)st.free, (unsigned long long)st.capacity,
         (unsigned long long)st.match_hit, (unsigned long long)st.match_queried);
  CHECK(kvt_manager_check(m));
  kvt_manager_destroy(m);
  return 0;
}
