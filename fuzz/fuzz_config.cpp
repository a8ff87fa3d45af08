// fuzz_config: arbitrary config structs into kvt_manager_create and kvt_manager_destroy.
// Every field takes raw input bytes, struct_size included; the pointers are NULL, a real
// string or a layout over real memory. A config is either refused with
// KVT_ERR_INVALID_ARGUMENT / UNSUPPORTED / NO_MEMORY / IO / NO_SPACE and a message, or
// gives a manager whose invariants hold and which serves one allocation.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "input.hpp"
#include "kvtier.h"

using kvt_fuzz::Input;

static void fail(const char *what) {
  std::fprintf(stderr, "fuzz_config: %s (%s)\n", what, kvt_last_error());
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  // Either start from the defaults and overwrite some fields, or take the whole struct raw.
  if (in.flag()) {
    in.bytes(&c, sizeof c);
  } else {
    for (int k = in.byte() % 8; k > 0; --k) {
      size_t at = in.below(sizeof c);
      in.bytes(reinterpret_cast<char *>(&c) + at, std::min<size_t>(1 + in.below(8), sizeof c - at));
    }
  }
  // This header's size, 0.1.0's (the fields after it then take their defaults), or raw.
  if (in.flag()) c.struct_size = in.flag() ? sizeof c : 152;
  // Memory the library would really touch stays within what a fuzzing process may use: tiers
  // are mapped lazily, but G3 is preallocated on disk, and a huge G1/G2 is a test of the
  // machine, not of kvtier. These bounds are the harness's, the fields are still arbitrary.
  const uint64_t block = uint64_t(c.num_layers) * c.num_outer * c.chunk_bytes;
  auto cap = [&](uint64_t &blocks, uint64_t max_bytes) {
    if (block != 0 && blocks > max_bytes / block) blocks %= max_bytes / block + 1;
  };
  cap(c.g1_blocks, 64 << 20);
  cap(c.g2_blocks, 64 << 20);
  cap(c.g3_blocks, 16 << 20);
  if (c.g1_blocks > (1u << 20)) c.g1_blocks %= (1u << 20);  // slot arrays and registries
  if (c.g2_blocks > (1u << 20)) c.g2_blocks %= (1u << 20);
  if (c.g3_blocks > (1u << 20)) c.g3_blocks %= (1u << 20);
  if (c.event_capacity > (1u << 20)) c.event_capacity %= (1u << 20);
  if (c.copy_threads > 64 && in.flag()) c.copy_threads %= 64;
  if (c.max_concurrent_transfers > 16) c.max_concurrent_transfers %= 16;  // threads each

  const char *paths[] = {nullptr, "/nonexistent/kvtier-fuzz", "/tmp", ""};
  c.g3_path = paths[in.below(4)];
  // The strings of 0.4.0 are pointers too: chosen, never raw bytes. No endpoint a run could
  // reach: a publisher binds only inproc, G4 points at nothing listening, or at bad URLs.
  const char *endpoints[] = {nullptr, "inproc://kvtier-fuzz", "tcp://127.0.0.1:1", "", "bogus"};
  c.kv_events_endpoint = endpoints[in.below(5)];
  c.kv_events_replay_endpoint = in.flag() ? nullptr : endpoints[in.below(5)];
  const char *topics[] = {nullptr, "", "kv"};
  c.kv_events_topic = topics[in.below(3)];
  const char *urls[] = {nullptr, "redis://127.0.0.1:1", "unix:///nonexistent/redis.sock",
                        "redis://", "redis://a:b:c/x", "redis://127.0.0.1:1,redis://127.0.0.1:2",
                        ""};
  c.g4_url = urls[in.below(7)];
  const char *envs[] = {nullptr, "KVTIER_FUZZ_UNSET_VARIABLE", ""};
  c.g4_password_env = envs[in.below(3)];
  c.g4_key_env = envs[in.below(3)];  // unset or empty: refused, as a key that is no key
  c.g3_key_env = envs[in.below(3)];
  const char *prefixes[] = {nullptr, "kvtier", "", "has space"};
  c.g4_key_prefix = prefixes[in.below(4)];
  if (c.g4_timeout_us > 100000) c.g4_timeout_us %= 100000;  // a connect refused is quick anyway
  // A layout over real memory, shaped by the input.
  std::vector<char> mem;
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  kvt_g1_layout lay{};
  c.g1_layout = nullptr;
  if (in.flag() && c.num_layers <= 8 && c.num_outer <= 2 && c.num_outer >= 1 &&
      c.chunk_bytes <= 4096 && c.g1_blocks <= 64) {
    size_t regions = size_t(c.num_layers) * c.num_outer;
    mem.resize(regions * 64 * 8192);
    for (size_t r = 0; r < regions; ++r) {
      bases.push_back(in.flag() ? nullptr : mem.data() + r * 64 * 8192 + in.below(64));
      strides.push_back(in.flag() ? c.chunk_bytes : in.below(8192));
    }
    lay.struct_size = in.flag() ? sizeof lay : in.byte();
    lay.memory = in.below(4);
    lay.cuda_device = in.byte();
    lay.reserved = in.flag() ? 0 : 1;
    lay.bases = in.flag() ? nullptr : bases.data();
    lay.strides = strides.data();
    c.g1_layout = &lay;
  }

  kvt_manager *m = nullptr;
  kvt_status st = kvt_manager_create(&m, &c);
  if (st != KVT_OK) {
    if (m != nullptr) fail("a refused config still produced a manager");
    if (st != KVT_ERR_INVALID_ARGUMENT && st != KVT_ERR_UNSUPPORTED &&
        st != KVT_ERR_NO_MEMORY && st != KVT_ERR_IO && st != KVT_ERR_NO_SPACE)
      fail("an unexpected status for a refused config");
    if (kvt_last_error()[0] == '\0') fail("a refused config without a message");
    return 0;
  }
  if (kvt_manager_check(m) != KVT_OK) fail("a new manager breaks its invariants");
  kvt_block b = 0;
  if (kvt_block_alloc(&b, 1, m, KVT_TIER_G1) != KVT_OK) fail("a new manager cannot allocate");
  if (kvt_block_register_hash(&b, m, b, 42, 0) != KVT_OK) fail("register");
  if (kvt_block_release(m, &b, 1) != KVT_OK) fail("release");
  if (kvt_manager_check(m) != KVT_OK) fail("invariants after one block");
  kvt_manager_destroy(m);
  return 0;
}
