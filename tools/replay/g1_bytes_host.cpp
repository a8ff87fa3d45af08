#include <cstdlib>
#include <string>

#include "g1_bytes.hpp"
#include "pattern.hpp"

namespace kvt::replay {

// Without CUDA, main() refuses --g1-memory cuda, so `cuda` is always false here.
bool g1_cuda_ready(std::string *why) {
  *why = "this kvtier-replay was built without CUDA";
  return false;
}

void *g1_alloc(bool, size_t bytes, std::string *error) {
  void *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) *error = std::to_string(bytes) + " bytes of host memory: out of memory";
  return p;
}

void g1_free(bool, void *p) { std::free(p); }

bool g1_fill(bool, void *p, size_t len, uint64_t hash, std::string *) {
  fill(p, len, hash);
  return true;
}

bool g1_fill_range(bool, void *p, size_t from, size_t len, uint64_t hash, std::string *) {
  fill_range(p, from, len, hash);
  return true;
}

bool g1_holds(bool, const void *p, size_t len, uint64_t hash, std::string *) {
  return holds(p, len, hash);
}

kvt_status g1_block_ptr(void **out, size_t *len, kvt_manager *m, kvt_block b, bool) {
  return kvt_block_data(out, len, m, b);
}

}  // namespace kvt::replay
