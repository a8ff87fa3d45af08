// KV events: the tokens of blocks registered by hash, for the publisher's BlockStored.
#include "abi/guard.hpp"
#include "abi/objects.hpp"

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API kvt_status kvt_manager_note_tokens(kvt_manager *m, const uint64_t *seq_hashes, size_t n,
                                           const uint32_t *tokens) {
  static constexpr const char *fn = "kvt_manager_note_tokens";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    const uint32_t page = mgr.config().page_size;  // n <= 2^45 and page <= 2^16: no overflow
    if (kvt_status s = check_array(fn, "tokens", tokens, n * page); s != KVT_OK) return s;
    if (KvSink *sink = mgr.kv_sink()) sink->note_tokens(seq_hashes, n, tokens);
    return KVT_OK;
  });
}

}  // extern "C"
