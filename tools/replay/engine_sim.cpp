#include "engine_sim.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier.h"
#include "g1_bytes.hpp"
#include "metrics_server.hpp"

namespace kvt::replay {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kNil = UINT32_MAX;

// The engine's G1 blocks, kept as vLLM's block pool keeps them: a free queue in eviction
// order (least recently freed first) and a prefix cache by sequence hash. A freed block
// keeps its hash, and can be hit again, until it is handed out for writing.
class BlockPool {
 public:
  explicit BlockPool(uint32_t n) : ref_(n, 0), hash_(n, 0), cached_(n, 0), prev_(n), next_(n) {
    for (uint32_t b = 0; b < n; ++b) push_back(b);
  }
  size_t free() const { return free_; }
  uint32_t refs(uint32_t b) const { return ref_[b]; }
  // The block holding the full block of this hash, or kNil.
  uint32_t lookup(uint64_t hash) const {
    auto it = map_.find(hash);
    return it == map_.end() ? kNil : it->second;
  }
  // A prefix hit: one more reference, out of the free queue if it was there.
  void take(uint32_t b) {
    if (ref_[b]++ == 0) unlink(b);
  }
  // The free block next in line (the caller checked free() > 0); its hash is forgotten.
  uint32_t alloc() {
    uint32_t b = head_;
    unlink(b);
    ref_[b] = 1;
    if (cached_[b]) map_.erase(hash_[b]);
    cached_[b] = 0;
    return b;
  }
  void release(uint32_t b) {
    if (--ref_[b] == 0) push_back(b);
  }
  // Block b now holds the full block of this hash; the first block with a hash keeps it.
  void cache(uint32_t b, uint64_t hash) {
    if (cached_[b] || !map_.emplace(hash, b).second) return;
    hash_[b] = hash;
    cached_[b] = 1;
  }

 private:
  void push_back(uint32_t b) {
    prev_[b] = tail_;
    next_[b] = kNil;
    (tail_ == kNil ? head_ : next_[tail_]) = b;
    tail_ = b;
    ++free_;
  }
  void unlink(uint32_t b) {
    (prev_[b] == kNil ? head_ : next_[prev_[b]]) = next_[b];
    (next_[b] == kNil ? tail_ : prev_[next_[b]]) = prev_[b];
    --free_;
  }

  std::vector<uint32_t> ref_;
  std::vector<uint64_t> hash_;
  std::vector<uint8_t> cached_;
  std::vector<uint32_t> prev_, next_;
  uint32_t head_ = kNil, tail_ = kNil;
  size_t free_ = 0;
  std::unordered_map<uint64_t, uint32_t> map_;
};

struct Req {
  const Request *rq = nullptr;
  uint64_t index = 0;
  std::string id;
  std::vector<uint32_t> tokens;  // the prompt, then the sampled tokens; empty until started
  std::vector<uint64_t> hashes;  // sequence hashes of the full blocks of tokens
  kvt_seq *seq = nullptr;
  uint64_t outputs = 0;          // tokens sampled so far
  uint64_t num_computed = 0;     // tokens whose KV G1 holds (computed, hit or loaded)
  std::vector<uint32_t> blocks;  // G1 block ids
  size_t seen_blocks = 0, seen_tokens = 0;  // what the connector has been told
  size_t cached = 0;             // blocks [0, cached) are in the engine's prefix cache
  size_t load_first = 0, load_count = 0;  // blocks this step loads, checked after it
};

struct Scheduled {
  Req *r;
  uint64_t n;  // tokens computed this step
};

// A block the forward completes: G1 block id, the hash whose KV it gets.
using Written = std::pair<uint32_t, uint64_t>;

// A layer's attention: the CPU stays busy, as the engine's thread launching kernels would.
void busy_for(uint32_t us) {
  const auto end = Clock::now() + std::chrono::microseconds(us);
  while (us > 0 && Clock::now() < end) {
  }
}

class Engine {
 public:
  Engine(const Options &o, const Trace &t)
      : o_(o), t_(t), ps_(o.page_size), bb_(o.block_bytes()), pool_(uint32_t(o.g1_blocks)) {}
  ~Engine() {
    metrics_.stop();
    for (Req &r : reqs_) kvt_seq_destroy(r.seq);
    kvt_connector_destroy(c_);
    kvt_manager_destroy(m_);
    g1_free(o_.g1_cuda, g1_);
  }

