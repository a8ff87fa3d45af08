// fuzz_hash: arbitrary token streams and page sizes. kvt_hash_tokens over the whole stream
// and kvt_seq fed the same tokens in random splits must give the same hashes; bad page sizes
// and short output arrays must fail cleanly.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "input.hpp"
#include "kvtier.h"

using kvt_fuzz::Input;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_hash: %s (%s)\n", what, kvt_last_error());
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  // Page sizes: mostly small powers of two, sometimes anything at all.
  uint32_t page = in.flag() ? 1u << in.below(8) : in.take<uint32_t>();
  uint8_t salt_len = in.byte() % 16;
  char salt[16] = {};
  in.bytes(salt, salt_len);
  uint64_t salt_hash = 0;
  check(kvt_hash_salt(&salt_hash, salt, salt_len) == KVT_OK, "kvt_hash_salt");
  size_t n_tokens = in.below(4096);
  std::vector<uint32_t> tokens(n_tokens);
  in.bytes(tokens.data(), n_tokens * sizeof(uint32_t));

  const bool page_ok = page >= 1 && page <= 65536 && (page & (page - 1)) == 0;
  size_t need = 0;
  kvt_status st = kvt_hash_tokens(nullptr, 0, &need, salt_hash, tokens.data(), n_tokens, page);
  if (!page_ok) {
    check(st == KVT_ERR_INVALID_ARGUMENT, "a bad page size was accepted");
    kvt_seq *s = nullptr;
    check(kvt_seq_create(&s, salt_hash, page) == KVT_ERR_INVALID_ARGUMENT && s == nullptr,
          "kvt_seq_create accepted a bad page size");
    return 0;
  }
  check(st == KVT_OK, "kvt_hash_tokens counting");
  check(need == n_tokens / page, "full block count");
  std::vector<uint64_t> want(need + 1);
  size_t got = 0;
  check(kvt_hash_tokens(want.data(), need, &got, salt_hash, tokens.data(), n_tokens, page) ==
                KVT_OK && got == need,
        "kvt_hash_tokens");
  if (need > 0) {  // a short array gets the first hashes, and the count of all
    std::vector<uint64_t> some(need);
    const size_t cap = in.below(need);
    check(kvt_hash_tokens(some.data(), cap, &got, salt_hash, tokens.data(), n_tokens, page) ==
                  KVT_OK && got == need && std::equal(some.begin(), some.begin() + cap,
                                                      want.begin()),
          "kvt_hash_tokens with a short array");
  }

  // The same stream through kvt_seq, in splits the input chooses.
  kvt_seq *s = nullptr;
  check(kvt_seq_create(&s, salt_hash, page) == KVT_OK, "kvt_seq_create");
  size_t at = 0;
  while (at < n_tokens) {
    size_t step = in.empty() ? n_tokens - at : std::min<size_t>(n_tokens - at, in.below(700));
    check(kvt_seq_append(s, tokens.data() + at, step) == KVT_OK || step == 0, "kvt_seq_append");
    at += step;
    size_t t = 0, b = 0;
    check(kvt_seq_info(&t, &b, s) == KVT_OK && t == at && b == at / page, "kvt_seq_info");
  }
  // Read the hashes back in windows of random size, from random starting blocks.
  std::vector<uint64_t> seq(need + 8), block(need + 8);
  for (size_t first = 0; first < need;) {
    size_t cap = 1 + in.below(16), n = 0;
    check(kvt_seq_copy_hashes(block.data() + first, seq.data() + first, cap, &n, s, first) ==
                  KVT_OK &&
              n == need - first,
          "kvt_seq_copy_hashes window");
    first += std::min(cap, n);
  }
  size_t n = 99, past = in.below(5);
  kvt_status end = kvt_seq_copy_hashes(block.data(), nullptr, 4, &n, s, need + past);
  check(past == 0 ? end == KVT_OK && n == 0 : end == KVT_ERR_INVALID_ARGUMENT,
        "kvt_seq_copy_hashes at or past the end");
  kvt_seq_destroy(s);
  for (size_t i = 0; i < need; ++i)
    check(seq[i] == want[i], "kvt_seq and kvt_hash_tokens disagree");
  check(need == 0 || block[0] == seq[0], "the first block's hash is its sequence hash");
  return 0;
}
