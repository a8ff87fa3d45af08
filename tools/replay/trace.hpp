// A serving trace in Mooncake's JSONL form: one request per line, each a chain of block ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvt::replay {

// The trace's tokens per id, fixed by its README: token j of id h is h * kTokensPerId + j.
inline constexpr uint32_t kTokensPerId = 512;

struct Request {
  uint64_t timestamp_ms;
  size_t first_id, n_ids;  // its ids are Trace::ids[first_id, first_id + n_ids)
  size_t line;             // 1-based line in the file, for messages
  // Prompt tokens (input_length when it ends within the last id's tokens, else
  // n_ids * kTokensPerId) and tokens to sample (output_length, at least 1). Only --mode engine uses
  // them.
  uint64_t input_length = 0, output_length = 1;
};

struct Trace {
  std::vector<Request> requests;
  std::vector<uint32_t> ids;  // every request's hash_ids, back to back
  uint64_t blocks = 0;        // sum of n_ids
};

// Ids must keep every token of theirs within a uint32_t.
inline constexpr uint64_t kMaxId = (uint64_t{1} << 32) / kTokensPerId - 1;

// The first n tokens of rq's prompt (n at most rq.n_ids * kTokensPerId) into out.
inline void prompt_tokens(const Trace &t, const Request &rq, size_t n, uint32_t *out) {
  for (size_t k = 0; k < n; ++k)
    out[k] = t.ids[rq.first_id + k / kTokensPerId] * kTokensPerId + uint32_t(k % kTokensPerId);
}

// Reads the trace; on failure returns false with *error naming the file and, for a bad line,
// the line number and what is wrong with it.
bool load_trace(const std::string &path, Trace *out, std::string *error);

}  // namespace kvt::replay
