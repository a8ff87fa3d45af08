// fuzz_api: the input is a program of C API calls on one or two managers. Arguments come
// from the input: valid, stale, forged, zero and foreign handles; NULL and overlapping
// buffers; zero, small and absurd counts; transfers cancelled, waited for and released in any
// order; fences signalled before, during and after. After every call the managers'
// invariants must hold (kvt_manager_check); any crash, leak or sanitizer report is a bug.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "input.hpp"
#include "kvtier.h"

using kvt_fuzz::Input;

namespace {

void require(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_api: %s (%s)\n", what, kvt_last_error());
  std::abort();
}

// A status from the ABI: one of the documented values, with a message when it is an error.
void valid_status(kvt_status s) {
  require(s == KVT_OK || s == KVT_AGAIN || s == KVT_TIMEOUT ||
              (s <= KVT_ERR_INVALID_ARGUMENT && s >= KVT_ERR_CUDA) || s == KVT_ERR_INTERNAL,
          "an undocumented status");
  require(s >= 0 || kvt_last_error()[0] != '\0', "an error without a message");
  require(s != KVT_ERR_INTERNAL, "KVT_ERR_INTERNAL from a public call");
}

struct World {
  kvt_manager *m[2] = {};
  std::vector<kvt_block> blocks;   // every handle ever seen: live, stale and foreign alike
  std::vector<kvt_xfer *> xfers;   // live transfers (released ones leave the list)
  std::vector<kvt_fence *> fences; // live fences
  std::vector<kvt_xfer *> xfers1;  // the second manager's, which die with it
  std::vector<kvt_fence *> fences1;
  std::vector<kvt_seq *> seqs;
  uint64_t hashes[8];              // a small set, so that matches and dedups happen
};

kvt_tier pick_tier(Input &in) {
  uint8_t t = in.byte();
  int v = t < 240 ? 1 + t % 3 : int(int8_t(t));  // mostly valid, sometimes any value
  kvt_tier out;
  std::memcpy(&out, &v, sizeof v);
  return out;
}

kvt_block pick_block(Input &in, World &w) {
  switch (in.byte() % 8) {
    case 0: return 0;
    case 1: return in.take<uint64_t>();  // forged
    default: return w.blocks.empty() ? 0 : w.blocks[in.below(uint32_t(w.blocks.size()))];
  }
}

// Every read from the input happens in a statement of its own: C++ leaves the order of
// function arguments open (g++ and clang differ), and a corpus must mean the same program
// to the libFuzzer build and to the g++ replay driver.

// An array of n handles chosen by the input; n is small here (the count passed may not be).
std::vector<kvt_block> pick_blocks(Input &in, World &w, size_t n) {
  std::vector<kvt_block> v(n);
  for (auto &b : v) b = pick_block(in, w);
  return v;
}

uint64_t pick_hash(Input &in, World &w) {
  return in.byte() < 230 ? w.hashes[in.below(8)] : in.take<uint64_t>();
}

kvt_manager *pick_manager(Input &in, World &w) {
  uint8_t k = in.byte();
  if (k == 255) return nullptr;
  return w.m[k % 8 == 7 && w.m[1] ? 1 : 0];
}

// A count to pass with an array of `have` elements: usually right, sometimes zero, larger
// than the array behind it would be wrong, so only absurd values go past it (the library must
// refuse those before touching the array).
size_t pass_count(Input &in, size_t have) {
  switch (in.byte() % 16) {
    case 0: return 0;
    case 1: return SIZE_MAX;
    case 2: return size_t{1} << 60;
    default: return have;
  }
}

void remember(World &w, const kvt_block *b, size_t n) {
  for (size_t i = 0; i < n && w.blocks.size() < 4096; ++i)
    if (b[i] != 0) w.blocks.push_back(b[i]);
}

kvt_manager *create(Input &in) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = 1u << in.below(4);
  c.num_layers = 1 + in.below(2);
  c.num_outer = 1 + in.below(2);
  c.chunk_bytes = in.below(3) * 256;
  c.g1_blocks = 1 + in.below(12);
  c.g2_blocks = in.below(12);
  c.g3_blocks = in.flag() ? in.below(12) : 0;
  c.g1_memory = KVT_MEMORY_HOST;
  c.event_capacity = 1 + in.below(64);
  c.max_batch_size = 1 + in.below(8);
  c.min_batch_size = 1 + in.below(c.max_batch_size);
  c.flush_interval_us = in.below(2000);
  c.max_concurrent_transfers = 1 + in.below(2);
  c.copy_threads = 1 + in.below(2);
  c.g3_io = in.below(3);
  // Under valgrind (tools/test.sh), which does not see io_uring's writes into user buffers.
  if (const char *io = std::getenv("KVTIER_TEST_G3_IO");
      io != nullptr && std::strcmp(io, "threads") == 0)
    c.g3_io = KVT_IO_THREADS;
  c.policy_g1_g2 = {in.below(4), in.below(3)};
  c.policy_g1_g3 = {in.below(4), in.below(3)};
  c.policy_g2_g3 = {in.below(4), in.below(3)};
  kvt_manager *m = nullptr;
  kvt_status s = kvt_manager_create(&m, &c);
  valid_status(s);
  return s == KVT_OK ? m : nullptr;
}

