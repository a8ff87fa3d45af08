#include "core.hpp"

#include "kvtier.h"

namespace kvt::router {

std::optional<uint64_t> seq_of(std::string_view frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (unsigned char c : frame) v = v << 8 | c;
  return v;
}

ReplayReply replay_reply(const std::vector<std::string_view> &frames) {
  constexpr uint64_t kEndSeq = ~uint64_t(0);  // -1 as 8 signed big-endian bytes
  ReplayReply r;
  if ((frames.size() != 3 && frames.size() != 4) || !frames[0].empty()) {
    r.why = "a reply of " + std::to_string(frames.size()) + " frames";
    return r;
  }
  const std::string_view seq = frames[frames.size() - 2], payload = frames.back();
  std::optional<uint64_t> s = seq_of(seq);
  if (!s) {
    r.why = "a sequence frame of " + std::to_string(seq.size()) + " bytes";
    return r;
  }
  if (*s == kEndSeq && payload.empty()) {
    r.kind = ReplayReply::End;
    return r;
  }
  r.kind = ReplayReply::Batch;
  r.seq = *s;
  r.payload = payload;
  return r;
}

size_t Core::add_instance(std::string name) {
  std::lock_guard lock(mu_);
  names_.push_back(std::move(name));
  stats_.emplace_back();
  stale_.push_back(false);
  snapshot_broken_.push_back(false);
  gap_end_.push_back(0);
  caught_up_.emplace_back();
  return index_.add_instance();
}

void Core::apply(size_t inst, uint64_t seq, std::string_view payload) {
  stats_[inst].last_seq = seq;
  apply_payload(inst, payload, seq);
}

bool Core::apply_payload(size_t inst, std::string_view payload, std::optional<uint64_t> seq) {
  StreamStats &s = stats_[inst];
  Batch b;
  std::string error;
  if (!decode_batch(reinterpret_cast<const uint8_t *>(payload.data()), payload.size(), &b,
                    &error)) {
    ++s.bad;
    s.last_error = (seq ? "seq " + std::to_string(*seq) : std::string("snapshot")) + ": " + error;
    return false;
  }
  index_.apply(inst, b);
  s.events += b.events.size();
  return true;
}

std::optional<uint64_t> Core::deliver(size_t inst, const std::vector<std::string_view> &frames) {
  std::lock_guard lock(mu_);
  last_arrival_ = std::chrono::steady_clock::now();
  StreamStats &s = stats_[inst];
  if (frames.size() != 3) {
    ++s.bad;
    s.last_error = "a message of " + std::to_string(frames.size()) + " frames, not 3";
    return std::nullopt;
  }
  std::optional<uint64_t> seq = seq_of(frames[1]);
  if (!seq) {
    ++s.bad;
    s.last_error = "a sequence frame of " + std::to_string(frames[1].size()) + " bytes, not 8";
    return std::nullopt;
  }
  if (caught_up_[inst] && *seq <= *caught_up_[inst]) {
    ++s.duplicates;  // sent live while the catch-up replayed it
    return std::nullopt;
  }
  caught_up_[inst].reset();
  if (s.last_seq && *seq <= *s.last_seq) {
    // Live numbers only grow: the publisher started over, and its cache with it.
    ++s.restarts;
    s.last_seq.reset();
    index_.clear(inst);
  }
  const uint64_t expected = s.last_seq ? *s.last_seq + 1 : 0;
  if (*seq > expected) {
    gap_end_[inst] = *seq;
    return expected;
  }
  ++s.messages;
  apply(inst, *seq, frames[2]);
  return std::nullopt;
}

void Core::deliver_replayed(size_t inst, uint64_t seq, std::string_view payload) {
  std::lock_guard lock(mu_);
  last_arrival_ = std::chrono::steady_clock::now();
  StreamStats &s = stats_[inst];
  const uint64_t expected = s.last_seq ? *s.last_seq + 1 : 0;
  if (seq < expected) {
    ++s.duplicates;
    return;
  }
  // The replay buffer runs on to the newest message, past the gap: those after it arrive
  // live too, and are applied then.
  if (seq >= gap_end_[inst]) return;
  if (seq > expected) {  // the replay buffer no longer held them
    s.lost += seq - expected;
    stale_[inst] = true;
  }
  ++s.replayed;
  apply(inst, seq, payload);
}

std::optional<uint64_t> Core::catch_up(size_t inst) {
  std::lock_guard lock(mu_);
  if (stats_[inst].last_seq) return std::nullopt;
  gap_end_[inst] = UINT64_MAX;
  return 0;
}

uint64_t Core::resync(size_t inst) {
  std::lock_guard lock(mu_);
  gap_end_[inst] = UINT64_MAX;
  return stats_[inst].last_seq ? *stats_[inst].last_seq + 1 : 0;
}

void Core::caught_up(size_t inst) {
  std::lock_guard lock(mu_);
  caught_up_[inst] = stats_[inst].last_seq;
}

void Core::bad_reply(size_t inst, std::string why) {
  std::lock_guard lock(mu_);
  ++stats_[inst].bad;
  stats_[inst].last_error = "replay: " + std::move(why);
}

void Core::replay_missed(size_t inst) {
  std::lock_guard lock(mu_);
  StreamStats &s = stats_[inst];
  const uint64_t expected = s.last_seq ? *s.last_seq + 1 : 0;
  if (gap_end_[inst] == UINT64_MAX || gap_end_[inst] <= expected) return;
  s.lost += gap_end_[inst] - expected;
  s.last_seq = gap_end_[inst] - 1;
  stale_[inst] = true;
}

bool Core::stale(size_t inst) const {
  std::lock_guard lock(mu_);
  return stale_[inst];
}

void Core::deliver_snapshot(size_t inst, std::string_view payload) {
  std::lock_guard lock(mu_);
  last_arrival_ = std::chrono::steady_clock::now();
  if (!apply_payload(inst, payload, std::nullopt)) snapshot_broken_[inst] = true;
}

void Core::end_snapshot(size_t inst, uint64_t next) {
  std::lock_guard lock(mu_);
  StreamStats &s = stats_[inst];
  s.last_seq = next == 0 ? std::nullopt : std::optional<uint64_t>(next - 1);
  caught_up_[inst] = s.last_seq;
  stale_[inst] = snapshot_broken_[inst];  // a message of it was bad: still stale
  snapshot_broken_[inst] = false;
  ++s.snapshots;
}

void Core::snapshot_failed(size_t inst) {
  std::lock_guard lock(mu_);
  stale_[inst] = true;
  snapshot_broken_[inst] = false;
}

Answer Core::route(const std::vector<uint32_t> &tokens) const {
  size_t n = 0;
  kvt_hash_tokens(nullptr, 0, &n, salt_, tokens.data(), tokens.size(), page_);
  std::vector<uint64_t> h(n);
  if (n > 0) kvt_hash_tokens(h.data(), n, &n, salt_, tokens.data(), tokens.size(), page_);
  return route_hashes(h);
}

Answer Core::route_hashes(const std::vector<uint64_t> &h) const {
  std::lock_guard lock(mu_);
  Answer a;
  a.blocks = h.size();
  size_t top = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    size_t k = index_.prefix(i, h.data(), h.size());
    a.overlap.push_back(k);
    if (k > top) {
      top = k;
      a.best = i;
    }
    auto &per = a.by_medium.emplace_back();
    for (const std::string &m : index_.media())
      per.push_back(k == 0 ? 0 : index_.prefix(i, h.data(), k, m));
  }
  return a;
}

StreamStats Core::stats(size_t inst) const {
  std::lock_guard lock(mu_);
  return stats_[inst];
}

std::vector<std::string> Core::media() const {
  std::lock_guard lock(mu_);
  return index_.media();
}

std::vector<uint64_t> Core::hashes(size_t inst, const std::optional<std::string> &medium) const {
  std::lock_guard lock(mu_);
  return index_.hashes(inst, medium);
}

std::chrono::steady_clock::time_point Core::last_arrival() const {
  std::lock_guard lock(mu_);
  return last_arrival_;
}

}  // namespace kvt::router
