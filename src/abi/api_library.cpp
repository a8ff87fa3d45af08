// Library-wide entry points: version, status names, last error.
#include "abi/objects.hpp"
#include "common/log.hpp"

#define KVT_STR2(x) #x
#define KVT_STR(x) KVT_STR2(x)

namespace kvt::abi {
kvt_status bad_object(const char *fn, const void *p, const char *type) noexcept {
  if (p == nullptr) return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the %s handle is NULL", fn, type);
  return fail(KVT_ERR_INVALID_HANDLE, "%s: %p is not a live kvtier %s", fn, p, type);
}
}  // namespace kvt::abi

extern "C" {

KVT_API const char *kvt_version(void) {
  return KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(KVT_VERSION_PATCH);
}

KVT_API const char *kvt_status_str(kvt_status s) {
  switch (s) {
    case KVT_OK: return "KVT_OK";
    case KVT_AGAIN: return "KVT_AGAIN";
    case KVT_TIMEOUT: return "KVT_TIMEOUT";
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

KVT_API const char *kvt_last_error(void) { return kvt::last_error(); }

KVT_API void kvt_set_log_callback(int level, kvt_log_fn fn, void *user_data) {
  kvt::set_log_callback(level, fn, user_data);
}

}  // extern "C"
