/* Seed 003 through the connector: the canonical scenario of the request layer. Every binding
 * repeats it and prints the same lines (seed003.txt beside this file); a test diffs them.
 *
 * The engine owns G1 (a host buffer of 100 blocks) and schedules two requests. A computes
 * two full blocks, which are stored to G2 (eager offload). B shares A's first 32 tokens: the
 * connector reports them, loads them from G2 into B's own G1 blocks, and B computes only
 * its third block, which is stored too. G2 then holds B's three blocks with the bytes the
 * engine computed. One worker and one scheduler half live in one connector (role BOTH). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kvt_status s_ = (call);                                                              \
    if (s_ != KVT_OK) {                                                                  \
      fprintf(stderr, "%s: %s: %s\n", #call, kvt_status_str(s_), kvt_last_error());     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

enum { PAGE = 16, LAYERS = 2, OUTER = 2, CHUNK = 256, BLOCK = LAYERS * OUTER * CHUNK };
enum { GPU_BLOCKS = 100, MAX_HASHES = 8 };

static kvt_manager *mgr;
static kvt_connector *conn;
static unsigned char *g1; /* the engine's G1: block b is bytes [b * BLOCK, (b + 1) * BLOCK) */
static uint64_t salt;

/* Byte k of the KV of a full block whose sequence hash is h. */
static unsigned char kv_byte(uint64_t h, size_t k) {
  return (unsigned char)(((h >> (8 * (k % 8))) & 0xff) ^ ((k / 8) & 0xff));
}

static int holds_kv(const unsigned char *p, uint64_t h) {
  for (size_t k = 0; k < BLOCK; ++k)
    if (p[k] != kv_byte(h, k)) return 0;
  return 1;
}

static size_t hashes_of(uint64_t *out, const uint32_t *tokens, size_t n) {
  size_t full;
  CHECK(kvt_hash_tokens(out, MAX_HASHES, &full, salt, tokens, n, PAGE));
  return full;
}

