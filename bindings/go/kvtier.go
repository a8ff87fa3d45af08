// Package kvtier is the Go binding of kvtier, a tiered KV-cache block manager with a C ABI.
//
// The library is found through pkg-config (package kvtier; for a build tree, put its
// directory holding kvtier.pc on PKG_CONFIG_PATH) or through CGO_CFLAGS and CGO_LDFLAGS.
// Types that own C objects have Close(); finalizers only catch what a program forgot.
// Errors are *Error values that keep the status: errors.Is(err, kvtier.ErrCancelled).
// Waits take a time.Duration (negative: forever), and the blocking ones have a Context form.
package kvtier

/*
#cgo pkg-config: kvtier
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Tier names a storage tier.
type Tier int32

const (
	G1 Tier = C.KVT_TIER_G1 // GPU memory, or its host stand-in
	G2 Tier = C.KVT_TIER_G2 // host memory
	G3 Tier = C.KVT_TIER_G3 // local disk
	G4 Tier = C.KVT_TIER_G4 // remote, on Redis: no blocks of its own (see G4Match)
)

// Block is a block handle; 0 is never valid.
type Block uint64

// Status is a kvt_status.
type Status int32

const (
	StatusOK              Status = C.KVT_OK
	StatusAgain           Status = C.KVT_AGAIN // nothing to do now; try again later
	StatusTimeout         Status = C.KVT_TIMEOUT
	StatusIterOver        Status = C.KVT_ITEROVER // an iteration has no more items (0.5.0)
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
	StatusNotFound        Status = C.KVT_ERR_NOT_FOUND // an unknown request id (never seen, or finished)
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

// Sentinels for errors.Is, one per status but StatusOK. ErrAgain, ErrTimeout and
// ErrIterOver are outcomes, not failures (the positive statuses).
var (
	ErrAgain           = &Error{Status: StatusAgain}
	ErrTimeout         = &Error{Status: StatusTimeout}
	ErrIterOver        = &Error{Status: StatusIterOver}
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrInvalidHandle   = &Error{Status: StatusInvalidHandle}
	ErrState           = &Error{Status: StatusState}
	ErrNoSpace         = &Error{Status: StatusNoSpace}
	ErrCancelled       = &Error{Status: StatusCancelled}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrIO              = &Error{Status: StatusIO}
	ErrCorrupt         = &Error{Status: StatusCorrupt}
	ErrNoMemory        = &Error{Status: StatusNoMemory}
	ErrCUDA            = &Error{Status: StatusCUDA}
	ErrNotFound        = &Error{Status: StatusNotFound}
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

// TryHashSalt hashes a salt (a model name, for instance) for HashSequence, with the
// library's status.
func TryHashSalt(salt []byte) (uint64, error) {
	var out C.uint64_t
	var p unsafe.Pointer
	if len(salt) > 0 {
		p = unsafe.Pointer(&salt[0])
	}
	err := call(func() C.kvt_status { return C.kvt_hash_salt(&out, p, C.size_t(len(salt))) })
	return uint64(out), err
}

// HashSalt is TryHashSalt without the status (0 where it fails).
//
// Deprecated: use TryHashSalt, which does not drop the status.
func HashSalt(salt []byte) uint64 {
	h, _ := TryHashSalt(salt)
	return h
}

// HashSequence returns the sequence hashes of the full blocks of tokens.
func HashSequence(tokens []uint32, pageSize uint32, saltHash uint64) ([]uint64, error) {
	if pageSize == 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "page size 0"}
	}
	out := make([]uint64, len(tokens)/int(pageSize)+1)
	var n C.size_t
	err := call(func() C.kvt_status {
		return C.kvt_hash_tokens((*C.uint64_t)(&out[0]), C.size_t(len(out)), &n, C.uint64_t(saltHash),
			u32ptr(tokens), C.size_t(len(tokens)), C.uint32_t(pageSize))
	})
	// *n is the number of full blocks, of which only the first len(out) were written.
	return out[:minSize(n, len(out))], err
}

// minSize is min(n, max) for a count a call set and the room it had (0 for max < 0).
func minSize(n C.size_t, max int) int {
	if max <= 0 {
		return 0
	}
	if n < C.size_t(max) {
		return int(n)
	}
	return max
}

// noNUL refuses a string holding a NUL byte, which C would take for its end; what names it.
func noNUL(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf("%s %q holds a NUL byte", what, s)}
	}
	return nil
}

// cString is C.CString for a string without a NUL byte (what names it in the error); the
// caller frees the copy.
func cString(what, s string) (*C.char, error) {
	if err := noNUL(what, s); err != nil {
		return nil, err
	}
	return C.CString(s), nil
}

// cStrs holds C copies of strings until the call that borrows them has returned; err is the
// first string refused.
type cStrs struct {
	ptrs []unsafe.Pointer
	err  error
}

// str copies s, the field what; "" is NULL, the library's default. A string holding a NUL
// byte is refused: NULL, and a.err says so.
func (a *cStrs) str(what, s string) *C.char {
	if s == "" {
		return nil
	}
	if err := noNUL(what, s); err != nil {
		if a.err == nil {
			a.err = err
		}
		return nil
	}
	p := C.CString(s)
	a.ptrs = append(a.ptrs, unsafe.Pointer(p))
	return p
}

func (a *cStrs) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

func cBool(b bool) C.uint32_t {
	if b {
		return 1
	}
	return 0
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

// MemoryKind says where G1 lives (kvt_memory_kind).
type MemoryKind uint32

const (
	MemoryAuto MemoryKind = C.KVT_MEMORY_AUTO // CUDA memory when a device is present, else host
	MemoryHost MemoryKind = C.KVT_MEMORY_HOST
	MemoryCUDA MemoryKind = C.KVT_MEMORY_CUDA
)

// IOEngine says how G3's file is read and written (kvt_io_engine).
type IOEngine uint32

const (
	IOAuto    IOEngine = C.KVT_IO_AUTO
	IOURing   IOEngine = C.KVT_IO_URING
	IOThreads IOEngine = C.KVT_IO_THREADS
)

// CUDACopy says how the CUDA engine copies scattered chunks (kvt_cuda_copy).
type CUDACopy uint32

const (
	CUDACopyBatched  CUDACopy = C.KVT_CUDA_COPY_BATCHED
	CUDACopyPerChunk CUDACopy = C.KVT_CUDA_COPY_PER_CHUNK
	CUDACopyKernel   CUDACopy = C.KVT_CUDA_COPY_KERNEL
	CUDACopyAuto     CUDACopy = C.KVT_CUDA_COPY_AUTO
)

// G3Fault names the G3 operations that the fault injector fails (kvt_g3_fault), for tests.
type G3Fault uint32

const (
	G3FaultOff   G3Fault = C.KVT_G3_FAULT_OFF
	G3FaultWrite G3Fault = C.KVT_G3_FAULT_WRITE
	G3FaultRead  G3Fault = C.KVT_G3_FAULT_READ
)

// G3Mismatch says what NewManager does with a persistent G3 file it cannot read as its own
// (kvt_g3_mismatch).
type G3Mismatch uint32

const (
	G3Refuse G3Mismatch = C.KVT_G3_REFUSE // fail with ErrInvalidArgument naming the difference
	G3Reset  G3Mismatch = C.KVT_G3_RESET  // start the file empty, with a log message
)

// Eviction says which inactive block a tier evicts first (kvt_eviction).
type Eviction uint32

const (
	EvictLRU    Eviction = C.KVT_EVICT_LRU
	EvictS3FIFO Eviction = C.KVT_EVICT_S3FIFO // scan-resistant, for the lower tiers
)

// KVEventsFormat is the vLLM wire format the KV events follow (kvt_kv_events_format).
type KVEventsFormat uint32

const (
	KVEventsFormatCurrent    KVEventsFormat = C.KVT_KV_EVENTS_FORMAT_CURRENT
	KVEventsFormatArrayV0_11 KVEventsFormat = C.KVT_KV_EVENTS_FORMAT_ARRAY_V0_11
)

// Policy flags: which blocks are worth offloading (kvt_policy); they combine as all-of.
const (
	PolicyPassAll   = C.KVT_POLICY_PASS_ALL
	PolicyPresence  = C.KVT_POLICY_PRESENCE  // skip blocks already in, or on their way to, the destination
	PolicyFrequency = C.KVT_POLICY_FREQUENCY // skip blocks offered fewer than MinFrequency times
)

// Policy is the offload filter of one tier pair.
type Policy struct {
	Flags, MinFrequency uint32
}

// G1Layout is engine-owned G1 memory (kvt_g1_layout): chunk (layer, outer) of slot b lives
// at Bases[layer*NumOuter+outer] + b*Strides[same index]. The memory lies outside Go's heap
// (C, mmap or CUDA memory: cgo forbids the library from keeping Go pointers), holds every
// slot, and outlives the manager.
type G1Layout struct {
	Memory     MemoryKind // MemoryHost or MemoryCUDA
	CUDADevice int32
	Bases      []uintptr
	Strides    []uint64
}

// Config is the whole kvt_manager_config; DefaultConfig gives the library's defaults.
type Config struct {
	PageSize, NumLayers, NumOuter uint32
	ChunkBytes                    uint64
	G1Blocks, G2Blocks, G3Blocks  uint64
	G3Path                        string // "": a temporary directory
	EventCapacity                 uint64
	G1Layout                      *G1Layout // nil: library-owned G1, in G1Memory
	G1Memory                      MemoryKind
	CUDADevice                    int32
	// Pipeline
	MaxBatchSize, MinBatchSize                        uint32
	FlushIntervalUs, PolicyTimeoutUs, SweepIntervalUs uint64
	MaxConcurrentTransfers, CopyThreads               uint32
	PolicyG1G2, PolicyG1G3, PolicyG2G3                Policy
	G3IO                                              IOEngine
	CUDACopy                                          CUDACopy
	// Fault injection (tests): of the G3 operations of kind G3FaultOp, the first
	// G3FaultSkip go through, the next G3FaultCount fail with errno G3FaultErrno.
	G3FaultOp                 G3Fault
	G3FaultErrno              int32
	G3FaultSkip, G3FaultCount uint64
	// A G3 that survives restarts: G3Path/kvtier-g3.bin (G3Path needed) outlives the
	// manager, and the next one recovers its blocks.
	G3Persist    bool
	G3OnMismatch G3Mismatch
	G3Namespace  uint64 // a persistent file's owner tag, e.g. the model's salt hash
	G3KeyEnv     string // "": checksums; else the variable holding G3's MAC key (64 hex digits)
	// Eviction: the order of each tier (G1, G2, G3), and the share of a tier pinned blocks
	// may hold (0..100).
	Eviction         [3]Eviction
	MaxPinnedPercent uint32
	// KV events in vLLM's ZMQ wire format; "" strings are NULL: no publisher, no replay
	// socket, the topic "".
	KVEventsEndpoint, KVEventsReplayEndpoint, KVEventsTopic string
	KVEventsBuffer                                          uint64 // batches kept for replay
	KVEventsDPRank                                          int32
	KVEventsTiers                                           uint32 // bit 1<<tier: that tier is published
	KVEventsFormat                                          KVEventsFormat
	// G4, a tier on Redis: "redis://host:port[/db]", "unix:///path[?db=N]", shards separated
	// by commas, or "redis+cluster://..."; "": no G4. The *Env fields name environment
	// variables, read at NewManager; G4KeyPrefix "" is the library's "kvtier".
	G4URL, G4PasswordEnv, G4KeyPrefix string
	G4Namespace, G4TimeoutUs          uint64
	G4KeyEnv                          string // "": checksums; else the variable holding the MAC key
}

func initConfig(c *C.kvt_manager_config) {
	C.kvt_manager_config_init_sized(c, C.size_t(unsafe.Sizeof(*c)))
}

// DefaultConfig is the library's defaults, except that G1 lives in host memory (the embedded
// stand-in for GPU memory).
func DefaultConfig() Config {
	var c C.kvt_manager_config
	initConfig(&c)
	policy := func(p C.kvt_policy) Policy { return Policy{uint32(p.flags), uint32(p.min_frequency)} }
	return Config{
		PageSize: uint32(c.page_size), NumLayers: uint32(c.num_layers), NumOuter: uint32(c.num_outer),
		ChunkBytes: uint64(c.chunk_bytes), G1Blocks: uint64(c.g1_blocks),
		G2Blocks: uint64(c.g2_blocks), G3Blocks: uint64(c.g3_blocks),
		EventCapacity: uint64(c.event_capacity), G1Memory: MemoryHost,
		CUDADevice: int32(c.cuda_device), MaxBatchSize: uint32(c.max_batch_size),
		MinBatchSize: uint32(c.min_batch_size), FlushIntervalUs: uint64(c.flush_interval_us),
		PolicyTimeoutUs: uint64(c.policy_timeout_us), SweepIntervalUs: uint64(c.sweep_interval_us),
		MaxConcurrentTransfers: uint32(c.max_concurrent_transfers),
		CopyThreads:            uint32(c.copy_threads),
		PolicyG1G2:             policy(c.policy_g1_g2), PolicyG1G3: policy(c.policy_g1_g3),
		PolicyG2G3: policy(c.policy_g2_g3), G3IO: IOEngine(c.g3_io), CUDACopy: CUDACopy(c.cuda_copy),
		G3FaultOp: G3Fault(c.g3_fault_op), G3FaultErrno: int32(c.g3_fault_errno),
		G3FaultSkip: uint64(c.g3_fault_skip), G3FaultCount: uint64(c.g3_fault_count),
		G3Persist: c.g3_persist != 0, G3OnMismatch: G3Mismatch(c.g3_on_mismatch),
		G3Namespace: uint64(c.g3_namespace), MaxPinnedPercent: uint32(c.max_pinned_percent),
		Eviction:       [3]Eviction{Eviction(c.eviction[0]), Eviction(c.eviction[1]), Eviction(c.eviction[2])},
		KVEventsDPRank: int32(c.kv_events_dp_rank), KVEventsTiers: uint32(c.kv_events_tiers),
		KVEventsFormat: KVEventsFormat(c.kv_events_format), G4Namespace: uint64(c.g4_namespace),
		G4TimeoutUs: uint64(c.g4_timeout_us), KVEventsBuffer: uint64(c.kv_events_buffer),
	}
}

// Manager owns a kvt_manager. Its methods may be called from many goroutines at once.
// Close cancels the transfers that goroutines wait for, then waits for every call in
// progress to return.
type Manager struct {
	mu      sync.RWMutex // Close takes it for writing, every call for reading
	m       *C.kvt_manager
	waitMu  sync.Mutex // guards waiting, closing, conn and eps
	waiting map[*C.kvt_xfer]int
	closing bool
	conn    *connState              // its open connector, closed before the manager
	eps     map[*endpointState]bool // its open endpoints, closed before the connector
	pageSz  int                     // tokens per block, to size NoteTokens' array
}

// cLayout copies a layout into C memory (cgo forbids Go memory holding these pointers);
// free releases it once kvt_manager_create has copied it.
func cLayout(l *G1Layout) (p *C.kvt_g1_layout, free func()) {
	n := len(l.Bases)
	p = (*C.kvt_g1_layout)(C.calloc(1, C.size_t(unsafe.Sizeof(*p))))
	bases := C.calloc(C.size_t(n+1), C.size_t(unsafe.Sizeof(C.uintptr_t(0))))
	strides := C.calloc(C.size_t(len(l.Strides)+1), 8)
	for i, b := range l.Bases {
		unsafe.Slice((*C.uintptr_t)(bases), n)[i] = C.uintptr_t(b)
	}
	for i, s := range l.Strides {
		unsafe.Slice((*C.uint64_t)(strides), len(l.Strides))[i] = C.uint64_t(s)
	}
	p.struct_size = C.uint32_t(unsafe.Sizeof(*p))
	p.memory = C.uint32_t(l.Memory)
	p.cuda_device = C.int32_t(l.CUDADevice)
	p.bases = (*unsafe.Pointer)(bases)
	p.strides = (*C.uint64_t)(strides)
	return p, func() {
		C.free(bases)
		C.free(strides)
		C.free(unsafe.Pointer(p))
	}
}

// NewManager creates a manager from every field of cfg: start from DefaultConfig().
func NewManager(cfg Config) (*Manager, error) {
	var c C.kvt_manager_config
	initConfig(&c)
	policy := func(p Policy) C.kvt_policy {
		return C.kvt_policy{flags: C.uint32_t(p.Flags), min_frequency: C.uint32_t(p.MinFrequency)}
	}
	c.page_size, c.num_layers, c.num_outer = C.uint32_t(cfg.PageSize), C.uint32_t(cfg.NumLayers), C.uint32_t(cfg.NumOuter)
	c.chunk_bytes = C.uint64_t(cfg.ChunkBytes)
	c.g1_blocks, c.g2_blocks, c.g3_blocks = C.uint64_t(cfg.G1Blocks), C.uint64_t(cfg.G2Blocks), C.uint64_t(cfg.G3Blocks)
	c.event_capacity = C.uint64_t(cfg.EventCapacity)
	c.g1_memory, c.cuda_device = C.uint32_t(cfg.G1Memory), C.int32_t(cfg.CUDADevice)
	c.max_batch_size, c.min_batch_size = C.uint32_t(cfg.MaxBatchSize), C.uint32_t(cfg.MinBatchSize)
	c.flush_interval_us = C.uint64_t(cfg.FlushIntervalUs)
	c.policy_timeout_us = C.uint64_t(cfg.PolicyTimeoutUs)
	c.sweep_interval_us = C.uint64_t(cfg.SweepIntervalUs)
	c.max_concurrent_transfers, c.copy_threads = C.uint32_t(cfg.MaxConcurrentTransfers), C.uint32_t(cfg.CopyThreads)
	c.policy_g1_g2, c.policy_g1_g3, c.policy_g2_g3 = policy(cfg.PolicyG1G2), policy(cfg.PolicyG1G3), policy(cfg.PolicyG2G3)
	c.g3_io, c.cuda_copy = C.uint32_t(cfg.G3IO), C.uint32_t(cfg.CUDACopy)
	c.g3_fault_op, c.g3_fault_errno = C.uint32_t(cfg.G3FaultOp), C.int32_t(cfg.G3FaultErrno)
	c.g3_fault_skip, c.g3_fault_count = C.uint64_t(cfg.G3FaultSkip), C.uint64_t(cfg.G3FaultCount)
	c.g3_persist = cBool(cfg.G3Persist)
	c.g3_on_mismatch, c.g3_namespace = C.uint32_t(cfg.G3OnMismatch), C.uint64_t(cfg.G3Namespace)
	for i, e := range cfg.Eviction {
		c.eviction[i] = C.uint32_t(e)
	}
	c.max_pinned_percent = C.uint32_t(cfg.MaxPinnedPercent)
	c.kv_events_buffer, c.kv_events_dp_rank = C.uint64_t(cfg.KVEventsBuffer), C.int32_t(cfg.KVEventsDPRank)
	c.kv_events_tiers, c.kv_events_format = C.uint32_t(cfg.KVEventsTiers), C.uint32_t(cfg.KVEventsFormat)
	c.g4_namespace, c.g4_timeout_us = C.uint64_t(cfg.G4Namespace), C.uint64_t(cfg.G4TimeoutUs)
	var strs cStrs
	defer strs.free()
	c.g3_path, c.g3_key_env = strs.str("G3Path", cfg.G3Path), strs.str("G3KeyEnv", cfg.G3KeyEnv)
	c.kv_events_endpoint = strs.str("KVEventsEndpoint", cfg.KVEventsEndpoint)
	c.kv_events_replay_endpoint = strs.str("KVEventsReplayEndpoint", cfg.KVEventsReplayEndpoint)
	c.kv_events_topic = strs.str("KVEventsTopic", cfg.KVEventsTopic)
	c.g4_url, c.g4_password_env = strs.str("G4URL", cfg.G4URL), strs.str("G4PasswordEnv", cfg.G4PasswordEnv)
	c.g4_key_prefix, c.g4_key_env = strs.str("G4KeyPrefix", cfg.G4KeyPrefix), strs.str("G4KeyEnv", cfg.G4KeyEnv)
	if strs.err != nil {
		return nil, strs.err
	}
	if l := cfg.G1Layout; l != nil {
		if len(l.Bases) != len(l.Strides) {
			return nil, &Error{Status: StatusInvalidArgument,
				Message: fmt.Sprintf("G1Layout: %d bases but %d strides", len(l.Bases), len(l.Strides))}
		}
		p, free := cLayout(l)
		defer free()
		c.g1_layout = p
	}
	var cm *C.kvt_manager
	if err := call(func() C.kvt_status { return C.kvt_manager_create(&cm, &c) }); err != nil {
		return nil, err
	}
	mgr := &Manager{m: cm, waiting: map[*C.kvt_xfer]int{}, eps: map[*endpointState]bool{},
		pageSz: int(cfg.PageSize)}
	runtime.SetFinalizer(mgr, (*Manager).Close)
	return mgr, nil
}

// Close destroys the manager and everything it owns, its endpoints and connector first;
// transfers and fences of it become invalid. Calling it again is a no-op.
func (m *Manager) Close() error {
	m.waitMu.Lock()
	m.closing = true
	for x := range m.waiting { // alive: their Transfer.Close waits for the waiters
		C.kvt_xfer_cancel(x)
	}
	conn := m.conn
	m.waitMu.Unlock()
	if conn != nil { // a scheduler call paused at a breakpoint holds the lock below: let it go
		conn.startClose()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waitMu.Lock()
	conn, eps := m.conn, m.eps
	m.conn, m.eps = nil, map[*endpointState]bool{}
	m.waitMu.Unlock()
	for e := range eps {
		e.close()
	}
	if conn != nil {
		conn.close()
	}
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
		return C.kvt_tier_match_prefix(&n, blockPtr(out), c, C.kvt_tier(tier), u64ptr(hashes),
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

// Chunk is the address of chunk (layer, outer) of a block, in the memory of its tier (a
// device address for CUDA memory), ChunkBytes long: valid while a reference is held.
func (m *Manager) Chunk(b Block, layer, outer uint32) (uintptr, error) {
	var p unsafe.Pointer
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_block_chunk(&p, c, C.kvt_block(b), C.uint32_t(layer), C.uint32_t(outer))
	})
	return uintptr(p), err
}

// Check verifies the manager's invariants.
func (m *Manager) Check() error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_check(c) })
}

// AllTiers, given to Reset, names every tier.
const AllTiers Tier = 0

// Reset empties one tier's registry, or every tier's (AllTiers): transfers not yet
// committed that touch it end cancelled, copies in flight are waited for, and blocks still
// held stay readable until released. Events: EventBlockRemoved per block, then
// EventTierCleared.
func (m *Manager) Reset(tier Tier) error {
	return m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_manager_reset(c, C.int(tier))
	})
}

// Event is one completion or registry event.
type Event struct {
	Type     uint32 // one of the Event* constants below
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
	EventTierCleared   = C.KVT_EVENT_TIER_CLEARED
)

// Poll drains up to max pending events, oldest first.
func (m *Manager) Poll(max int) ([]Event, error) {
	if max <= 0 {
		return nil, nil
	}
	buf := make([]C.kvt_event, max)
	var n C.size_t
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		n = C.kvt_manager_poll(c, &buf[0], C.size_t(max))
		return C.KVT_OK
	})
	return events(buf[:n]), err
}

func events(buf []C.kvt_event) []Event {
	out := make([]Event, len(buf))
	for i := range out {
		e := &buf[i]
		out[i] = Event{uint32(e._type), Status(e.status), Tier(e.tier), uint64(e.user_data),
			uint64(e.hash), uint64(e.parent_hash), uint64(e.count)}
	}
	return out
}

// EventFD is readable while events are pending; owned by the manager.
func (m *Manager) EventFD() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.m == nil {
		return -1
	}
	return int(C.kvt_manager_event_fd(m.m))
}

// Transfer is an enqueued offload or onboard. Close releases it (cancelling it if it has
// not committed). Its methods may be called from several goroutines at once, Close during
// another goroutine's Wait included.
type Transfer struct {
	m       *Manager
	mu      sync.Mutex // guards x and waiters
	left    sync.Cond  // signalled when a waiter leaves
	x       *C.kvt_xfer
	waiters int
	n       int
}

func (m *Manager) newTransfer(x *C.kvt_xfer, n int) *Transfer {
	t := &Transfer{m: m, x: x, n: n}
	t.left.L = &t.mu
	runtime.SetFinalizer(t, (*Transfer).Close)
	return t
}

// Offload copies registered blocks of one tier down to dst. fence may be nil.
func (m *Manager) Offload(blocks []Block, dst Tier, fence *Fence, userData uint64) (*Transfer, error) {
	var x *C.kvt_xfer
	err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_xfer_offload(&x, c, blockPtr(blocks), C.size_t(len(blocks)), C.kvt_tier(dst),
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
		return C.kvt_xfer_onboard(&x, c, blockPtr(src), blockPtr(dst), C.size_t(len(src)),
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

// with runs a short call on the live transfer of a live manager. Locks in the order of
// Close: the manager's, then the transfer's.
func (t *Transfer) with(f func(*C.kvt_xfer) C.kvt_status) error {
	t.m.mu.RLock()
	defer t.m.mu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.x == nil || t.m.m == nil {
		return &Error{Status: StatusInvalidHandle, Message: "the transfer is closed or its manager closed"}
	}
	return call(func() C.kvt_status { return f(t.x) })
}

// Cancel cancels a transfer that has not committed.
func (t *Transfer) Cancel() error {
	return t.with(func(x *C.kvt_xfer) C.kvt_status { return C.kvt_xfer_cancel(x) })
}

// Wait waits for the end (timeout < 0: forever, 0: only looks) and returns the blocks moved;
// a cancelled transfer gives ErrCancelled, one that has not ended in time ErrTimeout.
func (t *Transfer) Wait(timeout time.Duration) (uint64, error) {
	// Locks in the order of Close: the manager's, then the transfer's. A waiter that Close
	// counts already holds the manager's lock, so it never queues for it behind the
	// manager's Close while Close waits for it.
	t.m.mu.RLock()
	defer t.m.mu.RUnlock()
	t.mu.Lock()
	x := t.x
	if x == nil || t.m.m == nil {
		t.mu.Unlock()
		return 0, &Error{Status: StatusInvalidHandle, Message: "the transfer is closed or its manager closed"}
	}
	t.waiters++
	t.mu.Unlock()
	defer func() { // x stays alive until the last waiter is out: Close waits for it
		t.mu.Lock()
		t.waiters--
		t.left.Broadcast()
		t.mu.Unlock()
	}()
	var count C.uint64_t
	err := call(func() C.kvt_status {
		defer t.m.waitFor(x)()
		s := C.kvt_xfer_wait(x, C.int64_t(timeout))
		if s == C.KVT_OK {
			s = C.kvt_xfer_status(nil, nil, &count, x)
		}
		return s
	})
	var e *Error
	if errors.As(err, &e) && e.Status == StatusTimeout { // kvt_last_error may be older
		e.Message = fmt.Sprintf("the transfer did not end within %v", timeout)
	}
	return uint64(count), err
}

// WaitContext is Wait until the transfer ends or ctx does (then ctx.Err(); the transfer
// goes on).
func (t *Transfer) WaitContext(ctx context.Context) (n uint64, err error) {
	err = waitSliced(ctx, func(slice time.Duration) error {
		n, err = t.Wait(slice)
		return err
	})
	return n, err
}

// waitSlice bounds how late a Context form of a wait sees its context end: the library's
// waits cannot be interrupted, so they wait in slices and look at the context in between.
const waitSlice = 10 * time.Millisecond

// waitSliced calls wait with slices of time until it returns anything but ErrTimeout, or
// ctx ends.
func waitSliced(ctx context.Context, wait func(time.Duration) error) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := waitSlice
		if d, ok := ctx.Deadline(); ok {
			left := time.Until(d)
			if left <= 0 { // the context's timer may not have fired yet
				return context.DeadlineExceeded
			}
			if left < slice {
				slice = left
			}
		}
		if err := wait(slice); !errors.Is(err, ErrTimeout) {
			return err
		}
	}
}

// waitFor registers a wait on x, so that the manager's Close can cancel it; the function it
// returns unregisters it.
func (m *Manager) waitFor(x *C.kvt_xfer) func() {
	m.waitMu.Lock()
	defer m.waitMu.Unlock()
	if m.closing {
		C.kvt_xfer_cancel(x)
	}
	m.waiting[x]++
	return func() {
		m.waitMu.Lock()
		defer m.waitMu.Unlock()
		if m.waiting[x]--; m.waiting[x] == 0 {
			delete(m.waiting, x)
		}
	}
}

// Blocks gives an ended onboard's final G1 handles.
func (t *Transfer) Blocks() ([]Block, error) {
	out := make([]Block, t.n+1)
	err := t.with(func(x *C.kvt_xfer) C.kvt_status {
		return C.kvt_xfer_blocks(blockPtr(out), C.size_t(t.n), x)
	})
	return out[:t.n], err
}

// Close releases the transfer. Waits in other goroutines end first: a transfer not yet
// committed is cancelled at once, one in flight finishes its copy. Safe after the manager's
// Close, and twice.
func (t *Transfer) Close() error {
	t.m.mu.RLock()
	defer t.m.mu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.x
	t.x = nil
	if x != nil && t.m.m != nil {
		// Waiters hold the manager's lock for reading too (taken before they are counted),
		// so waiting for them here under it cannot wait on the manager's Close.
		if t.waiters > 0 {
			C.kvt_xfer_cancel(x)
			for t.waiters > 0 {
				t.left.Wait()
			}
		}
		C.kvt_xfer_release(x)
	}
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
