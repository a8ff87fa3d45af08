/*
 * kvtier: a tiered KV-cache block manager behind a stable C ABI.
 *
 * Conventions (docs/CONVENTIONS.md has them all, with the rules for changing this header):
 * - Calls are named kvt_<object>_<verb>; this header is ordered by object.
 * - Every fallible call returns kvt_status: 0 is KVT_OK, positive values are outcomes that
 *   are not errors, negative values are errors. Results go through out-parameters, which
 *   come first. On failure, out-parameters are left untouched and kvt_last_error() says why.
 * - A failing call changes no state: calls over arrays are all-or-nothing.
 * - Empty arrays (a count of 0) are valid everywhere except kvt_block_alloc, and the matching
 *   pointer may then be NULL.
 * - Every function of a manager may be called from any thread at the same time, unless its
 *   comment says otherwise.
 * - No C++ exception ever crosses this boundary.
 * - Ownership: "borrowed" pointers stay owned by the caller and are only read during the
 *   call; "owned by the library" results stay valid for the time stated.
 * - A destroyed object is gone: every call on a destroyed manager, or with its block
 *   handles, transfers or fences, is forbidden, and so is destroying a manager while another
 *   thread is inside any call on it (kvt_manager_poll included). The manager is freed memory then:
 *   the library does not promise to detect such a call.
 * - Versioned structs: the structs that begin with struct_size (kvt_manager_config,
 *   kvt_g1_layout, kvt_tier_stats, kvt_transfer_stats, kvt_block_info and, since 0.3.0,
 *   kvt_connector_config, kvt_connector_stats, kvt_finished; since 0.4.0, kvt_g4_stats,
 *   kvt_log_replay, kvt_connector_hooks, kvt_pause_info; since 0.5.0, kvt_endpoint_config,
 *   kvt_endpoint_stats) only ever grow at their end.
 *   The caller sets struct_size to the sizeof its program was built with (the *_config_init
 *   functions do it for configs). The library accepts any size from the struct's size in
 *   the release that introduced it up to its own, in steps of 8 bytes: fields beyond a
 *   caller's size keep their defaults in structs the library reads, and are not written in
 *   structs it fills. Other sizes fail with KVT_ERR_INVALID_ARGUMENT.
 */
#ifndef KVTIER_H
#define KVTIER_H

/* Only size_t from <stddef.h>: its max_align_t carries attributes that cffi's cdef cannot
 * parse once bindings preprocess this header with `cc -E -P -DKVT_API= -DKVT_NO_INLINE`. */
#define __need_size_t
#include <stddef.h>
#include <stdint.h>

#ifndef KVT_API
#define KVT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 5
#define KVT_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------
 * Status codes. Numbers are stable; new codes are only ever added.
 *   1..99     outcomes that are not errors
 *  -1..-98    errors
 *  -99        internal error (a bug in kvtier: please report it)
 * ------------------------------------------------------------------------------------ */
typedef int32_t kvt_status;

#define KVT_OK                    0
#define KVT_AGAIN                 1    /* nothing to do now; try again later */
#define KVT_TIMEOUT               2    /* a wait ran out of time */
#define KVT_ITEROVER              3    /* 0.5.0: an iteration has no more items */
#define KVT_ERR_INVALID_ARGUMENT (-1)
#define KVT_ERR_INVALID_HANDLE   (-2)  /* unknown, foreign or stale handle */
#define KVT_ERR_STATE            (-3)  /* the call does not fit the object's state */
#define KVT_ERR_NO_SPACE         (-4)  /* a tier is full and nothing can be evicted, or the
                                          process holds KVT_MAX_MANAGERS managers already */
#define KVT_ERR_CANCELLED        (-5)
#define KVT_ERR_UNSUPPORTED      (-6)
#define KVT_ERR_IO               (-7)
#define KVT_ERR_CORRUPT          (-8)  /* a checksum or hash did not match */
#define KVT_ERR_NO_MEMORY        (-9)
#define KVT_ERR_CUDA             (-10)
#define KVT_ERR_NOT_FOUND        (-11) /* no such id or key: an unknown request (never seen,
                                          or finished) or breakpoint, a missing G4 key */
#define KVT_ERR_INTERNAL         (-99)

/* ---------------------------------------------------------------------------------------
 * Library information and errors
 * ------------------------------------------------------------------------------------ */

/* "MAJOR.MINOR.PATCH" of the loaded library. Static string owned by the library. */
KVT_API const char *kvt_version(void);

/* The name of a status code, e.g. "KVT_ERR_STATE"; "KVT_UNKNOWN_STATUS" for a number that is
 * not a status. Static string owned by the library. */
KVT_API const char *kvt_status_str(kvt_status s);

/* A message describing the last failure on the calling thread ("no error" before any).
 * Never NULL. Owned by the library, valid until the next failing kvtier call on this thread. */
KVT_API const char *kvt_last_error(void);

/* Diagnostics the library wants a person to see (a fallback it took, a file it cleaned up).
 * The library never writes to stdout or stderr itself: messages at or below `level` go to
 * fn, on whichever thread noticed the condition, possibly with the library's locks held, so
 * fn must not call back into kvtier. Off (level 0) until the host sets a callback. Process-
 * wide; fn NULL turns logging off. message is owned by the library, valid during the call. */
typedef enum kvt_log_level {
  KVT_LOG_OFF = 0, KVT_LOG_ERROR = 1, KVT_LOG_WARN = 2, KVT_LOG_INFO = 3, KVT_LOG_DEBUG = 4
} kvt_log_level;
typedef void (*kvt_log_fn)(int level, const char *message, void *user_data);
KVT_API void kvt_log_set_callback(int level, kvt_log_fn fn, void *user_data);

/* ---------------------------------------------------------------------------------------
 * Handles: blocks, tiers and the objects
 * ------------------------------------------------------------------------------------ */

/* A block handle names one block in one tier of one manager: tier, slot and generation.
 * 0 is never a valid handle. A handle goes stale when its block returns to the free pool
 * or is evicted; stale, forged and foreign handles are refused with KVT_ERR_INVALID_HANDLE.
 * Bounds:
 * - A stale handle is never valid again: each slot has 2^28 generations (268 million
 *   reuses), and a slot that has used its last one is retired for the manager's lifetime
 *   (kvt_tier_stats.retired counts them) instead of reusing an old handle's number.
 * - A live manager refuses the handles of every other live manager: at most
 *   KVT_MAX_MANAGERS managers live in a process at once. A destroyed manager's handles stay
 *   foreign to new managers until its number comes back, which is after every number freed
 *   before it: at the least, the next 255 - N managers created, N being the number alive
 *   when it was destroyed. Passing them to any manager is still the caller's error. */
typedef uint64_t kvt_block;

/* Managers that can live in one process at once; kvt_manager_create refuses one more. */
#define KVT_MAX_MANAGERS 256

typedef enum kvt_tier {
  KVT_TIER_G1 = 1, KVT_TIER_G2 = 2, KVT_TIER_G3 = 3,
  KVT_TIER_G4 = 4               /* 0.4.0: remote, on Redis (see G4). It has no blocks of its
                                   own: calls that take a tier for handles (kvt_block_alloc,
                                   kvt_tier_match_prefix, kvt_tier_evictable_blocks,
                                   kvt_tier_stats_get, kvt_manager_reset) refuse it with
                                   KVT_ERR_INVALID_ARGUMENT, and no handle names it */
} kvt_tier;

/* The handle types, all opaque, and who may call on one at the same time. Every handle is
 * destroyed (or closed, or released) once, when no other call on it runs.
 * - kvt_manager: any thread, any number of calls at once.
 * - kvt_xfer, kvt_fence: tokens, not addresses (see Fences); any thread. kvt_xfer_release is
 *   legal while another thread waits on the transfer.
 * - kvt_seq: the caller's running hasher; one thread at a time.
 * - kvt_connector: any thread (see Connector: the scheduler half's calls take turns).
 * - kvt_subscription: kvt_subscription_drain and kvt_subscription_fd from any thread (drains
 *   take turns); it may outlive its manager.
 * - kvt_event_log: a reader with a position; one thread at a time.
 * - kvt_endpoint: kvt_endpoint_stats_get from any thread; it serves from threads of its own. */
typedef struct kvt_manager      kvt_manager;
typedef struct kvt_xfer         kvt_xfer;          /* one enqueued offload or onboard */
typedef struct kvt_fence        kvt_fence;         /* a precondition the host signals */
typedef struct kvt_seq          kvt_seq;           /* incremental token-sequence hasher */
typedef struct kvt_connector    kvt_connector;     /* a serving engine's request layer */
typedef struct kvt_subscription kvt_subscription;  /* a reader of the observe stream */
typedef struct kvt_event_log    kvt_event_log;     /* a reader of a recorded event log */
typedef struct kvt_endpoint     kvt_endpoint;      /* the management socket */

/* Longest request id (a connector's, and in events), in bytes; ids are NUL-terminated,
 * non-empty strings. */
#define KVT_REQ_ID_MAX 255

/* ---------------------------------------------------------------------------------------
 * Manager: configuration and lifetime
 * ------------------------------------------------------------------------------------ */

/* Where G1 lives when the engine registers no memory of its own. */
typedef enum kvt_memory_kind {
  KVT_MEMORY_AUTO = 0,   /* CUDA device memory when a device is present, else host memory */
  KVT_MEMORY_HOST = 1,   /* ordinary host memory (the embedded stand-in for a GPU) */
  KVT_MEMORY_CUDA = 2    /* CUDA device memory; KVT_ERR_UNSUPPORTED without CUDA or a device */
} kvt_memory_kind;

/* Engine-owned G1 memory: kvtier reads and writes the engine's own KV-cache tensors in
 * place. For every pair (layer l, outer o) the engine gives a base pointer and a block
 * stride: chunk (l, o) of slot b lives at
 * bases[l * num_outer + o] + b * strides[l * num_outer + o], and is chunk_bytes long.
 * This covers vLLM's per-layer [2, num_blocks, ...] tensors, layer-major and fully
 * contiguous layouts. Chunks must not overlap; every stride must be >= chunk_bytes.
 * Both arrays are borrowed during kvt_manager_create (copied); the memory they point to is
 * borrowed for the manager's lifetime and must outlive it. */
typedef struct kvt_g1_layout {
  uint32_t            struct_size;  /* set by the caller: sizeof(kvt_g1_layout) */
  uint32_t            memory;       /* KVT_MEMORY_HOST or KVT_MEMORY_CUDA */
  int32_t             cuda_device;  /* for KVT_MEMORY_CUDA: the device the memory is on */
  uint32_t            reserved;     /* must be 0 */
  const void *const  *bases;        /* num_layers * num_outer base pointers */
  const uint64_t     *strides;      /* num_layers * num_outer strides in bytes */
} kvt_g1_layout;

/* Offload policy: which blocks are worth copying to a lower tier. Flags combine as all-of;
 * 0 passes every block. */
#define KVT_POLICY_PASS_ALL  0u
#define KVT_POLICY_PRESENCE  1u  /* skip blocks already in, or on their way to, the destination */
#define KVT_POLICY_FREQUENCY 2u  /* skip blocks offered fewer than min_frequency times */
typedef struct kvt_policy {
  uint32_t flags;               /* KVT_POLICY_* */
  uint32_t min_frequency;       /* for KVT_POLICY_FREQUENCY, >= 1 */
} kvt_policy;

/* How G3's file is read and written. */
typedef enum kvt_io_engine {
  KVT_IO_AUTO = 0,              /* io_uring where the kernel allows it, else a thread pool */
  KVT_IO_URING = 1,             /* io_uring, or kvt_manager_create fails with UNSUPPORTED */
  KVT_IO_THREADS = 2            /* a thread pool doing preadv/pwritev */
} kvt_io_engine;

/* How the CUDA engine copies the chunks of a batch between device and host. */
typedef enum kvt_cuda_copy {
  KVT_CUDA_COPY_BATCHED = 0,    /* one cudaMemcpyBatchAsync per batch and direction */
  KVT_CUDA_COPY_PER_CHUNK = 1,  /* one cudaMemcpyAsync per chunk: the baseline */
  KVT_CUDA_COPY_KERNEL = 2,     /* 0.4.0: a gather/scatter kernel reading or writing the
                                   pinned, mapped G2 directly; copies that touch other host
                                   memory go through BATCHED. Faster for chunks under about
                                   1 MiB (docs/BENCHMARKS.md) */
  KVT_CUDA_COPY_AUTO = 3        /* 0.4.0: KERNEL for chunks under 1 MiB, else BATCHED */
} kvt_cuda_copy;

/* Which G3 operations the config's fault injector fails (for tests). */
typedef enum kvt_g3_fault {
  KVT_G3_FAULT_OFF = 0,
  KVT_G3_FAULT_WRITE = 1,       /* slot writes: offloads into G3 */
  KVT_G3_FAULT_READ = 2         /* slot reads: onboards from G3 */
} kvt_g3_fault;

