// What the replay socket's replies hold, counted exactly: a reply's message is counted when
// the publisher hands it to ZMQ and uncounted when ZMQ frees it (its free callback, on ZMQ's
// I/O thread), so that clients that do not read can pin at most the budgets below
// (docs/KV_EVENTS.md, Replay). Shared by the publisher and every message in flight, which
// may outlive it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace kvt::pub {

// Counted per reply message beside its payload (and topic): ZMQ's frames and content, the
// lease; so that a flood of small or empty messages is bounded too.
constexpr uint64_t kReplayMessageOverhead = 512;
// Replies a client may have in flight (some message not yet freed); past it, a request is
// dropped. vLLM's REQ clients have one at most.
constexpr uint32_t kMaxRepliesPerClient = 2;
// A snapshot may hold this much in flight for its client even where the replay buffer is
// smaller (a few million blocks: its token_ids are empty); the total budget still holds.
constexpr uint64_t kSnapshotClientBytesMin = uint64_t{64} << 20;
// All clients together: at least this much, or kReplayTotalFullReplies full replays.
constexpr uint64_t kReplayTotalBytesMin = uint64_t{64} << 20;
constexpr uint64_t kReplayTotalFullReplies = 2;

// Publisher::replay_stats: counts since create, and the bytes in flight now.
struct ReplayStats {
  uint64_t requests;           // messages read from the ROUTER and handled: counted last
  uint64_t malformed;          // of them, not a replay request: ignored
  uint64_t full;               // answered with every kept batch from their start, then END_SEQ
  uint64_t cut;                // answered with fewer (a budget ran out), then END_SEQ
  uint64_t dropped;            // not answered: replies or budget exhausted
  uint64_t snapshots;          // snapshot requests answered with the blocks, then END_SEQ
  uint64_t snapshots_refused;  // answered with END_SEQ alone: bigger than the room left
  uint64_t bytes;              // the cost of the reply messages ZMQ holds now
  uint64_t peak_bytes;         // the most `bytes` was
  uint64_t peak_client_bytes;  // the most one client had in flight
  uint64_t kept_batches;
  uint64_t client_budget;  // every kept batch, and an END_SEQ per reply in flight
  uint64_t total_budget;
};

struct ReplayLedger {
  std::atomic<uint64_t> bytes{0};
  // Written by the publisher's thread only; atomic for replay_stats.
  std::atomic<uint64_t> requests{0}, malformed{0}, full{0}, cut{0}, dropped{0};
  std::atomic<uint64_t> snapshots{0}, snapshots_refused{0};
  std::atomic<uint64_t> peak_bytes{0}, peak_client_bytes{0};
  std::atomic<uint64_t> kept_batches{0}, kept_cost{0};

  // A client may hold one full replay, and an END_SEQ for each reply it may have: a request
  // while its first reply is in flight gets at least END_SEQ. All clients together a few.
  uint64_t client_budget() const noexcept {
    return kept_cost.load(std::memory_order_relaxed) +
           kMaxRepliesPerClient * kReplayMessageOverhead;
  }
  uint64_t total_budget() const noexcept {
    return std::max(kReplayTotalBytesMin, kReplayTotalFullReplies * client_budget());
  }
  ReplayStats stats() const noexcept {
    // requests first, with acquire: the outcomes counted before it are seen.
    const uint64_t handled = requests.load(std::memory_order_acquire);
    auto get = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
    return ReplayStats{handled,         get(malformed),          get(full),
                       get(cut),        get(dropped),            get(snapshots),
                       get(snapshots_refused), get(bytes),       get(peak_bytes),
                       get(peak_client_bytes), get(kept_batches), client_budget(),
                       total_budget()};
  }
};

// One client (ROUTER identity) with replies in flight; alive while one is.
struct ReplayClient {
  explicit ReplayClient(std::shared_ptr<ReplayLedger> l) : ledger(std::move(l)) {}
  std::shared_ptr<ReplayLedger> ledger;
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint32_t> replies{0};
};

// A reply in flight: each of its messages holds it, so it ends when ZMQ frees the last one.
struct ReplayReply {
  explicit ReplayReply(std::shared_ptr<ReplayClient> c) : client(std::move(c)) {
    client->replies.fetch_add(1, std::memory_order_relaxed);
  }
  ~ReplayReply() { client->replies.fetch_sub(1, std::memory_order_release); }
  ReplayReply(const ReplayReply &) = delete;
  ReplayReply &operator=(const ReplayReply &) = delete;
  std::shared_ptr<ReplayClient> client;
};

}  // namespace kvt::pub
