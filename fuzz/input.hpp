// Reads a fuzzer's input as a stream of choices. Past the end every read yields zero, so
// any input, however short, is a complete program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvt_fuzz {

class Input {
 public:
  Input(const uint8_t *data, size_t size) : p_(data), n_(size) {}

  bool empty() const { return n_ == 0; }

  template <class T>
  T take() {
    T v{};
    size_t k = n_ < sizeof v ? n_ : sizeof v;
    if (k > 0) std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  uint8_t byte() { return take<uint8_t>(); }
  bool flag() { return byte() & 1; }
  // A value in [0, n); 0 when n is 0.
  uint32_t below(uint32_t n) { return n ? take<uint16_t>() % n : 0; }
  // Mostly small counts, sometimes zero, sometimes absurd ones.
  size_t count(size_t small) {
    switch (byte() % 16) {
      case 0: return 0;
      case 1: return SIZE_MAX;
      case 2: return size_t{1} << (40 + byte() % 20);
      default: return below(uint32_t(small) + 1);
    }
  }
  // Fills out[0..n) with bytes from the input.
  void bytes(void *out, size_t n) {
    size_t k = n_ < n ? n_ : n;
    if (k > 0) std::memcpy(out, p_, k);
    if (n > k) std::memset(static_cast<char *>(out) + k, 0, n - k);
    p_ += k;
    n_ -= k;
  }

 private:
  const uint8_t *p_;
  size_t n_;
};

}  // namespace kvt_fuzz