typedef struct kvt_manager_config {
  uint32_t    struct_size;      /* set by kvt_manager_config_init */
  uint32_t    page_size;        /* tokens per block: a power of two in 1..65536 (default 16) */
  uint32_t    num_layers;       /* 1..65536 (default 1) */
  uint32_t    num_outer;        /* 2: separate K and V; 1: fused K/V or MLA (default 2) */
  uint64_t    chunk_bytes;      /* bytes of one (layer, outer) chunk of one block (default 4096);
                                   0 is allowed: blocks then carry metadata only */
  uint64_t    g1_blocks;        /* capacity of each tier in blocks; G1 >= 1 (default 1024), */
  uint64_t    g2_blocks;        /* G2 and G3 may be 0 (absent); at most KVT_MAX_TIER_BLOCKS */
  uint64_t    g3_blocks;        /* (defaults 4096 and 0) */
  const char *g3_path;          /* directory for the G3 file, not ""; NULL: a fresh temporary
                                   directory under $TMPDIR (or /tmp), removed at destroy. The
                                   file is removed at destroy unless g3_persist, and files (and
                                   temporary directories) that dead processes left there are
                                   removed at create. Borrowed during kvt_manager_create. */
  uint64_t    event_capacity;   /* bound of the event queue, 1..2^24 (default 65536) */
  const kvt_g1_layout *g1_layout; /* NULL: library-owned G1. Borrowed during create. */
  uint32_t    g1_memory;        /* kvt_memory_kind of library-owned G1 (default AUTO) */
  int32_t     cuda_device;      /* device for library-owned G1 in CUDA memory (default 0) */

  /* Offload pipeline: how transfers are filtered, batched and copied (see Transfers). */
  uint32_t    max_batch_size;   /* blocks per transfer batch, >= 1 (default 64) */
  uint32_t    min_batch_size;   /* blocks that flush a batch early when the executor is idle,
                                   1..max_batch_size (default 8) */
  uint64_t    flush_interval_us;  /* a partial batch waits at most this long (default 10000) */
  uint64_t    policy_timeout_us;  /* policy evaluation of one container may take this long;
                                     blocks not evaluated by then are not offloaded (100000) */
  uint64_t    sweep_interval_us;  /* how often conditions that cannot wake the pipeline (CUDA
                                     events) are polled; cancellation never waits for it (10000) */
  uint32_t    max_concurrent_transfers;  /* batches in flight at once, >= 1 (default 1) */
  uint32_t    copy_threads;     /* threads that split large host copies, and that do G3's I/O
                                   without io_uring, 1..64 (default 4) */
  kvt_policy  policy_g1_g2;     /* offload filters per tier pair (default: presence) */
  kvt_policy  policy_g1_g3;
  kvt_policy  policy_g2_g3;
  uint32_t    g3_io;            /* kvt_io_engine (default AUTO) */
  uint32_t    cuda_copy;        /* kvt_cuda_copy: how scattered chunks cross PCIe (default AUTO
                                   since 0.4.0, BATCHED before) */

  /* Fault injection, for tests (off by default): of the G3 operations of kind g3_fault_op,
   * the first g3_fault_skip go through, the next g3_fault_count fail with errno
   * g3_fault_errno as if the kernel had returned it (their transfer ends with KVT_ERR_IO and
   * a message naming the error), and the rest go through again. */
  uint32_t    g3_fault_op;      /* kvt_g3_fault; OFF (0) needs the three fields below at 0 */
  int32_t     g3_fault_errno;   /* 1..4095 */
  uint64_t    g3_fault_skip;
  uint64_t    g3_fault_count;   /* >= 1 */

  /* 0.3.0: a G3 that survives restarts (docs/G3_FORMAT.md). */
  uint32_t    g3_persist;       /* 1: G3's file, g3_path/kvtier-g3.bin (g3_path required),
                                   outlives the manager: create recovers the blocks it holds
                                   intact (as inactive G3 blocks, counted in
                                   kvt_tier_stats.recovered, without events), destroy keeps
                                   it. A file another live manager holds: KVT_ERR_STATE.
                                   0 (default): a fresh file, removed at destroy */
  uint32_t    g3_on_mismatch;   /* kvt_g3_mismatch: what create does with a persistent file
                                   of another layout, salt namespace or format version */
  uint64_t    g3_namespace;     /* a persistent file's owner tag, e.g. the salt hash of the
                                   model: a file of another namespace is a mismatch (0) */
  /* 0.3.0: eviction (see Priorities and pins) */
  uint32_t    eviction[3];      /* kvt_eviction of G1, G2, G3 (default LRU each) */
  uint32_t    max_pinned_percent; /* share of a tier that pinned blocks may hold, 0..100
                                     (default 50) */

  /* 0.4.0: KV events in vLLM's ZMQ wire format, for routers (see KV events). Strings are
   * borrowed during kvt_manager_create. */
  const char *kv_events_endpoint; /* NULL (default): no publisher. A ZMQ endpoint for the PUB
                                   socket: bound when it has a wildcard ("tcp://\*:5557",
                                   "::") or is ipc:// or inproc://, connected otherwise, as
                                   vLLM does */
  const char *kv_events_replay_endpoint; /* NULL: no replay socket. Else a ROUTER socket
                                   bound there answers replay requests */
  const char *kv_events_topic;  /* the first frame of every message; NULL: "" */
  uint64_t    kv_events_buffer; /* batches kept for replay, 1..2^24 (default 10000) */
  int32_t     kv_events_dp_rank; /* data_parallel_rank of every batch, >= 0 (default 0) */
  uint32_t    kv_events_tiers;  /* bit (1 << tier) set: that tier's events are published
                                   (default G1 | G2 | G3) */

  /* 0.4.0: G4, a tier on Redis shared by many managers (see G4). */
  const char *g4_url;           /* NULL (default): no G4. "redis://host:port[/db]" or
                                   "unix:///path[?db=N]"; several, separated by commas, are
                                   shards that keys are spread over by consistent hashing.
                                   "redis+cluster://host:port[,host:port...]": a Redis
                                   Cluster, its slot map read from these nodes (since 0.5.0) */
  const char *g4_password_env;  /* NULL, or the name of an environment variable holding the
                                   password (AUTH), read at create */
  const char *g4_key_prefix;    /* prefix of every key; NULL: "kvtier" */
  uint64_t    g4_namespace;     /* in every key, e.g. the salt hash of the model: managers of
                                   other namespaces never see each other's values (0) */
  uint64_t    g4_timeout_us;    /* connect and command timeout (default 1000000) */

  /* 0.5.0: which vLLM's wire format the KV events follow (see KV events). */
  uint32_t    kv_events_format; /* kvt_kv_events_format (default CURRENT) */
  uint32_t    reserved;         /* must be 0 */

  /* 0.5.0: G4 values no other tenant can forge (see G4). */
  const char *g4_key_env;       /* NULL (default): G4's values carry checksums, which catch
                                   corruption but not a writer. Else the name of an
                                   environment variable holding this namespace's key, 64 hex
                                   digits (32 bytes), read at create: every value is then
                                   authenticated with a keyed BLAKE2b MAC over its block,
                                   chain, namespace, layout and bytes, and a value without a
                                   valid one is a miss (corrupt_blocks), never served */
  /* 0.5.0: G3 slots no other writer can forge, for a g3_path on a filesystem that others
   * can write (an NFS export shared by hosts), as G4's values (see G3_FORMAT). */
  const char *g3_key_env;       /* NULL (default): G3's slots carry checksums. Else the name
                                   of an environment variable holding a 32-byte key, 64 hex
                                   digits, read at create (G3 needed): every slot is written
                                   with a keyed BLAKE2b MAC over its block, chain, g3_namespace
                                   and bytes, and a read of a slot without a valid one fails
                                   with KVT_ERR_CORRUPT (the block leaves G3), never served */
} kvt_manager_config;

/* The wire format of the KV events (docs/KV_EVENTS.md). */
typedef enum kvt_kv_events_format {
  KVT_KV_EVENTS_FORMAT_CURRENT = 0,     /* vLLM main (0231dd5): events are maps tagged by
                                           "type"; media GPU, CPU, FS; replay answers carry
                                           the topic */
  KVT_KV_EVENTS_FORMAT_ARRAY_V0_11 = 1  /* vLLM 0.10/0.11: events are tagged arrays of 7
                                           (BlockStored) or 3 (BlockRemoved) fields; G3's
                                           medium is "DISK"; replay answers [seq, payload] */
} kvt_kv_events_format;

/* What kvt_manager_create does with a persistent G3 file it cannot read as its own. */
typedef enum kvt_g3_mismatch {
  KVT_G3_REFUSE = 0,            /* fail with KVT_ERR_INVALID_ARGUMENT naming the difference */
  KVT_G3_RESET = 1              /* start the file empty, with a log message */
} kvt_g3_mismatch;

/* Which inactive block a tier evicts first. */
typedef enum kvt_eviction {
  KVT_EVICT_LRU = 0,            /* least recently released first (exact) */
  KVT_EVICT_S3FIFO = 1          /* S3-FIFO: scan-resistant, for the lower tiers */
} kvt_eviction;

/* Largest capacity of one tier, in blocks: 2^26 - 1 (67,108,863). */
#define KVT_MAX_TIER_BLOCKS ((uint64_t)0x03FFFFFF)

/* Sets cfg->struct_size to size and every field within the first size bytes to its default
 * above; writes nothing past size bytes. A size this library does not accept (see Versioned
 * structs) sets only struct_size (when size >= 4), so that kvt_manager_create refuses the
 * config with a message. cfg: borrowed; NULL is ignored. Call it through
 * kvt_manager_config_init, which passes the size this header declares. (Binaries built
 * against the 0.1.0 header call an exported kvt_manager_config_init instead, which the
 * library keeps: it fills a struct of 0.1.0's size.) */
KVT_API void kvt_manager_config_init_sized(kvt_manager_config *cfg, size_t size);
#ifndef KVT_NO_INLINE  /* defined by binding generators that read declarations only (cffi) */
static inline void kvt_manager_config_init(kvt_manager_config *cfg) {
  kvt_manager_config_init_sized(cfg, sizeof *cfg);
}
#endif

/* Creates a manager. *out is owned by the caller and freed with kvt_manager_destroy.
 * cfg is borrowed during the call. Fails with KVT_ERR_INVALID_ARGUMENT for a config that
 * does not validate (the message names the field), KVT_ERR_UNSUPPORTED for CUDA memory
 * without CUDA, KVT_ERR_NO_MEMORY when a tier cannot be allocated, KVT_ERR_NO_SPACE when
 * KVT_MAX_MANAGERS managers are alive or g3_path's filesystem cannot hold G3's file,
 * KVT_ERR_IO when that file cannot be created. */
KVT_API kvt_status kvt_manager_create(kvt_manager **out, const kvt_manager_config *cfg);

/* Destroys a manager and everything it owns. NULL is ignored. Transfers not yet committed are
 * cancelled, copies in flight are waited for, and the manager's transfers, fences and G3
 * file are freed: every kvt_xfer, kvt_fence, block handle and data pointer of this manager is
 * invalid afterwards. Every later call on m, or with any of those, is forbidden: m itself is
 * freed memory. It must not race with any other call on the same manager (kvt_manager_poll,
 * kvt_xfer_wait and the rest): the caller makes sure every such call has returned first. */
KVT_API void kvt_manager_destroy(kvt_manager *m);

/* Checks the manager's invariants: per tier, free + active + inactive + retired = capacity;
 * every registered hash maps to a registered block of its tier and back; reference counts
 * match states; the inactive list is well formed; the references on a tier's blocks add up
 * to those the host holds plus those the transfers hold, and the transfers hold none beyond
 * what they still need (that part is skipped while copies keep it busy for 100 ms).
 * KVT_OK, or KVT_ERR_INTERNAL with a message naming the first violation. Takes every tier's
 * lock: meant for tests and debug builds. */
KVT_API kvt_status kvt_manager_check(kvt_manager *m);

/* Empties a tier's registry (tier 0: every tier): transfers not yet committed that touch it
 * are cancelled and copies in flight waited for, each ending with exactly one XFER_DONE;
 * every inactive block returns to the free pool; one TIER_CLEARED event per tier emptied
 * follows the BLOCK_REMOVED events, if any. Blocks the host still holds stay valid until
 * released, but leave the registry: no match finds them, and their release frees them. A
 * persistent G3 file is emptied too. Pins are dropped. Transfers enqueued by other threads
 * while it runs are not held back. KVT_ERR_INVALID_ARGUMENT for a tier that is not 0..3 or
 * is absent. */
KVT_API kvt_status kvt_manager_reset(kvt_manager *m, int tier);

/* ---------------------------------------------------------------------------------------
 * Tiers: statistics and contents
 * ------------------------------------------------------------------------------------ */

typedef struct kvt_tier_stats {
  uint32_t struct_size;         /* set by the caller: sizeof(kvt_tier_stats) */
  uint32_t memory;              /* kvt_memory_kind holding this tier's bytes (G3: 0) */
  uint64_t capacity;            /* blocks */
  uint64_t free;                /* never registered, or returned: no data worth keeping */
  uint64_t active;              /* held by at least one reference (mutable or registered) */
  uint64_t inactive;            /* registered, unreferenced, still matchable until evicted */
  uint64_t registered;          /* registered blocks, active or inactive */
  uint64_t block_bytes;         /* bytes of one block's data */
  uint64_t metadata_bytes;      /* bytes of bookkeeping kvtier holds for this tier */
  uint64_t allocs;              /* blocks handed out by kvt_block_alloc */
  uint64_t evictions;           /* inactive blocks evicted to satisfy allocations */
  uint64_t registrations;       /* blocks newly registered (not deduplicated) */
  uint64_t dedups;              /* registrations that found the hash already present */
  uint64_t match_queried;       /* hashes asked for by kvt_tier_match_prefix */
  uint64_t match_hit;           /* hashes found (the prefix part) */
  /* 0.2.0 */
  uint64_t retired;             /* slots that used their last generation, never reused; free
                                   + active + inactive + retired = capacity */
  /* 0.3.0 */
  uint64_t recovered;           /* G3: blocks recovered from a persistent file at create */
  uint64_t pinned;              /* blocks pinned (kvt_block_pin) */
} kvt_tier_stats;

