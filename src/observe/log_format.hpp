// The event log's bytes (docs/EVENTS.md): a 16-byte file header, then one record per event,
// each a little-endian u32 payload length and u32 XXH32 of the payload before the payload.
// Format 2 lets a CALL record carry its call's arguments after the request id.
// A reader trusts a record only when its length, checksum and fields all hold, so a tail
// torn by a killed writer is cut, never misread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt::obs {

inline constexpr char kLogMagic[8] = {'K', 'V', 'T', 'E', 'V', 'L', 'O', 'G'};
inline constexpr uint32_t kLogFormat = 2;  // this kvtier writes 2 and reads 1 and 2
inline constexpr size_t kLogHeaderBytes = 16;  // magic, format, schema
inline constexpr size_t kRecordHeadBytes = 8;  // length, checksum
inline constexpr size_t kPayloadFixed = 118;   // the payload without the request id
inline constexpr size_t kMaxPayload = kPayloadFixed + KVT_REQ_ID_MAX + kMaxCallArgs;

void encode_header(std::string *out);
// KVT_OK, or the status and message for n bytes that do not start an event log.
kvt_status check_header(const uint8_t *p, size_t n);

void encode_record(const ObsEvent &e, std::string *out);

// The payload length the record at p[0..n) claims (n >= kRecordHeadBytes).
uint32_t record_length(const uint8_t *p);

enum class Decoded { Ok, Short, Bad };
// The record at p[0..n): Ok with the event, a CALL's arguments in *args (may be null: not
// wanted) and *used bytes; Short when the bytes end inside it; Bad when its length,
// checksum or fields are wrong (*why says which).
Decoded decode_record(const uint8_t *p, size_t n, kvt_obs_event *out, std::string *args,
                      size_t *used, const char **why);

}  // namespace kvt::obs