void drop_xfer(World &w, size_t i) {
  kvt_xfer_release(w.xfers[i]);
  w.xfers.erase(w.xfers.begin() + long(i));
}

// KVT_FUZZ_VERBOSE=1 prints each call and its status, to read a crashing input as a program.
const bool verbose = std::getenv("KVT_FUZZ_VERBOSE") != nullptr;

void step(Input &in, World &w) {
  kvt_manager *m = pick_manager(in, w);
  kvt_status s = KVT_OK;
  const int op = in.byte() % 24;
  struct Trace {
    const int &op;
    const kvt_status &s;
    ~Trace() {
      if (verbose) std::fprintf(stderr, "op %d -> %d %s\n", op, s, s < 0 ? kvt_last_error() : "");
    }
  } trace{op, s};
  switch (op) {
    case 0: {  // alloc
      size_t n = in.count(8);
      size_t room = n <= 16 ? n : 0;
      std::vector<kvt_block> out(room);
      kvt_tier tier = pick_tier(in);
      s = kvt_block_alloc(room || n == 0 ? out.data() : nullptr, n, m, tier);
      if (s == KVT_OK) remember(w, out.data(), room);
      break;
    }
    case 1: {  // release, possibly with duplicates and bad handles
      auto v = pick_blocks(in, w, in.below(6));
      const kvt_block *p = v.empty() && in.flag() ? nullptr : v.data();
      size_t count = pass_count(in, v.size());
      s = kvt_block_release(m, p, count);
      break;
    }
    case 2:
      s = kvt_block_retain(m, pick_block(in, w));
      break;
    case 3: {  // register one block under a hash
      kvt_block out = 0;
      kvt_block *o = in.flag() ? &out : nullptr;
      kvt_block b = pick_block(in, w);
      uint64_t h = pick_hash(in, w);
      uint64_t parent = in.flag() ? 0 : pick_hash(in, w);
      s = kvt_block_register_hash(o, m, b, h, parent);
      if (s == KVT_OK) remember(w, &out, 1);
      break;
    }
    case 4: {  // register a chain; out may alias the input array, wholly or shifted
      size_t n = in.below(5);
      auto v = pick_blocks(in, w, n + 1);
      std::vector<uint64_t> h(n + 1);
      for (auto &x : h) x = pick_hash(in, w);
      kvt_block *out = in.flag() ? v.data() : (in.flag() ? v.data() + 1 : nullptr);
      std::vector<kvt_block> sep(n + 1);
      if (out == nullptr && in.flag()) out = sep.data();
      size_t count = pass_count(in, n);
      uint64_t parent = in.flag() ? 0 : pick_hash(in, w);
      s = kvt_block_register_hashes(out, m, v.data(), h.data(), count, parent);
      if (s == KVT_OK && out) remember(w, out, n);
      break;
    }
    case 5: {  // prefix match; out may overlap the hash array
      size_t n = in.below(8);
      std::vector<uint64_t> h(n + 1);
      for (auto &x : h) x = pick_hash(in, w);
      std::vector<kvt_block> out(n + 1);
      kvt_block *o = in.byte() < 40 ? reinterpret_cast<kvt_block *>(h.data()) : out.data();
      size_t got = 0;
      size_t *got_p = in.byte() == 0 ? nullptr : &got;
      kvt_tier tier = pick_tier(in);
      size_t count = pass_count(in, n);
      s = kvt_tier_match_prefix(got_p, o, m, tier, h.data(), count);
      if (s == KVT_OK) {
        require(got <= n, "match found more than asked");
        remember(w, o, got);
        if (in.flag()) valid_status(kvt_block_release(m, o, got));
      }
      break;
    }
    case 6: {
      kvt_block_info info{};
      info.struct_size = in.flag() ? sizeof info : in.byte();
      kvt_block_info *o = in.flag() ? &info : nullptr;
      kvt_block b = pick_block(in, w);
      s = kvt_block_info_get(o, m, b);
      break;
    }
    case 7: {  // data and chunk pointers: write through them what the tier gives
      void *p = nullptr;
      size_t len = 0;
      kvt_block b = pick_block(in, w);
      if (in.flag()) {
        s = kvt_block_data(in.flag() ? &p : nullptr, &len, m, b);
        if (s == KVT_OK && p) std::memset(p, in.byte(), len);
      } else {
        uint32_t layer = in.below(3);
        uint32_t outer = in.below(3);
        s = kvt_block_chunk(&p, m, b, layer, outer);
        if (s == KVT_OK && p) std::memset(p, in.byte(), 1);
      }
      break;
    }
    case 8: {  // the token path, one transition chosen by the input
      kvt_block b = pick_block(in, w);
      uint32_t tokens[20];
      in.bytes(tokens, sizeof tokens);
      switch (in.below(6)) {
        case 0: {
          uint64_t salt = pick_hash(in, w);
          uint64_t parent = pick_hash(in, w);
          s = kvt_block_init(m, b, salt, parent);
          break;
        }
        case 1: {
          const uint32_t *t = in.flag() ? tokens : nullptr;
          size_t n = in.count(20);
          s = kvt_block_append(m, b, t, n <= 20 || n > (size_t{1} << 46) ? n : 20);
          break;
        }
        case 2: s = kvt_block_schedule(m, b); break;
        case 3: s = kvt_block_unschedule(m, b); break;
        case 4: s = kvt_block_compute_done(m, b); break;
        default: {
          kvt_block out = 0;
          s = kvt_block_register(&out, m, b);
          if (s == KVT_OK) remember(w, &out, 1);
        }
      }
      break;
    }
    case 9: {  // offload
      auto v = pick_blocks(in, w, in.below(6));
      kvt_fence *f = !w.fences.empty() && in.flag() ? w.fences[in.below(uint32_t(w.fences.size()))] : nullptr;
      kvt_xfer *x = nullptr;
      kvt_xfer **out = in.byte() == 0 ? nullptr : &x;
      size_t count = pass_count(in, v.size());
      kvt_tier dst = pick_tier(in);
      uint64_t user_data = in.take<uint64_t>();
      s = kvt_xfer_offload(out, m, v.data(), count, dst, f, user_data);
      if (s == KVT_OK) (m == w.m[0] ? w.xfers : w.xfers1).push_back(x);
      break;
    }
    case 10: {  // onboard
      size_t n = in.below(5);
      auto src = pick_blocks(in, w, n);
      auto dst = pick_blocks(in, w, n);
      if (in.flag() && n > 1) dst[0] = dst[1];  // the same destination twice
      kvt_fence *f = !w.fences.empty() && in.flag() ? w.fences[in.below(uint32_t(w.fences.size()))] : nullptr;
      kvt_xfer *x = nullptr;
      const kvt_block *d = in.flag() ? dst.data() : src.data();
      size_t count = pass_count(in, n);
      uint64_t user_data = in.take<uint64_t>();
      s = kvt_xfer_onboard(&x, m, src.data(), d, count, f, user_data);
      if (s == KVT_OK) (m == w.m[0] ? w.xfers : w.xfers1).push_back(x);
      break;
    }
    case 11: {  // a transfer: cancel, wait, status, blocks or release, in any order
      if (w.xfers.empty()) {
        s = kvt_xfer_cancel(nullptr);
        break;
      }
      size_t i = in.below(uint32_t(w.xfers.size()));
      kvt_xfer *x = w.xfers[i];
      switch (in.below(5)) {
        case 0: s = kvt_xfer_cancel(x); break;
        case 1: s = kvt_xfer_wait(x, in.flag() ? 0 : int64_t(in.below(2000)) * 1000); break;
        case 2: {
          uint32_t state = 0;
          kvt_status r = 0;
          uint64_t count = 0;
          uint32_t *sp = in.flag() ? &state : nullptr;
          uint64_t *cp = in.flag() ? &count : nullptr;
          s = kvt_xfer_status(sp, &r, cp, x);
          break;
        }
        case 3: {
          kvt_block out[8] = {};
          s = kvt_xfer_blocks(out, in.below(9), x);
          if (s == KVT_OK) remember(w, out, 1);
          break;
        }
        default: drop_xfer(w, i);
      }
      break;
    }
    case 12: {  // fences: create, signal, destroy
      if (w.fences.empty() || in.below(3) == 0) {
        kvt_fence *f = nullptr;
        s = kvt_fence_create(in.byte() == 0 ? nullptr : &f, m);
        if (s == KVT_OK) (m == w.m[0] ? w.fences : w.fences1).push_back(f);
      } else {
        size_t i = in.below(uint32_t(w.fences.size()));
        if (in.flag()) {
          s = kvt_fence_signal(w.fences[i]);
        } else {
          kvt_fence_destroy(w.fences[i]);
          w.fences.erase(w.fences.begin() + long(i));
        }
      }
      break;
    }
    case 13: {  // poll into a buffer, NULL or short
      kvt_event ev[16];
      size_t max = in.below(17);
      size_t n = kvt_manager_poll(m, in.byte() == 0 ? nullptr : ev, max);
      require(n <= max, "kvt_manager_poll returned more than max");
      return;  // returns a count, not a status
    }
    case 14: {
      kvt_tier_stats t{};
      t.struct_size = in.flag() ? sizeof t : in.byte();
      kvt_tier_stats *o = in.byte() == 0 ? nullptr : &t;
      kvt_tier tier = pick_tier(in);
      s = kvt_tier_stats_get(o, m, tier);
      if (s == KVT_OK) require(t.free + t.active + t.inactive == t.capacity, "stats add up");
      break;
    }
    case 15: {
      kvt_transfer_stats t{};
      t.struct_size = in.flag() ? sizeof t : in.byte();
      kvt_tier src = pick_tier(in);
      kvt_tier dst = pick_tier(in);
      s = kvt_transfer_stats_get(&t, m, src, dst);
      break;
    }
    case 16: {
      kvt_block out[8] = {};
      size_t n = 0;
      size_t *np = in.byte() == 0 ? nullptr : &n;
      size_t max = in.below(9);
      kvt_tier tier = pick_tier(in);
      s = kvt_tier_evictable_blocks(out, max, np, m, tier);
      break;
    }
    case 17: {  // stateless hashing with short and NULL arrays
      uint32_t tokens[32];
      in.bytes(tokens, sizeof tokens);
      uint64_t out[8];
      size_t n = 0;
      uint64_t *o = in.flag() ? out : nullptr;
      size_t cap = in.below(9);
      uint64_t salt = in.take<uint64_t>();
      const uint32_t *t = in.flag() ? tokens : nullptr;
      size_t n_tokens = in.below(33);
      uint32_t page = in.take<uint32_t>() % 9;
      s = kvt_hash_tokens(o, cap, &n, salt, t, n_tokens, page);
      break;
    }
    case 18: {  // incremental sequences
      if (w.seqs.empty() || in.flag()) {
        kvt_seq *q = nullptr;
        uint64_t salt = in.take<uint64_t>();
        uint32_t page = in.take<uint32_t>() % 9;
        s = kvt_seq_create(&q, salt, page);
        if (s == KVT_OK) w.seqs.push_back(q);
        break;
      }
      size_t i = in.below(uint32_t(w.seqs.size()));
      uint32_t tokens[16];
      in.bytes(tokens, sizeof tokens);
      uint64_t a[4], b[4];
      size_t n = 0, t = 0;
      switch (in.below(4)) {
        case 0: {
          size_t n_tok = in.below(17);
          s = kvt_seq_append(w.seqs[i], tokens, pass_count(in, n_tok));
          break;
        }
        case 1: s = kvt_seq_info(&t, &n, w.seqs[i]); break;
        case 2: {
          uint64_t *bp = in.flag() ? b : nullptr;
          size_t first = in.count(4);
          size_t cap = in.below(5);
          s = kvt_seq_copy_hashes(a, bp, cap, &n, w.seqs[i], first);
          break;
        }
        default:
          kvt_seq_destroy(w.seqs[i]);
          w.seqs.erase(w.seqs.begin() + long(i));
      }
      break;
    }
    case 19:
      require(m == nullptr || kvt_manager_event_fd(m) >= 0, "kvt_manager_event_fd");
      return;
    case 20:
      require(kvt_status_str(in.take<int32_t>()) != nullptr, "kvt_status_str");
      return;
    case 21: {  // a manager's hashes from the other manager's blocks: foreign handles
      if (w.m[1] == nullptr) {
        w.m[1] = create(in);
        return;
      }
      kvt_block b = 0;
      s = kvt_block_alloc(&b, 1, w.m[1], KVT_TIER_G1);
      if (s == KVT_OK) remember(w, &b, 1);
      break;
    }
    case 22:  // destroy the second manager with its transfers and fences pending; its
              // handles stay in the pool as handles of a manager that is gone
      if (w.m[1] != nullptr && in.byte() < 64) {
        kvt_manager_destroy(w.m[1]);
        w.m[1] = nullptr;
        w.xfers1.clear();
        w.fences1.clear();
      }
      return;
    default: {
      kvt_status c = kvt_manager_check(m);
      require(m == nullptr ? c == KVT_ERR_INVALID_ARGUMENT : c == KVT_OK, "kvt_manager_check");
      return;
    }
  }
  valid_status(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  World w;
  for (auto &h : w.hashes) h = 1 + in.below(1000);
  w.m[0] = create(in);
  if (w.m[0] == nullptr) return 0;
  for (int steps = 0; steps < 400 && !in.empty(); ++steps) {
    step(in, w);
    for (kvt_manager *m : w.m)
      if (m != nullptr) require(kvt_manager_check(m) == KVT_OK, "invariants after a step");
  }
  // Leave in any order: some transfers and fences released, the rest to the destroys.
  for (size_t i = w.xfers.size(); i-- > 0;)
    if (in.flag()) drop_xfer(w, i);
  for (kvt_fence *f : w.fences)
    if (in.flag()) kvt_fence_destroy(f);
  for (kvt_seq *q : w.seqs) kvt_seq_destroy(q);
  kvt_manager_destroy(w.m[1]);
  kvt_manager_destroy(w.m[0]);
  return 0;
}