/* Fills *out, up to out->struct_size (set by the caller), with a snapshot of one tier.
 * A tier of capacity 0 reports all zeros. */
KVT_API kvt_status kvt_tier_stats_get(kvt_tier_stats *out, kvt_manager *m, kvt_tier tier);

/* 0.5.0. The blocks that the next allocations in a tier would evict, in that order: the
 * first cap of them into out, and into *n how many the tier could evict now (out NULL and
 * cap 0 ask for it). Pinned blocks are not listed (see Priorities and pins). Nothing is
 * pinned or changed, so a handle may go stale as soon as another call evicts it. This is
 * for write-back offload (SGLang HiCache's write_back): offload these blocks, wait, then
 * allocate over them. */
KVT_API kvt_status kvt_tier_evictable_blocks(kvt_block *out, size_t cap, size_t *n,
                                             kvt_manager *m, kvt_tier tier);

/* The hashes tier t of m holds registered now, in no particular order: up to cap into out,
 * their number into *n (out NULL and cap 0 ask for it). */
KVT_API kvt_status kvt_tier_hashes(uint64_t *out, size_t cap, size_t *n, kvt_manager *m,
                                   kvt_tier tier);

/* ---------------------------------------------------------------------------------------
 * Blocks: states and references
 *
 *  Empty --init--> Partial --append--> Ready --schedule--> Inflight
 *                    ^  ^               |  unschedule         |
 *                    |  +---------------+                     |
 *                    +------- compute_done (not full) --------+
 *  Inflight --compute_done (full)--> Complete --register--> Registered
 *
 * kvt_block_alloc hands out Empty blocks holding one reference, owned by the caller.
 * Registered blocks are immutable and shared; kvt_tier_match_prefix adds references to them.
 * kvt_block_release drops one reference per handle: a mutable block returns to the free
 * pool (its handle goes stale); a registered block with no references left moves to the
 * tier's inactive pool, where it can still be matched until its slot is needed.
 * Every call that does not fit a block's state fails with KVT_ERR_STATE and changes nothing.
 * ------------------------------------------------------------------------------------ */

typedef enum kvt_block_state {
  KVT_BLOCK_EMPTY = 1,
  KVT_BLOCK_PARTIAL = 2,
  KVT_BLOCK_READY = 3,          /* ReadyForScheduling */
  KVT_BLOCK_INFLIGHT = 4,
  KVT_BLOCK_COMPLETE = 5,
  KVT_BLOCK_REGISTERED = 6,     /* referenced by at least one holder */
  KVT_BLOCK_INACTIVE = 7        /* registered, no references, evictable */
} kvt_block_state;

typedef struct kvt_block_info {
  uint32_t struct_size;         /* set by the caller: sizeof(kvt_block_info) */
  uint32_t state;               /* kvt_block_state */
  uint32_t tier;                /* kvt_tier */
  uint32_t refs;                /* references held */
  uint32_t tokens;              /* tokens held (token path, before registration) */
  uint32_t reserved;
  uint64_t seq_hash;            /* registered blocks: the sequence hash */
  uint64_t parent_hash;         /* registered blocks: the parent's, 0 for a first block */
} kvt_block_info;

/* Allocates n Empty blocks in one tier, all or none: free never-registered slots first, then
 * evicting inactive blocks in the tier's eviction order (see Priorities and pins; each
 * eviction emits BLOCK_REMOVED). KVT_ERR_NO_SPACE when the tier cannot supply n blocks, leaving it as it
 * was. out: borrowed array of n handles; each block holds one reference for the caller. */
KVT_API kvt_status kvt_block_alloc(kvt_block *out, size_t n, kvt_manager *m, kvt_tier tier);

/* Drops one reference per handle (a handle may appear several times if it holds several
 * references). All or nothing: one invalid handle, or a block without references, fails
 * the whole call. Give a request's blocks in sequence order: within one call, the blocks
 * later in the array are evicted first, so that shared prefixes survive longest.
 * blocks: borrowed; may mix tiers. */
KVT_API kvt_status kvt_block_release(kvt_manager *m, const kvt_block *blocks, size_t n);

/* --- Priorities and pins: what eviction spares ---
 * Every registered block has a priority (0 by default): among inactive blocks, a tier
 * evicts lower priorities first, and its eviction policy (kvt_eviction) orders blocks of
 * equal priority. A pinned block is never evicted, even when inactive; a tier refuses a pin
 * (KVT_ERR_NO_SPACE) that would make pinned blocks exceed max_pinned_percent of its
 * capacity. Both are all or nothing over the array, which may mix tiers, for registered
 * blocks (KVT_ERR_STATE otherwise), and stay with the block until it is evicted or reset.
 * An inactive block whose priority changes, or that is unpinned, takes the most recent place
 * of its priority; unpinning a block not pinned does nothing. */
KVT_API kvt_status kvt_block_set_priority(kvt_manager *m, const kvt_block *blocks, size_t n,
                                          int32_t priority);
KVT_API kvt_status kvt_block_pin(kvt_manager *m, const kvt_block *blocks, size_t n);
KVT_API kvt_status kvt_block_unpin(kvt_manager *m, const kvt_block *blocks, size_t n);

/* Takes one more reference on a registered block (active or inactive). The caller owns it
 * and drops it with kvt_block_release. KVT_ERR_STATE for a mutable block. */
KVT_API kvt_status kvt_block_retain(kvt_manager *m, kvt_block b);

/* Snapshot of one block, up to out->struct_size (set by the caller). */
KVT_API kvt_status kvt_block_info_get(kvt_block_info *out, kvt_manager *m, kvt_block b);

/* The bytes of a block in host-visible memory: G2, and G1 when it is library-owned host
 * memory or an engine layout in host memory whose chunks are contiguous. *out_len is the
 * block size (the pointer is NULL when it is 0). The memory belongs to the tier: it stays
 * valid while the caller holds a reference to the block. KVT_ERR_UNSUPPORTED for G3 (on
 * disk), CUDA memory, and non-contiguous engine layouts (use kvt_block_chunk);
 * KVT_ERR_STATE for a block without references. */
KVT_API kvt_status kvt_block_data(void **out_ptr, size_t *out_len, kvt_manager *m,
                                  kvt_block b);

/* The address of chunk (layer, outer) of a block, in whatever memory holds its tier (a
 * device pointer for CUDA memory), chunk_bytes long. Valid like kvt_block_data's pointer.
 * KVT_ERR_UNSUPPORTED for G3. */
KVT_API kvt_status kvt_block_chunk(void **out_ptr, kvt_manager *m, kvt_block b,
                                   uint32_t layer, uint32_t outer);

/* --- token path: kvtier computes the hash --- */

/* Empty -> Partial. parent_seq_hash is the sequence hash of the block before this one in
 * its sequence, 0 for a first block; salt_hash as from kvt_hash_salt. */
KVT_API kvt_status kvt_block_init(kvt_manager *m, kvt_block b, uint64_t salt_hash,
                                  uint64_t parent_seq_hash);
/* Partial or Ready -> Ready: stages n >= 1 tokens. More tokens than the block has room for
 * is KVT_ERR_INVALID_ARGUMENT. tokens: borrowed. */
KVT_API kvt_status kvt_block_append(kvt_manager *m, kvt_block b, const uint32_t *tokens,
                                    size_t n);
KVT_API kvt_status kvt_block_schedule(kvt_manager *m, kvt_block b);     /* Ready -> Inflight */
KVT_API kvt_status kvt_block_unschedule(kvt_manager *m, kvt_block b);   /* Ready -> Partial,
                                                                           tokens kept */
/* Inflight -> Complete when the block holds page_size tokens, else back to Partial. */
KVT_API kvt_status kvt_block_compute_done(kvt_manager *m, kvt_block b);
/* Complete -> Registered under the chained hash of its tokens; deduplicates like
 * kvt_block_register_hash, and *out is the registered block. */
KVT_API kvt_status kvt_block_register(kvt_block *out, kvt_manager *m, kvt_block b);

/* --- hash path: the engine computed the hash --- */

/* Registers a filled mutable block (Empty or Complete) under seq_hash; parent_seq_hash is 0
 * for a first block. Emits BLOCK_STORED. If seq_hash is already registered in that tier, the
 * registration deduplicates: *out is the existing block with one more reference, b is
 * released to the free pool (its handle goes stale) and no event is emitted.
 * Otherwise *out is b itself. Either way the caller owns one reference through *out.
 * KVT_ERR_STATE for a destination of an onboard in flight. */
KVT_API kvt_status kvt_block_register_hash(kvt_block *out, kvt_manager *m, kvt_block b,
                                           uint64_t seq_hash, uint64_t parent_seq_hash);

/* Batch form for a chain of blocks of one tier: blocks[i] is registered under seq_hashes[i]
 * with parent seq_hashes[i - 1], and blocks[0] with parent_seq_hash. out[i] receives what
 * kvt_block_register_hash would give for blocks[i]. All or nothing: every block is checked
 * before any is registered. out may overlap blocks (be the same array, or shifted). All
 * arrays are borrowed. */
KVT_API kvt_status kvt_block_register_hashes(kvt_block *out, kvt_manager *m,
                                             const kvt_block *blocks,
                                             const uint64_t *seq_hashes, size_t n,
                                             uint64_t parent_seq_hash);

/* Longest prefix of seq_hashes[0..n) registered in the tier. *out_n receives its length and
 * out_blocks[0..*out_n) its blocks, each pinned with one more reference that the caller owns
 * and releases with kvt_block_release. out_blocks: borrowed, room for n handles. */
KVT_API kvt_status kvt_tier_match_prefix(size_t *out_n, kvt_block *out_blocks, kvt_manager *m,
                                         kvt_tier tier, const uint64_t *seq_hashes, size_t n);

/* ---------------------------------------------------------------------------------------
 * Hashing: chained xxh3-64, compatible with NVIDIA Dynamo's KVBM.
 *   salt_hash     = XXH3_64bits_withSeed(salt, len, 0)
 *   block_hash[i] = XXH3_64bits_withSeed(tokens of block i as LE u32, page_size*4, salt_hash)
 *   seq_hash[0]   = block_hash[0]
 *   seq_hash[i]   = XXH3_64bits_withSeed(LE u64 {seq_hash[i-1], block_hash[i]}, 16, salt_hash)
 * These functions need no manager and are safe from any thread.
 * ------------------------------------------------------------------------------------ */

/* salt: borrowed, may be NULL when len is 0 (the empty salt). */
KVT_API kvt_status kvt_hash_salt(uint64_t *out_salt_hash, const void *salt, size_t len);

/* 0.5.0. Sequence hashes of the full blocks of tokens[0..n_tokens); a trailing partial block
 * has none. The first cap of them go into out, and the number of full blocks into *n (out
 * NULL and cap 0 ask for it). tokens: borrowed. */
KVT_API kvt_status kvt_hash_tokens(uint64_t *out, size_t cap, size_t *n, uint64_t salt_hash,
                                   const uint32_t *tokens, size_t n_tokens, uint32_t page_size);

/* Incremental form: append tokens in any split and read the hashes of the blocks completed
 * so far; they equal kvt_hash_tokens over the concatenation. A kvt_seq is owned by the
 * caller (kvt_seq_destroy) and must not be used from two threads at once. */
KVT_API kvt_status kvt_seq_create(kvt_seq **out, uint64_t salt_hash, uint32_t page_size);
KVT_API void       kvt_seq_destroy(kvt_seq *s);   /* NULL is ignored */
KVT_API kvt_status kvt_seq_append(kvt_seq *s, const uint32_t *tokens, size_t n);
/* Total tokens appended and the number of full blocks hashed so far. */
KVT_API kvt_status kvt_seq_info(size_t *out_tokens, size_t *out_blocks, const kvt_seq *s);
/* 0.5.0. The hashes of the complete blocks from block `first` on: the first cap of them into
 * the arrays (either may be NULL to skip it), and into *n how many blocks from first on are
 * complete (0 when first is at the end; first beyond it is KVT_ERR_INVALID_ARGUMENT). */
KVT_API kvt_status kvt_seq_copy_hashes(uint64_t *out_block_hashes, uint64_t *out_seq_hashes,
                                       size_t cap, size_t *n, const kvt_seq *s, size_t first);

/* ---------------------------------------------------------------------------------------
 * Fences: preconditions the host signals
 *
 * kvt_fence * and kvt_xfer * values are opaque tokens, never addresses: the library never
 * reads memory through them, and never hands out the same value twice in a process. A
 * token that was released or destroyed, belongs to a destroyed manager, or was never
 * handed out is refused with KVT_ERR_INVALID_HANDLE (functions returning void ignore it).
 * ------------------------------------------------------------------------------------ */

/* A one-shot fence owned by the caller (kvt_fence_destroy). Transfers enqueued with it wait
 * until it is signalled. */
