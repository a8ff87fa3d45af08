#include "replayer.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kvtier.h"
#include "g1_bytes.hpp"
#include "metrics_server.hpp"
#include "registry_dump.hpp"

namespace kvt::replay {

namespace {

using Clock = std::chrono::steady_clock;

int direction(kvt_tier src, kvt_tier dst) {
  if (src == KVT_TIER_G1) return dst == KVT_TIER_G2 ? G1G2 : G1G3;
  if (dst == KVT_TIER_G1) return src == KVT_TIER_G2 ? G2G1 : G3G1;
  return G2G3;
}

// One worker's buffers, reused across its requests.
struct Scratch {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> hashes;
  std::vector<kvt_block> table, src2, src3, onboarded;
  std::vector<char> computed;  // per position: this request filled and registered it
};

class Replayer {
 public:
  Replayer(const Options &o, const Trace &t) : o_(o), t_(t) {}
  ~Replayer() {
    metrics_.stop();
    kvt_endpoint_close(endpoint_);
    kvt_manager_destroy(m_);
  }

  bool run(Result *out, std::string *error);

 private:
  struct Pending {  // an offload the poller finishes
    kvt_xfer *x;
    size_t interval;
    size_t blocks;
  };

  bool create(std::string *error);
  bool prefault(std::string *error);
  void worker();
  bool serve(size_t i, Scratch &s);
  bool alloc_g1(kvt_block *out, size_t n);
  bool write_back(kvt_tier tier, size_t n);
  bool onboard(kvt_xfer **x, const kvt_block *src, kvt_block *dst, size_t n);
  bool offload_async(const kvt_block *src, size_t n, kvt_tier dst, size_t interval);
  void poller();
  bool lib_failed(const char *what, kvt_status st);
  bool failed(const std::string &why);
  size_t interval_of(const Request &r) const {
    return size_t(double(r.timestamp_ms) / (o_.interval_s * 1000.0));
  }
  double now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  const Options &o_;
  const Trace &t_;
  kvt_manager *m_ = nullptr;
  MetricsServer metrics_;
  kvt_endpoint *endpoint_ = nullptr;
  uint64_t salt_ = 0;
  uint64_t block_bytes_ = 0;
  Clock::time_point start_;

  std::atomic<size_t> done_{0};
  std::atomic<bool> abort_{false};

  // Admission: requests start in trace order, and only while G1 can hold every block of the
  // requests in flight.
  std::mutex admit_mu_;
  std::condition_variable admit_cv_;
  size_t next_ = 0, turn_ = 0;  // next request to claim; next request allowed to start
  size_t admitted_blocks_ = 0;