  bool run(EngineResult *out, std::string *error);

 private:
  bool create(std::string *error);
  bool verify_record(std::string *error);
  kvt_manager *fresh_manager(std::string *error);
  bool step();
  bool forward(const std::vector<Written> &writes, bool connector);
  bool bare_forwards();
  bool schedule();
  bool admit(Req &r, uint64_t budget, bool *admitted);
  bool preempt(Req &r);
  bool start(Req &r);
  bool append(Req &r, const uint32_t *tokens, size_t n);
  bool finish(Req &r);
  void release(std::vector<uint32_t> &blocks);
  bool failed(const char *what, kvt_status st);
  bool failed(const std::string &why);
  bool fill_block(uint32_t g1, uint64_t hash) {
    std::string e;
    return g1_fill(o_.g1_cuda, block(g1), bb_, hash, &e) || failed(e);
  }
  bool fill_layer(uint32_t g1, uint32_t layer, uint64_t hash) {
    const size_t layer_bytes = size_t(o_.outer) * o_.chunk_bytes;
    std::string e;
    return g1_fill_range(o_.g1_cuda, block(g1), layer * layer_bytes, layer_bytes, hash, &e) ||
           failed(e);
  }
  size_t blocks_for(uint64_t tokens) const { return size_t((tokens + ps_ - 1) / ps_); }
  char *block(uint32_t g1) const { return g1_ + size_t(g1) * bb_; }

  const Options &o_;
  const Trace &t_;
  const uint32_t ps_;
  const uint64_t bb_;
  kvt_manager *m_ = nullptr;
  kvt_connector *c_ = nullptr;
  kvt_manager_config cfg_{};  // m_'s, for --verify-record's fresh manager
  kvt_connector_config ccfg_{};  // c_'s, for its fresh connector
  MetricsServer metrics_;
  char *g1_ = nullptr;  // the engine's G1: g1_blocks blocks of bb_ bytes, block-contiguous
  uint64_t salt_ = 0;
  BlockPool pool_;

  std::vector<Req> reqs_;
  std::deque<Req *> waiting_;  // trace order; preempted requests go back to the front
  std::vector<Req *> running_;  // oldest first: the youngest is preempted first
  std::unordered_map<std::string, std::vector<uint32_t>> delayed_;  // finished, stores pending
  size_t done_ = 0;

  // One step's scratch.
  std::vector<Scheduled> sched_;
  std::vector<const char *> preempted_;
  std::vector<kvt_scheduled_request> meta_reqs_;
  std::vector<uint32_t> hits_;
  std::unordered_set<uint32_t> load_errors_;
  std::vector<Written> writes_;
  std::vector<std::vector<Written>> all_writes_;  // per step, for --compare-bare

  EngineResult res_;
  std::string error_;
};

bool Engine::failed(const char *what, kvt_status st) {
  return failed(std::string(what) + " failed: " + kvt_status_str(st) + ": " + kvt_last_error());
}

bool Engine::failed(const std::string &why) {
  if (error_.empty()) error_ = why;
  return false;
}

bool Engine::create(std::string *error) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = o_.page_size;
  c.num_layers = o_.layers;
  c.num_outer = o_.outer;
  c.chunk_bytes = o_.chunk_bytes;
  c.g1_blocks = 1;  // the manager's own G1 is left alone: the engine's is registered below
  c.g2_blocks = o_.g2_blocks;
  c.g3_blocks = o_.g3_blocks;
  c.g3_path = o_.g3_path.empty() ? nullptr : o_.g3_path.c_str();
  set_kv_events(&c, o_);
  c.g1_memory = KVT_MEMORY_HOST;  // unused: G1 is the engine's, below
  if (o_.cuda_copy >= 0) c.cuda_copy = uint32_t(o_.cuda_copy);
  c.max_concurrent_transfers = 1;  // as in --mode blocks: the copies share 2 cores
  c.max_batch_size = 256;
  c.copy_threads = 2;
  if (kvt_manager_create(&m_, &c) != KVT_OK) {
    *error = std::string("cannot create the manager: ") + kvt_last_error();
    return false;
  }
  cfg_ = c;
  if (!start_recording(m_, o_, error)) return false;
  kvt_hash_salt(&salt_, "kvtier-replay", 13);