KVT_API kvt_status kvt_fence_create(kvt_fence **out, kvt_manager *m);
/* Signals the fence: transfers waiting on it proceed. Signalling again is a no-op. */
KVT_API kvt_status kvt_fence_signal(kvt_fence *f);
/* A fence that is signalled when a CUDA event (a cudaEvent_t, passed as void *) recorded on
 * the host's stream has completed; the event is borrowed until then. KVT_ERR_UNSUPPORTED
 * without CUDA. */
KVT_API kvt_status kvt_fence_from_cuda_event(kvt_fence **out, kvt_manager *m, void *cuda_event);
/* Releases the caller's fence. Transfers still waiting on an unsignalled fence can never
 * proceed and end with KVT_ERR_CANCELLED. NULL, and a fence destroyed before, are ignored. */
KVT_API void kvt_fence_destroy(kvt_fence *f);

/* ---------------------------------------------------------------------------------------
 * Transfers: offload down the tiers, onboard back to G1
 *
 * A transfer moves one container of blocks through policy evaluation, the precondition,
 * batching and the copy. Until the copy commits, the container holds only weak references:
 * a source block evicted before then is dropped from it, and the final count says so. A
 * container larger than max_batch_size is copied in several batches; it commits with its
 * first and ends with its last. Every transfer ends in exactly one XFER_DONE event (unless
 * released first) carrying user_data, its status (KVT_OK, KVT_ERR_CANCELLED or the
 * failure) and the blocks moved. The calls on a transfer never wait for other transfers:
 * kvt_xfer_status, kvt_xfer_cancel and kvt_xfer_wait with timeout 0 return at once.
 * ------------------------------------------------------------------------------------ */

typedef enum kvt_xfer_state {
  KVT_XFER_QUEUED = 1,          /* enqueued, not yet evaluated */
  KVT_XFER_EVALUATING = 2,      /* policy evaluation */
  KVT_XFER_WAITING = 3,         /* waiting for its precondition */
  KVT_XFER_BATCHED = 4,         /* in a batch, not yet committed */
  KVT_XFER_INFLIGHT = 5,        /* committed: copying; cancel no longer applies */
  KVT_XFER_DONE = 6,            /* finished with KVT_OK */
  KVT_XFER_CANCELLED = 7,
  KVT_XFER_FAILED = 8
} kvt_xfer_state;

/* Offloads registered blocks of one tier to the lower tier dst (G1 -> G2, G1 -> G3,
 * G2 -> G3, and G1, G2 or G3 -> G4: see G4). The copies are registered in dst under the
 * same hashes (emitting BLOCK_STORED) and left there unreferenced, matchable until evicted.
 * precondition may be NULL. src is borrowed; *out is owned by the caller and freed with
 * kvt_xfer_release. */
KVT_API kvt_status kvt_xfer_offload(kvt_xfer **out, kvt_manager *m, const kvt_block *src, size_t n,
                                    kvt_tier dst, kvt_fence *precondition, uint64_t user_data);

/* Copies registered blocks of G2 or G3 into the Empty G1 blocks dst_g1[0..n) that the caller
 * allocated, and registers those under the source hashes. Where G1 already held a hash by
 * then, the existing block is pinned instead, and the first kvt_xfer_blocks gives its
 * handle and frees the caller's block (whose handle goes stale). The caller keeps one
 * reference on each final block and must not touch dst_g1 until the transfer ends (nor
 * register them: kvt_block_register_hash refuses with KVT_ERR_STATE). If it fails or is
 * cancelled, or is released before kvt_xfer_blocks was called, dst_g1 stay the caller's:
 * registered where the copy was registered, Empty where it failed or G1 held the hash.
 * A G3 source that fails its checksum (KVT_ERR_CORRUPT) leaves G3's registry with a
 * BLOCK_REMOVED event, so the next match misses it; handles to it stay valid until
 * released. Arrays are borrowed. */
KVT_API kvt_status kvt_xfer_onboard(kvt_xfer **out, kvt_manager *m, const kvt_block *src,
                                    const kvt_block *dst_g1, size_t n, kvt_fence *precondition,
                                    uint64_t user_data);

/* Cancels a transfer that has not committed: it ends at once with KVT_ERR_CANCELLED, its
 * XFER_DONE is queued before this returns, and nothing is copied or registered. After
 * commitment, and after the end, it is a no-op that returns KVT_OK: the transfer finishes. */
KVT_API kvt_status kvt_xfer_cancel(kvt_xfer *x);

/* Waits for the transfer to end: its final status (KVT_OK, KVT_ERR_CANCELLED or the
 * failure), or KVT_TIMEOUT (with a message). timeout_ns < 0 waits forever, 0 only looks.
 * Another thread may release the transfer meanwhile: the wait then returns
 * KVT_ERR_CANCELLED if the transfer had not committed, else its final status once its
 * copy ends. */
KVT_API kvt_status kvt_xfer_wait(kvt_xfer *x, int64_t timeout_ns);

/* Where the transfer is (kvt_xfer_state), its final status once ended (else KVT_AGAIN),
 * and the blocks it moved (blocks dropped or filtered out do not count). Any out-pointer may
 * be NULL. */
KVT_API kvt_status kvt_xfer_status(uint32_t *out_state, kvt_status *out_result,
                                   uint64_t *out_count, kvt_xfer *x);

/* After an onboard ended with KVT_OK: the final G1 handle for each dst_g1[i], in order (n
 * entries); 0 for a pair that was dropped. KVT_ERR_STATE before the end or for an offload.
 * The first call hands over the blocks pinned in place of the caller's (see kvt_xfer_onboard). */
KVT_API kvt_status kvt_xfer_blocks(kvt_block *out, size_t n, kvt_xfer *x);

/* Gives up the handle. A transfer not yet committed is cancelled; one in flight finishes.
 * Legal while another thread waits on x (see kvt_xfer_wait). No event names x after this
 * returns (queued ones are withdrawn); an event the host polled before may still name it,
 * and calls with it then fail with KVT_ERR_INVALID_HANDLE, since no transfer ever gets the
 * same token. NULL, and a transfer released before, are ignored. */
KVT_API void kvt_xfer_release(kvt_xfer *x);

/* Counters of one transfer direction: G1->G2, G1->G3, G2->G3 (offloads), G2->G1, G3->G1
 * (onboards) and, since 0.4.0, G1->G4, G2->G4, G3->G4 (offloads: blocks written) and
 * G4->G1, G4->G2 (kvt_g4_onboard). */
typedef struct kvt_transfer_stats {
  uint32_t struct_size;         /* set by the caller: sizeof(kvt_transfer_stats) */
  uint32_t reserved;
  uint64_t completed;           /* transfers that ended with KVT_OK */
  uint64_t cancelled;           /* ended with KVT_ERR_CANCELLED */
  uint64_t failed;              /* ended with any other error */
  uint64_t blocks;              /* blocks copied and registered at the destination */
  uint64_t bytes;               /* blocks * block bytes */
  uint64_t busy_ns;             /* time the copy engines spent on this direction; a batch
                                   phase serving several directions is shared by bytes */
} kvt_transfer_stats;

/* Fills *out, up to out->struct_size (set by the caller), with the counters of transfers
 * from src to dst since the manager was created. bytes / busy_ns is the engines' bandwidth,
 * without the time transfers spent waiting in the pipeline. A connector's worker counts each
 * batch it runs as one transfer per tier it touches (0.4.0). KVT_ERR_INVALID_ARGUMENT for a
 * pair that is not a direction. */
KVT_API kvt_status kvt_transfer_stats_get(kvt_transfer_stats *out, kvt_manager *m,
                                          kvt_tier src, kvt_tier dst);

/* ---------------------------------------------------------------------------------------
 * Events: what the host learns without asking
 * ------------------------------------------------------------------------------------ */

typedef enum kvt_event_type {
  KVT_EVENT_XFER_DONE = 1, KVT_EVENT_BLOCK_STORED = 2, KVT_EVENT_BLOCK_REMOVED = 3,
  KVT_EVENT_EVENTS_DROPPED = 4,
  KVT_EVENT_TIER_CLEARED = 5    /* 0.3.0: kvt_manager_reset emptied the tier's registry;
                                   never dropped, like XFER_DONE */
} kvt_event_type;

typedef struct kvt_event {
  uint32_t   type;              /* kvt_event_type */
  kvt_status status;            /* XFER_DONE: KVT_OK, KVT_ERR_CANCELLED or the failure */
  uint32_t   tier;              /* BLOCK_*, TIER_CLEARED: the tier; XFER_DONE: the
                                   destination tier */
  uint32_t   reserved;
  kvt_xfer  *xfer;              /* XFER_DONE: the transfer */
  uint64_t   user_data;         /* XFER_DONE: as given at enqueue */
  uint64_t   hash;              /* BLOCK_*: the sequence hash */
  uint64_t   parent_hash;       /* BLOCK_STORED: the parent's sequence hash, 0 for a first block */
  uint64_t   count;             /* XFER_DONE: blocks moved; EVENTS_DROPPED: events lost */
} kvt_event;

/* Moves up to max pending events, oldest first, into out (borrowed, room for max) and
 * returns how many. When BLOCK_* events were dropped because the queue was full, the next
 * poll begins with one EVENTS_DROPPED event whose count says how many were lost.
 * Returns 0 for a NULL manager, or NULL out with max > 0 (and sets kvt_last_error). */
KVT_API size_t kvt_manager_poll(kvt_manager *m, kvt_event *out, size_t max);

/* A file descriptor that is readable while events are pending, for epoll, select, asyncio
 * or Go's poller. Owned by the manager: do not close it, do not read it. -1 for NULL. */
KVT_API int kvt_manager_event_fd(kvt_manager *m);

/* ---------------------------------------------------------------------------------------
 * KV events (0.4.0): the BLOCK_STORED, BLOCK_REMOVED and TIER_CLEARED events of the tiers
 * in kv_events_tiers, published over ZMQ exactly as vLLM's ZmqEventPublisher publishes
 * them (docs/KV_EVENTS.md names the vLLM version and the tier-to-medium mapping), so that a
 * router built for vLLM subscribes to kvtier unchanged. A library thread sends them: the
 * calls that cause them never wait for the network, and a publisher that falls behind
 * drops whole batches (the subscribers see a gap in the sequence numbers and ask the
 * replay socket). kvt_manager_poll is not affected.
 *
 * BlockStored carries the blocks' token ids. A block registered through kvt_block_append
 * has them; for blocks registered by hash (kvt_block_register_hash, offload, onboard, the
 * connector), the tokens come from kvt_manager_note_tokens, which the connector calls
 * itself. Note them before the blocks are registered: the publisher takes them when the
 * block is stored and keeps them while any tier holds it, for its offloads and onboards. A
 * hash whose tokens were never noted is published with an empty token_ids, and the
 * publisher logs a warning. TIER_CLEARED is published as AllBlocksCleared only once every
 * published tier has been cleared with nothing stored in between (kvt_manager_reset of
 * every tier): one tier's clearing is told by its BlockRemoved events.
 * ------------------------------------------------------------------------------------ */

/* Tells the publisher the tokens of n full blocks: tokens[i * page_size ..] are those of
 * the block whose sequence hash is seq_hashes[i]. Kept while any tier holds the block, and
 * for blocks no tier holds, the tiers' capacity of them (the least recently noted
 * forgotten first), for the BlockStored events of those hashes in any tier.
 * A no-op returning KVT_OK when the manager has no publisher. Arrays are borrowed. */
KVT_API kvt_status kvt_manager_note_tokens(kvt_manager *m, const uint64_t *seq_hashes,
                                           size_t n, const uint32_t *tokens);

/* ---------------------------------------------------------------------------------------
 * Observe (0.4.0): the event stream of docs/EVENTS.md, schema KVT_OBS_SCHEMA_VERSION. Slot
 * transitions, transfer candidates, blocks stored and removed per tier, and ended transfers,
 * each with a sequence number (1, 2, ... per manager, without gaps) and a CLOCK_MONOTONIC
 * time. Subscribers, the recorder's ring and its log read the same stream; with none of
 * them, a call site costs one branch.
 * ------------------------------------------------------------------------------------ */

/* 2 added CALL events; readers take logs of schema 1 and 2. */
#define KVT_OBS_SCHEMA_VERSION 2

typedef enum kvt_obs_kind {
  KVT_OBS_SLOT = 1,           /* a slot entered `state` from `prev` (the same for a repeat) */
  KVT_OBS_CANDIDATE = 2,      /* a connector batch (a transfer candidate) entered `state` */
  KVT_OBS_BLOCK_STORED = 3,   /* tier `dst` registered `hash` (child of `parent_hash`) */
  KVT_OBS_BLOCK_REMOVED = 4,  /* tier `dst` dropped `hash` (eviction or removal) */
  KVT_OBS_TIER_CLEARED = 5,   /* kvt_manager_reset emptied tier `dst` */
  KVT_OBS_TRANSFER = 6,       /* a transfer src -> dst ended with `status` */
  KVT_OBS_DROPPED = 7,        /* this reader lost `count` events before this one */
  KVT_OBS_CALL = 8            /* a call of the connector's scheduler half ended with `status`
                                 (schema 2); an event log keeps its arguments too */
} kvt_obs_kind;

/* The connector call that moved a slot. */
typedef enum kvt_obs_trigger {
  KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS = 1, KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC = 2,
  KVT_TRIGGER_BUILD_CONNECTOR_META = 3, KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT = 4,
  KVT_TRIGGER_REQUEST_FINISHED = 5, KVT_TRIGGER_REQUEST_PREEMPTED = 6,
  KVT_TRIGGER_RESET_CACHE = 7                       /* 0.5.0 */
} kvt_obs_trigger;