  std::mutex mu_;  // the result, the pending offloads, the first error
  std::condition_variable pending_cv_;
  // Keyed by user_data, not by pointer: an event polled before its transfer was released
  // may name an address that a newer transfer has since taken.
  std::unordered_map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 1;  // user_data of asynchronous offloads; 0 marks everything else
  size_t pending_blocks_ = 0;
  bool stop_poller_ = false;
  Result r_;
  std::string error_;
};

bool Replayer::lib_failed(const char *what, kvt_status st) {
  return failed(std::string(what) + " failed: " + kvt_status_str(st) + ": " + kvt_last_error());
}

bool Replayer::failed(const std::string &why) {
  std::lock_guard lock(mu_);
  if (error_.empty()) error_ = why;
  abort_ = true;
  return false;
}

bool Replayer::create(std::string *error) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = o_.page_size;
  c.num_layers = o_.layers;
  c.num_outer = o_.outer;
  c.chunk_bytes = o_.chunk_bytes;
  c.g1_blocks = o_.g1_blocks;
  c.g2_blocks = o_.g2_blocks;
  c.g3_blocks = o_.g3_blocks;
  c.g3_path = o_.g3_path.empty() ? nullptr : o_.g3_path.c_str();
  c.g3_persist = o_.g3_keep;
  set_kv_events(&c, o_);
  c.g4_url = o_.g4_url.empty() ? nullptr : o_.g4_url.c_str();
  c.g4_key_env = o_.g4_key_env.empty() ? nullptr : o_.g4_key_env.c_str();
  // Host memory is the embedded stand-in for GPU memory.
  c.g1_memory = o_.g1_cuda ? KVT_MEMORY_CUDA : KVT_MEMORY_HOST;
  if (o_.cuda_copy >= 0) c.cuda_copy = uint32_t(o_.cuda_copy);
  // One batch at a time, 256 blocks each: on a small machine the copies would otherwise
  // compete with each other and with the requests for cores, for no gain in wall time.
  c.max_concurrent_transfers = 1;
  c.max_batch_size = 256;
  c.copy_threads = 2;
  for (int t = 0; t < 3; ++t)
    if (o_.eviction[t] >= 0) c.eviction[t] = uint32_t(o_.eviction[t]);
  if (o_.min_frequency > 0) {
    kvt_policy p{KVT_POLICY_PRESENCE | KVT_POLICY_FREQUENCY, o_.min_frequency};
    c.policy_g1_g2 = c.policy_g1_g3 = c.policy_g2_g3 = p;
  }
  if (kvt_status st = kvt_manager_create(&m_, &c); st != KVT_OK) {
    *error = std::string("cannot create the manager: ") + kvt_last_error();
    return false;
  }
  if (!start_recording(m_, o_, error)) return false;
  if (o_.metrics_port && !metrics_.start(o_.metrics_port, m_, nullptr, error)) return false;
  if (!o_.console_socket.empty() &&
      kvt_endpoint_open(&endpoint_, m_, nullptr, o_.console_socket.c_str()) != KVT_OK) {
    *error = std::string("--console-socket: ") + kvt_last_error();
    return false;
  }
  kvt_hash_salt(&salt_, "kvtier-replay", 13);
  block_bytes_ = o_.block_bytes();
  if (o_.g3_keep) {
    kvt_tier_stats st{};
    st.struct_size = sizeof st;
    kvt_tier_stats_get(&st, m_, KVT_TIER_G3);
    r_.g3_recovered = st.recovered;
  }
  return !o_.prefault || prefault(error);
}

// Touches every page of G1 and G2 once, so that copies into them measure the copy engine,
// not the kernel's first-touch page faults: on a GPU host the manager pins G2 at start,
// which faults it in there too. Without this, the first pass through G2 faults 160,000
// pages in the default run and G1 -> G2 loses about a third of its bandwidth.
bool Replayer::prefault(std::string *error) {
  const double t0 = now();
  for (auto [tier, n] : {std::pair{KVT_TIER_G1, o_.g1_blocks}, std::pair{KVT_TIER_G2, o_.g2_blocks}}) {
    if (n == 0 || block_bytes_ == 0 || (tier == KVT_TIER_G1 && o_.g1_cuda)) continue;
    std::vector<kvt_block> b(n);
    if (kvt_block_alloc(b.data(), n, m_, tier) != KVT_OK) {
      *error = std::string("prefault: kvt_block_alloc: ") + kvt_last_error();
      return false;
    }
    for (kvt_block x : b) {
      void *p = nullptr;
      size_t len = 0;
      if (kvt_block_data(&p, &len, m_, x) != KVT_OK) continue;
      for (size_t at = 0; at < len; at += 4096) static_cast<volatile char *>(p)[at] = 0;
    }
    kvt_block_release(m_, b.data(), n);
  }
  r_.prefault_seconds = now() - t0;
  return true;
}

// Offloads inactive blocks that the next allocation of n blocks in `tier` would evict into
// the next tier below, and waits: "lazy" (write-back) offload. Cascades: room in G2 is made
// by writing its own victims to G3 first.
bool Replayer::write_back(kvt_tier tier, size_t n) {
  kvt_tier dst = tier == KVT_TIER_G1 && o_.g2_blocks ? KVT_TIER_G2 : KVT_TIER_G3;
  if (dst == KVT_TIER_G3 && o_.g3_blocks == 0) return true;
  // Another request may evict a victim between the query and the offload, which then refuses
  // the stale handle: query again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    kvt_tier_stats ts{};
    ts.struct_size = sizeof ts;
    if (kvt_status st = kvt_tier_stats_get(&ts, m_, tier); st != KVT_OK)
      return lib_failed("kvt_tier_stats_get", st);
    if (ts.free >= n) return true;
    std::vector<kvt_block> victims(n - ts.free);
    size_t k = 0;
    if (kvt_status st = kvt_tier_evictable_blocks(victims.data(), victims.size(), &k, m_, tier);
        st != KVT_OK)
      return lib_failed("kvt_tier_evictable_blocks", st);
    k = std::min(k, victims.size());  // k counts every evictable block; victims holds the first
    if (k == 0) return true;
    if (dst == KVT_TIER_G2 && !write_back(KVT_TIER_G2, k)) return false;
    kvt_xfer *x = nullptr, *x4 = nullptr;
    kvt_status st = kvt_xfer_offload(&x, m_, victims.data(), k, dst, nullptr, 0);
    if (st == KVT_ERR_INVALID_HANDLE && o_.concurrency > 1) continue;
    if (st != KVT_OK) return lib_failed("kvt_xfer_offload (write-back)", st);
    // What leaves G1 goes to G4 too (a G2 victim went there when it left G1).
    if (!o_.g4_url.empty() && tier == KVT_TIER_G1 &&
        (st = kvt_xfer_offload(&x4, m_, victims.data(), k, KVT_TIER_G4, nullptr, 0)) != KVT_OK &&
        st != KVT_ERR_INVALID_HANDLE) {
      kvt_xfer_release(x);
      return lib_failed("kvt_xfer_offload to G4 (write-back)", st);
    }
    for (kvt_xfer *w : {x, x4}) {
      if (w == nullptr) continue;
      kvt_xfer_wait(w, -1);
      kvt_xfer_release(w);  // the manager's counters record what it moved
    }
    return true;
  }
  return true;  // the victims keep being taken by other requests: nothing left to save
}

