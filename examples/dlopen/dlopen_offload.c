/* Loads libkvtier with dlopen, as a host in any language can, resolves the functions it
 * needs with dlsym, checks the library's version, and runs a small offload G1 -> G2 whose
 * bytes it compares. The header is used for types and constants only; nothing links
 * against kvtier. kvt_manager_config_init is a static inline wrapper in the header, so a
 * dlopen host calls the exported kvt_manager_config_init_sized with its sizeof instead.
 *   dlopen_offload [path to libkvtier.so]   (default: libkvtier.so.0 from the loader path) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

struct api {
  const char *(*version)(void);
  const char *(*last_error)(void);
  void (*set_log_callback)(int, kvt_log_fn, void *);
  void (*config_init_sized)(kvt_manager_config *, size_t);
  kvt_status (*create)(kvt_manager **, const kvt_manager_config *);
  void (*destroy)(kvt_manager *);
  kvt_status (*alloc)(kvt_block *, size_t, kvt_manager *, kvt_tier);
  kvt_status (*data)(void **, size_t *, kvt_manager *, kvt_block);
  kvt_status (*register_hashes)(kvt_block *, kvt_manager *, const kvt_block *,
                                const uint64_t *, size_t, uint64_t);
  kvt_status (*release)(kvt_manager *, const kvt_block *, size_t);
  kvt_status (*match)(size_t *, kvt_block *, kvt_manager *, kvt_tier, const uint64_t *, size_t);
  kvt_status (*offload)(kvt_xfer **, kvt_manager *, const kvt_block *, size_t, kvt_tier,
                        kvt_fence *, uint64_t);
  kvt_status (*wait)(kvt_xfer *, int64_t);
  void (*xfer_release)(kvt_xfer *);
};

/* dlsym returns void *; ISO C has no conversion to function pointers, POSIX guarantees it
 * through the object representation. */
static int resolve(void *lib, const char *name, void *fn_slot) {
  void *sym = dlsym(lib, name);
  if (sym == NULL) {
    fprintf(stderr, "dlopen_offload: %s is missing: %s\n", name, dlerror());
    return 0;
  }
  memcpy(fn_slot, &sym, sizeof sym);
  return 1;
}

/* The library never prints: its diagnostics reach the host through this callback. */
static void log_to_stderr(int level, const char *message, void *user_data) {
  (void)user_data;
  fprintf(stderr, "kvtier[%d]: %s\n", level, message);
}

#define CHECK(call)                                                                 \
  do {                                                                              \
    kvt_status s_ = (call);                                                         \
    if (s_ != KVT_OK) {                                                             \
      fprintf(stderr, "%s failed (%d): %s\n", #call, s_, k.last_error());           \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "libkvtier.so.0";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen_offload: %s\n", dlerror());
    return 1;
  }
  struct api k;
  int ok = resolve(lib, "kvt_version", &k.version) &&
           resolve(lib, "kvt_last_error", &k.last_error) &&
           resolve(lib, "kvt_log_set_callback", &k.set_log_callback) &&
           resolve(lib, "kvt_manager_config_init_sized", &k.config_init_sized) &&
           resolve(lib, "kvt_manager_create", &k.create) &&
           resolve(lib, "kvt_manager_destroy", &k.destroy) &&
           resolve(lib, "kvt_block_alloc", &k.alloc) &&
           resolve(lib, "kvt_block_data", &k.data) &&
           resolve(lib, "kvt_block_register_hashes", &k.register_hashes) &&
           resolve(lib, "kvt_block_release", &k.release) &&
           resolve(lib, "kvt_tier_match_prefix", &k.match) &&
           resolve(lib, "kvt_xfer_offload", &k.offload) &&
           resolve(lib, "kvt_xfer_wait", &k.wait) &&
           resolve(lib, "kvt_xfer_release", &k.xfer_release);
  if (!ok) return 1;

  /* The library's major version must be the one this program was written against. */
  const char *v = k.version();
  if (atoi(v) != KVT_VERSION_MAJOR) {
    fprintf(stderr, "dlopen_offload: %s is kvtier %s, need major %d\n", path, v,
            KVT_VERSION_MAJOR);
    return 1;
  }
  printf("loaded %s: kvtier %s\n", path, v);

  k.set_log_callback(KVT_LOG_WARN, log_to_stderr, NULL);
  kvt_manager_config cfg;
  k.config_init_sized(&cfg, sizeof cfg);
  cfg.g1_blocks = 8;
  cfg.g2_blocks = 8;
  cfg.chunk_bytes = 256;
  cfg.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m;
  CHECK(k.create(&m, &cfg));
  enum { N = 4 };
  kvt_block b[N], g2[N];
  const uint64_t hashes[N] = {11, 12, 13, 14};
  CHECK(k.alloc(b, N, m, KVT_TIER_G1));
  for (int i = 0; i < N; ++i) {
    void *p;
    size_t len;
    CHECK(k.data(&p, &len, m, b[i]));
    memset(p, 0x40 + i, len);
  }
  CHECK(k.register_hashes(b, m, b, hashes, N, 0));
  kvt_xfer *x;
  CHECK(k.offload(&x, m, b, N, KVT_TIER_G2, NULL, 7));
  CHECK(k.wait(x, -1));
  k.xfer_release(x);
  size_t found = 0;
  CHECK(k.match(&found, g2, m, KVT_TIER_G2, hashes, N));
  int same = found == N;
  for (size_t i = 0; i < found; ++i) {
    unsigned char *p;
    size_t len;
    CHECK(k.data((void **)&p, &len, m, g2[i]));
    for (size_t j = 0; j < len; ++j) same &= p[j] == 0x40 + i;
  }
  CHECK(k.release(m, g2, found));
  CHECK(k.release(m, b, N));
  printf("offloaded %d blocks to G2 through dlsym'd calls: %s\n", N,
         same ? "bytes equal" : "MISMATCH");
  k.destroy(m);
  dlclose(lib);
  return same ? 0 : 1;
}
