// A replay request as the ROUTER delivers it (docs/KV_EVENTS.md, Replay): [identity,
// delimiter, start seq (8 bytes big-endian)]. Pure, so that fuzz_replay_request drives it
// byte for byte; the publisher only reads frames and acts on the result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvt::pub {

// The frames of a request the parser looks at; the publisher reads the others and drops them.
constexpr size_t kReplayRequestFrames = 3;

// kvtier's addition (docs/KV_EVENTS.md, Snapshots): this third frame instead of a start
// asks for every block the instance holds. vLLM's publisher reads it as a start beyond its
// newest batch, and answers END_SEQ alone.
inline constexpr std::string_view kSnapshotRequest = "KVTIER_SNAPSHOT";

struct ReplayRequest {
  bool ok = false;
  bool snapshot = false;       // ok: a snapshot, not a replay
  uint64_t start = 0;          // ok, a replay: the first seq asked for
  const char *why = nullptr;   // !ok: what is wrong with it, for the log
};

// frames: the first min(count, kReplayRequestFrames) frames of a message of `count` frames.
// A request is three frames: an identity of 1..255 bytes (ZMQ's bounds), a delimiter whose
// content is not checked (vLLM's ROUTER does not check it either) and 8 bytes of start, or
// kSnapshotRequest.
ReplayRequest parse_replay_request(const std::string_view *frames, size_t count) noexcept;

void put_be64(unsigned char *p, uint64_t v) noexcept;
uint64_t get_be64(const unsigned char *p) noexcept;

}  // namespace kvt::pub