  const size_t bytes = size_t(o_.g1_blocks) * bb_;
  std::string why;
  g1_ = static_cast<char *>(g1_alloc(o_.g1_cuda, bytes, &why));
  if (g1_ == nullptr) {
    *error = "cannot allocate the engine's G1: " + why;
    return false;
  }
  // As --mode blocks does: fault in G1 and G2 before the run, as pinning them would.
  const auto t0 = Clock::now();
  if (o_.prefault) {
    if (!o_.g1_cuda) std::memset(g1_, 0, bytes);  // cudaMalloc'd memory needs no faulting
    if (o_.g2_blocks) {
      std::vector<kvt_block> b(o_.g2_blocks);
      if (kvt_block_alloc(b.data(), b.size(), m_, KVT_TIER_G2) != KVT_OK) {
        *error = std::string("prefault: kvt_block_alloc: ") + kvt_last_error();
        return false;
      }
      for (kvt_block x : b) {
        void *p = nullptr;
        size_t len = 0;
        if (kvt_block_data(&p, &len, m_, x) != KVT_OK) continue;
        for (size_t at = 0; at < len; at += 4096) static_cast<volatile char *>(p)[at] = 0;
      }
      kvt_block_release(m_, b.data(), b.size());
    }
  }
  res_.prefault_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  kvt_connector_config cc;
  kvt_connector_config_init(&cc);
  cc.role = KVT_ROLE_BOTH;
  cc.offload = o_.offload == Offload::Eager ? KVT_OFFLOAD_EAGER : KVT_OFFLOAD_LAZY;
  cc.store_tier = o_.g2_blocks ? KVT_TIER_G2 : KVT_TIER_G3;
  cc.num_gpu_blocks = o_.g1_blocks;
  cc.salt_hash = salt_;
  cc.load_async = 0;
  ccfg_ = cc;
  // The connector serves the management endpoint itself, from its config.
  if (!o_.console_socket.empty()) cc.endpoint_path = o_.console_socket.c_str();
  if (kvt_connector_create(&c_, m_, &cc) != KVT_OK) {
    *error = std::string(o_.console_socket.empty() ? "cannot create the connector: "
                                                   : "--console-socket: ") +
             kvt_last_error();
    return false;
  }
  if (o_.metrics_port && !metrics_.start(o_.metrics_port, m_, c_, error)) return false;
  // One chunk per (layer, K/V) at its offset within each block: block-contiguous G1.
  const size_t chunks = size_t(o_.layers) * o_.outer;
  std::vector<const void *> bases(chunks);
  std::vector<uint64_t> strides(chunks, bb_);
  for (size_t k = 0; k < chunks; ++k) bases[k] = g1_ + k * o_.chunk_bytes;
  kvt_g1_layout l{};
  l.struct_size = sizeof l;
  l.memory = o_.g1_cuda ? KVT_MEMORY_CUDA : KVT_MEMORY_HOST;
  l.bases = bases.data();
  l.strides = strides.data();
  if (kvt_connector_register_kv_caches(c_, &l, o_.g1_blocks) != KVT_OK) {
    *error = std::string("kvt_connector_register_kv_caches: ") + kvt_last_error();
    return false;
  }
  return true;
}