/* Candidate states. A load is PENDING_EVALUATION from the match that staged it
 * until update_state_after_alloc PROMOTES it (the engine takes it) or SKIPS it; a store is
 * PROMOTED into a step's metadata, and its blocks that need no copy are SKIPPED. A promoted
 * batch ends COMPLETED, FAILED or CANCELLED when the worker's report reaches the scheduler. */
typedef enum kvt_candidate_state {
  KVT_CANDIDATE_PENDING_EVALUATION = 1, KVT_CANDIDATE_PROMOTED = 2, KVT_CANDIDATE_SKIPPED = 3,
  KVT_CANDIDATE_COMPLETED = 4, KVT_CANDIDATE_FAILED = 5, KVT_CANDIDATE_CANCELLED = 6
} kvt_candidate_state;

typedef struct kvt_obs_event {
  uint64_t   seq;          /* 1, 2, ...: a gap only where a DROPPED event says so */
  uint64_t   time_ns;      /* CLOCK_MONOTONIC */
  uint32_t   kind;         /* kvt_obs_kind */
  uint32_t   state;        /* SLOT: the state entered; CANDIDATE: kvt_candidate_state */
  uint32_t   prev;         /* SLOT: the state left, 0 for a new slot */
  uint32_t   trigger;      /* SLOT: kvt_obs_trigger; CALL: the call */
  uint32_t   src;          /* CANDIDATE, TRANSFER: the source tier */
  uint32_t   dst;          /* CANDIDATE, TRANSFER: the destination tier; BLOCK_*, TIER_CLEARED:
                              the tier */
  kvt_status status;       /* TRANSFER, CALL, and CANDIDATE FAILED: how it ended */
  uint32_t   reserved;
  uint64_t   batch;        /* CANDIDATE, and TRANSFER of a connector worker: the batch id */
  uint64_t   hash;         /* BLOCK_*: the sequence hash; CALL of build_connector_meta: XXH64
                              of the metadata */
  uint64_t   parent_hash;  /* BLOCK_STORED: the parent's sequence hash, 0 for a first block */
  uint64_t   tokens;       /* SLOT: the request's tokens; CALL: get_num_new_matched_tokens'
                              num_tokens */
  uint64_t   computed;     /* SLOT: its tokens computed or loaded; CALL: num_computed_tokens
                              (get_num_...), num_external_tokens (update_state_after_alloc) */
  uint64_t   blocks;       /* CANDIDATE: blocks; TRANSFER: blocks that arrived; CALL:
                              num_block_ids (update_state_after_alloc), num_reqs (build_...) */
  uint64_t   bytes;        /* TRANSFER: bytes that arrived; CALL: its arguments' bytes in a
                              log */
  uint64_t   duration_ns;  /* TRANSFER: enqueue (a worker: the batch's start) to end */
  uint64_t   count;        /* DROPPED: events lost; CALL: the result (tokens matched,
                              delay_free, the metadata's bytes) */
  char       req_id[KVT_REQ_ID_MAX + 1]; /* SLOT, CANDIDATE, a worker's TRANSFER, CALL of a
                                            request: the request; "" otherwise */
} kvt_obs_event;

/* A reader of m's events from now on, with a queue of `capacity` events (1..2^24). A reader
 * that falls behind never slows m: its oldest events give way, and the next drain begins
 * with one DROPPED event that counts them. It may outlive m (it then receives nothing). */
KVT_API kvt_status kvt_subscription_create(kvt_subscription **out, kvt_manager *m, size_t capacity);
/* Readable while events are queued; owned by the subscription. -1 for NULL. */
KVT_API int kvt_subscription_fd(kvt_subscription *s);
/* Moves up to max queued events, oldest first, into out; returns how many (0 for NULL s,
 * or NULL out with max > 0, with kvt_last_error set). */
KVT_API size_t kvt_subscription_drain(kvt_subscription *s, kvt_obs_event *out, size_t max);
/* NULL is ignored. */
KVT_API void kvt_subscription_destroy(kvt_subscription *s);

/* Names for printing: "SLOT", "PROMOTED", "UPDATE_STATE_AFTER_ALLOC"; "UNKNOWN" otherwise. */
KVT_API const char *kvt_obs_kind_str(uint32_t kind);
KVT_API const char *kvt_candidate_state_str(uint32_t state);
KVT_API const char *kvt_obs_trigger_str(uint32_t trigger);
/* 0.5.0: e as one line of JSON, the one mapping that the management endpoint,
 * kvtier-events --json and the bindings use (docs/EVENTS.md, "Events as JSON"). Writes the
 * text and a NUL into buf when cap is enough, and sets *len to the text's length. buf NULL
 * with cap 0 asks for the length (KVT_OK); a smaller cap otherwise is
 * KVT_ERR_INVALID_ARGUMENT, with *len set. */
KVT_API kvt_status kvt_obs_event_json(char *buf, size_t cap, size_t *len,
                                      const kvt_obs_event *e);

/* The recorder. kvt_manager_recorder_ring keeps m's last `events` events in memory (0: none, up to
 * 2^24), and kvt_manager_recorder_dump writes them to a new file at path as an event log.
 * The event log files of kvt_manager_recorder_dump and kvt_manager_recorder_open are regular files
 * only: a symbolic link as path's last component (links among its directories are followed), a
 * FIFO, a device or a directory is refused with KVT_ERR_INVALID_ARGUMENT and left as it is.
 * Their file work never blocks m's other calls: a slow or hung disk holds up only the
 * recorder call that writes to it (and recorder opens and closes after it). */
KVT_API kvt_status kvt_manager_recorder_ring(kvt_manager *m, size_t events);
KVT_API kvt_status kvt_manager_recorder_dump(kvt_manager *m, const char *path);
/* Appends every event from now on to a new event log at path (replaced if it exists):
 * length-prefixed records with a checksum each (docs/EVENTS.md), written in 64 KiB runs.
 * KVT_ERR_STATE while a log is open (of calls racing to open, one wins); KVT_ERR_IO when
 * the file cannot be written (the log then stops, and m goes on). kvt_manager_recorder_close writes
 * what is buffered and closes it (events after it are not written; KVT_ERR_IO if a write
 * failed); a manager's destroy does too. */
KVT_API kvt_status kvt_manager_recorder_open(kvt_manager *m, const char *path);
KVT_API kvt_status kvt_manager_recorder_close(kvt_manager *m);

/* ---------------------------------------------------------------------------------------
 * Event logs: files of the observe stream (kvt_manager_recorder_open, kvt_manager_recorder_dump)
 * ------------------------------------------------------------------------------------ */


/* Reads an event log, a regular file (symbolic links are followed). KVT_ERR_INVALID_ARGUMENT
 * at once for a FIFO, a device or a directory; KVT_ERR_CORRUPT for a file that is not an
 * event log, KVT_ERR_UNSUPPORTED for another format version, KVT_ERR_IO when it cannot be
 * read. */
KVT_API kvt_status kvt_event_log_open(kvt_event_log **out, const char *path);
/* 0.5.0. The next record into *out: KVT_OK; KVT_ITEROVER past the last one (and on every call
 * after); KVT_ERR_CORRUPT once, where a record is torn or damaged (a writer killed
 * mid-write): nothing from there on is read, and kvt_last_error says at which byte. */
KVT_API kvt_status kvt_event_log_read(kvt_obs_event *out, kvt_event_log *l);
/* NULL is ignored. */
KVT_API void kvt_event_log_close(kvt_event_log *l);

/* Replay of an event log. The events are applied in order, and checked as they go:
 * - every BLOCK_STORED registers its hash in the same tier of m (when m is not NULL: a
 *   fresh manager with the recorded one's tiers and at least its capacities), every
 *   BLOCK_REMOVED removes it, so that m ends with the recorded manager's registry; a hash
 *   stored twice or removed while absent is a violation;
 * - SLOT events rebuild each request's slot: a transition must start where the slot is and
 *   be one of the table's (see Connector, kvt_slot_state);
 * - every promoted batch must end (COMPLETED, FAILED or CANCELLED) exactly once;
 * - sequence numbers must follow each other, and no DROPPED event may be in the log.
 * KVT_OK when nothing was violated; KVT_ERR_CORRUPT otherwise, with the first violation in
 * kvt_last_error and their number in out->violations. A torn tail ends the replay there
 * (out->torn = 1). */
typedef struct kvt_log_replay {
  uint32_t struct_size;          /* set by the caller: sizeof(kvt_log_replay) */
  uint32_t torn;
  uint64_t events;               /* records applied */
  uint64_t violations;
  uint64_t live_slots;           /* slots not finished at the end */
  uint64_t finished_slots;
  uint64_t open_batches;         /* promoted batches without an end */
  uint64_t loaded_blocks;        /* blocks of completed loads */
  uint64_t transitions[11][11];  /* as kvt_connector_stats.transitions */
  uint64_t registered[4];        /* hashes registered at the end, by tier */
  uint64_t calls;                /* kvt_event_log_rerun: the calls made again */
} kvt_log_replay;
KVT_API kvt_status kvt_event_log_replay(kvt_log_replay *out, kvt_manager *m, const char *path);

/* Re-execution of an event log that a manager recorded from its creation on
 * (kvt_manager_recorder_open before its connector's first call). Every CALL event's call is made
 * again, in order and with its recorded arguments, on c's scheduler half, and must end with the
 * recorded status. c: a new connector with the recorded one's config, over a new manager with the
 * recorded one's config (its G3 anywhere); the worker's recorded reports stand in for a worker. The
 * log's events are checked as kvt_event_log_replay checks them (without a manager), and at
 * the end c and its manager must hold the state they describe: the same live slots in the
 * same states, the same hashes in each tier, the same transition counts, and, once every
 * slot finished and every batch ended, no block still pinned. KVT_OK when all of
 * it agrees; KVT_ERR_CORRUPT otherwise, with the first difference in kvt_last_error and the
 * number of differences and violations in out->violations. A log without CALL events
 * (schema 1, or no connector) is such a difference. */
KVT_API kvt_status kvt_event_log_rerun(kvt_log_replay *out, kvt_connector *c, const char *path);

/* ---------------------------------------------------------------------------------------
 * Connector: the request layer a serving engine plugs in (vLLM's KVConnectorBase_V1)
 *
 * A connector carries requests, by id, through the slot state machine below and moves their
 * KV between the engine's G1 blocks and kvtier's G2/G3. It has two halves, named after
 * vLLM's methods, that may live in different processes:
 * - The scheduler half decides. It owns the G2/G3 registries of its manager: it matches a
 *   request's block hashes, picks the G2/G3 slots of loads and stores, pins them until the
 *   worker reports the copies done, and registers stored blocks (BLOCK_STORED events).
 * - The worker half copies. It reads and writes the engine's G1 memory (register_kv_caches)
 *   and its manager's G2 memory and G3 file, at the slots the metadata names. Its manager's
 *   registries are not used.
 * Between them pass only two byte strings: the metadata of a step (scheduler -> worker) and
 * the worker's report (worker -> scheduler). Their format is versioned and documented in
 * docs/CONNECTOR.md; bytes that are truncated, corrupt, from another format version or from
 * a connector with other capacities are refused with KVT_ERR_CORRUPT.
 * In one process, one connector of role KVT_ROLE_BOTH does both over one manager; across
 * two, each process creates its manager with the same page_size, G2 and G3 capacities (the
 * scheduler's may have chunk_bytes 0) and a connector of its role.
 *
 * The engine owns G1: it allocates the block ids, and kvtier never allocates, registers or
 * frees G1 blocks for a connector. The manager's own G1 tier is left alone. A G1 block id is
 * "written" by a request at positions from its num_computed_tokens on (its loads and the
 * tokens it computes); a block written by one live request may not be given to another for
 * writing (KVT_ERR_INVALID_ARGUMENT). Blocks of the engine's own prefix hit (below
 * num_computed_tokens) may be shared.
 *
 * Slot states and every legal transition, with its trigger:
 *   (none)          -> INITIALIZED       get_num_new_matched_tokens, first call for an id
 *   INITIALIZED     -> ONBOARD_STAGED    get_num_new_matched_tokens finds tokens in G2/G3
 *   PREEMPTED       -> ONBOARD_STAGED    the same, for a preempted request coming back
 *   ONBOARD_STAGED  -> ONBOARDING        update_state_after_alloc with external tokens > 0
 *   ONBOARD_STAGED  -> INITIALIZED       update_state_after_alloc with 0 external tokens
 *                                        (the engine declined the hit; pins are dropped),
 *                                        or get_num_new_matched_tokens asked again and
 *                                        finding nothing;
 *                                        from INITIALIZED or PREEMPTED that call changes
 *                                        no state
 *   INITIALIZED, ONBOARDING, PREEMPTED
 *                   -> PREFILLING        build_connector_meta schedules it
 *   PREFILLING      -> PREFILLING        scheduled again without new tokens (chunked prefill)
 *   PREFILLING, DECODING
 *                   -> DECODING          scheduled with new tokens (sampled ones); from
 *                                        DECODING also without (async scheduling schedules
 *                                        a step before its sampled token is known)
 *   PREFILLING      -> SKIPPED_PREFILL   build_connector_meta without it
 *   DECODING        -> SKIPPED_DECODE    build_connector_meta without it
 *   SKIPPED_PREFILL -> PREFILLING or DECODING, SKIPPED_DECODE -> DECODING: scheduled again
 *   INITIALIZED, ONBOARD_STAGED, ONBOARDING, PREFILLING, DECODING, SKIPPED_* -> PREEMPTED
 *                                        request_preempted: device blocks are dropped,
 *                                        tokens kept; it can onboard again. Also
 *                                        get_num_new_matched_tokens on a request in
 *                                        ONBOARDING or later, not yet told: the engine sent
 *                                        it back to waiting (vLLM's reset_prefix_cache,
 *                                        a failed asynchronous load), which is a preemption
 *   any state but FINISHING, FINISHED -> FINISHING   request_finished
 *   FINISHING       -> FINISHED          its stores and loads drain (update_connector_output)
 * request_finished always enters FINISHING, and moves on to FINISHED in the same call when
 * nothing is outstanding (the history shows both). A FINISHED slot is gone: its id is unknown to every call
 * but kvt_connector_slot_state afterwards (KVT_ERR_NOT_FOUND). Every call that would make
 * a transition not listed fails with KVT_ERR_STATE and changes nothing, and a failing call
 * on one request leaves every other request as it was; request_preempted on a request that
 * is preempted already (told twice, or by get_num_new_matched_tokens in the same step) is a
 * no-op.
 *
 * Offload: EAGER plans a store, at the step that computes it (or loads it from G3), for
 * every full block of a request that its store tier lacks. LAZY stores a full block only
 * when the engine hands its G1 block id to a request to write (the block is about to be
 * overwritten); the worker copies such blocks out in start_load_kv, before anything writes
 * them. Either way a store's G2/G3 slot is pinned until the worker reports its batch done,
 * and a load's sources until the worker reports the load done. A load that fails (a G3
 * checksum, an I/O error) lists its G1 blocks in kvt_finished.load_error_block_ids for the
 * engine to recompute, fails every store of that request in the same step (they were
 * computed over the missing bytes), and takes a corrupt G3 copy out of the registry.
 * ------------------------------------------------------------------------------------ */

