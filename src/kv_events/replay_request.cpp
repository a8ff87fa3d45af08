#include "kv_events/replay_request.hpp"

namespace kvt::pub {

ReplayRequest parse_replay_request(const std::string_view *frames, size_t count) noexcept {
  ReplayRequest r;
  if (count != kReplayRequestFrames)
    r.why = "not 3 frames (identity, empty, the start sequence number)";
  else if (frames[0].empty() || frames[0].size() > 255)
    r.why = "an identity that is not 1..255 bytes";
  else if (frames[2] == kSnapshotRequest)
    r.ok = r.snapshot = true;
  else if (frames[2].size() != 8)
    r.why = "a start sequence number that is not 8 bytes big-endian, nor KVTIER_SNAPSHOT";
  else {
    r.ok = true;
    r.start = get_be64(reinterpret_cast<const unsigned char *>(frames[2].data()));
  }
  return r;
}

void put_be64(unsigned char *p, uint64_t v) noexcept {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<unsigned char>(v);
}

uint64_t get_be64(const unsigned char *p) noexcept {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}

}  // namespace kvt::pub