// Allocates n G1 blocks. Room for them was reserved at admission, but blocks being copied
// out stay pinned until their copy ends, so an allocation may have to wait for that.
bool Replayer::alloc_g1(kvt_block *out, size_t n) {
  if (n == 0) return true;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (bool waited = false;; waited = true) {
    if (o_.offload == Offload::Lazy && !write_back(KVT_TIER_G1, n)) return false;
    kvt_status st = kvt_block_alloc(out, n, m_, KVT_TIER_G1);
    if (st == KVT_OK) {
      if (waited) {
        std::lock_guard lock(mu_);
        ++r_.alloc_waits;
      }
      return true;
    }
    if (st != KVT_ERR_NO_SPACE || Clock::now() > deadline)
      return lib_failed("kvt_block_alloc in G1", st);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool Replayer::onboard(kvt_xfer **x, const kvt_block *src, kvt_block *dst, size_t n) {
  *x = nullptr;
  if (n == 0) return true;
  if (kvt_status st = kvt_xfer_onboard(x, m_, src, dst, n, nullptr, 0); st != KVT_OK)
    return lib_failed("kvt_xfer_onboard", st);
  return true;
}

bool Replayer::offload_async(const kvt_block *src, size_t n, kvt_tier dst, size_t interval) {
  if (n == 0) return true;
  std::unique_lock lock(mu_);
  // Back-pressure: a serving engine cannot let offloads pile up without bound either.
  const size_t limit = std::max<uint64_t>(o_.g1_blocks / 2, 1);
  pending_cv_.wait(lock, [&] { return pending_blocks_ + n <= limit || pending_.empty(); });
  kvt_xfer *x = nullptr;
  const uint64_t id = next_id_++;
  if (kvt_status st = kvt_xfer_offload(&x, m_, src, n, dst, nullptr, id); st != KVT_OK) {
    lock.unlock();
    return lib_failed("kvt_xfer_offload", st);
  }
  pending_.emplace(id, Pending{x, interval, n});
  pending_blocks_ += n;
  return true;
}

// Finishes the asynchronous offloads: accounts what each moved and releases it.
void Replayer::poller() {
  std::vector<kvt_event> ev(256);
  pollfd pfd{kvt_manager_event_fd(m_), POLLIN, 0};
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_poller_ && pending_.empty()) return;
    }
    ::poll(&pfd, 1, 20);
    size_t n = kvt_manager_poll(m_, ev.data(), ev.size());
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].type != KVT_EVENT_XFER_DONE) continue;
      auto it = pending_.find(ev[i].user_data);
      if (it == pending_.end()) continue;  // an onboard or write-back: its worker handles it
      r_.timeline[it->second.interval].offload_bytes += ev[i].count * block_bytes_;
      pending_blocks_ -= it->second.blocks;
      kvt_xfer_release(it->second.x);
      pending_.erase(it);
      pending_cv_.notify_all();
    }
  }
}