bool Engine::append(Req &r, const uint32_t *tokens, size_t n) {
  r.tokens.insert(r.tokens.end(), tokens, tokens + n);
  if (kvt_status st = kvt_seq_append(r.seq, tokens, n); st != KVT_OK)
    return failed("kvt_seq_append", st);
  const size_t have = r.hashes.size(), full = r.tokens.size() / ps_;
  if (full == have) return true;
  r.hashes.resize(full);
  size_t got = 0;
  if (kvt_status st = kvt_seq_copy_hashes(nullptr, r.hashes.data() + have, full - have, &got,
                                          r.seq, have);
      st != KVT_OK || got != full - have)
    return failed("kvt_seq_copy_hashes", st);
  return true;
}

// The request's prompt, as the trace's README says (prompt_tokens).
bool Engine::start(Req &r) {
  if (kvt_status st = kvt_seq_create(&r.seq, salt_, ps_); st != KVT_OK)
    return failed("kvt_seq_create", st);
  std::vector<uint32_t> prompt(r.rq->input_length);
  prompt_tokens(t_, *r.rq, prompt.size(), prompt.data());
  r.tokens.reserve(prompt.size() + r.rq->output_length);
  res_.prompt_tokens += prompt.size();
  return append(r, prompt.data(), prompt.size());
}

// Releases in reverse, as vLLM does: a request's last blocks are the first to be reused.
void Engine::release(std::vector<uint32_t> &blocks) {
  for (size_t k = blocks.size(); k-- > 0;) pool_.release(blocks[k]);
  blocks.clear();
}

bool Engine::preempt(Req &r) {
  running_.pop_back();  // r is the youngest
  if (kvt_status st = kvt_connector_request_preempted(c_, r.id.c_str()); st != KVT_OK)
    return failed("kvt_connector_request_preempted", st);
  release(r.blocks);
  r.num_computed = 0;
  r.seen_blocks = 0;
  r.cached = 0;
  r.load_count = 0;
  waiting_.push_front(&r);
  preempted_.push_back(r.id.c_str());
  ++res_.preemptions;
  return true;
}

bool Engine::finish(Req &r) {
  int32_t delay = 0;
  if (kvt_status st = kvt_connector_request_finished(&delay, c_, r.id.c_str()); st != KVT_OK)
    return failed("kvt_connector_request_finished", st);
  if (delay) delayed_.emplace(r.id, std::move(r.blocks));
  else release(r.blocks);
  r.blocks = {};
  r.tokens = {};
  r.hashes = {};
  kvt_seq_destroy(r.seq);
  r.seq = nullptr;
  ++done_;
  ++res_.requests;
  return true;
}

// A waiting request: the engine's own prefix hit, then the connector's; admitted when G1 has
// blocks for both and for the tokens it computes this step.
bool Engine::admit(Req &r, uint64_t budget, bool *admitted) {
  *admitted = false;
  if (r.seq == nullptr && !start(r)) return false;
  hits_.clear();
  const size_t limit = (r.tokens.size() - 1) / ps_;  // never the last token: compute one
  for (size_t b = 0; b < limit; ++b) {
    uint32_t g = pool_.lookup(r.hashes[b]);
    if (g == kNil) break;
    hits_.push_back(g);
  }
  const uint64_t local = uint64_t(hits_.size()) * ps_;
  uint64_t ext = 0;
  int32_t async = 0;
  if (kvt_status st = kvt_connector_get_num_new_matched_tokens(
          &ext, &async, c_, r.id.c_str(), r.tokens.data(), r.tokens.size(), local);
      st != KVT_OK)
    return failed("kvt_connector_get_num_new_matched_tokens", st);
  const uint64_t n = std::min<uint64_t>(r.tokens.size() - local - ext, budget);
  const size_t need = blocks_for(local + ext + n) - hits_.size();
  size_t hit_free = 0;
  for (uint32_t g : hits_) hit_free += pool_.refs(g) == 0;
  // Too full: it waits, and asks the connector again next step (which drops these pins).
  if (pool_.free() < need + hit_free) return true;
  for (uint32_t g : hits_) pool_.take(g);
  r.blocks = hits_;
  for (size_t k = 0; k < need; ++k) r.blocks.push_back(pool_.alloc());
  if (kvt_status st = kvt_connector_update_state_after_alloc(c_, r.id.c_str(), r.blocks.data(),
                                                             r.blocks.size(), ext);
      st != KVT_OK)
    return failed("kvt_connector_update_state_after_alloc", st);
  r.seen_blocks = r.blocks.size();
  r.seen_tokens = r.tokens.size();
  r.num_computed = local + ext;
  r.cached = hits_.size();
  r.load_first = hits_.size();
  r.load_count = size_t(ext / ps_);
  res_.g1_hit_tokens += local;
  res_.loaded_tokens += ext;
  sched_.push_back({&r, n});
  running_.push_back(&r);
  waiting_.pop_front();
  *admitted = true;
  return true;
}

