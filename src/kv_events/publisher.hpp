// The KV-event publisher: vLLM's ZmqEventPublisher in C++ (docs/KV_EVENTS.md). Tiers hand it
// their events through KvSink; its thread encodes what is pending as one batch each time it
// wakes and sends it on a PUB socket as [topic, seq (8 bytes big-endian), payload], keeping
// the last batches for a ROUTER socket that answers replay requests. Both sockets hand ZMQ
// the kept batch itself, never a copy, and count what ZMQ holds against the budgets of
// kv_events/send_ledger.hpp and kv_events/replay_ledger.hpp. The calls that cause events only
// take short locks: the network never holds them up.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "event/kv_sink.hpp"
#include "kvtier.h"
#include "kv_events/batch_encoder.hpp"
#include "kv_events/replay_ledger.hpp"
#include "kv_events/send_ledger.hpp"
#include "kv_events/token_memo.hpp"

namespace kvt::pub {

struct PublisherConfig {
  std::string endpoint, replay_endpoint, topic;  // replay_endpoint empty: no replay socket
  uint64_t buffer;      // batches kept for replay
  int32_t dp_rank;
  unsigned tiers;       // bit (1 << tier): published, and present
  uint32_t page_size;
  uint64_t memo_blocks;  // the tiers' total capacity
  kvt_kv_events_format format;
};

// vLLM's rule: bind an endpoint with a wildcard ("*" or "::") or of ipc:// or inproc://,
// connect to any other.
bool binds(const std::string &endpoint) noexcept;

class Publisher final : public KvSink {
 public:
  // Opens the sockets and starts the thread. An endpoint that ZMQ refuses:
  // KVT_ERR_INVALID_ARGUMENT (malformed, unknown transport) or KVT_ERR_IO (address in use,
  // no such interface), with ZMQ's message and the config field's name.
  static kvt_status create(std::unique_ptr<Publisher> *out, const PublisherConfig &c);
  // Sends what is pending, then stops the thread; ZMQ gets up to kLingerMs to deliver it.
  ~Publisher();
  Publisher(const Publisher &) = delete;
  Publisher &operator=(const Publisher &) = delete;

  void note_tokens(const uint64_t *seq_hashes, size_t n, const uint32_t *tokens) noexcept override;
  // Tells the memo which blocks the tiers hold, and has it keep each queued BlockStored's
  // tokens until the thread encodes it.
  void publish(const kvt_event *events, size_t n) noexcept override;

  // Fills the blocks a snapshot reports (docs/KV_EVENTS.md, Snapshots): BLOCK_STORED
  // events of the published tiers, their tokens not held.
  using SnapshotSource = std::function<void(std::vector<QueuedEvent> *)>;
  // Called on the publisher's thread; set to null (which waits for a snapshot under way)
  // before what the source reads goes away.
  void set_snapshot_source(SnapshotSource source);

  friend ReplayStats replay_stats(const KvSink &publisher) noexcept;
  friend SendStats send_stats(const KvSink &publisher) noexcept;
  friend bool publisher_idle(const KvSink &publisher) noexcept;

  static constexpr int kLingerMs = 1000;
  // Events waiting for the thread; past this many, the oldest waiting batch is dropped
  // whole and its sequence number skipped, so that subscribers see the gap.
  static constexpr size_t kMaxPending = size_t{1} << 18;
  // How long the thread lets events gather after the first wakes it: vLLM sends a batch per
  // engine step, and a wake-up per tier operation cost the engine's cores more than the
  // encoding (docs/BENCHMARKS.md, issue 25).
  static constexpr auto kGatherWindow = std::chrono::microseconds(1000);
  // Blocks per message of a snapshot's answer.
  static constexpr size_t kSnapshotBlocksPerBatch = 8192;
  // A snapshot answers the requests of this long after it was taken, as long as the replay
  // buffer holds the batches from its number on (an older snapshot is as right as a new
  // one: its number says where to go on from). So however many clients ask, the tiers are
  // read (each under its lock, one pass over its slots) at most once a period, or once per
  // buffer of batches the engine publishes.
  static constexpr auto kSnapshotReuse = std::chrono::seconds(1);

