#include "common/error.hpp"
#include "memory/cuda.hpp"

namespace kvt::cuda {

bool available() noexcept { return false; }

bool device_present(int) noexcept { return false; }

kvt_status alloc(void **, size_t, int) noexcept {
  return fail(KVT_ERR_UNSUPPORTED, "this kvtier was built without CUDA");
}

void free(void *, int) noexcept {}
bool host_register(void *, size_t) noexcept { return false; }
void host_unregister(void *) noexcept {}
bool on_device(const void *, int) noexcept { return false; }
bool event_done(void *) noexcept { return true; }

}  // namespace kvt::cuda
