// Four threads hammer alloc, register, match and release on one manager; afterwards every
// tier's counts add up and kvt_manager_check finds nothing wrong. Then an engine drives a
// connector while six more threads make every other connector call. Also run under TSan.
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "connector_support.hpp"

using namespace kvt_test;

TEST(Threads, FourThreadsKeepTheManagerConsistent) {
  kvt_manager_config c = small_config(512, 256);
  c.event_capacity = 1024;
  auto m = make(c);
  std::atomic<uint64_t> failures{0}, ops{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(id);
    std::vector<kvt_block> held;
    for (int iter = 0; iter < 20000; ++iter) {
      kvt_tier tier = (rng() % 4 == 0) ? KVT_TIER_G2 : KVT_TIER_G1;
      // A "request": a chain of up to 8 hashes drawn from a small space, so threads
      // share prefixes, dedup against each other and evict each other's blocks.
      size_t len = 1 + rng() % 8;
      uint64_t root = rng() % 64;
      std::vector<uint64_t> chain(len);
      for (size_t i = 0; i < len; ++i) chain[i] = root * 100 + i + 1;
      std::vector<kvt_block> got(len);
      size_t hit = 0;
      if (kvt_tier_match_prefix(&hit, got.data(), m.get(), tier, chain.data(), len) != KVT_OK)
        ++failures;
      got.resize(hit);
      size_t need = len - hit;
      std::vector<kvt_block> fresh(need);
      if (need > 0) {
        kvt_status s = kvt_block_alloc(fresh.data(), need, m.get(), tier);
        if (s == KVT_ERR_NO_SPACE) {
          kvt_block_release(m.get(), got.data(), got.size());
          continue;
        }
        if (s != KVT_OK) ++failures;
      }
      for (size_t i = 0; i < need; ++i) {
        kvt_block r = 0;
        uint64_t parent = hit + i == 0 ? 0 : chain[hit + i - 1];
        if (kvt_block_register_hash(&r, m.get(), fresh[i], chain[hit + i], parent) != KVT_OK)
          ++failures;
        got.push_back(r);
      }
      if (rng() % 3 == 0) {  // keep some across iterations, release them later
        held.insert(held.end(), got.begin(), got.end());
      } else if (kvt_block_release(m.get(), got.data(), got.size()) != KVT_OK) {
        ++failures;
      }
      if (held.size() > 64) {
        if (kvt_block_release(m.get(), held.data(), held.size()) != KVT_OK) ++failures;
        held.clear();
      }
      if (id == 0 && iter % 50 == 0) {
        kvt_event ev[256];
        kvt_manager_poll(m.get(), ev, 256);
      }
      ++ops;
    }
    if (kvt_block_release(m.get(), held.data(), held.size()) != KVT_OK) ++failures;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker, i + 1);
  for (auto &t : ts) t.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(ops.load(), 60000u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2}) {
    kvt_tier_stats s = stats(m.get(), t);
    EXPECT_EQ(s.free + s.active + s.inactive, s.capacity);
    EXPECT_EQ(s.active, 0u) << "every reference was released";
    EXPECT_GT(s.dedups + s.match_hit, 0u) << "threads never shared a prefix";
  }
}

// --- the connector (issue 24) ---

namespace {

using namespace kvt_conn_test;

// Statuses a call may return; anything else is counted, the first with its message.
struct Verdicts {
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first;
  void fail(const std::string &what) {
    std::lock_guard lk(mu);
    if (bad++ == 0) first = what;
  }
  void check(kvt_status st, std::initializer_list<kvt_status> ok, const char *what) {
    if (std::find(ok.begin(), ok.end(), st) == ok.end())
      fail(std::string(what) + " -> " + kvt_status_str(st) + ": " + kvt_last_error());
  }
};

// A queue between the engine's threads.
template <class T>
struct Chan {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<T> q;
  void push(T v) {
    {
      std::lock_guard lk(mu);
      q.push_back(std::move(v));
    }
    cv.notify_all();
  }
  // The next item, or false after `wait` with none.
  bool pop(T *out, std::chrono::microseconds wait) {
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, wait, [&] { return !q.empty(); })) return false;
    *out = std::move(q.front());
    q.pop_front();
    return true;
  }
  std::deque<T> take_all() {
    std::lock_guard lk(mu);
    return std::exchange(q, {});
  }
  size_t size() {
    std::lock_guard lk(mu);
    return q.size();
  }
};

