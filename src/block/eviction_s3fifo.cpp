// S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP '23) over the
// inactive blocks of one priority level. A block registered for the first time joins the
// small queue when released; one used again (matched or retained) while it was cached moves
// to the main queue at its next release; the small queue's head is evicted while the small
// queue holds at least a tenth of the level, its hash kept in the ghost, so that a block
// registered again soon after goes to main at once. Main is a FIFO whose head, when it was
// used since it last went round (a use frequency of 1..3), goes round again one frequency
// lower instead of leaving. So one pass of blocks used once (a scan) only churns the small
// queue, and the blocks used again stay in main.
//
// Unlike a cache of objects, a block in use is in no queue at all (it cannot be evicted),
// and re-enters at the tail of its queue when released.
#include "block/eviction.hpp"

namespace kvt {

void Evictor::s3_released(uint8_t &m) noexcept {
  if (!(m & kMain) && freq(m) > 0) m = kMain | uint8_t(m & (kPinned | kPrio));
}

namespace {
// The small queue's turn: while it holds at least a tenth of the level's evictable blocks.
bool small_first(uint64_t small, uint64_t main) {
  return small > 0 && (main == 0 || small * 10 >= small + main);
}
}  // namespace

uint32_t Evictor::s3_victim(Level &l) noexcept {
  Slot *slots = *slots_;
  SlotQueue &small = l.q[0], &main = l.q[1];
  if (small_first(small.size, main.size)) {
    uint32_t s = small.pop_front(slots);
    ghost_->insert(slots[s].seq_hash);
    return s;
  }
  for (;;) {  // at most three rounds of main: each one lowers every frequency
    uint32_t s = main.pop_front(slots);
    uint8_t &m = marks_[s];
    if (freq(m) == 0) return s;
    m = uint8_t(m - (1u << kFreqShift));
    main.push_back(slots, s);
  }
}

// What s3_victim would do, without doing it: the small queue in order whenever it has the
// turn; main in rounds, round r taking the blocks of frequency r in queue order, which is
// where each block would leave after r trips round.
void Evictor::s3_order(const Level &l, size_t max, std::vector<uint32_t> &out) const {
  const Slot *slots = *slots_;
  uint64_t small = l.q[0].size, main = l.q[1].size;
  uint32_t si = l.q[0].head, mi = l.q[1].head;
  unsigned round = 0;
  while (out.size() < max && small + main > 0) {
    if (small_first(small, main)) {
      out.push_back(si);
      si = slots[si].next;
      --small;
      continue;
    }
    for (;;) {
      if (mi == kNilSlot) {
        ++round;
        mi = l.q[1].head;
      }
      uint32_t s = mi;
      mi = slots[s].next;
      if (freq(marks_[s]) == round) {
        out.push_back(s);
        --main;
        break;
      }
    }
  }
}

}  // namespace kvt
