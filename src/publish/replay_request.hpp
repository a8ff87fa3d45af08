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

struct ReplayRequest {
  bool ok = false;
  uint64_t start = 0;          // ok: the first seq asked for
  const char *why = nullptr;   // !ok: what is wrong with it, for the log
};

// frames: the first min(count, kReplayRequestFrames) frames of a message of `count` frames.
// A request is three frames: an identity of 1..255 bytes (ZMQ's bounds), a delimiter whose
// content is not checked (vLLM's ROUTER does not check it either) and 8 bytes of start.
ReplayRequest parse_replay_request(const std::string_view *frames, size_t count) noexcept;

void put_be64(unsigned char *p, uint64_t v) noexcept;
uint64_t get_be64(const unsigned char *p) noexcept;

}  // namespace kvt::pub