bool Replayer::serve(size_t i, Scratch &s) {
  const Request &rq = t_.requests[i];
  const double begin = now();

  // The request's tokens, then kvtier's own chained hashes of its full blocks.
  s.tokens.resize(rq.n_ids * kTokensPerId);
  prompt_tokens(t_, rq, s.tokens.size(), s.tokens.data());
  size_t n = s.tokens.size() / o_.page_size;
  s.hashes.resize(n);
  if (kvt_status st = kvt_hash_tokens(s.hashes.data(), n, &n, salt_, s.tokens.data(),
                                      s.tokens.size(), o_.page_size);
      st != KVT_OK)
    return lib_failed("kvt_hash_tokens", st);
  // The blocks are registered by hash: their BlockStored events take these tokens.
  if (!o_.kv_events.empty())
    if (kvt_status st = kvt_manager_note_tokens(m_, s.hashes.data(), n, s.tokens.data());
        st != KVT_OK)
      return lib_failed("kvt_manager_note_tokens", st);
  s.table.assign(n, 0);
  s.src2.resize(n);
  s.src3.resize(n);
  s.computed.assign(n, 0);
  const uint64_t *h = s.hashes.data();

  // The longest prefix in G1, continued in G2, then in G3. Every match pins its blocks.
  size_t h1 = 0, h2 = 0, h3 = 0;
  if (kvt_status st = kvt_tier_match_prefix(&h1, s.table.data(), m_, KVT_TIER_G1, h, n);
      st != KVT_OK)
    return lib_failed("kvt_tier_match_prefix in G1", st);
  if (o_.g2_blocks)
    if (kvt_status st = kvt_tier_match_prefix(&h2, s.src2.data(), m_, KVT_TIER_G2, h + h1, n - h1);
        st != KVT_OK)
      return lib_failed("kvt_tier_match_prefix in G2", st);
  if (o_.g3_blocks)
    if (kvt_status st = kvt_tier_match_prefix(&h3, s.src3.data(), m_, KVT_TIER_G3, h + h1 + h2,
                                              n - h1 - h2);
        st != KVT_OK)
      return lib_failed("kvt_tier_match_prefix in G3", st);

  // Then in G4, which Redis may evict from at any time: a lookup that fails is a miss.
  size_t h4 = 0;
  const size_t before4 = h1 + h2 + h3;
  if (!o_.g4_url.empty() && kvt_g4_match(&h4, m_, h + before4, n - before4) != KVT_OK) h4 = 0;

  // G1 blocks for everything not in G1; onboard the G2, G3 and G4 parts into the first.
  if (!alloc_g1(s.table.data() + h1, n - h1)) return false;
  kvt_xfer *x2 = nullptr, *x3 = nullptr, *x4 = nullptr;
  if (!onboard(&x2, s.src2.data(), s.table.data() + h1, h2) ||
      !onboard(&x3, s.src3.data(), s.table.data() + h1 + h2, h3))
    return false;
  if (h4 > 0)
    if (kvt_status st = kvt_g4_onboard(&x4, m_, h + before4, h4, before4 ? h[before4 - 1] : 0,
                                       s.table.data() + before4, nullptr, 0);
        st != KVT_OK)
      return lib_failed("kvt_g4_onboard", st);
  uint64_t onboard_bytes = 0, verified = 0, mismatched = 0, got4 = 0;
  for (auto [x, first, count] : {std::tuple{x2, h1, h2}, std::tuple{x3, h1 + h2, h3},
                                 std::tuple{x4, before4, h4}}) {
    if (x == nullptr) continue;
    kvt_status st = kvt_xfer_wait(x, -1);
    s.onboarded.assign(count, 0);
    if (st == KVT_OK) {
      st = kvt_xfer_blocks(s.onboarded.data(), count, x);
    } else if (x == x4) {  // the prefix before the first value missing is registered
      for (size_t k = 0; k < count; ++k) {
        kvt_block_info bi{};
        bi.struct_size = sizeof bi;
        if (kvt_block_info_get(&bi, m_, s.table[first + k]) == KVT_OK &&
            bi.state == KVT_BLOCK_REGISTERED)
          s.onboarded[k] = s.table[first + k];
      }
    }
    kvt_xfer_release(x);
    for (size_t k = 0; k < count; ++k) {
      kvt_block b = st == KVT_OK || x == x4 ? s.onboarded[k] : 0;
      if (b == 0) {  // not onboarded: the block stays the caller's, Empty: compute it
        s.computed[first + k] = 1;
        continue;
      }
      if (x == x4) ++got4;
      s.table[first + k] = b;
      onboard_bytes += block_bytes_;
      void *p = nullptr;
      size_t len = 0;
      if (kvt_status ds = g1_block_ptr(&p, &len, m_, b, o_.g1_cuda); ds != KVT_OK)
        return lib_failed("kvt_block_data", ds);
      std::string cuda_error;
      ++(g1_holds(o_.g1_cuda, p, len, h[first + k], &cuda_error) ? verified : mismatched);
      if (!cuda_error.empty()) return failed(cuda_error);
    }
  }
  // The onboards are over: unpin their sources.
  for (auto [src, count] : {std::pair{&s.src2, h2}, std::pair{&s.src3, h3}})
    if (kvt_status st = kvt_block_release(m_, src->data(), count); st != KVT_OK)
      return lib_failed("kvt_block_release of onboard sources", st);

  // "Compute" the rest: fill each block from its hash, and register runs as chains.
  for (size_t k = before4 + h4; k < n; ++k) s.computed[k] = 1;
  for (size_t k = h1; k < n;) {
    if (!s.computed[k]) {
      ++k;
      continue;
    }
    size_t end = k;
    for (; end < n && s.computed[end]; ++end) {
      void *p = nullptr;
      size_t len = 0;
      if (kvt_status st = g1_block_ptr(&p, &len, m_, s.table[end], o_.g1_cuda); st != KVT_OK)
        return lib_failed("kvt_block_data", st);
      if (std::string cuda_error; !g1_fill(o_.g1_cuda, p, len, h[end], &cuda_error))
        return failed(cuda_error);
    }
    if (kvt_status st = kvt_block_register_hashes(s.table.data() + k, m_, s.table.data() + k,
                                                  h + k, end - k, k ? h[k - 1] : 0);
        st != KVT_OK)
      return lib_failed("kvt_block_register_hashes", st);
    if (o_.offload == Offload::Eager) {
      for (kvt_tier dst : {KVT_TIER_G2, KVT_TIER_G3, KVT_TIER_G4}) {
        if (dst == KVT_TIER_G4 ? o_.g4_url.empty()
                               : (dst == KVT_TIER_G2 ? o_.g2_blocks : o_.g3_blocks) == 0)
          continue;
        if (!offload_async(s.table.data() + k, end - k, dst, interval_of(rq))) return false;
      }
    }
    k = end;
  }

  // The request is done: release its blocks in sequence order, in one call.
  if (kvt_status st = kvt_block_release(m_, s.table.data(), n); st != KVT_OK)
    return lib_failed("kvt_block_release", st);

  const double end = now();
  std::lock_guard lock(mu_);
  Interval &iv = r_.timeline[interval_of(rq)];
  iv.add_request(n, h1, h2, h3, got4);
  iv.onboard_bytes += onboard_bytes;
  if (iv.requests == 1 || begin < iv.wall_begin) iv.wall_begin = begin;
  iv.wall_end = std::max(iv.wall_end, end);
  r_.add_request(n, h1, h2, h3, got4);
  r_.verified += verified;
  r_.mismatched += mismatched;
  return true;
}

