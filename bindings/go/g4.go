package kvtier

/*
#include <kvtier.h>
*/
import "C"

import "unsafe"

// G4 is a tier on Redis (Config.G4URL) that many managers share, holding blocks by sequence
// hash. Offload to it is Offload with dst G4; it has no handles of its own.

// G4Match gives the length of the longest prefix of seqHashes that G4 holds, in one
// pipelined round trip per shard (blocking up to G4TimeoutUs). ErrUnsupported without G4,
// ErrIO when Redis cannot be reached.
func (m *Manager) G4Match(seqHashes []uint64) (int, error) {
	var n C.size_t
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_g4_match(&n, c, u64ptr(seqHashes), C.size_t(len(seqHashes)))
	})
	return int(n), err
}

// G4Onboard copies the G4 values of the chain seqHashes (parent: the hash before the first)
// into dst, Empty blocks of G1 or G2 that the caller allocated, and registers them, as
// Onboard does. The transfer ends ErrNotFound, ErrCorrupt or ErrIO at the first block it
// cannot have; the blocks before it are registered.
func (m *Manager) G4Onboard(seqHashes []uint64, parent uint64, dst []Block, fence *Fence, userData uint64) (*Transfer, error) {
	if len(seqHashes) != len(dst) {
		return nil, &Error{Status: StatusInvalidArgument, Message: "seqHashes and dst differ in length"}
	}
	var x *C.kvt_xfer
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_g4_onboard(&x, c, u64ptr(seqHashes), C.size_t(len(dst)), C.uint64_t(parent),
			blockPtr(dst), fence.ptr(), C.uint64_t(userData))
	})
	if err != nil {
		return nil, err
	}
	return m.newTransfer(x, len(dst)), nil
}

// G4Stats are G4's counters (kvt_g4_stats).
type G4Stats struct {
	Shards                  uint32 // Redis endpoints; a cluster's masters
	Lookups, Hits           uint64 // hashes G4Match asked for, and found
	StoredBlocks            uint64 // values written
	LoadedBlocks            uint64 // values read into blocks
	MissingBlocks           uint64 // onboards that found no key
	CorruptBlocks           uint64 // values that failed their header, checksum or MAC
	FailedBlocks            uint64 // blocks of transfers that failed with ErrIO
	BytesWritten, BytesRead uint64
	RoundTrips, Reconnects  uint64
	Redirects, SlotMapReads uint64 // a Redis Cluster's MOVED/ASK, and slot maps read
}

// G4Stats gives G4's counters; ErrUnsupported without G4.
func (m *Manager) G4Stats() (G4Stats, error) {
	var s C.kvt_g4_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	err := m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_g4_stats_get(&s, c) })
	return G4Stats{uint32(s.shards), uint64(s.lookups), uint64(s.hits), uint64(s.stored_blocks),
		uint64(s.loaded_blocks), uint64(s.missing_blocks), uint64(s.corrupt_blocks),
		uint64(s.failed_blocks), uint64(s.bytes_written), uint64(s.bytes_read),
		uint64(s.round_trips), uint64(s.reconnects), uint64(s.redirects), uint64(s.slot_map_reads)}, err
}