static kvt_connector_stats stats(void) {
  kvt_connector_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK(kvt_connector_stats_get(&s, conn));
  return s;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A block the model writes in a step: its G1 id and the hash whose KV it computes. */
typedef struct kv_write {
  uint32_t block;
  uint64_t hash;
} kv_write;

/* Names the worker listed in finished_recving, space separated. */
static char recving[256];

/* Counts the G1 blocks in [dst, dst + n) that equal [src, src + n) byte for byte. */
static size_t same_blocks(uint32_t dst, uint32_t src, size_t n) {
  size_t same = 0;
  for (size_t i = 0; i < n; ++i)
    same += memcmp(g1 + (dst + i) * (size_t)BLOCK, g1 + (src + i) * (size_t)BLOCK, BLOCK) == 0;
  return same;
}

/* One engine step on the worker side, then the worker's reports to the scheduler until its
 * stats show want_stored stores and want_loaded loads. *loaded_same (when not NULL) counts
 * the blocks [load_dst, +2) equal to [load_src, +2) right after the loads. */
static void step(const void *meta, size_t len, const kv_write *fwd, size_t nfwd,
                 uint64_t want_stored, uint64_t want_loaded, size_t *loaded_same,
                 uint32_t load_dst, uint32_t load_src) {
  uint32_t l;
  size_t i;
  CHECK(kvt_connector_bind_connector_metadata(conn, meta, len));
  CHECK(kvt_connector_start_load_kv(conn));
  for (l = 0; l < LAYERS; ++l) CHECK(kvt_connector_wait_for_layer_load(conn, l));
  if (loaded_same) *loaded_same = same_blocks(load_dst, load_src, 2);
  for (i = 0; i < nfwd; ++i) /* forward */
    for (size_t k = 0; k < BLOCK; ++k) g1[fwd[i].block * (size_t)BLOCK + k] = kv_byte(fwd[i].hash, k);
  for (l = 0; l < LAYERS; ++l) CHECK(kvt_connector_save_kv_layer(conn, l));
  CHECK(kvt_connector_wait_for_save(conn));
  double deadline = now() + 5.0;
  for (;;) {
    kvt_finished f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    CHECK(kvt_connector_get_finished(&f, conn));
    for (i = 0; i < f.num_finished_recving; ++i) {
      strncat(recving, " ", sizeof recving - strlen(recving) - 1);
      strncat(recving, f.finished_recving[i], sizeof recving - strlen(recving) - 1);
    }
    CHECK(kvt_connector_update_connector_output(conn, f.report, f.report_len));
    kvt_connector_stats s = stats();
    if (s.stored_blocks == want_stored && s.loaded_blocks == want_loaded) break;
    if (now() > deadline) {
      fprintf(stderr, "step: stored %llu loaded %llu after 5 s, want %llu and %llu\n",
              (unsigned long long)s.stored_blocks, (unsigned long long)s.loaded_blocks,
              (unsigned long long)want_stored, (unsigned long long)want_loaded);
      exit(1);
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  CHECK(kvt_connector_clear_connector_metadata(conn));
}

static void print_states(const char *req) {
  uint32_t hist[16];
  size_t n;
  CHECK(kvt_connector_slot_state(NULL, hist, &n, 16, conn, req));
  printf("%s: states", req);
  for (size_t i = 0; i < n && i < 16; ++i) printf(" %s", kvt_slot_state_str(hist[i]));
  printf("\n");
}

static kvt_scheduled_request sched(const char *req, uint64_t computed, uint64_t scheduled,
                                   const uint32_t *new_tokens, size_t num_new_tokens) {
  kvt_scheduled_request r;
  memset(&r, 0, sizeof r);
  r.req_id = req;
  r.num_computed_tokens = computed;
  r.num_scheduled_tokens = scheduled;
  r.new_token_ids = new_tokens;
  r.num_new_token_ids = num_new_tokens;
  return r;
}

int main(void) {
  kvt_manager_config cfg;
  kvt_manager_config_init(&cfg);
  cfg.page_size = PAGE;
  cfg.num_layers = LAYERS;
  cfg.num_outer = OUTER;
  cfg.chunk_bytes = CHUNK;
  cfg.g1_blocks = 1; /* the manager's own G1 is unused: the engine owns G1 */
  cfg.g2_blocks = 50;
  cfg.g3_blocks = 0;
  CHECK(kvt_manager_create(&mgr, &cfg));

  kvt_connector_config cc;
  kvt_connector_config_init(&cc);
  cc.role = KVT_ROLE_BOTH;
  cc.offload = KVT_OFFLOAD_EAGER;
  cc.store_tier = KVT_TIER_G2;
  cc.num_gpu_blocks = GPU_BLOCKS;
  cc.load_async = 0;
  CHECK(kvt_connector_create(&conn, mgr, &cc));
  CHECK(kvt_hash_salt(&salt, NULL, 0));

  g1 = calloc(GPU_BLOCKS, BLOCK);
  if (!g1) return 1;
  const void *bases[LAYERS * OUTER];
  uint64_t strides[LAYERS * OUTER];
  for (int i = 0; i < LAYERS * OUTER; ++i) {
    bases[i] = g1 + i * CHUNK;
    strides[i] = BLOCK;
  }
  kvt_g1_layout layout;
  memset(&layout, 0, sizeof layout);
  layout.struct_size = sizeof layout;
  layout.memory = KVT_MEMORY_HOST;
  layout.bases = bases;
  layout.strides = strides;
  CHECK(kvt_connector_register_kv_caches(conn, &layout, GPU_BLOCKS));

  uint32_t a[40], b[52], sampled = 3000;
  for (uint32_t i = 0; i < 40; ++i) a[i] = 1000 + i;
  memcpy(b, a, 32 * sizeof *b);
  for (uint32_t i = 0; i < 20; ++i) b[32 + i] = 2000 + i;
  uint64_t ha[MAX_HASHES], hb[MAX_HASHES];
  hashes_of(ha, a, 40);
  size_t nb = hashes_of(hb, b, 52);

  uint64_t matched;
  int32_t async, delay_free;
  const void *meta;
  size_t len;
  kvt_connector_stats s;

  /* 1. A: nothing to load; computes its two full blocks, which are stored. */
  CHECK(kvt_connector_get_num_new_matched_tokens(&matched, &async, conn, "A", a, 40, 0));
  printf("A: matched %llu async %d\n", (unsigned long long)matched, (int)async);
  const uint32_t a_blocks[] = {1, 2, 3};
  CHECK(kvt_connector_update_state_after_alloc(conn, "A", a_blocks, 3, 0));
  kvt_scheduled_request ra = sched("A", 0, 40, NULL, 0);
  CHECK(kvt_connector_build_connector_meta(&meta, &len, conn, &ra, 1));
  const kv_write a_fwd[] = {{1, ha[0]}, {2, ha[1]}};
  step(meta, len, a_fwd, 2, 2, 0, NULL, 0, 0);
  s = stats();
  printf("A: stored %llu loaded %llu\n", (unsigned long long)s.stored_blocks,
         (unsigned long long)s.loaded_blocks);
  CHECK(kvt_connector_request_finished(&delay_free, conn, "A"));
  printf("A: delay_free %d\n", (int)delay_free);
  print_states("A");

  /* 2. B: A's two blocks come from G2 into B's blocks 4 and 5; B computes block 6. */
  CHECK(kvt_connector_get_num_new_matched_tokens(&matched, &async, conn, "B", b, 52, 0));
  printf("B: matched %llu async %d\n", (unsigned long long)matched, (int)async);
  const uint32_t b_blocks[] = {4, 5, 6, 7};
  CHECK(kvt_connector_update_state_after_alloc(conn, "B", b_blocks, 4, matched));
  kvt_scheduled_request rb = sched("B", 32, 20, NULL, 0);
  CHECK(kvt_connector_build_connector_meta(&meta, &len, conn, &rb, 1));
  const kv_write b_fwd[] = {{6, hb[2]}};
  size_t same = 0;
  recving[0] = '\0';
  step(meta, len, b_fwd, 1, 3, 2, &same, 4, 1);
  printf("B: loaded blocks matching A's %zu\n", same);
  /* none: a synchronous load, which the engine waited for in its step */
  printf("B: finished_recving%s\n", recving[0] ? recving : " none");
  s = stats();
  printf("B: stored %llu loaded %llu\n", (unsigned long long)s.stored_blocks,
         (unsigned long long)s.loaded_blocks);

  /* 3. B decodes one token: nothing to load or store. */
  kvt_scheduled_request rd = sched("B", 52, 1, &sampled, 1);
  CHECK(kvt_connector_build_connector_meta(&meta, &len, conn, &rd, 1));
  step(meta, len, NULL, 0, 3, 2, NULL, 0, 0);
  CHECK(kvt_connector_request_finished(&delay_free, conn, "B"));
  printf("B: delay_free %d\n", (int)delay_free);
  print_states("B");

  /* 4. G2 holds B's three blocks, with the bytes the engine computed. */
  kvt_block g2[MAX_HASHES];
  size_t hit, good = 0;
  CHECK(kvt_tier_match_prefix(&hit, g2, mgr, KVT_TIER_G2, hb, nb));
  for (size_t i = 0; i < hit; ++i) {
    void *p;
    size_t n;
    CHECK(kvt_block_data(&p, &n, mgr, g2[i]));
    good += n == BLOCK && holds_kv(p, hb[i]);
  }
  CHECK(kvt_block_release(mgr, g2, hit));
  kvt_tier_stats ts;
  memset(&ts, 0, sizeof ts);
  ts.struct_size = sizeof ts;
  CHECK(kvt_tier_stats_get(&ts, mgr, KVT_TIER_G2));
  printf("G2: registered %llu matching %zu\n", (unsigned long long)ts.registered, good);

  CHECK(kvt_manager_check(mgr));
  kvt_connector_destroy(conn);
  kvt_manager_destroy(mgr);
  free(g1);
  return 0;
}
