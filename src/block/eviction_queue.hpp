// The evictable blocks of one priority level, in intrusive queues linked through the slots'
// prev/next fields, so that joining or leaving a queue costs no allocation.
#pragma once

#include <cstdint>

#include "block/slot.hpp"

namespace kvt {

// A doubly linked FIFO of slots: the head leaves first.
struct SlotQueue {
  uint32_t head = kNilSlot, tail = kNilSlot;
  uint64_t size = 0;

  void push_back(Slot *slots, uint32_t s) noexcept {
    Slot &sl = slots[s];
    sl.prev = tail;
    sl.next = kNilSlot;
    if (tail != kNilSlot) slots[tail].next = s; else head = s;
    tail = s;
    ++size;
  }
  void unlink(Slot *slots, uint32_t s) noexcept {
    Slot &sl = slots[s];
    if (sl.prev != kNilSlot) slots[sl.prev].next = sl.next; else head = sl.next;
    if (sl.next != kNilSlot) slots[sl.next].prev = sl.prev; else tail = sl.prev;
    --size;
  }
  uint32_t pop_front(Slot *slots) noexcept {
    uint32_t s = head;
    unlink(slots, s);
    return s;
  }
};

// One priority's evictable blocks. LRU uses q[0] alone, least recently released at the head;
// S3-FIFO uses q[0] as its small queue and q[1] as its main queue.
struct Level {
  SlotQueue q[2];
  uint64_t members = 0;  // registered blocks of this priority, evictable or not (not level 0)
  uint64_t size() const noexcept { return q[0].size + q[1].size; }
};

}  // namespace kvt
