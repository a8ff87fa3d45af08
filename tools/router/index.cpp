#include "index.hpp"

#include <algorithm>

namespace kvt::router {

size_t Index::add_instance() {
  inst_.emplace_back();
  return inst_.size() - 1;
}

std::optional<uint32_t> Index::find_bit(const std::optional<std::string> &medium) const {
  const std::string &name = medium ? *medium : std::string();
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) return std::nullopt;
  return uint32_t(1) << (it - names_.begin());
}

uint32_t Index::bit_of(const std::optional<std::string> &medium) {
  if (auto bit = find_bit(medium)) return *bit;
  if (names_.size() == kMaxMedia) return uint32_t(1) << (kMaxMedia - 1);
  names_.push_back(medium ? *medium : std::string());
  return uint32_t(1) << (names_.size() - 1);
}

void Index::apply(size_t inst, const Batch &b) {
  Masks &m = inst_[inst];
  for (const Event &e : b.events) {
    switch (e.kind) {
      case EventKind::Stored: {
        const uint32_t bit = bit_of(e.medium);
        for (uint64_t h : e.hashes) m[h] |= bit;
        break;
      }
      case EventKind::Removed: {
        const uint32_t bit = bit_of(e.medium);
        for (uint64_t h : e.hashes) {
          auto it = m.find(h);
          if (it == m.end()) continue;
          if ((it->second &= ~bit) == 0) m.erase(it);
        }
        break;
      }
      case EventKind::Cleared:
        m.clear();
        break;
    }
  }
}

size_t Index::prefix(size_t inst, const uint64_t *h, size_t n,
                     const std::optional<std::string> &medium) const {
  uint32_t want = ~uint32_t(0);
  if (medium) {
    auto bit = find_bit(medium);
    if (!bit) return 0;
    want = *bit;
  }
  const Masks &m = inst_[inst];
  size_t k = 0;
  for (; k < n; ++k) {
    auto it = m.find(h[k]);
    if (it == m.end() || (it->second & want) == 0) break;
  }
  return k;
}

size_t Index::blocks(size_t inst, const std::optional<std::string> &medium) const {
  if (!medium) return inst_[inst].size();
  auto bit = find_bit(medium);
  if (!bit) return 0;
  size_t n = 0;
  for (const auto &[h, mask] : inst_[inst]) n += (mask & *bit) != 0;
  return n;
}

std::vector<uint64_t> Index::hashes(size_t inst, const std::optional<std::string> &medium) const {
  uint32_t want = ~uint32_t(0);
  if (medium) {
    auto bit = find_bit(medium);
    if (!bit) return {};
    want = *bit;
  }
  std::vector<uint64_t> v;
  for (const auto &[h, mask] : inst_[inst])
    if (mask & want) v.push_back(h);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace kvt::router
