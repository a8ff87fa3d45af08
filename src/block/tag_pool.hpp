// Manager tags: the part of a block handle that tells one live manager's handles from
// another's. Tags are unique among live managers, so a process holds at most
// KVT_MAX_MANAGERS managers at once. A freed tag goes to the back of the queue: a new
// manager gets the tag freed longest ago, so a destroyed manager's handles stay foreign to
// the managers after it for as long as the tag space allows.
#pragma once

#include <cstdint>

#include "kvtier.h"

namespace kvt {

class TagLease {
 public:
  TagLease() = default;
  ~TagLease();
  TagLease(const TagLease &) = delete;
  TagLease &operator=(const TagLease &) = delete;

  // Takes the least recently freed tag; KVT_ERR_NO_SPACE when every tag is in use.
  kvt_status acquire() noexcept;
  uint32_t value() const noexcept { return tag_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t tag_ = kNone;
};

}  // namespace kvt
