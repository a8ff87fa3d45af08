#include "connector/slot.hpp"

#include <cstring>

#include "common/error.hpp"

namespace kvt::conn {

bool legal(SlotState from, SlotState to) noexcept {
  switch (to) {
    case KVT_SLOT_ONBOARD_STAGED:
      return from == KVT_SLOT_INITIALIZED || from == KVT_SLOT_PREEMPTED;
    case KVT_SLOT_ONBOARDING:
      return from == KVT_SLOT_ONBOARD_STAGED;
    case KVT_SLOT_INITIALIZED:
      return from == KVT_SLOT_ONBOARD_STAGED;
    case KVT_SLOT_PREFILLING:
      return from == KVT_SLOT_INITIALIZED || from == KVT_SLOT_ONBOARDING ||
             from == KVT_SLOT_PREEMPTED || from == KVT_SLOT_PREFILLING ||
             from == KVT_SLOT_SKIPPED_PREFILL;
    case KVT_SLOT_DECODING:
      return from == KVT_SLOT_PREFILLING || from == KVT_SLOT_DECODING ||
             from == KVT_SLOT_SKIPPED_PREFILL || from == KVT_SLOT_SKIPPED_DECODE;
    case KVT_SLOT_SKIPPED_PREFILL:
      return from == KVT_SLOT_PREFILLING;
    case KVT_SLOT_SKIPPED_DECODE:
      return from == KVT_SLOT_DECODING;
    case KVT_SLOT_PREEMPTED:
      return from == KVT_SLOT_INITIALIZED || from == KVT_SLOT_ONBOARD_STAGED ||
             from == KVT_SLOT_ONBOARDING ||
             from == KVT_SLOT_PREFILLING || from == KVT_SLOT_DECODING ||
             from == KVT_SLOT_SKIPPED_PREFILL || from == KVT_SLOT_SKIPPED_DECODE;
    case KVT_SLOT_FINISHING:
      return from != KVT_SLOT_FINISHING && from != KVT_SLOT_FINISHED;
    case KVT_SLOT_FINISHED:
      return from == KVT_SLOT_FINISHING;
  }
  return false;
}

kvt_status check_id(const char *fn, const char *id) noexcept {
  if (id == nullptr) return fail(KVT_ERR_INVALID_ARGUMENT, "%s: req_id must not be NULL", fn);
  size_t n = strnlen(id, KVT_REQ_ID_MAX + 1);
  if (n == 0) return fail(KVT_ERR_INVALID_ARGUMENT, "%s: req_id is empty", fn);
  if (n > KVT_REQ_ID_MAX)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: req_id is longer than %d bytes", fn,
                KVT_REQ_ID_MAX);
  return KVT_OK;
}

}  // namespace kvt::conn
