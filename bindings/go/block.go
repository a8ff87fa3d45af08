package kvtier

/*
#include <stdint.h>
#include <kvtier.h>

// A CUDA event is a handle the caller holds as a uintptr; converting it to a pointer in C
// keeps Go from treating it as a Go pointer.
static kvt_status kvtier_fence_from_cuda_event(kvt_fence **out, kvt_manager *m, uintptr_t ev) {
	return kvt_fence_from_cuda_event(out, m, (void *)ev);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// BlockState is a block's place in its life (kvt_block_state).
type BlockState uint32

const (
	BlockEmpty      BlockState = C.KVT_BLOCK_EMPTY
	BlockPartial    BlockState = C.KVT_BLOCK_PARTIAL
	BlockReady      BlockState = C.KVT_BLOCK_READY // ready for scheduling
	BlockInflight   BlockState = C.KVT_BLOCK_INFLIGHT
	BlockComplete   BlockState = C.KVT_BLOCK_COMPLETE
	BlockRegistered BlockState = C.KVT_BLOCK_REGISTERED // referenced by at least one holder
	BlockInactive   BlockState = C.KVT_BLOCK_INACTIVE   // registered, unreferenced, evictable
)

// BlockInfo is a snapshot of one block (kvt_block_info).
type BlockInfo struct {
	State   BlockState
	Tier    Tier
	Refs    uint32 // references held
	Tokens  uint32 // tokens staged (token path, before registration)
	SeqHash uint64 // registered blocks: the sequence hash
	Parent  uint64 // registered blocks: the parent's sequence hash, 0 for a first block
}

// BlockInfo gives a snapshot of one block.
func (m *Manager) BlockInfo(b Block) (BlockInfo, error) {
	var i C.kvt_block_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	err := m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_block_info_get(&i, c, C.kvt_block(b)) })
	return BlockInfo{BlockState(i.state), Tier(i.tier), uint32(i.refs), uint32(i.tokens),
		uint64(i.seq_hash), uint64(i.parent_hash)}, err
}

func (m *Manager) onBlock(b Block, f func(*C.kvt_manager, C.kvt_block) C.kvt_status) error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return f(c, C.kvt_block(b)) })
}

// --- token path: kvtier computes the hash ---

// InitBlock starts an Empty block of a sequence (Partial): parent is the sequence hash of
// the block before it, 0 for a first block; saltHash as from HashSalt.
func (m *Manager) InitBlock(b Block, saltHash, parent uint64) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status {
		return C.kvt_block_init(c, cb, C.uint64_t(saltHash), C.uint64_t(parent))
	})
}

// AppendTokens stages tokens (at least one, at most the room left) in a Partial or Ready
// block, which becomes Ready.
func (m *Manager) AppendTokens(b Block, tokens []uint32) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status {
		return C.kvt_block_append(c, cb, u32ptr(tokens), C.size_t(len(tokens)))
	})
}

// Schedule moves a Ready block to Inflight: its tokens are being computed.
func (m *Manager) Schedule(b Block) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status { return C.kvt_block_schedule(c, cb) })
}

// Unschedule moves a Ready block back to Partial, keeping its tokens.
func (m *Manager) Unschedule(b Block) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status { return C.kvt_block_unschedule(c, cb) })
}

// ComputeDone ends an Inflight block's computing: Complete when it holds a page of
// tokens, else Partial again.
func (m *Manager) ComputeDone(b Block) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status { return C.kvt_block_compute_done(c, cb) })
}

// Register registers a Complete block under the chained hash of its tokens; it returns
// the registered block (an existing one when the hash was there: b is then freed).
func (m *Manager) Register(b Block) (Block, error) {
	var out C.kvt_block
	err := m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status { return C.kvt_block_register(&out, c, cb) })
	return Block(out), err
}

// --- hash path: the engine computed the hash ---

// RegisterHash registers a filled Empty or Complete block under seqHash (parent: 0 for a
// first block); it returns the registered block, as Register does.
func (m *Manager) RegisterHash(b Block, seqHash, parent uint64) (Block, error) {
	var out C.kvt_block
	err := m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status {
		return C.kvt_block_register_hash(&out, c, cb, C.uint64_t(seqHash), C.uint64_t(parent))
	})
	return Block(out), err
}

// Retain takes one more reference on a registered block, dropped with Release.
func (m *Manager) Retain(b Block) error {
	return m.onBlock(b, func(c *C.kvt_manager, cb C.kvt_block) C.kvt_status { return C.kvt_block_retain(c, cb) })
}

func (m *Manager) onBlocks(blocks []Block, f func(*C.kvt_manager, *C.kvt_block, C.size_t) C.kvt_status) error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return f(c, blockPtr(blocks), C.size_t(len(blocks))) })
}

// SetPriority sets the priority of registered blocks: among inactive blocks, lower
// priorities are evicted first.
func (m *Manager) SetPriority(blocks []Block, priority int32) error {
	return m.onBlocks(blocks, func(c *C.kvt_manager, p *C.kvt_block, n C.size_t) C.kvt_status {
		return C.kvt_block_set_priority(c, p, n, C.int32_t(priority))
	})
}

// Pin keeps registered blocks from eviction; ErrNoSpace when pinned blocks would exceed
// MaxPinnedPercent of their tier.
func (m *Manager) Pin(blocks []Block) error {
	return m.onBlocks(blocks, func(c *C.kvt_manager, p *C.kvt_block, n C.size_t) C.kvt_status {
		return C.kvt_block_pin(c, p, n)
	})
}

// Unpin lets pinned blocks be evicted again.
func (m *Manager) Unpin(blocks []Block) error {
	return m.onBlocks(blocks, func(c *C.kvt_manager, p *C.kvt_block, n C.size_t) C.kvt_status {
		return C.kvt_block_unpin(c, p, n)
	})
}

// --- tiers ---

// TierStats is a snapshot of one tier (kvt_tier_stats), in blocks unless named otherwise.
type TierStats struct {
	Memory                                  MemoryKind
	Capacity, Free, Active, Inactive        uint64
	Registered, BlockBytes, MetadataBytes   uint64
	Allocs, Evictions, Registrations        uint64
	Dedups, MatchQueried, MatchHit, Retired uint64
	Recovered                               uint64 // G3: recovered from a persistent file
	Pinned                                  uint64
}

// TierStats gives a snapshot of one tier (all zeros for an absent one).
func (m *Manager) TierStats(tier Tier) (TierStats, error) {
	var s C.kvt_tier_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	err := m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_tier_stats_get(&s, c, C.kvt_tier(tier)) })
	return TierStats{MemoryKind(s.memory), uint64(s.capacity), uint64(s.free), uint64(s.active),
		uint64(s.inactive), uint64(s.registered), uint64(s.block_bytes), uint64(s.metadata_bytes),
		uint64(s.allocs), uint64(s.evictions), uint64(s.registrations), uint64(s.dedups),
		uint64(s.match_queried), uint64(s.match_hit), uint64(s.retired), uint64(s.recovered),
		uint64(s.pinned)}, err
}

// Evictable lists up to max blocks that the tier's next allocations would evict, in that
// order (pinned ones never). Nothing is held: a handle may go stale at once.
func (m *Manager) Evictable(tier Tier, max int) ([]Block, error) {
	out := make([]Block, max+1)
	var n C.size_t // how many the tier could evict: the first max of them were written
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_tier_evictable_blocks(blockPtr(out), C.size_t(max), &n, c, C.kvt_tier(tier))
	})
	return out[:minSize(n, max)], err
}

// Hashes gives the hashes the tier holds registered, in no particular order.
func (m *Manager) Hashes(tier Tier) ([]uint64, error) {
	var out []uint64
	for {
		var n C.size_t
		err := m.with(func(c *C.kvt_manager) C.kvt_status {
			return C.kvt_tier_hashes(u64ptr(out), C.size_t(len(out)), &n, c, C.kvt_tier(tier))
		})
		if err != nil || int(n) <= len(out) {
			return out[:n:n], err
		}
		out = make([]uint64, n+n/8+1) // registrations may come meanwhile: room for some
	}
}

// TransferStats are the counters of one transfer direction (kvt_transfer_stats).
type TransferStats struct {
	Completed, Cancelled, Failed uint64 // transfers that ended so
	Blocks, Bytes                uint64 // copied and registered at the destination
	Busy                         time.Duration
}

// TransferStats gives the counters of transfers from src to dst since the manager was
// created (ErrInvalidArgument for a pair that is not a direction).
func (m *Manager) TransferStats(src, dst Tier) (TransferStats, error) {
	var s C.kvt_transfer_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_transfer_stats_get(&s, c, C.kvt_tier(src), C.kvt_tier(dst))
	})
	return TransferStats{uint64(s.completed), uint64(s.cancelled), uint64(s.failed),
		uint64(s.blocks), uint64(s.bytes), time.Duration(s.busy_ns)}, err
}

// NoteTokens tells the KV events publisher the tokens of full blocks registered by hash:
// tokens holds PageSize tokens per hash, in order. A no-op without a publisher.
func (m *Manager) NoteTokens(seqHashes []uint64, tokens []uint32) error {
	if len(tokens) != len(seqHashes)*m.pageSz {
		return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf(
			"%d tokens for %d blocks of %d tokens", len(tokens), len(seqHashes), m.pageSz)}
	}
	return m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_manager_note_tokens(c, u64ptr(seqHashes), C.size_t(len(seqHashes)), u32ptr(tokens))
	})
}

// FenceFromCUDAEvent makes a fence that is signalled when a CUDA event (a cudaEvent_t,
// held until then) recorded on the host's stream has completed. ErrUnsupported without
// CUDA.
func (m *Manager) FenceFromCUDAEvent(event uintptr) (*Fence, error) {
	var cf *C.kvt_fence
	if err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvtier_fence_from_cuda_event(&cf, c, C.uintptr_t(event))
	}); err != nil {
		return nil, err
	}
	f := &Fence{m: m, f: cf}
	runtime.SetFinalizer(f, (*Fence).Close)
	return f, nil
}

// Seq hashes a token sequence incrementally: tokens appended in any split give the hashes
// HashSequence gives for their concatenation. Its methods may be called from several
// goroutines (they take turns).
type Seq struct {
	mu sync.Mutex
	s  *C.kvt_seq
}

// NewSeq starts a hasher of blocks of pageSize tokens under saltHash (from HashSalt).
func NewSeq(saltHash uint64, pageSize uint32) (*Seq, error) {
	var s *C.kvt_seq
	if err := call(func() C.kvt_status { return C.kvt_seq_create(&s, C.uint64_t(saltHash), C.uint32_t(pageSize)) }); err != nil {
		return nil, err
	}
	q := &Seq{s: s}
	runtime.SetFinalizer(q, (*Seq).Close)
	return q, nil
}

func (q *Seq) with(f func(*C.kvt_seq) C.kvt_status) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.s == nil {
		return &Error{Status: StatusInvalidHandle, Message: "the hasher is closed"}
	}
	return call(func() C.kvt_status { return f(q.s) })
}

// Append adds tokens to the sequence.
func (q *Seq) Append(tokens []uint32) error {
	return q.with(func(s *C.kvt_seq) C.kvt_status { return C.kvt_seq_append(s, u32ptr(tokens), C.size_t(len(tokens))) })
}

// Info gives the tokens appended so far and the number of full blocks hashed.
func (q *Seq) Info() (tokens, blocks int, err error) {
	var t, b C.size_t
	err = q.with(func(s *C.kvt_seq) C.kvt_status { return C.kvt_seq_info(&t, &b, s) })
	return int(t), int(b), err
}

// Hashes gives the block hashes and sequence hashes of up to max complete blocks from
// block first on.
func (q *Seq) Hashes(first, max int) (blockHashes, seqHashes []uint64, err error) {
	blockHashes, seqHashes = make([]uint64, max+1), make([]uint64, max+1)
	var n C.size_t // how many blocks from first on are complete: the first max were copied
	err = q.with(func(s *C.kvt_seq) C.kvt_status {
		return C.kvt_seq_copy_hashes(u64ptr(blockHashes), u64ptr(seqHashes), C.size_t(max), &n, s, C.size_t(first))
	})
	k := minSize(n, max)
	return blockHashes[:k], seqHashes[:k], err
}

// Close frees the hasher; closing twice is a no-op.
func (q *Seq) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	C.kvt_seq_destroy(q.s)
	q.s = nil
	runtime.SetFinalizer(q, nil)
	return nil
}
