/* The cost of one kvt_tier_match_prefix of one block from C: the baseline of the binding
 * overhead table (bench/bindings.sh). Median over 5 rounds of 1,000,000 calls. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvtier.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(void) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = 4;
  c.chunk_bytes = 64;
  c.g1_blocks = 64;
  c.g2_blocks = 0;
  c.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m;
  if (kvt_manager_create(&m, &c) != KVT_OK) return 1;
  kvt_block b;
  uint64_t h = 99;
  kvt_block_alloc(&b, 1, m, KVT_TIER_G1);
  kvt_block_register_hash(&b, m, b, h, 0);
  kvt_block_release(m, &b, 1);
  enum { N = 1000000 };
  double rounds[5];
  for (int r = 0; r < 5; ++r) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < N; ++i) {
      size_t n;
      kvt_block out;
      kvt_tier_match_prefix(&n, &out, m, KVT_TIER_G1, &h, 1);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    rounds[r] = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / N;
  }
  qsort(rounds, 5, sizeof rounds[0], cmp);
  printf("c %.1f ns/call\n", rounds[2]);
  kvt_manager_destroy(m);
  return 0;
}