// vLLM's scheduler in short: running requests first, each getting the tokens it has left
// (1 when decoding) within the step's budget, preempting the youngest running request when
// G1 is full; then waiting requests in order while the budget, max_running and G1 allow,
// unless this step preempted.
bool Engine::schedule() {
  sched_.clear();
  preempted_.clear();
  uint64_t budget = o_.token_budget;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Req &r = *running_[i];
    const uint64_t n = std::min<uint64_t>(r.tokens.size() - r.num_computed, budget);
    const size_t need = blocks_for(r.num_computed + n) - r.blocks.size();
    bool self = false;
    while (pool_.free() < need && !self) {
      Req &victim = *running_.back();
      self = &victim == &r;
      if (!preempt(victim)) return false;
    }
    if (self) break;
    for (size_t k = 0; k < need; ++k) r.blocks.push_back(pool_.alloc());
    sched_.push_back({&r, n});
    budget -= n;
  }
  while (preempted_.empty() && budget > 0 && running_.size() < o_.max_running &&
         !waiting_.empty()) {
    bool admitted = false;
    if (!admit(*waiting_.front(), budget, &admitted)) return false;
    if (!admitted) break;
    budget -= sched_.back().n;
  }
  return true;
}

// One step: schedule, the connector's metadata, the worker's side around the "forward",
// the worker's report back to the scheduler half, then sampling and finishing.
bool Engine::step() {
  if (!schedule()) return false;
  meta_reqs_.clear();
  for (auto [r, n] : sched_) {
    meta_reqs_.push_back({r->id.c_str(), r->num_computed, n, r->blocks.data() + r->seen_blocks,
                          r->blocks.size() - r->seen_blocks, r->tokens.data() + r->seen_tokens,
                          r->tokens.size() - r->seen_tokens});
    r->seen_blocks = r->blocks.size();
    r->seen_tokens = r->tokens.size();
  }
  const void *meta = nullptr;
  size_t meta_len = 0;
  if (kvt_status st = kvt_connector_build_connector_meta(&meta, &meta_len, c_,
                                                         meta_reqs_.data(), meta_reqs_.size());
      st != KVT_OK)
    return failed("kvt_connector_build_connector_meta", st);

  // The worker: nothing may write the preempted requests' blocks before their copies end.
  const auto t0 = Clock::now();
  if (!preempted_.empty())
    if (kvt_status st = kvt_connector_handle_preemptions(c_, preempted_.data(), preempted_.size());
        st != KVT_OK)
      return failed("kvt_connector_handle_preemptions", st);
  if (kvt_status st = kvt_connector_bind_connector_metadata(c_, meta, meta_len); st != KVT_OK)
    return failed("kvt_connector_bind_connector_metadata", st);
  if (kvt_status st = kvt_connector_start_load_kv(c_); st != KVT_OK)
    return failed("kvt_connector_start_load_kv", st);
  // The forward: every block that this step's tokens complete gets its hash's bytes.
  writes_.clear();
  for (auto [r, n] : sched_) {
    for (size_t b = r->num_computed / ps_; b < (r->num_computed + n) / ps_; ++b)
      writes_.emplace_back(r->blocks[b], r->hashes[b]);
    res_.computed_tokens += n;
  }
  if (!forward(writes_, true)) return false;
  if (kvt_status st = kvt_connector_wait_for_save(c_); st != KVT_OK)
    return failed("kvt_connector_wait_for_save", st);
  if (!sched_.empty()) {
    res_.step_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (o_.compare_bare) all_writes_.push_back(writes_);
  }
  kvt_finished f{};
  f.struct_size = sizeof f;
  if (kvt_status st = kvt_connector_get_finished(&f, c_); st != KVT_OK)
    return failed("kvt_connector_get_finished", st);
  if (kvt_status st = kvt_connector_clear_connector_metadata(c_); st != KVT_OK)
    return failed("kvt_connector_clear_connector_metadata", st);

  // The scheduler half takes the report; finished requests whose stores ended free G1.
  if (kvt_status st = kvt_connector_update_connector_output(c_, f.report, f.report_len);
      st != KVT_OK)
    return failed("kvt_connector_update_connector_output", st);
  for (size_t k = 0; k < f.num_finished_sending; ++k) {
    auto it = delayed_.find(f.finished_sending[k]);
    if (it == delayed_.end()) continue;
    release(it->second);
    delayed_.erase(it);
  }
  load_errors_.clear();
  load_errors_.insert(f.load_error_block_ids, f.load_error_block_ids + f.num_load_errors);

  for (auto [r, n] : sched_) {
    // Check what this step loaded; a failed load is recomputed (its bytes written now).
    for (size_t b = r->load_first; b < r->load_first + r->load_count; ++b) {
      if (load_errors_.count(r->blocks[b])) {
        if (!fill_block(r->blocks[b], r->hashes[b])) return false;
        ++res_.load_error_blocks;
        continue;
      }
      std::string e;
      ++(g1_holds(o_.g1_cuda, block(r->blocks[b]), bb_, r->hashes[b], &e) ? res_.verified
                                                                           : res_.mismatched);
      if (!e.empty()) return failed(e);
      res_.prefill_tokens_saved += ps_;
    }
    r->load_count = 0;
    r->num_computed += n;
    for (; r->cached < r->num_computed / ps_; ++r->cached)
      pool_.cache(r->blocks[r->cached], r->hashes[r->cached]);
    if (r->num_computed < r->tokens.size()) continue;  // chunked prefill goes on
    ++res_.output_tokens;
    if (++r->outputs == r->rq->output_length) {
      if (!finish(*r)) return false;
      continue;
    }
    // A sampled token: any fixed id, distinct per request, above the prompts' ids.
    const uint64_t x = (r->index << 24 | r->outputs) * 0x9E3779B97F4A7C15ull;
    const uint32_t tok = 0x80000000u | uint32_t(x >> 33);
    if (!append(*r, &tok, 1)) return false;
  }
  std::erase_if(running_, [](const Req *r) { return r->seq == nullptr; });
  ++res_.steps;
  return true;
}

