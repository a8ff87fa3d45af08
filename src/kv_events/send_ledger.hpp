// What the PUB socket holds for subscribers that have not read it, counted as the replay
// socket's replies are (kv_events/replay_ledger.hpp): a batch counts from its send until ZMQ
// frees it, once every subscriber's queue has let go of it (ZMQ shares one copy among them).
// Past the budget a batch is not sent: subscribers see the gap in seq and may replay it, and
// one subscriber that never reads pins no more than the budget. ZMTP heartbeats drop such a
// subscriber, and what it held comes back.
#pragma once

#include <atomic>
#include <cstdint>

namespace kvt::pub {

constexpr uint64_t kSendBudgetBytes = uint64_t{64} << 20;
// Counted per message beside its payload and topic: the seq frame, ZMQ's message, the lease.
constexpr uint64_t kSendMessageOverhead = 512;
// Messages each subscriber's queue may hold (ZMQ_SNDHWM). vLLM's is 100,000; the budget
// bounds their bytes, and this their count, which ZMQ keeps per subscriber (some 200 bytes
// each).
constexpr int kSendHwm = 10000;
// ZMTP PING every second; a peer that answers nothing for 10 s is dropped. A subscriber
// whose application stops reading stops answering once its queue is full.
constexpr int kHeartbeatIvlMs = 1000;
constexpr int kHeartbeatTimeoutMs = 10000;

// Publisher::send_stats: counts since create, and the bytes held now.
struct SendStats {
  uint64_t sent;        // batches handed to the PUB socket
  uint64_t skipped;     // batches not sent: the budget was held (a gap in seq)
  uint64_t bytes;       // the cost of the batches ZMQ holds now
  uint64_t peak_bytes;  // the most `bytes` was
  uint64_t budget;
};

struct SendLedger {
  std::atomic<uint64_t> bytes{0};
  // Written by the publisher's thread only; atomic for send_stats.
  std::atomic<uint64_t> sent{0}, skipped{0}, peak_bytes{0};

  SendStats stats() const noexcept {
    auto get = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
    return SendStats{get(sent), get(skipped), get(bytes), get(peak_bytes), kSendBudgetBytes};
  }
};

}  // namespace kvt::pub
