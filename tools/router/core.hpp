// kvtier-router's core, without sockets: the instances' event streams (sequence numbers,
// gaps, restarts, bad messages), their index, and the answer for a request's tokens.
// Thread-safe: one thread delivers messages while others route.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "index.hpp"

namespace kvt::router {

struct StreamStats {
  uint64_t messages = 0;    // delivered live, good or bad
  uint64_t replayed = 0;    // delivered through the replay socket
  uint64_t duplicates = 0;  // replayed messages already seen
  uint64_t bad = 0;         // wrong frames or undecodable payloads, skipped
  uint64_t lost = 0;        // sequence numbers never received, not even by replay (a
                            // snapshot may stand in for them)
  uint64_t restarts = 0;    // the publisher started over (its sequence went back)
  uint64_t snapshots = 0;   // the index rebuilt from the publisher's snapshot
  uint64_t events = 0;      // events applied
  std::optional<uint64_t> last_seq;
  std::string last_error;   // why the last bad message was refused
};

struct Answer {
  size_t blocks = 0;                 // full blocks of the request
  std::optional<size_t> best;        // the instance with the longest prefix; none if all 0
  std::vector<size_t> overlap;       // per instance: leading blocks it holds, any medium
  // per instance, per medium (Index::media order): leading blocks held in that medium
  std::vector<std::vector<size_t>> by_medium;
};

class Core {
 public:
  Core(uint64_t salt_hash, uint32_t page_size) : salt_(salt_hash), page_(page_size) {}

  size_t add_instance(std::string name);
  const std::string &name(size_t inst) const { return names_[inst]; }
  size_t instances() const { return names_.size(); }

  // A live message's frames [topic, seq (8 bytes big-endian), payload]. Returns the first
  // missing sequence number when the message shows a gap before it (or arrives first with
  // a number above 0): the caller replays from there (deliver_replayed) and then delivers
  // this message again. Otherwise applies it and returns nothing.
  std::optional<uint64_t> deliver(size_t inst, const std::vector<std::string_view> &frames);
  // A message from the replay socket: [seq, payload]. Only those in the gap that the last
  // deliver reported are applied: ones already seen, and ones from the live message on
  // (they also arrive live), are skipped.
  void deliver_replayed(size_t inst, uint64_t seq, std::string_view payload);
  // Before the first live message: asks the caller to replay everything the publisher
  // still buffers (returns 0), unless something was delivered already. Live messages that
  // the catch-up already applied then count as duplicates, not as a restart.
  std::optional<uint64_t> catch_up(size_t inst);
  // The catch-up's replay is over.
  void caught_up(size_t inst);
  // For an instance quiet a while: the seq to replay from (the next expected), every reply
  // applied. Messages lost at the end of a burst are otherwise never noticed, as no later
  // message shows them missing (a subscriber that connected after the burst, say).
  uint64_t resync(size_t inst);
  // A bad reply from the replay socket: counted, with why.
  void bad_reply(size_t inst, std::string why);
  // After the replay of the gap the last deliver reported (or none: no replay socket, or
  // no answer): the messages it did not bring are lost, and the live message at its end
  // is applied next (the index is stale).
  void replay_missed(size_t inst);
  // Whether the instance's index may lack what lost messages said: a gap that replay did
  // not fill, or a snapshot cut short. A snapshot makes it whole again.
  bool stale(size_t inst) const;

  // A snapshot (docs/KV_EVENTS.md, Snapshots): each message of its answer, in order (the
  // first begins with AllBlocksCleared, so the index starts over), all numbered `next`;
  // then end_snapshot with that number: the index holds what the instance held when the
  // live messages from `next` on began, and earlier ones count as duplicates. A snapshot
  // cut short leaves the index stale (snapshot_failed).
  void deliver_snapshot(size_t inst, std::string_view payload);
  void end_snapshot(size_t inst, uint64_t next);
  void snapshot_failed(size_t inst);

  // The instance with the longest cached prefix of these tokens, and every overlap.
  Answer route(const std::vector<uint32_t> &tokens) const;
  // The same, for sequence hashes already computed.
  Answer route_hashes(const std::vector<uint64_t> &hashes) const;

  StreamStats stats(size_t inst) const;
  std::vector<std::string> media() const;
  std::vector<uint64_t> hashes(size_t inst, const std::optional<std::string> &medium) const;
  // When the last message of any instance arrived (steady clock); at first, the Core's
  // construction.
  std::chrono::steady_clock::time_point last_arrival() const;

 private:
  // Applies the payload of message `seq`, which is the next one expected (or after a gap
  // counted lost). Holds mu_.
  void apply(size_t inst, uint64_t seq, std::string_view payload);
  // Decodes a payload and applies it to the index; false, counted bad with why (naming the
  // message's seq, or the snapshot), when it does not decode. Holds mu_.
  bool apply_payload(size_t inst, std::string_view payload, std::optional<uint64_t> seq);

  const uint64_t salt_;
  const uint32_t page_;
  mutable std::mutex mu_;
  std::vector<std::string> names_;
  std::vector<StreamStats> stats_;
  std::vector<bool> stale_;
  std::vector<bool> snapshot_broken_;  // a message of the snapshot under way was bad
  std::vector<uint64_t> gap_end_;   // the live message after the last gap reported
  std::vector<std::optional<uint64_t>> caught_up_;  // the last seq the catch-up applied
  Index index_;
  std::chrono::steady_clock::time_point last_arrival_ = std::chrono::steady_clock::now();
};

// The request frame that asks a kvtier publisher's replay socket for a snapshot.
inline constexpr std::string_view kSnapshotRequest = "KVTIER_SNAPSHOT";

// The 8-byte big-endian sequence number frame; nothing if it is not 8 bytes.
std::optional<uint64_t> seq_of(std::string_view frame);

// One reply of a replay (ROUTER) socket as a DEALER receives it: vLLM main's
// [empty, topic, seq, payload], ending with [empty, empty, -1 (8 bytes), empty], or vLLM
// 0.10/0.11's [empty, seq, payload], ending with [empty, -1, empty].
struct ReplayReply {
  enum Kind { Batch, End, Bad } kind = Bad;
  uint64_t seq = 0;          // Batch
  std::string_view payload;  // Batch
  std::string why;           // Bad
};
ReplayReply replay_reply(const std::vector<std::string_view> &frames);

}  // namespace kvt::router