// The model's forward, layer by layer as vLLM runs it: the step's new KV of a layer is written
// (before the layer's wait, as vLLM's KV-cache update comes before it), the layer's loads
// waited for, its attention computed (--layer-forward-us of busy time), the layer saved.
// Without the connector: the same, minus its calls.
bool Engine::forward(const std::vector<Written> &writes, bool connector) {
  for (uint32_t l = 0; l < o_.layers; ++l) {
    for (auto [g1, hash] : writes)
      if (!fill_layer(g1, l, hash)) return false;
    if (connector)
      if (kvt_status st = kvt_connector_wait_for_layer_load(c_, l); st != KVT_OK)
        return failed("kvt_connector_wait_for_layer_load", st);
    busy_for(o_.layer_forward_us);
    if (connector)
      if (kvt_status st = kvt_connector_save_kv_layer(c_, l); st != KVT_OK)
        return failed("kvt_connector_save_kv_layer", st);
  }
  return true;
}

// --compare-bare: every step's forward of the run again, without the connector's copies, in
// the same process on the same G1, once the run's copies have all ended.
bool Engine::bare_forwards() {
  for (const std::vector<Written> &w : all_writes_) {
    const auto t0 = Clock::now();
    if (!forward(w, false)) return false;
    res_.bare_step_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return true;
}

bool Engine::run(EngineResult *out, std::string *error) {
  if (!create(error)) return false;
  reqs_.resize(t_.requests.size());
  for (size_t i = 0; i < reqs_.size(); ++i) {
    reqs_[i].rq = &t_.requests[i];
    reqs_[i].index = i;
    reqs_[i].id = "req-" + std::to_string(i);
    waiting_.push_back(&reqs_[i]);
  }
  const auto start = Clock::now();
  const bool bar = o_.progress && isatty(STDERR_FILENO);
  auto last_bar = start, last_progress = start;
  uint64_t last_computed = 0;
  size_t last_delayed = 0;
  while (done_ < reqs_.size() || !delayed_.empty()) {
    if (!step()) {
      *error = error_;
      return false;
    }
    if (res_.steps % 256 != 0 && !sched_.empty()) continue;
    const auto now = Clock::now();
    if (res_.computed_tokens != last_computed || delayed_.size() != last_delayed) {
      last_computed = res_.computed_tokens;
      last_delayed = delayed_.size();
      last_progress = now;
    } else if (now - last_progress > std::chrono::seconds(60)) {
      *error = "no progress for 60 s: no request can run, and no store ends";
      return false;
    }
    if (sched_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (bar && now - last_bar > std::chrono::milliseconds(100)) {
      last_bar = now;
      int filled = int(40.0 * double(done_) / double(reqs_.size()));
      std::fprintf(stderr, "\r[%-40.*s] %zu/%zu requests", filled,
                   "########################################", done_, reqs_.size());
    }
  }
  res_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (bar) std::fprintf(stderr, "\r%60s\r", "");

  kvt_connector_stats cs{};
  cs.struct_size = sizeof cs;
  if (kvt_status st = kvt_connector_stats_get(&cs, c_); st != KVT_OK) {
    *error = std::string("kvt_connector_stats_get: ") + kvt_last_error();
    return false;
  }
  std::memcpy(res_.transitions, cs.transitions, sizeof res_.transitions);
  if (!read_transfer_stats(m_, res_.dir, error)) return false;
  res_.stored_blocks = cs.stored_blocks;
  res_.store_failures = cs.store_failures;
  if (kvt_status st = kvt_manager_check(m_); st != KVT_OK) {
    *error = std::string("kvt_manager_check after the replay: ") + kvt_last_error();
    return false;
  }
  if (o_.verify_record && !verify_record(error)) return false;
  if (o_.compare_bare && !bare_forwards()) {
    *error = error_;
    return false;
  }
  *out = res_;
  return true;
}

// A manager with m_'s config and a temporary G3 of its own, for --verify-record.
kvt_manager *Engine::fresh_manager(std::string *error) {
  kvt_manager_config c = cfg_;
  c.g3_path = nullptr;
  c.kv_events_endpoint = nullptr;
  c.kv_events_replay_endpoint = nullptr;
  kvt_manager *m = nullptr;
  if (kvt_manager_create(&m, &c) != KVT_OK) {
    *error = std::string("--verify-record: the fresh manager: ") + kvt_last_error();
    return nullptr;
  }
  return m;
}

namespace {

std::vector<uint64_t> sorted_hashes(kvt_manager *m, kvt_tier t) {
  size_t n = 0;
  kvt_tier_hashes(nullptr, 0, &n, m, t);
  std::vector<uint64_t> h(n);
  kvt_tier_hashes(h.data(), h.size(), &n, m, t);
  h.resize(std::min(n, h.size()));
  std::sort(h.begin(), h.end());
  return h;
}

bool same_registry(kvt_manager *a, kvt_manager *b) {
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3})
    if (sorted_hashes(a, t) != sorted_hashes(b, t)) return false;
  return true;
}

// The live slots by id: state, tokens, computed, blocks, batches.
std::map<std::string, std::array<uint64_t, 5>> slots_of(kvt_connector *c) {
  size_t n = 0;
  kvt_connector_slots(nullptr, 0, &n, c);
  std::vector<kvt_slot_info> v(n);
  kvt_connector_slots(v.data(), v.size(), &n, c);
  std::map<std::string, std::array<uint64_t, 5>> out;
  for (size_t i = 0; i < std::min(n, v.size()); ++i)
    out[v[i].req_id] = {v[i].state, v[i].tokens, v[i].computed, v[i].blocks, v[i].batches};
  return out;
}

}  // namespace