typedef enum kvt_connector_role {
  KVT_ROLE_SCHEDULER = 1, KVT_ROLE_WORKER = 2, KVT_ROLE_BOTH = 3
} kvt_connector_role;

typedef enum kvt_offload_mode { KVT_OFFLOAD_EAGER = 0, KVT_OFFLOAD_LAZY = 1 } kvt_offload_mode;

typedef enum kvt_slot_state {
  KVT_SLOT_INITIALIZED = 1,
  KVT_SLOT_ONBOARD_STAGED = 2,
  KVT_SLOT_ONBOARDING = 3,
  KVT_SLOT_PREFILLING = 4,
  KVT_SLOT_DECODING = 5,
  KVT_SLOT_SKIPPED_PREFILL = 6,
  KVT_SLOT_SKIPPED_DECODE = 7,
  KVT_SLOT_PREEMPTED = 8,
  KVT_SLOT_FINISHING = 9,
  KVT_SLOT_FINISHED = 10
} kvt_slot_state;

typedef struct kvt_connector_config {
  uint32_t struct_size;         /* set by kvt_connector_config_init */
  uint32_t role;                /* kvt_connector_role (default BOTH) */
  uint32_t offload;             /* kvt_offload_mode (default EAGER) */
  uint32_t store_tier;          /* where stores go: KVT_TIER_G2 (default) or KVT_TIER_G3;
                                   loads take each block of a prefix from G2, else G3 */
  uint64_t num_gpu_blocks;      /* scheduler: G1 block ids are 0..num_gpu_blocks-1; 0 (the
                                   default) takes the manager's g1_blocks */
  uint64_t salt_hash;           /* of the requests' block hashes (default: the empty salt's) */
  uint32_t load_async;          /* 1: loads are asynchronous (the engine waits for the
                                   request in finished_recving); 0 (default): they end
                                   before wait_for_layer_load returns, within the step */
  uint32_t reserved;            /* must be 0 */
  const char *endpoint_path;    /* non-NULL: serve the management endpoint (kvt_endpoint_open)
                                   on this Unix socket from create to destroy; NULL
                                   (default): none. Borrowed */
  uint32_t pause_timeout_ms;    /* how long a breakpoint's pause waits for a resume before
                                   it ends itself: 1 ms .. 1 hour (default 30000) */
  uint32_t reserved2;           /* must be 0 */
  /* 0.5.0: tensor and pipeline parallelism. One scheduler half plans for world_size worker
   * halves, each in its own process with its own manager, moving its shard of every block
   * (its KV heads, its layers) under the block's one name. A batch ends when every rank's
   * report has named it, failed if any rank's copy failed: a block is stored only when
   * every shard is. Every rank reports its own finished sets; the engine counts world_size
   * of them (vLLM's KVOutputAggregator). */
  uint32_t world_size;          /* 1..KVT_MAX_WORLD_SIZE (default 1); BOTH needs 1 */
  uint32_t rank;                /* a worker half's rank, below world_size (default 0) */
  /* 0.5.0: one KV cache group of a hybrid model (vLLM's sliding-window attention layers),
   * one connector per group. With a window of W tokens, attention at position p reads only
   * tokens (p-W, p]: a prefix hit of n tokens needs only the blocks holding tokens
   * [n-W+1, n) (vLLM's SlidingWindowManager), only those are loaded, and block ids before
   * them may be KVT_BLOCK_ID_NONE. The engine frees the blocks that leave the window
   * without telling the connector, so the scheduler half stops claiming and storing a
   * request's blocks that lie wholly before num_computed_tokens - W + 1, and the worker
   * half's handle_preemptions (and start_load_kv) waits for the stores of earlier steps:
   * both halves must be given the same value. A Mamba group is a window of 2 (vLLM keeps
   * the last computed token's state only). Lazy offload is refused (a freed block is reused
   * unseen). */
  uint32_t sliding_window;      /* tokens; 0 (default): full attention */
  uint32_t reserved3;           /* must be 0 */
} kvt_connector_config;

/* A block id that names no block: the engine's null block (vLLM's), in a sliding-window
 * group's tokens that left the window. Never loaded, stored or claimed. */
#define KVT_BLOCK_ID_NONE 0xFFFFFFFFu

#define KVT_MAX_WORLD_SIZE 4096

/* Sets cfg->struct_size to size and every field within the first size bytes to its default.
 * Call it through kvt_connector_config_init. */
KVT_API void kvt_connector_config_init_sized(kvt_connector_config *cfg, size_t size);
#ifndef KVT_NO_INLINE
static inline void kvt_connector_config_init(kvt_connector_config *cfg) {
  kvt_connector_config_init_sized(cfg, sizeof *cfg);
}
#endif

/* Creates a connector over m, which must outlive it. cfg: borrowed. A manager has at most
 * one connector (KVT_ERR_STATE). The scheduler role needs G2 or G3 (whichever store_tier
 * names); KVT_ERR_INVALID_ARGUMENT names a field that does not validate. */
KVT_API kvt_status kvt_connector_create(kvt_connector **out, kvt_manager *m,
                                        const kvt_connector_config *cfg);
/* Waits for the worker's copies in flight, releases every pin and frees the connector. A
 * call paused at a breakpoint is resumed and waited for first.
 * NULL is ignored. Must not race with other calls on c. */
KVT_API void kvt_connector_destroy(kvt_connector *c);

/* Any thread may call a connector. The scheduler half's calls are serialized by a lock; the
 * worker half synchronizes itself, so that its waits (wait_for_layer_load,
 * handle_preemptions) block no other call. Calls of the wrong half (a worker call on a
 * SCHEDULER connector, say) fail with KVT_ERR_STATE. */

/* --- scheduler half --- */

/* How many tokens beyond num_computed_tokens (the engine's own prefix hit) kvtier can load,
 * and whether the load is asynchronous (*out_load_async, from the config's load_async;
 * out_load_async may be NULL).
 * tokens[0..num_tokens): the request's tokens so far (the prompt, plus its outputs when a
 * preempted request comes back); borrowed. Only full blocks count, and never the last
 * token: the engine must compute at least one. The first call for an id creates its slot.
 * Found blocks are pinned (ONBOARD_STAGED) until update_state_after_alloc. Called again
 * before then, it drops the earlier pins and matches anew. Called for a request that is
 * ONBOARDING (its loads reported ended: KVT_ERR_STATE while they are in flight), PREFILLING,
 * DECODING or SKIPPED_*, it preempts it first: the engine asks only about waiting requests,
 * so it took the request's blocks back, and a request_preempted that follows in the same
 * step is then a no-op. A num_computed_tokens inside a block (a hit of the engine's that
 * ends mid-block) gets 0: kvtier loads whole blocks. */
KVT_API kvt_status kvt_connector_get_num_new_matched_tokens(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    const uint32_t *tokens, size_t num_tokens, uint64_t num_computed_tokens);

/* 0.5.0: the same for a request whose blocks are named under its own salt_hash (from
 * kvt_hash_salt) instead of the config's: everything besides its tokens that decides what
 * its KV is (vLLM's cache_salt, LoRA adapter, multimodal inputs, the model) folded into one
 * value, so that two requests share a block only when their salts and tokens are equal. A
 * later call may name another salt: the request's blocks are named anew. */
KVT_API kvt_status kvt_connector_get_num_new_matched_tokens_salted(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    uint64_t salt_hash, const uint32_t *tokens, size_t num_tokens,
    uint64_t num_computed_tokens);

/* 0.5.0: kvt_connector_get_num_new_matched_tokens_salted with the hit capped:
 * *out_num_tokens <= max_tokens. An engine with several KV cache groups (a connector each)
 * needs the longest hit that every group serves: it lowers the cap to the smallest group's
 * hit and asks each group again, until all agree (with sliding windows a lower cap can
 * lower a group's hit further: the window must fit below the new end). */
KVT_API kvt_status kvt_connector_get_num_new_matched_tokens_max(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    uint64_t salt_hash, const uint32_t *tokens, size_t num_tokens,
    uint64_t num_computed_tokens, uint64_t max_tokens);

/* The engine allocated block_ids[0..num_block_ids) (all of the request's G1 blocks, in
 * order; KVT_BLOCK_ID_NONE for the null blocks of a sliding window) and wants
 * num_external_tokens of them filled by kvtier: 0, or exactly what
 * get_num_new_matched_tokens reported. Plans the loads (ONBOARDING). */
KVT_API kvt_status kvt_connector_update_state_after_alloc(
    kvt_connector *c, const char *req_id, const uint32_t *block_ids, size_t num_block_ids,
    uint64_t num_external_tokens);

/* One request in a step's schedule. */
typedef struct kvt_scheduled_request {
  const char     *req_id;
  uint64_t        num_computed_tokens;   /* before this step */
  uint64_t        num_scheduled_tokens;  /* tokens whose KV this step computes; may reach
                                            beyond the tokens known so far (vLLM's async
                                            scheduling placeholders, speculative drafts): a
                                            block is stored once all of its tokens are
                                            known and computed */
  const uint32_t *new_block_ids;         /* G1 blocks added to it since the connector last
                                            saw its list, in order (KVT_BLOCK_ID_NONE: a
                                            null block, never stored) */
  size_t          num_new_block_ids;
  const uint32_t *new_token_ids;         /* tokens appended to its sequence since the last
                                            step (sampled ones); empty during prefill */
  size_t          num_new_token_ids;
} kvt_scheduled_request;

/* One step: the loads planned since the last step, and the stores the step's computing
 * makes due, as metadata bytes for the worker. Live slots missing from reqs are skipped
 * (SKIPPED_*). *out_meta: owned by the connector, valid until its next
 * build_connector_meta or destroy. All or nothing: a bad entry fails the call and changes
 * no slot. */
KVT_API kvt_status kvt_connector_build_connector_meta(
    const void **out_meta, size_t *out_len, kvt_connector *c,
    const kvt_scheduled_request *reqs, size_t num_reqs);

/* The worker's report (kvt_finished.report): registers completed stores in their tier,
 * unpins what the finished copies used, drops failed stores, unregisters G3 blocks that
 * failed their checksum, and finishes FINISHING slots whose copies drained. A report
 * naming an unknown transfer fails with KVT_ERR_INVALID_ARGUMENT and changes nothing.
 * With world_size > 1, each rank's reports come here: a transfer ends when every rank
 * named it, failed if any rank's copy failed; a rank naming one twice is refused. */
KVT_API kvt_status kvt_connector_update_connector_output(kvt_connector *c, const void *report,
                                                         size_t len);

/* The request is done. *out_delay_free is 1 when copies still use its G1 blocks: the
 * engine keeps them until the worker (every rank's, with world_size > 1) lists the request
 * in finished_sending. The worker
 * learns of the finish from the next step's metadata, so the engine keeps building and
 * binding steps (empty ones will do) until then, as vLLM does. A request whose
 * asynchronous load is in flight gets 0 and is never listed in finished_sending: the
 * engine keeps its blocks until the load's finished_recving (vLLM frees a finished
 * request there), so each request reaches exactly one of the two lists. */
KVT_API kvt_status kvt_connector_request_finished(int32_t *out_delay_free, kvt_connector *c,
                                                  const char *req_id);

/* The engine preempted the request and takes its G1 blocks back (PREEMPTED). Stores already
 * in the metadata still run: the worker's handle_preemptions waits for them before the
 * engine reuses the blocks. A request preempted already is left as it is (KVT_OK). */
