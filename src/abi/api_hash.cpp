// Hashing: stateless chained hashes and the incremental kvt_seq.
#include <bit>

#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "hash/chain_hash.hpp"

using namespace kvt;
using namespace kvt::abi;

namespace {
kvt_status check_page_size(const char *fn, uint32_t page_size) {
  if (page_size == 0 || page_size > 65536 || !std::has_single_bit(page_size))
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: page_size is %u: a power of two in 1..65536", fn,
                page_size);
  return KVT_OK;
}
}  // namespace

extern "C" {

KVT_API kvt_status kvt_hash_salt(uint64_t *out_salt_hash, const void *salt, size_t len) {
  static constexpr const char *fn = "kvt_hash_salt";
  if (out_salt_hash == nullptr) return null_arg(fn, "out_salt_hash");
  if (kvt_status s = check_array(fn, "salt", static_cast<const char *>(salt), len); s != KVT_OK)
    return s;
  *out_salt_hash = hash_salt(salt, len);
  return KVT_OK;
}

KVT_API kvt_status kvt_hash_tokens(uint64_t *out, size_t cap, size_t *n, uint64_t salt_hash,
                                   const uint32_t *tokens, size_t n_tokens, uint32_t page_size) {
  static constexpr const char *fn = "kvt_hash_tokens";
  if (n == nullptr) return null_arg(fn, "n");
  if (kvt_status s = check_page_size(fn, page_size); s != KVT_OK) return s;
  if (kvt_status s = check_array(fn, "tokens", tokens, n_tokens); s != KVT_OK) return s;
  if (kvt_status s = check_array(fn, "out", out, cap); s != KVT_OK) return s;
  const size_t blocks = n_tokens / page_size;
  // Each hash chains on the one before, so only the first cap blocks need hashing.
  ChainHasher(salt_hash).sequence(out, tokens, std::min(cap, blocks), page_size);
  *n = blocks;
  return KVT_OK;
}

KVT_API kvt_status kvt_seq_create(kvt_seq **out, uint64_t salt_hash, uint32_t page_size) {
  static constexpr const char *fn = "kvt_seq_create";
  return guard(fn, [&] {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_page_size(fn, page_size); s != KVT_OK) return s;
    *out = new kvt_seq{kvt_seq::kMagic, TokenSeq(salt_hash, page_size)};
    return KVT_OK;
  });
}

KVT_API void kvt_seq_destroy(kvt_seq *s) {
  if (s == nullptr || s->magic != kvt_seq::kMagic) return;
  s->magic = 0;
  delete s;
}

KVT_API kvt_status kvt_seq_append(kvt_seq *s, const uint32_t *tokens, size_t n) {
  static constexpr const char *fn = "kvt_seq_append";
  return guard(fn, [&] {
    kvt_status st;
    TokenSeq *seq = token_seq(fn, s, &st);
    if (!seq) return st;
    if (kvt_status c = check_array(fn, "tokens", tokens, n); c != KVT_OK) return c;
    seq->append(tokens, n);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_seq_info(size_t *out_tokens, size_t *out_blocks, const kvt_seq *s) {
  static constexpr const char *fn = "kvt_seq_info";
  kvt_status st;
  const TokenSeq *seq = token_seq(fn, s, &st);
  if (!seq) return st;
  if (out_tokens == nullptr) return null_arg(fn, "out_tokens");
  if (out_blocks == nullptr) return null_arg(fn, "out_blocks");
  *out_tokens = seq->tokens();
  *out_blocks = seq->blocks();
  return KVT_OK;
}

KVT_API kvt_status kvt_seq_copy_hashes(uint64_t *out_block_hashes, uint64_t *out_seq_hashes,
                                       size_t cap, size_t *n, const kvt_seq *s, size_t first) {
  static constexpr const char *fn = "kvt_seq_copy_hashes";
  kvt_status st;
  const TokenSeq *seq = token_seq(fn, s, &st);
  if (!seq) return st;
  if (n == nullptr) return null_arg(fn, "n");
  if (out_block_hashes == nullptr && out_seq_hashes == nullptr && cap > 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: both output arrays are NULL but cap is %zu", fn,
                cap);
  if (first > seq->blocks())
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: first is %zu but only %zu blocks are complete",
                fn, first, seq->blocks());
  const size_t complete = seq->blocks() - first, copied = std::min(cap, complete);
  if (out_block_hashes)
    std::copy_n(seq->block_hashes().begin() + first, copied, out_block_hashes);
  if (out_seq_hashes) std::copy_n(seq->seq_hashes().begin() + first, copied, out_seq_hashes);
  *n = complete;
  return KVT_OK;
}

}  // extern "C"