// The log (1) replayed into a fresh manager of the same shape: its registry must be this
// run's, every slot finished, every batch ended, and the transitions counted alike; (2) made
// again, call by call, on a fresh manager and connector, which must end with this run's
// slots, registry and counters.
bool Engine::verify_record(std::string *error) {
  auto &v = res_.record_replay;
  if (kvt_manager_recorder_close(m_) != KVT_OK) {
    *error = std::string("--verify-record: closing the log: ") + kvt_last_error();
    return false;
  }
  kvt_manager *fresh = fresh_manager(error);
  if (fresh == nullptr) return false;
  auto t0 = Clock::now();
  v.r.struct_size = sizeof v.r;
  kvt_status st = kvt_event_log_replay(&v.r, fresh, o_.record.c_str());
  v.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st != KVT_OK && st != KVT_ERR_CORRUPT) {
    *error = std::string("--verify-record: ") + kvt_last_error();
    kvt_manager_destroy(fresh);
    return false;
  }
  if (st == KVT_ERR_CORRUPT) v.first_violation = kvt_last_error();
  v.same_registry = same_registry(m_, fresh);
  v.same_transitions = std::memcmp(v.r.transitions, res_.transitions, sizeof res_.transitions) == 0;
  kvt_manager_destroy(fresh);

  if ((fresh = fresh_manager(error)) == nullptr) return false;
  kvt_connector_config cc = ccfg_;
  cc.role = KVT_ROLE_SCHEDULER;  // the recorded reports stand in for the worker
  kvt_connector *c = nullptr;
  if (kvt_connector_create(&c, fresh, &cc) != KVT_OK) {
    *error = std::string("--verify-record: the fresh connector: ") + kvt_last_error();
    kvt_manager_destroy(fresh);
    return false;
  }
  t0 = Clock::now();
  v.rerun.struct_size = sizeof v.rerun;
  st = kvt_event_log_rerun(&v.rerun, c, o_.record.c_str());
  v.rerun_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st == KVT_ERR_CORRUPT) v.rerun_first = kvt_last_error();
  if (st != KVT_OK && st != KVT_ERR_CORRUPT) {
    *error = std::string("--verify-record: ") + kvt_last_error();
  } else {
    kvt_connector_stats a{}, b{};
    a.struct_size = b.struct_size = sizeof a;
    kvt_connector_stats_get(&a, c_);
    kvt_connector_stats_get(&b, c);
    v.rerun_same_counters = std::memcmp(&a, &b, sizeof a) == 0;
    v.rerun_same_slots = slots_of(c_) == slots_of(c);
    v.rerun_same_registry = same_registry(m_, fresh);
    v.done = true;
  }
  kvt_connector_destroy(c);
  kvt_manager_destroy(fresh);
  return v.done;
}

}  // namespace

bool run_engine(const Options &o, const Trace &t, EngineResult *out, std::string *error) {
  Engine e(o, t);
  return e.run(out, error);
}

}  // namespace kvt::replay
