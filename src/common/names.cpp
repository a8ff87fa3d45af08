#include "common/names.hpp"

namespace kvt {

const char *status_name(kvt_status s) noexcept {
  switch (s) {
    case KVT_OK: return "KVT_OK";
    case KVT_AGAIN: return "KVT_AGAIN";
    case KVT_TIMEOUT: return "KVT_TIMEOUT";
    case KVT_ITEROVER: return "KVT_ITEROVER";
    case KVT_ERR_INVALID_ARGUMENT: return "KVT_ERR_INVALID_ARGUMENT";
    case KVT_ERR_INVALID_HANDLE: return "KVT_ERR_INVALID_HANDLE";
    case KVT_ERR_STATE: return "KVT_ERR_STATE";
    case KVT_ERR_NO_SPACE: return "KVT_ERR_NO_SPACE";
    case KVT_ERR_CANCELLED: return "KVT_ERR_CANCELLED";
    case KVT_ERR_UNSUPPORTED: return "KVT_ERR_UNSUPPORTED";
    case KVT_ERR_IO: return "KVT_ERR_IO";
    case KVT_ERR_CORRUPT: return "KVT_ERR_CORRUPT";
    case KVT_ERR_NO_MEMORY: return "KVT_ERR_NO_MEMORY";
    case KVT_ERR_CUDA: return "KVT_ERR_CUDA";
    case KVT_ERR_NOT_FOUND: return "KVT_ERR_NOT_FOUND";
    case KVT_ERR_INTERNAL: return "KVT_ERR_INTERNAL";
  }
  return "KVT_UNKNOWN_STATUS";
}

const char *slot_state_name(uint32_t s) noexcept {
  switch (s) {
    case KVT_SLOT_INITIALIZED: return "KVT_SLOT_INITIALIZED";
    case KVT_SLOT_ONBOARD_STAGED: return "KVT_SLOT_ONBOARD_STAGED";
    case KVT_SLOT_ONBOARDING: return "KVT_SLOT_ONBOARDING";
    case KVT_SLOT_PREFILLING: return "KVT_SLOT_PREFILLING";
    case KVT_SLOT_DECODING: return "KVT_SLOT_DECODING";
    case KVT_SLOT_SKIPPED_PREFILL: return "KVT_SLOT_SKIPPED_PREFILL";
    case KVT_SLOT_SKIPPED_DECODE: return "KVT_SLOT_SKIPPED_DECODE";
    case KVT_SLOT_PREEMPTED: return "KVT_SLOT_PREEMPTED";
    case KVT_SLOT_FINISHING: return "KVT_SLOT_FINISHING";
    case KVT_SLOT_FINISHED: return "KVT_SLOT_FINISHED";
  }
  return "KVT_SLOT_UNKNOWN";
}

}  // namespace kvt