// One step for the model runner: requests preempted since the last one, the metadata, the
// blocks its forward writes and the blocks that must hold loaded KV before it.
struct StepMsg {
  std::vector<std::string> preempted;
  std::string meta;
  Forward fwd, check;
};

// What one get_finished listed, for the scheduler thread.
struct Outcome {
  std::string report;
  std::vector<std::string> sending, recving;
};

struct Req {
  std::string id;
  std::vector<uint32_t> tokens, blocks;
  uint64_t ext = 0;  // tokens loaded at its last admission
  int decodes = 0;   // decode steps left
  enum Phase { Waiting, Loading, Ready, Running, Freeing, Done } phase = Waiting;
  int32_t delay = -1;  // request_finished's delay_free
  int sent = 0, recved = 0, want_recv = 0;
};

std::atomic<uint64_t> will_calls{0}, finished_calls{0};
void on_will(void *, uint32_t, const char *) { ++will_calls; }
void on_finished(void *, uint32_t, const char *, kvt_status) { ++finished_calls; }

constexpr size_t kLive = 6, kEngineBlocks = 40;
// Requests through the engine: fewer under valgrind, which runs one thread at a time.
size_t requests() { return RUNNING_ON_VALGRIND ? 24 : 200; }

// An engine over a scheduler connector sc (over sm, storing to `store`) and a worker
// connector wc: one connector of role BOTH, or two over two managers, as two processes would
// have. The test's thread schedules, a model-runner thread steps the worker half, and five
// more threads call the rest meanwhile: get_finished, worker calls that must be refused or
// change nothing, requests of their own and reset_cache, inspection and hooks, breakpoints
// and pauses.
void run_engine(kvt_manager *sm, kvt_tier store, kvt_connector *sc, kvt_connector *wc,
                EngineG1 &g1) {
  const bool split = sc != wc;
  Verdicts v;
  Chan<StepMsg> steps;
  Chan<Outcome> inbox;
  std::atomic<bool> stop{false};
  std::atomic<int> bad_bytes{0}, resets_begun{0}, resets_ended{0}, pauses{0};
  std::mutex fin_mu;  // get_finished's arrays live until the next call, on any thread
  std::string idle_report;
  {
    Finished f;
    ASSERT_KVT_OK(collect(wc, &f, &idle_report));
  }

  // The observe stream on: the copy thread and the scheduler's callers emit into it, and
  // the ring keeps the calls' arguments.
  ASSERT_KVT_OK(kvt_manager_recorder_ring(sm, 4096));
  kvt_subscription *sub = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&sub, sm, 1024));
  std::unique_ptr<kvt_subscription, void (*)(kvt_subscription *)> sub_owner(
      sub, kvt_subscription_destroy);

  auto poll_finished = [&] {
    std::lock_guard lk(fin_mu);
    kvt_finished f{};
    f.struct_size = sizeof f;
    kvt_status st = kvt_connector_get_finished(&f, wc);
    v.check(st, {KVT_OK}, "get_finished");
    if (st != KVT_OK) return;
    Outcome o;
    o.report.assign(static_cast<const char *>(f.report), f.report_len);
    o.sending.assign(f.finished_sending, f.finished_sending + f.num_finished_sending);
    o.recving.assign(f.finished_recving, f.finished_recving + f.num_finished_recving);
    if (o.report != idle_report || !o.sending.empty() || !o.recving.empty())
      inbox.push(std::move(o));
  };

  // The model runner: every call of its step must succeed.
  std::thread runner([&] {
    StepMsg s;
    while (!stop || steps.size()) {
      if (!steps.pop(&s, std::chrono::milliseconds(1))) continue;
      if (!s.preempted.empty()) {
        std::vector<const char *> ids;
        for (const std::string &id : s.preempted) ids.push_back(id.c_str());
        v.check(kvt_connector_handle_preemptions(wc, ids.data(), ids.size()), {KVT_OK},
                "handle_preemptions");
      }
      v.check(worker_step(wc, g1, s.meta, s.fwd,
                          [&] {
                            for (auto [b, h] : s.check) bad_bytes += !g1.holds(b, h);
                          }),
              {KVT_OK}, "the runner's step");
      poll_finished();
      v.check(kvt_connector_clear_connector_metadata(wc), {KVT_OK}, "clear_connector_metadata");
    }
  });
  // A second thread polls get_finished.
  std::thread poller([&] {
    while (!stop) {
      poll_finished();
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  // Worker calls that must be refused, or that change nothing the runner relies on; the
  // wrong half's calls when the halves are two connectors.
  std::thread intruder([&] {
    const std::string garbage = "not metadata";
    for (uint32_t i = 0; !stop; ++i) {
      v.check(kvt_connector_register_kv_caches(wc, &g1.layout, kGpuBlocks), {KVT_ERR_STATE},
              "register_kv_caches again");
      v.check(kvt_connector_bind_connector_metadata(wc, garbage.data(), garbage.size()),
              {KVT_ERR_CORRUPT}, "bind of garbage");
      v.check(kvt_connector_start_load_kv(wc), {KVT_OK, KVT_ERR_STATE}, "start_load_kv");
      v.check(kvt_connector_wait_for_layer_load(wc, i % (kLayers + 1)),
              {KVT_OK, KVT_ERR_STATE, KVT_ERR_INVALID_ARGUMENT}, "wait_for_layer_load");
      // Not a layer the runner has: save_kv_layer(L) lets the stores read layer L at once,
      // which only the runner knows to be written.
      v.check(kvt_connector_save_kv_layer(wc, kLayers), {KVT_ERR_INVALID_ARGUMENT, KVT_ERR_STATE},
              "save_kv_layer(num_layers)");
      const char *nobody = "nobody";
      v.check(kvt_connector_handle_preemptions(wc, &nobody, 1), {KVT_OK}, "handle_preemptions");
      if (split) {
        int32_t d;
        kvt_finished f{};
        f.struct_size = sizeof f;
        v.check(kvt_connector_request_finished(&d, wc, "x"), {KVT_ERR_STATE}, "worker's finish");
        v.check(kvt_connector_start_load_kv(sc), {KVT_ERR_STATE}, "scheduler's start_load_kv");
        v.check(kvt_connector_get_finished(&f, sc), {KVT_ERR_STATE}, "scheduler's get_finished");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  // A second stream of scheduler calls: requests that never run, and reset_cache.
  std::thread side([&] {
    uint64_t salt = 0;
    v.check(kvt_hash_salt(&salt, "lora-7", 6), {KVT_OK}, "kvt_hash_salt");
    for (uint32_t k = 0; !stop; ++k) {
      const std::string id = "S" + std::to_string(k);
      auto t = concat(token_range(10000 * (k % 4 + 1), 32), token_range(900000 + 64 * k, 8));
      uint64_t n = 0;
      int32_t a = 0;
      v.check(k % 2 ? kvt_connector_get_num_new_matched_tokens(&n, &a, sc, id.c_str(), t.data(),
                                                               t.size(), 0)
                    : kvt_connector_get_num_new_matched_tokens_salted(
                          &n, &a, sc, id.c_str(), salt, t.data(), t.size(), 0),
              {KVT_OK}, "side get_num_new_matched_tokens");
      const uint32_t none = 0;
      if (k % 3 == 0)
        v.check(kvt_connector_update_state_after_alloc(sc, id.c_str(), &none, 0, 0), {KVT_OK},
                "side update_state_after_alloc");
      if (k % 3 == 1)
        v.check(kvt_connector_request_preempted(sc, id.c_str()), {KVT_OK}, "side preempted");
      int32_t d = -1;
      v.check(kvt_connector_request_finished(&d, sc, id.c_str()), {KVT_OK}, "side finished");
      if (d != 0) v.fail("side delay_free is not 0");
      if (slot_state(sc, id) != KVT_SLOT_FINISHED) v.fail("side slot");
      v.check(kvt_connector_request_finished(&d, sc, id.c_str()), {KVT_ERR_NOT_FOUND},
              "side finished twice");
      if (k % 16 == 15) {
        ++resets_begun;  // before the call: the scheduler thread may see its effect at once
        v.check(kvt_connector_reset_cache(sc), {KVT_OK, KVT_ERR_STATE}, "reset_cache");
        ++resets_ended;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  // Inspection, metrics, events and hooks.
  std::thread reader([&] {
    std::vector<char> buf(1 << 20);
    for (uint32_t i = 0; !stop; ++i) {
      kvt_connector_stats s{};
      s.struct_size = sizeof s;
      v.check(kvt_connector_stats_get(&s, sc), {KVT_OK}, "stats_get");
      size_t n = 0;
      std::vector<kvt_slot_info> slots(64);
      v.check(kvt_connector_slots(slots.data(), slots.size(), &n, sc), {KVT_OK}, "slots");
      std::vector<kvt_batch_info> batches(64);
      v.check(kvt_connector_batches(batches.data(), batches.size(), &n, sc), {KVT_OK}, "batches");
      size_t len = 0;
      v.check(kvt_metrics_text(buf.data(), buf.size(), &len, sm, sc), {KVT_OK},
              "kvt_metrics_text");
      if (!std::strstr(buf.data(), "kvtier_slots{")) v.fail("metrics without the slots");
      kvt_event ev[64];
      kvt_connector_drain_events(sc, ev, 64);
      kvt_obs_event oe[64];
      kvt_subscription_drain(sub, oe, 64);
      uint32_t state;
      v.check(kvt_connector_slot_state(&state, nullptr, nullptr, 0, sc, "R3"),
              {KVT_OK, KVT_ERR_NOT_FOUND}, "slot_state");
      kvt_connector_hooks h{};
      h.struct_size = sizeof h;
      h.will_call = on_will;
      h.finished_call = on_finished;
      v.check(kvt_connector_set_hooks(sc, i % 2 ? &h : nullptr), {KVT_OK}, "set_hooks");
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  // Breakpoints and pauses, resumed at once. A paused scheduler holds its lock, and nothing
  // but its own half's calls may wait for it: what this thread calls meanwhile must return
  // long before the pause would time out by itself.
  std::thread breaker([&] {
    using clock = std::chrono::steady_clock;
    v.check(kvt_connector_set_pause_timeout(sc, 10000), {KVT_OK}, "set_pause_timeout");
    std::vector<char> buf(1 << 20);
    for (uint32_t i = 0; !stop; ++i) {
      uint64_t id = 0;
      if (i % 2)
        v.check(kvt_connector_breakpoint_add(&id, sc, KVT_SLOT_DECODING, nullptr), {KVT_OK}, "add");
      else
        v.check(kvt_connector_pause(sc), {KVT_OK}, "pause");
      kvt_pause_info info{};
      info.struct_size = sizeof info;
      kvt_status st = kvt_connector_pause_wait(&info, sc, 100'000'000);
      v.check(st, {KVT_OK, KVT_TIMEOUT}, "pause_wait");
      if (st == KVT_OK) {
        ++pauses;
        if (info.breakpoint != 0 && info.state != KVT_SLOT_DECODING)
          v.fail("a pause at the wrong state");
        const auto t0 = clock::now();
        size_t n = 0, len = 0;
        v.check(kvt_connector_slots(nullptr, 0, &n, sc), {KVT_OK}, "slots while paused");
        v.check(kvt_connector_batches(nullptr, 0, &n, sc), {KVT_OK}, "batches while paused");
        v.check(kvt_metrics_text(buf.data(), buf.size(), &len, sm, sc), {KVT_OK},
                "kvt_metrics_text while paused");
        v.check(kvt_connector_start_load_kv(wc), {KVT_OK, KVT_ERR_STATE}, "paused start_load_kv");
        poll_finished();
        if (clock::now() - t0 > std::chrono::seconds(5))
          v.fail("a call waited for the paused scheduler");
        v.check(kvt_connector_resume(sc), {KVT_OK, KVT_ERR_STATE}, "resume");
      }
      if (id) v.check(kvt_connector_breakpoint_remove(sc, id), {KVT_OK}, "breakpoint_remove");
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    // A pause asked for and not taken yet ends at once; one taken already is resumed.
    v.check(kvt_connector_set_pause_timeout(sc, 1), {KVT_OK}, "set_pause_timeout");
    v.check(kvt_connector_resume(sc), {KVT_OK, KVT_ERR_STATE}, "resume");
  });
  // Joins every thread on every way out (a joinable std::thread at scope exit aborts).
  struct Joiner {
    std::atomic<bool> &stop;
    std::vector<std::thread *> ts;
    void join() {
      stop = true;
      for (std::thread *t : ts)
        if (t->joinable()) t->join();
    }
    ~Joiner() { join(); }
  } joiner{stop, {&runner, &poller, &intruder, &side, &reader, &breaker}};

  // The scheduler thread: admits, preempts, schedules and finishes the requests, as vLLM's
  // scheduler does, and feeds the worker's reports back.
  const size_t n_reqs = requests();
  std::vector<Req> reqs(n_reqs);
  for (size_t i = 0; i < n_reqs; ++i) {
    reqs[i].id = "R" + std::to_string(i);
    reqs[i].tokens = concat(token_range(10000 * (i % 4 + 1), 32),
                            token_range(100000 + 64 * i, 8 + 8 * (i % 2)));
    reqs[i].decodes = 4 + 4 * int(i % 3);
  }
  auto find = [&](const std::string &id) -> Req * {
    for (Req &r : reqs)
      if (r.id == id) return &r;
    return nullptr;
  };
  std::vector<uint32_t> free_blocks;
  for (uint32_t b = 0; b < kEngineBlocks; ++b) free_blocks.push_back(b);
  auto give_back = [&](Req &r) {
    free_blocks.insert(free_blocks.end(), r.blocks.begin(), r.blocks.end());
    r.blocks.clear();
  };
  std::mt19937 rng(7);
  std::deque<Req *> waiting;
  for (Req &r : reqs) waiting.push_back(&r);
  size_t live = 0, done = 0;
  uint64_t accepted = 0;
  int bad_lists = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (uint32_t step = 1; done < n_reqs; ++step) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the engine did not finish its requests in time: " << done << " done";
      break;
    }
    for (Outcome &o : inbox.take_all()) {
      v.check(kvt_connector_update_connector_output(sc, o.report.data(), o.report.size()),
              {KVT_OK}, "update_connector_output");
      for (const std::string &id : o.sending) {
        Req *r = find(id);
        if (r == nullptr || r->phase != Req::Freeing) {
          ++bad_lists;
          ADD_FAILURE() << id << " in finished_sending unexpectedly";
          continue;
        }
        ++r->sent;
        give_back(*r);
        r->phase = Req::Done;
        ++done;
      }
      for (const std::string &id : o.recving) {
        Req *r = find(id);
        if (r == nullptr || r->phase != Req::Loading) {
          ++bad_lists;
          ADD_FAILURE() << id << " in finished_recving unexpectedly";
          continue;
        }
        ++r->recved;
        r->phase = Req::Ready;
      }
    }
    StepMsg msg;
    // Now and then the engine takes a running request's blocks back.
    if (step % 7 == 0)
      for (Req &r : reqs)
        if (r.phase == Req::Running && r.decodes > 1) {
          v.check(kvt_connector_request_preempted(sc, r.id.c_str()), {KVT_OK}, "preempted");
          msg.preempted.push_back(r.id);
          give_back(r);
          r.phase = Req::Waiting;
          waiting.push_back(&r);
          --live;
          break;
        }
    while (live < kLive && !waiting.empty()) {
      Req &r = *waiting.front();
      const size_t nb = (r.tokens.size() + r.decodes + kPage - 1) / kPage;
      if (free_blocks.size() < nb) break;
      waiting.pop_front();
      r.blocks.assign(free_blocks.end() - nb, free_blocks.end());
      free_blocks.resize(free_blocks.size() - nb);
      uint64_t n = 0;
      int32_t a = 0;
      // Any reset not ended before the match may drop its hit before the alloc.
      const int ended_before = resets_ended;
      v.check(kvt_connector_get_num_new_matched_tokens(&n, &a, sc, r.id.c_str(),
                                                       r.tokens.data(), r.tokens.size(), 0),
              {KVT_OK}, "get_num_new_matched_tokens");
      kvt_status st = kvt_connector_update_state_after_alloc(sc, r.id.c_str(), r.blocks.data(),
                                                             r.blocks.size(), n);
      if (st == KVT_ERR_INVALID_ARGUMENT && n > 0 && resets_begun != ended_before) {
        n = 0;  // the other thread's reset_cache dropped the hit in between: decline it
        st = kvt_connector_update_state_after_alloc(sc, r.id.c_str(), r.blocks.data(),
                                                    r.blocks.size(), 0);
      }
      v.check(st, {KVT_OK}, "update_state_after_alloc");
      accepted += n;
      r.ext = n;
      if (n > 0 && a) {
        r.phase = Req::Loading;
        ++r.want_recv;
      } else {
        r.phase = Req::Ready;
      }
      ++live;
    }
    std::vector<Sched> sched;
    std::vector<Req *> finishing;
    for (Req &r : reqs) {
      if (r.phase == Req::Ready) {
        const std::vector<uint64_t> h = hashes_of(r.tokens);
        sched.push_back({r.id, r.ext, r.tokens.size() - r.ext});
        for (size_t j = 0; j < r.ext / kPage; ++j) msg.check.push_back({r.blocks[j], h[j]});
        for (size_t j = r.ext / kPage; j < h.size(); ++j) msg.fwd.push_back({r.blocks[j], h[j]});
        r.phase = Req::Running;
      } else if (r.phase == Req::Running && rng() % 5 != 0) {  // else skipped this step
        const uint64_t before = r.tokens.size();
        const uint32_t t = 7000000 + 100 * uint32_t(&r - reqs.data()) + uint32_t(before);
        r.tokens.push_back(t);
        sched.push_back({r.id, before, 1, {}, {t}});
        if (r.tokens.size() % kPage == 0) {
          const std::vector<uint64_t> h = hashes_of(r.tokens);
          msg.fwd.push_back({r.blocks[h.size() - 1], h.back()});
        }
        if (--r.decodes == 0) finishing.push_back(&r);
      }
    }
    kvt_status st = KVT_OK;
    msg.meta = build_meta(sc, sched, &st);
    v.check(st, {KVT_OK}, "build_connector_meta");
    const bool idle = sched.empty();
    steps.push(std::move(msg));
    for (Req *r : finishing) {
      v.check(kvt_connector_request_finished(&r->delay, sc, r->id.c_str()), {KVT_OK},
              "request_finished");
      --live;
      if (r->delay == 1) {
        r->phase = Req::Freeing;
      } else {
        give_back(*r);
        r->phase = Req::Done;
        ++done;
      }
    }
    // The next step once the runner has caught up, or the worker reported something.
    while (steps.size() > 2 && !stop) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (idle) {
      std::unique_lock lk(inbox.mu);
      inbox.cv.wait_for(lk, std::chrono::milliseconds(1), [&] { return !inbox.q.empty(); });
    }
  }
  joiner.join();
  for (Outcome &o : inbox.take_all())
    v.check(kvt_connector_update_connector_output(sc, o.report.data(), o.report.size()),
            {KVT_OK}, "update_connector_output");

  EXPECT_EQ(v.bad.load(), 0) << "first: " << v.first;
  EXPECT_EQ(bad_bytes.load(), 0) << "blocks loaded with the wrong bytes";
  EXPECT_EQ(bad_lists, 0);
  for (const Req &r : reqs) {
    EXPECT_EQ(r.phase, Req::Done) << r.id;
    EXPECT_EQ(r.sent, r.delay == 1 ? 1 : 0) << r.id << " in finished_sending";
    EXPECT_EQ(r.recved, r.want_recv) << r.id << " in finished_recving";
  }
  EXPECT_EQ(cstats(sc).matched_tokens, accepted);
  EXPECT_EQ(will_calls.load(), finished_calls.load()) << "hooks around a call came apart";
  EXPECT_GT(pauses.load(), 0) << "no breakpoint or pause ever stopped the scheduler";
  size_t n = 1;
  EXPECT_KVT(kvt_connector_slots(nullptr, 0, &n, sc), KVT_OK);
  EXPECT_EQ(n, 0u) << "slots left live";
  EXPECT_KVT(kvt_connector_batches(nullptr, 0, &n, sc), KVT_OK);
  EXPECT_EQ(n, 0u) << "batches never reported";
  EXPECT_EQ(stats(sm, store).active, 0u) << "pins left";
  EXPECT_KVT(kvt_manager_check(sm), KVT_OK);
}

}  // namespace

// One connector of role BOTH, eager stores to G2, loads the step waits for. At the end every
// block G2 holds has the bytes the engine computed for it.
TEST(Threads, ConnectorEveryCallFromSevenThreads) {
  Rig r(connector_config(KVT_ROLE_BOTH), seed_manager_config(64));
  ASSERT_NE(r.c, nullptr);
  run_engine(r.m.get(), KVT_TIER_G2, r.c, r.c, r.g1);
  for (size_t i = 0; i < requests(); ++i) {
    auto h = hashes_of(concat(token_range(10000 * (i % 4 + 1), 32),
                              token_range(100000 + 64 * i, 8 + 8 * (i % 2))));
    EXPECT_EQ(r.g2_holding(h), r.held(h)) << "R" << i;
  }
}

// The halves as two connectors over two managers (as in two processes), lazy stores to G3,
// asynchronous loads (finished_recving).
TEST(Threads, ConnectorHalvesApartEveryCallFromSevenThreads) {
  kvt_manager_config mc = seed_manager_config(0, 64);
  Rig sched(connector_config(KVT_ROLE_SCHEDULER, KVT_OFFLOAD_LAZY, KVT_TIER_G3, 1), mc);
  Rig work(connector_config(KVT_ROLE_WORKER, KVT_OFFLOAD_LAZY, KVT_TIER_G3, 1), mc);
  ASSERT_NE(sched.c, nullptr);
  ASSERT_NE(work.c, nullptr);
  run_engine(sched.m.get(), KVT_TIER_G3, sched.c, work.c, work.g1);
  EXPECT_KVT(kvt_manager_check(work.m.get()), KVT_OK);
}

// Worker calls that the header refuses while another call holds what they need, made by two
// threads at once: one bind wins and the other gets KVT_ERR_STATE, likewise one clear and one
// register_kv_caches, and the winner's metadata runs once (its stores are reported once).
TEST(Threads, ConnectorRacingWorkerCallsHaveOneWinner) {
  constexpr int kRounds = 100;
  Rig r;
  ASSERT_NE(r.c, nullptr);
  std::barrier sync(2);
  std::atomic<int> ok{0}, refused{0}, other{0};
  auto race = [&](const std::function<kvt_status()> &call) {
    auto one = [&] {
      sync.arrive_and_wait();
      kvt_status st = call();
      ++(st == KVT_OK ? ok : st == KVT_ERR_STATE ? refused : other);
    };
    std::thread t(one);
    one();
    t.join();
  };
  for (int i = 0; i < kRounds; ++i) {
    const std::string id = "A" + std::to_string(i);
    auto tokens = token_range(1000 + 100 * i, 40);
    auto h = hashes_of(tokens);
    const uint32_t b = 3 * uint32_t(i % 30);
    ASSERT_EQ(r.match(id, tokens).first, 0u);
    ASSERT_KVT_OK(r.alloc(id, {b, b + 1, b + 2}, 0));
    std::string meta = r.meta({{id, 0, 40}});
    race([&] { return kvt_connector_bind_connector_metadata(r.c, meta.data(), meta.size()); });
    ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
    r.g1.write(b, h[0]);
    r.g1.write(b + 1, h[1]);
    ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
    race([&] { return kvt_connector_clear_connector_metadata(r.c); });
    Finished f;
    ASSERT_TRUE(drain(r.c, r.c, &f, r.counts(2 * (i + 1), 0))) << id;
    EXPECT_EQ(r.finish(id), 0);
  }
  EXPECT_EQ(ok.load(), 2 * kRounds);
  EXPECT_EQ(refused.load(), 2 * kRounds);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(r.stats().store_failures, 0u) << "a store ran twice";

  ok = refused = other = 0;
  for (int i = 0; i < 10; ++i) {
    ManagerPtr m = make(seed_manager_config());
    kvt_connector_config cc = connector_config(KVT_ROLE_WORKER);
    kvt_connector *w = nullptr;
    ASSERT_KVT_OK(kvt_connector_create(&w, m.get(), &cc));
    EngineG1 g1;
    race([&] { return kvt_connector_register_kv_caches(w, &g1.layout, kGpuBlocks); });
    kvt_connector_destroy(w);
  }
  EXPECT_EQ(ok.load(), 10);
  EXPECT_EQ(refused.load(), 10);
  EXPECT_EQ(other.load(), 0);
}

// kvt_connector_pause stops the next scheduler call, which may name no request (reset_cache,
// build_connector_meta, update_connector_output): its pause has an empty req_id. UBSan saw
// the id copied with memcpy from a NULL data() in the stress tests above.
TEST(Threads, PauseAtACallThatNamesNoRequest) {
  Rig r;
  ASSERT_NE(r.c, nullptr);
  ASSERT_KVT_OK(kvt_connector_pause(r.c));
  kvt_status st = KVT_ERR_INTERNAL;
  std::thread t([&] { st = kvt_connector_reset_cache(r.c); });
  kvt_pause_info info{};
  info.struct_size = sizeof info;
  EXPECT_KVT(kvt_connector_pause_wait(&info, r.c, 10'000'000'000), KVT_OK);
  EXPECT_EQ(info.trigger, uint32_t(KVT_TRIGGER_RESET_CACHE));
  EXPECT_STREQ(info.req_id, "");
  EXPECT_KVT(kvt_connector_resume(r.c), KVT_OK);
  t.join();
  EXPECT_KVT(st, KVT_OK);
}