KVT_API kvt_status kvt_connector_request_preempted(kvt_connector *c, const char *req_id);

/* 0.5.0: the engine's prefix cache was reset (vLLM's reset_connector_cache, after a weight
 * reload): every G2/G3 block of the connector's manager leaves the registry (BLOCK_REMOVED,
 * TIER_CLEARED; its persistent G3 file, if it has one, is emptied), stores in flight are
 * never registered, lazy stores of what G1 holds are not made, and staged hits are dropped,
 * so nothing stored before is served again. KVT_ERR_STATE, changing nothing, while loads are
 * in flight (they would bring the old KV into G1): the engine retries once they ended. */
KVT_API kvt_status kvt_connector_reset_cache(kvt_connector *c);

/* The slot's state, and its states so far (from INITIALIZED on) into out_history[0..cap)
 * with their number in *out_n (the whole number, even when cap is smaller; either may be
 * NULL). Finished requests stay queryable until 4096 later ones have finished. */
KVT_API kvt_status kvt_connector_slot_state(uint32_t *out_state, uint32_t *out_history,
                                            size_t *out_n, size_t cap, kvt_connector *c,
                                            const char *req_id);

/* Counters of the scheduler half. */
typedef struct kvt_connector_stats {
  uint32_t struct_size;          /* set by the caller: sizeof(kvt_connector_stats) */
  uint32_t reserved;
  uint64_t transitions[11][11];  /* [from][to] by kvt_slot_state; from 0: slot created */
  uint64_t preemptions;
  uint64_t matched_tokens;       /* reported by get_num_new_matched_tokens and accepted */
  uint64_t loaded_blocks;        /* loads the worker reported done */
  uint64_t load_errors;          /* blocks whose load failed */
  uint64_t stored_blocks;        /* stores registered in their tier */
  uint64_t store_failures;       /* stores dropped */
} kvt_connector_stats;
/* Fills *out up to out->struct_size (set by the caller). */
KVT_API kvt_status kvt_connector_stats_get(kvt_connector_stats *out, kvt_connector *c);

/* 0.5.0. vLLM's take_events: moves up to max of the manager's pending events (BLOCK_STORED
 * and BLOCK_REMOVED of G2 and G3) into out, as kvt_manager_poll does, and returns how many
 * (0 for a bad handle, with kvt_last_error set). */
KVT_API size_t kvt_connector_drain_events(kvt_connector *c, kvt_event *out, size_t max);

/* --- worker half --- */

/* The engine's G1 memory: num_blocks blocks in the layout (see kvt_g1_layout), with the
 * manager's num_layers, num_outer and chunk_bytes. Once, before the first bind. Borrowed
 * arrays; the memory must outlive the connector. */
KVT_API kvt_status kvt_connector_register_kv_caches(kvt_connector *c,
                                                    const kvt_g1_layout *layout,
                                                    uint64_t num_blocks);

/* Decodes a step's metadata and holds it until clear_connector_metadata. Bytes that do not
 * decode fail with KVT_ERR_CORRUPT and bind nothing; so does a block id or slot out of
 * range. KVT_ERR_STATE while another metadata is bound. meta: borrowed. */
KVT_API kvt_status kvt_connector_bind_connector_metadata(kvt_connector *c, const void *meta,
                                                         size_t len);
KVT_API kvt_status kvt_connector_clear_connector_metadata(kvt_connector *c);

/* Starts the bound metadata's lazy stores and all its loads, every layer, on the connector's
 * copy thread, and returns once the lazy stores have ended: they read blocks that loads or
 * the model then overwrite, and vLLM writes a layer's new KV before that layer's
 * wait_for_layer_load. Loads move layer-major: layer 0 of every load of the step, then
 * layer 1, ...; a G3 block is read and checked whole before any of its layers reaches G1. */
KVT_API kvt_status kvt_connector_start_load_kv(kvt_connector *c);
/* Waits until layer `layer` of every load of the bound metadata (all requests) is in G1,
 * not for later layers; for the last layer, until the loads have ended, so that the next
 * get_finished reports them, failures included. A G3 block that failed its checksum is in
 * no layer of G1 and goes to load_error_block_ids. Asynchronous loads (load_async) are not
 * waited for. */
KVT_API kvt_status kvt_connector_wait_for_layer_load(kvt_connector *c, uint32_t layer);
/* The model wrote layer `layer` of this step: the bound metadata's eager stores may read it,
 * and copy it while the next layer computes. A store reads no layer before its save_kv_layer
 * (or wait_for_save or clear_connector_metadata), and its batch is reported done only once
 * every layer of it has been copied. */
KVT_API kvt_status kvt_connector_save_kv_layer(kvt_connector *c, uint32_t layer);
/* Lets the eager stores read the layers save_kv_layer did not name (an engine may skip the
 * hook for some layers), waits for the step's synchronous loads to end (as the last layer's
 * wait_for_layer_load does), and returns: stores run in the background and get_finished
 * reports them, as in vLLM's offloading connectors. */
KVT_API kvt_status kvt_connector_wait_for_save(kvt_connector *c);
/* Waits until no copy queued or running reads or writes the G1 blocks of these requests, so
 * that the engine can reuse them; first starts the bound metadata's lazy stores and loads,
 * as start_load_kv would. Copies run in the order their metadata came, so a later step's
 * loads never overtake an earlier step's stores. Unknown ids are ignored. req_ids: borrowed.
 * With a sliding window it also waits for every earlier step's stores: the engine may write
 * their freed blocks before start_load_kv (vLLM zeroes new blocks of Mamba hybrids there),
 * so call it at the start of every step, with n = 0 when no request was preempted. */
KVT_API kvt_status kvt_connector_handle_preemptions(kvt_connector *c,
                                                    const char *const *req_ids, size_t n);

/* What the worker finished since its last get_finished. */
typedef struct kvt_finished {
  uint32_t           struct_size;          /* set by the caller: sizeof(kvt_finished) */
  uint32_t           reserved;
  const char *const *finished_sending;     /* finished requests whose stores all ended */
  size_t             num_finished_sending;
  const char *const *finished_recving;     /* requests whose asynchronous loads all ended
                                              (load_async); a load the engine waited for
                                              in its step is never listed */
  size_t             num_finished_recving;
  const uint32_t    *load_error_block_ids; /* G1 blocks whose load failed: recompute them */
  size_t             num_load_errors;
  const void        *report;               /* for the scheduler's update_connector_output */
  size_t             report_len;
} kvt_finished;

/* Fills *out (up to out->struct_size) with everything that ended since the last call. It
 * waits only for the bound step's synchronous loads to end (once the forward waited for
 * every layer, they have landed: a failed one is then reported in its own step) and for
 * another thread's get_finished (calls take turns). The arrays and the report
 * are owned by the connector, valid until its next get_finished, from any thread, or
 * destroy. */
KVT_API kvt_status kvt_connector_get_finished(kvt_finished *out, kvt_connector *c);

/* The name of a kvt_slot_state, e.g. "KVT_SLOT_DECODING"; "KVT_SLOT_UNKNOWN" otherwise. */
KVT_API const char *kvt_slot_state_str(uint32_t state);

/* Inspection: the connector's live slots and its batches in flight (planned, or sent and not
 * yet reported), as the scheduler half sees them. Each fills up to cap entries of out and
 * sets *n to how many there are (out NULL and cap 0 ask for the count). While the scheduler
 * is paused (below), they answer from the state at the pause. */
typedef struct kvt_slot_info {
  char     req_id[KVT_REQ_ID_MAX + 1];
  uint32_t state;        /* kvt_slot_state */
  uint32_t reserved;
  uint64_t age_ns;       /* since get_num_new_matched_tokens created the slot */
  uint64_t tokens;       /* the request's tokens */
  uint64_t computed;     /* tokens computed or loaded */
  uint64_t blocks;       /* its G1 blocks */
  uint64_t batches;      /* its loads and stores not yet reported */
} kvt_slot_info;

typedef struct kvt_batch_info {
  char     req_id[KVT_REQ_ID_MAX + 1];
  uint32_t src, dst;     /* tiers: a load is G2/G3 -> G1, a store G1 -> G2/G3 */
  uint64_t batch;
  uint64_t blocks;
  uint64_t step;         /* the metadata that carried it; 0: planned for the next one */
} kvt_batch_info;

KVT_API kvt_status kvt_connector_slots(kvt_slot_info *out, size_t cap, size_t *n,
                                       kvt_connector *c);
KVT_API kvt_status kvt_connector_batches(kvt_batch_info *out, size_t cap, size_t *n,
                                         kvt_connector *c);

/* Interceptors around the scheduler half, for tracing and tests: will_call at the start of
 * each of its six calls (get_num_new_matched_tokens ... request_preempted; req_id NULL for
 * build_connector_meta and update_connector_output), finished_call at its end with its
 * status, transition after each slot transition (from 0 for a new slot). They run on the
 * calling thread under the connector's lock, so they must not call into this connector.
 * NULL members are skipped; hooks NULL removes them all. Without hooks, a call site costs
 * one branch. */
typedef struct kvt_connector_hooks {
  uint32_t struct_size;   /* set by the caller: sizeof(kvt_connector_hooks) */
  uint32_t reserved;
  void (*will_call)(void *user, uint32_t trigger, const char *req_id);
  void (*finished_call)(void *user, uint32_t trigger, const char *req_id, kvt_status status);
  void (*transition)(void *user, const char *req_id, uint32_t from, uint32_t to,
                     uint32_t trigger);
  void *user;
} kvt_connector_hooks;
KVT_API kvt_status kvt_connector_set_hooks(kvt_connector *c, const kvt_connector_hooks *hooks);

/* Breakpoints. A breakpoint pauses the thread inside a call of c's scheduler half when a slot
 * has entered `state` (0: any state), for request `req_id` (NULL: any request; with state 0,
 * at the start of every scheduler call that names it). kvt_connector_pause pauses it at the
 * next call or transition. The paused thread waits until kvt_connector_resume, or until the
 * pause timeout (the config's pause_timeout_ms, 30 s by default) ends the pause, so that a
 * breakpoint left behind never hangs the engine. With none set and no pause asked for, a
 * call site costs one branch. */
typedef struct kvt_pause_info {
  uint32_t struct_size;  /* set by the caller: sizeof(kvt_pause_info) */
  uint32_t trigger;      /* kvt_obs_trigger: the call that paused */
  uint32_t prev;         /* the transition: from prev to state; both 0 at a call's start */
  uint32_t state;
  uint64_t breakpoint;   /* the breakpoint's id; 0 for kvt_connector_pause */
  uint64_t pauses;       /* pauses so far, this one included */
  char     req_id[KVT_REQ_ID_MAX + 1];
} kvt_pause_info;

/* *id: the new breakpoint's id (1, 2, ...). KVT_ERR_INVALID_ARGUMENT for a state that is not
 * a kvt_slot_state, or neither a state nor a request; KVT_ERR_NO_SPACE (0.5.0) with
 * KVT_MAX_BREAKPOINTS set already. */
#define KVT_MAX_BREAKPOINTS 1024
KVT_API kvt_status kvt_connector_breakpoint_add(uint64_t *id, kvt_connector *c, uint32_t state,
                                                const char *req_id);
/* KVT_ERR_NOT_FOUND for an unknown id. A thread paused at it stays paused until resumed. */
KVT_API kvt_status kvt_connector_breakpoint_remove(kvt_connector *c, uint64_t id);
KVT_API kvt_status kvt_connector_pause(kvt_connector *c);
/* KVT_ERR_STATE when no thread is paused. */
KVT_API kvt_status kvt_connector_resume(kvt_connector *c);
/* 0.5.0. Waits for a paused thread and describes its pause: KVT_OK, or KVT_TIMEOUT (with a
 * message) when none paused in time. As kvt_xfer_wait: timeout_ns < 0 waits forever, 0 only
 * looks. */
KVT_API kvt_status kvt_connector_pause_wait(kvt_pause_info *out, kvt_connector *c,
                                            int64_t timeout_ns);
/* Changes the config's pause_timeout_ms: 1 ms .. 1 hour. */
KVT_API kvt_status kvt_connector_set_pause_timeout(kvt_connector *c, uint32_t timeout_ms);

/* ---------------------------------------------------------------------------------------
 * Endpoint: the management socket
 * ------------------------------------------------------------------------------------ */

/* The management endpoint: m (and c, a connector over m, or NULL) served on a Unix-domain
 * socket at path, for kvtier-console and scripts. A connector whose config names an
 * endpoint_path opens one of its own, with the defaults of kvt_endpoint_config. One JSON
 * object per line each way (docs/EVENTS.md): slots, batches, tiers, break, clear, pause,
 * resume, paused, metrics, timeline, subscribe. Malformed requests get an error reply.
 *
 * Who may connect, and what a client may cost (docs/SECURITY.md): the socket is mode 0600
 * whatever the umask, and every peer's uid is checked (SO_PEERCRED): the process's own user
 * and root, plus whom kvt_endpoint_config allows. The endpoint also holds "path.lock"
 * (flock). A file at path is replaced only when it is a socket that no live process serves
 * (one left by a killed process); anything else there fails the open (KVT_ERR_STATE while
 * a live process serves it, KVT_ERR_INVALID_ARGUMENT when it is not a socket). A client
 * beyond max_clients, or a user not allowed, gets one error line and is closed. A client's
 * replies wait for it up to client_buffer_bytes, then its further requests wait unread; a
 * client that takes none of its replies for 30 s, or sends a line over 64 KiB, is closed.
 * kvt_endpoint_close stops it and removes the socket and its lock; close it before c and m. */

