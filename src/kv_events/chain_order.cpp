#include "kv_events/chain_order.hpp"

#include <algorithm>
#include <vector>

#include <absl/container/flat_hash_map.h>

namespace kvt::pub {

void order_chains(QueuedEvent *events, size_t n) {
  absl::flat_hash_map<uint64_t, size_t> at;  // hash -> index
  at.reserve(n);
  for (size_t i = 0; i < n; ++i) at.emplace(events[i].hash, i);
  // Children of each index as a linked list (first_kid, next_sib), kept in given order.
  constexpr size_t kNone = ~size_t{0};
  std::vector<size_t> first_kid(n, kNone), last_kid(n, kNone), next_sib(n, kNone);
  std::vector<size_t> roots;
  for (size_t i = 0; i < n; ++i) {
    auto p = at.find(events[i].parent);
    if (p == at.end() || p->second == i) {
      roots.push_back(i);
      continue;
    }
    const size_t parent = p->second;
    (last_kid[parent] == kNone ? first_kid[parent] : next_sib[last_kid[parent]]) = i;
    last_kid[parent] = i;
  }
  std::vector<QueuedEvent> out;
  out.reserve(n);
  std::vector<bool> seen(n, false);
  std::vector<size_t> stack;
  auto walk = [&](size_t root) {
    stack.push_back(root);
    while (!stack.empty()) {
      const size_t i = stack.back();
      stack.pop_back();
      if (seen[i]) continue;
      seen[i] = true;
      out.push_back(events[i]);
      // Pushed so that the first child comes out next: right after its parent.
      const size_t mark = stack.size();
      for (size_t k = first_kid[i]; k != kNone; k = next_sib[k]) stack.push_back(k);
      std::reverse(stack.begin() + mark, stack.end());
    }
  };
  for (size_t r : roots) walk(r);
  for (size_t i = 0; i < n; ++i)  // a cycle of parents, which hashes cannot make: kept anyway
    if (!seen[i]) walk(i);
  std::copy(out.begin(), out.end(), events);
}

}  // namespace kvt::pub