void Replayer::worker() {
  Scratch s;
  for (;;) {
    size_t i, need;
    {
      // Requests start in trace order: each waits for its turn, then for room in G1.
      std::unique_lock lock(admit_mu_);
      i = next_++;
      if (i >= t_.requests.size()) return;
      need = t_.requests[i].n_ids * kTokensPerId / o_.page_size;
      admit_cv_.wait(lock, [&] {
        return abort_ || (turn_ == i && admitted_blocks_ + need <= o_.g1_blocks);
      });
      if (abort_) return;
      admitted_blocks_ += need;
      turn_ = i + 1;
    }
    admit_cv_.notify_all();
    bool ok = serve(i, s);
    {
      std::lock_guard lock(admit_mu_);
      admitted_blocks_ -= need;
    }
    admit_cv_.notify_all();
    if (!ok) {
      {
        std::lock_guard lock(admit_mu_);
        abort_ = true;
      }
      admit_cv_.notify_all();
      return;
    }
    ++done_;
  }
}

bool Replayer::run(Result *out, std::string *error) {
  if (!create(error)) return false;
  uint64_t last_ts = 0;
  for (const Request &rq : t_.requests) last_ts = std::max(last_ts, rq.timestamp_ms);
  r_.timeline.resize(size_t(double(last_ts) / (o_.interval_s * 1000.0)) + 1);

  start_ = Clock::now();
  std::thread poll_thread(&Replayer::poller, this);
  std::vector<std::thread> workers;
  for (uint32_t k = 0; k < o_.concurrency; ++k) workers.emplace_back(&Replayer::worker, this);

  const bool bar = o_.progress && isatty(STDERR_FILENO);
  while (bar && done_ < t_.requests.size() && !abort_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    size_t d = done_;
    int filled = int(40.0 * double(d) / double(t_.requests.size()));
    std::fprintf(stderr, "\r[%-40.*s] %zu/%zu requests", filled,
                 "########################################", d, t_.requests.size());
  }
  for (auto &w : workers) w.join();
  {
    std::lock_guard lock(mu_);
    stop_poller_ = true;  // the poller leaves once every pending offload has finished
  }
  poll_thread.join();
  r_.seconds = now();
  if (bar) std::fprintf(stderr, "\r%60s\r", "");

  if (!error_.empty()) {
    *error = error_;
    return false;
  }
  if (!read_transfer_stats(m_, r_.dir, error)) return false;
  if (!o_.g4_url.empty()) {
    kvt_g4_stats gs{};
    gs.struct_size = sizeof gs;
    if (kvt_status st = kvt_g4_stats_get(&gs, m_); st != KVT_OK) {
      *error = std::string("kvt_g4_stats_get: ") + kvt_last_error();
      return false;
    }
    r_.g4_stored = gs.stored_blocks;
    r_.g4_failed = gs.failed_blocks;
  }
  if (kvt_status st = kvt_manager_check(m_); st != KVT_OK) {
    *error = std::string("kvt_manager_check after the replay: ") + kvt_last_error();
    return false;
  }
  if (!o_.dump_registry.empty() &&
      !dump_registry(m_, o_, o_.dump_registry, error))
    return false;
  std::this_thread::sleep_for(std::chrono::duration<double>(o_.kv_events_hold_s));
  *out = std::move(r_);
  return true;
}

}  // namespace

