// Library-wide entry points: version, status names, last error.
#include "abi/objects.hpp"
#include "common/log.hpp"
#include "common/names.hpp"

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

KVT_API const char *kvt_status_str(kvt_status s) { return kvt::status_name(s); }

KVT_API const char *kvt_last_error(void) { return kvt::last_error(); }

KVT_API void kvt_log_set_callback(int level, kvt_log_fn fn, void *user_data) {
  kvt::set_log_callback(level, fn, user_data);
}

}  // extern "C"
