// A scheduler call's arguments as an event log keeps them in its CALL records
// (docs/EVENTS.md), so that kvt_event_log_rerun can make the call again: little-endian
// varints, and u32 arrays as runs of consecutive values (what block ids, and synthetic
// prompts, mostly are). update_connector_output keeps its report's own bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier.h"

namespace kvt::conn {

struct CallArgs {
  std::vector<uint32_t> ids;  // get_num_new_matched_tokens: tokens; update_state_after_alloc:
                              // block ids
  uint64_t number = 0;        // num_computed_tokens; num_external_tokens
  // get_num_new_matched_tokens with the slot's own tokens (those it matched last, and what
  // build_connector_meta appended since): their number, not the tokens, is logged.
  bool own_tokens = false;
  uint64_t num_tokens = 0;
  bool salted = false;        // get_num_new_matched_tokens_salted, with this salt
  uint64_t salt = 0;
  uint64_t max_tokens = UINT64_MAX;  // get_num_new_matched_tokens_max's cap
  struct Scheduled {
    std::string req_id;
    uint64_t computed = 0, scheduled = 0;
    std::vector<uint32_t> blocks, tokens;
  };
  std::vector<Scheduled> reqs;  // build_connector_meta
  std::string report;           // update_connector_output

  // reqs as the call takes them, pointing into reqs.
  std::vector<kvt_scheduled_request> schedule() const;
};

// own: the tokens are the slot's own (see CallArgs::own_tokens); only n is written then.
// salt: the request's own salt, or NULL for the connector's; max_tokens: the cap, or
// UINT64_MAX for none.
void encode_matched(std::string *out, const uint32_t *tokens, size_t n, uint64_t computed,
                    bool own, const uint64_t *salt, uint64_t max_tokens);
void encode_alloc(std::string *out, const uint32_t *blocks, size_t n, uint64_t external);
// Only for a schedule that build_connector_meta accepted (every id valid).
void encode_schedule(std::string *out, const kvt_scheduled_request *reqs, size_t n);

// The arguments of a call `trigger` (kvt_obs_trigger) from bytes[0..n): KVT_OK, or
// KVT_ERR_CORRUPT with what is wrong. Any bytes are safe, and at most 4 Mi values are
// decoded from one call. Only the encoders' own output decodes (one encoding per value).
kvt_status decode_call(CallArgs *out, uint32_t trigger, const uint8_t *bytes, size_t n);

}  // namespace kvt::conn