bool start_recording(kvt_manager *m, const Options &o, std::string *error) {
  if (o.record.empty() || kvt_manager_recorder_open(m, o.record.c_str()) == KVT_OK) return true;
  *error = std::string("--record: ") + kvt_last_error();
  return false;
}

bool read_transfer_stats(kvt_manager *m, DirectionTotals *dir, std::string *error) {
  for (int d = 0; d < kDirections; ++d) {
    static constexpr kvt_tier src[] = {KVT_TIER_G1, KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G2,
                                       KVT_TIER_G3};
    static constexpr kvt_tier dst[] = {KVT_TIER_G2, KVT_TIER_G3, KVT_TIER_G3, KVT_TIER_G1,
                                       KVT_TIER_G1};
    kvt_transfer_stats ts{};
    ts.struct_size = sizeof ts;
    if (kvt_status st = kvt_transfer_stats_get(&ts, m, src[d], dst[d]); st != KVT_OK) {
      *error = std::string("kvt_transfer_stats_get: ") + kvt_last_error();
      return false;
    }
    dir[direction(src[d], dst[d])] = {ts.completed, ts.cancelled, ts.failed,
                                      ts.blocks,    ts.bytes,     ts.busy_ns};
  }
  return true;
}

bool run_replay(const Options &o, const Trace &t, Result *out, std::string *error) {
  Replayer r(o, t);
  return r.run(out, error);
}

}  // namespace kvt::replay
