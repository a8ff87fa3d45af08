// Package kvtier is the Go binding of kvtier, a tiered KV-cache block manager with a C ABI.
//
// The library is found through pkg-config (package kvtier; for a build tree, put its
// directory holding kvtier.pc on PKG_CONFIG_PATH) or through CGO_CFLAGS and CGO_LDFLAGS.
// Types that own C objects have Close(); finalizers only catch what a program forgot.
// Errors are *Error values that keep the status: errors.Is(err, kvtier.ErrCancelled).
package kvtier

/*
#cgo pkg-config: kvtier
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Tier names a storage tier.
type Tier int32

const (
	G1 Tier = C.KVT_TIER_G1 // GPU memory, or its host stand-in
	G2 Tier = C.KVT_TIER_G2 // host memory
	G3 Tier = C.KVT_TIER_G3 // local disk
)

// Block is a block handle; 0 is never valid.
type Block uint64

// Status is a kvt_status.
type Status int32

const (
	StatusOK              Status = C.KVT_OK
	StatusTimeout         Status = C.KVT_TIMEOUT
	StatusInvalidArgument Status = C.KVT_ERR_INVALID_ARGUMENT
	StatusInvalidHandle   Status = C.KVT_ERR_INVALID_HANDLE
	StatusState           Status = C.KVT_ERR_STATE
	StatusNoSpace         Status = C.KVT_ERR_NO_SPACE
	StatusCancelled       Status = C.KVT_ERR_CANCELLED
	StatusUnsupported     Status = C.KVT_ERR_UNSUPPORTED
	StatusIO              Status = C.KVT_ERR_IO
	StatusCorrupt         Status = C.KVT_ERR_CORRUPT
	StatusNoMemory        Status = C.KVT_ERR_NO_MEMORY
	StatusCUDA            Status = C.KVT_ERR_CUDA
	StatusInternal        Status = C.KVT_ERR_INTERNAL
)

func (s Status) String() string { return C.GoString(C.kvt_status_str(C.kvt_status(s))) }

// Error is a failed call: the status and the library's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("kvtier: %v: %s", e.Status, e.Message) }

// Is makes errors.Is match on the status, so the sentinels below match any message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// Sentinels for errors.Is.
var (
	ErrTimeout         = &Error{Status: StatusTimeout}
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrInvalidHandle   = &Error{Status: StatusInvalidHandle}
	ErrState           = &Error{Status: StatusState}
	ErrNoSpace         = &Error{Status: StatusNoSpace}
	ErrCancelled       = &Error{Status: StatusCancelled}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrIO              = &Error{Status: StatusIO}
	ErrCorrupt         = &Error{Status: StatusCorrupt}
	ErrNoMemory        = &Error{Status: StatusNoMemory}
	ErrInternal        = &Error{Status: StatusInternal}
)

// kvt_last_error is thread-local: the goroutine must stay on its thread from the call to
// the read, hence LockOSThread around every call that can fail.
func call(f func() C.kvt_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if s := f(); s != C.KVT_OK {
		return &Error{Status: Status(s), Message: C.GoString(C.kvt_last_error())}
	}
	return nil
}

var errClosed = &Error{Status: StatusInvalidHandle, Message: "the manager is closed"}

// Version is the library's version string.
func Version() string { return C.GoString(C.kvt_version()) }

// HashSalt hashes a salt (a model name, for instance) for HashSequence.
func HashSalt(salt []byte) uint64 {
	var out C.uint64_t
	var p unsafe.Pointer
	if len(salt) > 0 {
		p = unsafe.Pointer(&salt[0])
	}
	C.kvt_hash_salt(&out, p, C.size_t(len(salt)))
	return uint64(out)
}

// HashSequence returns the sequence hashes of the full blocks of tokens.
func HashSequence(tokens []uint32, pageSize uint32, saltHash uint64) ([]uint64, error) {
	if pageSize == 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "page size 0"}
	}
	out := make([]uint64, len(tokens)/int(pageSize)+1)
	var n C.size_t
	err := call(func() C.kvt_status {
		return C.kvt_hash_sequence((*C.uint64_t)(&out[0]), &n, C.size_t(len(out)), C.uint64_t(saltHash),
			u32ptr(tokens), C.size_t(len(tokens)), C.uint32_t(pageSize))
	})
	return out[:n], err
}

func u32ptr(v []uint32) *C.uint32_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.uint32_t)(&v[0])
}

func u64ptr(v []uint64) *C.uint64_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.uint64_t)(&v[0])
}

func blockPtr(v []Block) *C.kvt_block {
	if len(v) == 0 {
		return nil
	}
	return (*C.kvt_block)(unsafe.Pointer(&v[0]))
}

// Config is the manager's configuration; zero fields keep the library's defaults.
type Config struct {
	PageSize, NumLayers, NumOuter uint32
	ChunkBytes                    uint64
	G1Blocks, G2Blocks, G3Blocks  uint64
	G3Path                        string
	EventCapacity                 uint64
	// Pipeline
	MaxBatchSize, MinBatchSize uint32
	FlushIntervalUs            uint64
}

// Manager owns a kvt_manager. Its methods may be called from many goroutines at once;
// Close must not race with them.
type Manager struct {
	mu sync.RWMutex // Close takes it for writing, every call for reading
	m  *C.kvt_manager
}

// NewManager creates a manager; G1 lives in host memory (the embedded default).
func NewManager(cfg Config) (*Manager, error) {
	var c C.kvt_manager_config
	C.kvt_manager_config_init(&c)
	c.g1_memory = C.KVT_MEMORY_HOST
	set32 := func(dst *C.uint32_t, v uint32) {
		if v != 0 {
			*dst = C.uint32_t(v)
		}
	}
	set64 := func(dst *C.uint64_t, v uint64) {
		if v != 0 {
			*dst = C.uint64_t(v)
		}
	}
	set32(&c.page_size, cfg.PageSize)
	set32(&c.num_layers, cfg.NumLayers)
	set32(&c.num_outer, cfg.NumOuter)
	c.chunk_bytes = C.uint64_t(cfg.ChunkBytes)
	set64(&c.g1_blocks, cfg.G1Blocks)
	c.g2_blocks = C.uint64_t(cfg.G2Blocks)
	c.g3_blocks = C.uint64_t(cfg.G3Blocks)
	set64(&c.event_capacity, cfg.EventCapacity)
	set32(&c.max_batch_size, cfg.MaxBatchSize)
	set32(&c.min_batch_size, cfg.MinBatchSize)
	set64(&c.flush_interval_us, cfg.FlushIntervalUs)
	if cfg.G3Path != "" {
		p := C.CString(cfg.G3Path)
		defer C.free(unsafe.Pointer(p))
		c.g3_path = p
	}
	var cm *C.kvt_manager
	if err := call(func() C.kvt_status { return C.kvt_manager_create(&cm, &c) }); err != nil {
		return nil, err
	}
	mgr := &Manager{m: cm}
	runtime.SetFinalizer(mgr, (*Manager).Close)
	return mgr, nil
}

// Close destroys the manager and everything it owns; transfers and fences of it become
// invalid. Calling it again is a no-op.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m != nil {
		C.kvt_manager_destroy(m.m)
		m.m = nil
	}
	runtime.SetFinalizer(m, nil)
	return nil
}

// with runs f with the live manager, or fails with ErrInvalidHandle once closed.
func (m *Manager) with(f func(*C.kvt_manager) C.kvt_status) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.m == nil {
		return errClosed
	}
	return call(func() C.kvt_status { return f(m.m) })
}

// Alloc allocates n empty blocks in a tier.
func (m *Manager) Alloc(n int, tier Tier) ([]Block, error) {
	out := make([]Block, n+1)
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_block_alloc(blockPtr(out), C.size_t(n), c, C.kvt_tier(tier))
	})
	if err != nil {
		return nil, err
	}
	return out[:n], nil
}

// Release drops one reference per block, all or nothing.
func (m *Manager) Release(blocks []Block) error {
	return m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_block_release(c, blockPtr(blocks), C.size_t(len(blocks)))
	})
}

// RegisterHashes registers a chain of filled blocks; it returns the registered handles
// (dedup swaps in existing blocks).
func (m *Manager) RegisterHashes(blocks []Block, hashes []uint64, parent uint64) ([]Block, error) {
	if len(blocks) != len(hashes) {
		return nil, &Error{Status: StatusInvalidArgument,
			Message: fmt.Sprintf("%d blocks but %d hashes", len(blocks), len(hashes))}
	}
	out := make([]Block, len(blocks)+1)
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_block_register_hashes(blockPtr(out), c, blockPtr(blocks), u64ptr(hashes),
			C.size_t(len(blocks)), C.uint64_t(parent))
	})
	return out[:len(blocks)], err
}

// MatchPrefix returns the pinned blocks of the longest registered prefix of hashes.
func (m *Manager) MatchPrefix(hashes []uint64, tier Tier) ([]Block, error) {
	out := make([]Block, len(hashes)+1)
	var n C.size_t
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_match_prefix(&n, blockPtr(out), c, C.kvt_tier(tier), u64ptr(hashes),
			C.size_t(len(hashes)))
	})
	return out[:n], err
}

// Data returns the block's bytes. The slice aliases tier memory: valid while a reference to
// the block is held and the manager is open.
func (m *Manager) Data(b Block) ([]byte, error) {
	var p unsafe.Pointer
	var n C.size_t
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_block_data(&p, &n, c, C.kvt_block(b))
	})
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

// Check verifies the manager's invariants.
func (m *Manager) Check() error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_check(c) })
}

// Event is one completion or registry event.
type Event struct {
	Type     uint32 // EventXferDone, EventBlockStored, EventBlockRemoved, EventEventsDropped
	Status   Status
	Tier     Tier
	UserData uint64
	Hash     uint64
	Parent   uint64
	Count    uint64
}

const (
	EventXferDone      = C.KVT_EVENT_XFER_DONE
	EventBlockStored   = C.KVT_EVENT_BLOCK_STORED
	EventBlockRemoved  = C.KVT_EVENT_BLOCK_REMOVED
	EventEventsDropped = C.KVT_EVENT_EVENTS_DROPPED
)

// Poll drains up to max pending events, oldest first.
func (m *Manager) Poll(max int) ([]Event, error) {
	if max <= 0 {
		return nil, nil
	}
	buf := make([]C.kvt_event, max)
	var n C.size_t
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		n = C.kvt_poll(c, &buf[0], C.size_t(max))
		return C.KVT_OK
	})
	out := make([]Event, n)
	for i := range out {
		e := &buf[i]
		out[i] = Event{uint32(e._type), Status(e.status), Tier(e.tier), uint64(e.user_data),
			uint64(e.hash), uint64(e.parent_hash), uint64(e.count)}
	}
	return out, err
}

// EventFD is readable while events are pending; owned by the manager.
func (m *Manager) EventFD() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.m == nil {
		return -1
	}
	return int(C.kvt_event_fd(m.m))
}

// Transfer is an enqueued offload or onboard. Close releases it (cancelling it if it has
// not committed).
type Transfer struct {
	m *Manager
	x *C.kvt_xfer
	n int
}

func (m *Manager) newTransfer(x *C.kvt_xfer, n int) *Transfer {
	t := &Transfer{m: m, x: x, n: n}
	runtime.SetFinalizer(t, (*Transfer).Close)
	return t
}

// Offload copies registered blocks of one tier down to dst. fence may be nil.
func (m *Manager) Offload(blocks []Block, dst Tier, fence *Fence, userData uint64) (*Transfer, error) {
	var x *C.kvt_xfer
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_offload(&x, c, blockPtr(blocks), C.size_t(len(blocks)), C.kvt_tier(dst),
			fence.ptr(), C.uint64_t(userData))
	})
	if err != nil {
		return nil, err
	}
	return m.newTransfer(x, len(blocks)), nil
}

// Onboard copies registered G2 or G3 blocks into the empty G1 blocks dst.
func (m *Manager) Onboard(src, dst []Block, fence *Fence, userData uint64) (*Transfer, error) {
	if len(src) != len(dst) {
		return nil, &Error{Status: StatusInvalidArgument, Message: "src and dst differ in length"}
	}
	var x *C.kvt_xfer
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_onboard(&x, c, blockPtr(src), blockPtr(dst), C.size_t(len(src)),
			fence.ptr(), C.uint64_t(userData))
	})
	if err != nil {
		return nil, err
	}
	return m.newTransfer(x, len(src)), nil
}

// withObject runs f while the manager stays open, unless the object (a transfer or fence
// of it) is closed or the manager is.
func (m *Manager) withObject(closed bool, what string, f func() C.kvt_status) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if closed || m.m == nil {
		return &Error{Status: StatusInvalidHandle, Message: "the " + what + " is closed or its manager closed"}
	}
	return call(f)
}

// with runs f on the live transfer of a live manager.
func (t *Transfer) with(f func(*C.kvt_xfer) C.kvt_status) error {
	return t.m.withObject(t.x == nil, "transfer", func() C.kvt_status { return f(t.x) })
}

// Cancel cancels a transfer that has not committed.
func (t *Transfer) Cancel() error {
	return t.with(func(x *C.kvt_xfer) C.kvt_status { return C.kvt_xfer_cancel(x) })
}

// Wait waits for the end (timeoutNs < 0: forever) and returns the blocks moved; a cancelled
// transfer gives ErrCancelled.
func (t *Transfer) Wait(timeoutNs int64) (uint64, error) {
	var count C.uint64_t
	err := t.with(func(x *C.kvt_xfer) C.kvt_status {
		s := C.kvt_xfer_wait(x, C.int64_t(timeoutNs))
		if s == C.KVT_TIMEOUT {
			return s
		}
		C.kvt_xfer_status(nil, nil, &count, x)
		return s
	})
	var e *Error
	if errors.As(err, &e) && e.Status == StatusTimeout && e.Message == "" {
		e.Message = "the transfer has not ended"
	}
	return uint64(count), err
}

// Blocks gives an ended onboard's final G1 handles.
func (t *Transfer) Blocks() ([]Block, error) {
	out := make([]Block, t.n+1)
	err := t.with(func(x *C.kvt_xfer) C.kvt_status {
		return C.kvt_xfer_blocks(blockPtr(out), C.size_t(t.n), x)
	})
	return out[:t.n], err
}

// Close releases the transfer. Safe after the manager's Close, and twice.
func (t *Transfer) Close() error {
	t.m.mu.RLock()
	defer t.m.mu.RUnlock()
	if t.x != nil && t.m.m != nil {
		C.kvt_xfer_release(t.x)
	}
	t.x = nil
	runtime.SetFinalizer(t, nil)
	return nil
}

// Fence is a precondition the host signals.
type Fence struct {
	m *Manager
	f *C.kvt_fence
}

// NewFence creates a fence.
func (m *Manager) NewFence() (*Fence, error) {
	var cf *C.kvt_fence
	if err := m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_fence_create(&cf, c) }); err != nil {
		return nil, err
	}
	f := &Fence{m: m, f: cf}
	runtime.SetFinalizer(f, (*Fence).Close)
	return f, nil
}

func (f *Fence) ptr() *C.kvt_fence {
	if f == nil {
		return nil
	}
	return f.f
}

// Signal lets the transfers waiting on the fence proceed.
func (f *Fence) Signal() error {
	return f.m.withObject(f.f == nil, "fence", func() C.kvt_status { return C.kvt_fence_signal(f.f) })
}

// Close destroys the fence; transfers still waiting on it end cancelled.
func (f *Fence) Close() error {
	f.m.mu.RLock()
	defer f.m.mu.RUnlock()
	if f.f != nil && f.m.m != nil {
		C.kvt_fence_destroy(f.f)
	}
	f.f = nil
	runtime.SetFinalizer(f, nil)
	return nil
}