typedef struct kvt_endpoint_config {  /* 0.5.0; a versioned struct */
  uint32_t struct_size;          /* set by kvt_endpoint_config_init */
  uint32_t max_clients;          /* clients served at once: 1 .. 4096 (default 64) */
  int64_t  allow_uid;            /* -1 (default): none besides the process's user and root.
                                    Else this user may connect too: the socket is then mode
                                    0666, and the uid check alone keeps others out */
  int64_t  allow_gid;            /* -1 (default): none. Else members of this group may connect
                                    too (primary or supplementary): the socket's group becomes
                                    it, mode 0660 (0666 with allow_uid) */
  uint64_t client_buffer_bytes;  /* replies held for a client that has not read them, before
                                    its next requests wait: 4 KiB .. 64 MiB (default 256 KiB) */
} kvt_endpoint_config;

/* Sets cfg->struct_size to size and every field within it to its default; call it through
 * kvt_endpoint_config_init. */
KVT_API void kvt_endpoint_config_init_sized(kvt_endpoint_config *cfg, size_t size);
#ifndef KVT_NO_INLINE
static inline void kvt_endpoint_config_init(kvt_endpoint_config *cfg) {
  kvt_endpoint_config_init_sized(cfg, sizeof *cfg);
}
#endif

KVT_API kvt_status kvt_endpoint_open(kvt_endpoint **out, kvt_manager *m, kvt_connector *c,
                                     const char *path);
/* kvt_endpoint_open with cfg (borrowed; NULL: the defaults). 0.5.0 */
KVT_API kvt_status kvt_endpoint_open_with(kvt_endpoint **out, kvt_manager *m,
                                          kvt_connector *c, const char *path,
                                          const kvt_endpoint_config *cfg);
KVT_API void kvt_endpoint_close(kvt_endpoint *e);

typedef struct kvt_endpoint_stats {  /* 0.5.0; a versioned struct */
  uint32_t struct_size;          /* set by the caller: sizeof(kvt_endpoint_stats) */
  uint32_t reserved;
  uint64_t clients;              /* connected now */
  uint64_t refused;              /* turned away: beyond max_clients, or a user not allowed */
  uint64_t dropped;              /* closed for a line over 64 KiB, or replies unread 30 s */
  uint64_t peak_buffered_bytes;  /* the most reply bytes one client has had waiting */
} kvt_endpoint_stats;
/* Fills *out up to out->struct_size (set by the caller). 0.5.0 */
KVT_API kvt_status kvt_endpoint_stats_get(kvt_endpoint_stats *out, kvt_endpoint *e);

/* ---------------------------------------------------------------------------------------
 * Metrics
 * ------------------------------------------------------------------------------------ */

/* Prometheus text exposition (format 0.0.4) of m's counters, with c's slot families when c
 * (a connector over m with a scheduler half) is given, NULL otherwise: hits and misses and
 * blocks per tier and state, transfers, bytes and a duration histogram per direction, live
 * slots per state and slot transitions, observe events emitted and dropped. Writes the text
 * and a NUL into buf when cap is enough; *len is the text's length either way (buf NULL
 * and cap 0 ask for it: KVT_OK from 0.5.0, KVT_ERR_INVALID_ARGUMENT before). A smaller cap
 * otherwise is KVT_ERR_INVALID_ARGUMENT: a text is never cut. Safe to call from
 * any thread, e.g. an HTTP server's. docs/EVENTS.md lists the families. */
KVT_API kvt_status kvt_metrics_text(char *buf, size_t cap, size_t *len, kvt_manager *m,
                                    kvt_connector *c);

/* ---------------------------------------------------------------------------------------
 * G4 (0.4.0): a remote tier on Redis (docs/G4.md)
 *
 * G4 holds blocks by sequence hash in Redis, shared by every manager configured with the
 * same g4_url, g4_key_prefix, g4_namespace and block layout. Redis owns its capacity and
 * eviction (maxmemory with an LRU or LFU policy): kvtier keeps no registry of G4, so a
 * missing key is a miss, and G4 emits no BLOCK_* events. Every value carries a header
 * (hash, parent, layout, length, checksum): a value that fails it is a miss with
 * KVT_ERR_CORRUPT, never wrong data. Commands are pipelined, one round trip per batch per
 * shard. While Redis is unreachable, G4 calls and transfers fail with KVT_ERR_IO and
 * G1-G3 keep serving; the connection is retried on the next call.
 * ------------------------------------------------------------------------------------ */

/* Offload to G4 is kvt_xfer_offload with dst KVT_TIER_G4 (from G1, G2 or G3; KVT_ERR_UNSUPPORTED
 * without G4). It writes every block (no policy but this: a hash already on its way to G4
 * is not sent twice), registers nothing and emits no BLOCK_STORED; XFER_DONE's count is the
 * blocks written, and a transfer that could not write some ends with KVT_ERR_IO. */

/* Longest prefix of seq_hashes[0..n) that G4 holds, by one pipelined EXISTS per shard.
 * Blocks the caller for up to g4_timeout_us. KVT_ERR_UNSUPPORTED without G4, KVT_ERR_IO
 * (with *out_n = 0) when Redis cannot be reached. A hit may still be evicted by Redis
 * before it is onboarded: the onboard then fails with KVT_ERR_NOT_FOUND. */
KVT_API kvt_status kvt_g4_match(size_t *out_n, kvt_manager *m, const uint64_t *seq_hashes,
                                size_t n);

/* Copies the G4 values of seq_hashes[0..n) (a chain: parent_seq_hash, then each hash the
 * parent of the next) into dst[0..n), Empty blocks of one tier (G1 or G2) that the caller
 * allocated, and registers them under those hashes, like kvt_xfer_onboard (same ownership, dedup
 * and cancellation rules, one XFER_DONE). The blocks before the first that cannot be had
 * are registered; from it on, dst stay Empty and the transfer ends with its status:
 * KVT_ERR_NOT_FOUND (no such key), KVT_ERR_CORRUPT (its value fails the header or the
 * checksum, and the key is deleted) or KVT_ERR_IO (Redis unreachable). After such a
 * failure the caller keeps its own dst (kvt_xfer_blocks needs KVT_OK): registered ones hold
 * the prefix, counted in the transfer's count, except where the tier held a hash already
 * (that dst stays Empty). dst of another tier, of mixed tiers, not Empty or listed twice:
 * KVT_ERR_INVALID_ARGUMENT or KVT_ERR_STATE, as for kvt_xfer_onboard. Arrays are borrowed. */
KVT_API kvt_status kvt_g4_onboard(kvt_xfer **out, kvt_manager *m, const uint64_t *seq_hashes,
                                  size_t n, uint64_t parent_seq_hash, const kvt_block *dst,
                                  kvt_fence *precondition, uint64_t user_data);

typedef struct kvt_g4_stats {
  uint32_t struct_size;         /* the caller's sizeof: see Versioned structs */
  uint32_t shards;              /* Redis endpoints; a cluster's masters in its slot map */
  uint64_t lookups;             /* hashes asked by kvt_g4_match */
  uint64_t hits;                /* of those, found */
  uint64_t stored_blocks;       /* values written */
  uint64_t loaded_blocks;       /* values read into blocks */
  uint64_t missing_blocks;      /* onboards that found no key */
  uint64_t corrupt_blocks;      /* values that failed their header or checksum */
  uint64_t failed_blocks;       /* blocks of transfers that failed with KVT_ERR_IO */
  uint64_t bytes_written;
  uint64_t bytes_read;
  uint64_t round_trips;         /* pipelined command batches sent */
  uint64_t reconnects;          /* connections made again after a failure */
  /* 0.5.0: a Redis Cluster (zero on plain servers). */
  uint64_t redirects;           /* commands sent again to the node a MOVED or ASK named */
  uint64_t slot_map_reads;      /* slot maps read (CLUSTER SLOTS): at the first call, then
                                   after a MOVED or a failed node */
} kvt_g4_stats;

/* Fills *out, up to out->struct_size (set by the caller). KVT_ERR_UNSUPPORTED without G4. */
KVT_API kvt_status kvt_g4_stats_get(kvt_g4_stats *out, kvt_manager *m);

/* ---------------------------------------------------------------------------------------
 * Deprecated names
 *
 * 0.5.0 renamed the calls whose names did not follow kvt_<object>_<verb>
 * (docs/CONVENTIONS.md). The old names stay exported through 0.5.x, in the symbol version
 * binaries already carry (KVTIER_0), and each does exactly what its new name does. Define
 * KVT_DEPRECATED() empty before including this header to silence the compiler's warnings.
 * ------------------------------------------------------------------------------------ */

#ifndef KVT_DEPRECATED
#if defined(__GNUC__) || defined(__clang__)
#define KVT_DEPRECATED(new_name) __attribute__((deprecated("use " #new_name)))
#else
#define KVT_DEPRECATED(new_name)
#endif
#endif

KVT_DEPRECATED(kvt_log_set_callback)
KVT_API void kvt_set_log_callback(int level, kvt_log_fn fn, void *user_data);
KVT_DEPRECATED(kvt_manager_poll)
KVT_API size_t kvt_poll(kvt_manager *m, kvt_event *out, size_t max);
KVT_DEPRECATED(kvt_manager_event_fd)
KVT_API int kvt_event_fd(kvt_manager *m);
KVT_DEPRECATED(kvt_xfer_offload)
KVT_API kvt_status kvt_offload(kvt_xfer **out, kvt_manager *m, const kvt_block *src, size_t n,
                               kvt_tier dst, kvt_fence *precondition, uint64_t user_data);
KVT_DEPRECATED(kvt_xfer_onboard)
KVT_API kvt_status kvt_onboard(kvt_xfer **out, kvt_manager *m, const kvt_block *src,
                               const kvt_block *dst_g1, size_t n, kvt_fence *precondition,
                               uint64_t user_data);
KVT_DEPRECATED(kvt_subscription_create)
KVT_API kvt_status kvt_subscribe(kvt_subscription **out, kvt_manager *m, size_t capacity);
KVT_DEPRECATED(kvt_manager_recorder_ring)
KVT_API kvt_status kvt_recorder_ring(kvt_manager *m, size_t events);
KVT_DEPRECATED(kvt_manager_recorder_dump)
KVT_API kvt_status kvt_recorder_dump(kvt_manager *m, const char *path);
KVT_DEPRECATED(kvt_manager_recorder_open)
KVT_API kvt_status kvt_recorder_open(kvt_manager *m, const char *path);
KVT_DEPRECATED(kvt_manager_recorder_close)
KVT_API kvt_status kvt_recorder_close(kvt_manager *m);
KVT_DEPRECATED(kvt_connector_breakpoint_add)
KVT_API kvt_status kvt_breakpoint_add(uint64_t *id, kvt_connector *c, uint32_t state,
                                      const char *req_id);
KVT_DEPRECATED(kvt_connector_breakpoint_remove)
KVT_API kvt_status kvt_breakpoint_remove(kvt_connector *c, uint64_t id);
KVT_DEPRECATED(kvt_tier_match_prefix)
KVT_API kvt_status kvt_match_prefix(size_t *out_n, kvt_block *out_blocks, kvt_manager *m,
                                    kvt_tier tier, const uint64_t *seq_hashes, size_t n);

/* 0.5.0 also gave these calls the argument order and codes of docs/CONVENTIONS.md. Each old
 * form keeps its own behaviour, as stated. */

/* kvt_tier_evictable_blocks, but *out_n receives how many were written (at most max). */
KVT_DEPRECATED(kvt_tier_evictable_blocks)
KVT_API kvt_status kvt_tier_evictable(size_t *out_n, kvt_block *out, size_t max,
                                      kvt_manager *m, kvt_tier tier);
/* kvt_hash_tokens, but a cap smaller than the number of full blocks fails with
 * KVT_ERR_INVALID_ARGUMENT (still setting *out_n to that number), writing nothing. */
KVT_DEPRECATED(kvt_hash_tokens)
KVT_API kvt_status kvt_hash_sequence(uint64_t *out_seq_hashes, size_t *out_n, size_t cap,
                                     uint64_t salt_hash, const uint32_t *tokens,
                                     size_t n_tokens, uint32_t page_size);
/* kvt_seq_copy_hashes, but *out_n receives how many were copied (at most cap). */
KVT_DEPRECATED(kvt_seq_copy_hashes)
KVT_API kvt_status kvt_seq_hashes(size_t *out_n, uint64_t *out_block_hashes,
                                  uint64_t *out_seq_hashes, const kvt_seq *s, size_t first,
                                  size_t cap);
/* kvt_event_log_read, but KVT_ERR_NOT_FOUND past the last record. */
KVT_DEPRECATED(kvt_event_log_read)
KVT_API kvt_status kvt_event_log_next(kvt_event_log *l, kvt_obs_event *out);
/* kvt_connector_drain_events. */
KVT_DEPRECATED(kvt_connector_drain_events)
KVT_API size_t kvt_connector_take_events(kvt_event *out, size_t max, kvt_connector *c);
/* kvt_connector_pause_wait with a timeout in milliseconds, but KVT_AGAIN when
 * none paused in time. */
KVT_DEPRECATED(kvt_connector_pause_wait)
KVT_API kvt_status kvt_connector_wait_paused(kvt_pause_info *out, kvt_connector *c,
                                             uint32_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H */