 private:
  explicit Publisher(const PublisherConfig &c);
  void run() noexcept;
  void send_batch(const std::vector<QueuedEvent> &events);
  void send_pub(const std::shared_ptr<const std::string> &batch);
  // Answers waiting replay requests, a few at a time: true when more may wait.
  bool serve_replay();
  // The client of id, and in *room the bytes a reply may hold besides its END_SEQ (the
  // least of what client_budget and the total budget leave); null when the request is
  // dropped, counted and logged: the client has kMaxRepliesPerClient replies in flight, or
  // no room for END_SEQ.
  std::shared_ptr<ReplayClient> admit(std::string_view id, uint64_t client_budget,
                                      uint64_t *room);
  void answer(std::string_view id, uint64_t start);
  void answer_snapshot(std::string_view id);
  using Messages = std::vector<std::pair<std::shared_ptr<const std::string>, uint64_t>>;
  uint64_t take_snapshot(Messages *out, uint64_t *next, uint64_t limit);  // (and their cost)
  void send_reply(std::string_view id, uint64_t seq, std::shared_ptr<const std::string> batch,
                  const std::shared_ptr<ReplayReply> &reply, uint64_t cost);
  uint64_t message_cost(const std::string &payload) const noexcept;
  // Bumps *count; true at the 1st, 2nd, 4th, 8th... bump, when to log: visible, never a flood.
  static bool bump_and_tell(std::atomic<uint64_t> *count) noexcept;
  void wake() noexcept;
  void drop_pending() noexcept;  // under mu_

  const PublisherConfig cfg_;
  TokenMemo memo_;
  BatchEncoder encoder_;
  void *ctx_ = nullptr, *pub_ = nullptr, *router_ = nullptr;
  int wake_fd_ = -1;  // eventfd: events are pending, or stop

  mutable std::mutex mu_;
  std::vector<QueuedEvent> pending_;  // guarded by mu_
  uint64_t dropped_ = 0;              // batches dropped since the thread last took pending_
  bool armed_ = false;                // the thread waits for wake_fd_
  bool stop_ = false;
  std::condition_variable gather_;  // cuts kGatherWindow short at stop

  std::mutex snapshot_mu_;  // held over each call of snapshot_
  SnapshotSource snapshot_;

  // The thread's own.
  uint64_t seq_ = 0;
  // The last snapshot, while kSnapshotReuse lasts: its messages (none when too big), its
  // number and its cost.
  Messages snapshot_messages_;
  uint64_t snapshot_next_ = 0, snapshot_cost_ = 0;
  std::chrono::steady_clock::time_point snapshot_at_{};
  uint64_t unknown_tokens_ = 0;  // stored blocks published with token_ids []
  std::string payload_;
  // The last cfg_.buffer batches: immutable, shared with the replies ZMQ still holds.
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> replay_;
  std::shared_ptr<SendLedger> sent_ = std::make_shared<SendLedger>();
  std::shared_ptr<ReplayLedger> ledger_ = std::make_shared<ReplayLedger>();
  // By identity; an entry expires with its client's last reply, and expired ones are
  // swept once the map doubles.
  std::unordered_map<std::string, std::weak_ptr<ReplayClient>> clients_;
  size_t sweep_at_ = 64;
  std::thread thread_;
};

// What the replay socket of a publisher (a manager's kv_sink()) did and holds; callable from
// any thread. UBSan's check of the downcast is off: the tests that call it see this class but
// not its typeinfo, which the library hides.
__attribute__((no_sanitize("vptr"))) inline ReplayStats replay_stats(
    const KvSink &publisher) noexcept {
  return static_cast<const Publisher &>(publisher).ledger_->stats();
}

// What the PUB socket of a publisher sent and holds; callable from any thread.
__attribute__((no_sanitize("vptr"))) inline SendStats send_stats(const KvSink &publisher) noexcept {
  return static_cast<const Publisher &>(publisher).sent_->stats();
}

// Whether the publisher's thread has sent (or skipped) every event published so far and
// waits for more; callable from any thread.
__attribute__((no_sanitize("vptr"))) inline bool publisher_idle(const KvSink &publisher) noexcept {
  const auto &p = static_cast<const Publisher &>(publisher);
  std::lock_guard lock(p.mu_);
  return p.armed_ && p.pending_.empty() && p.dropped_ == 0;
}

}  // namespace kvt::pub
