package kvtier

/*
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// ConnectorRole says which half (or both) a connector plays (kvt_connector_role).
type ConnectorRole uint32

const (
	RoleScheduler ConnectorRole = C.KVT_ROLE_SCHEDULER
	RoleWorker    ConnectorRole = C.KVT_ROLE_WORKER
	RoleBoth      ConnectorRole = C.KVT_ROLE_BOTH
)

// OffloadMode says when full blocks are stored (kvt_offload_mode): at the step that computes
// them, or when the engine is about to overwrite their G1 block.
type OffloadMode uint32

const (
	OffloadEager OffloadMode = C.KVT_OFFLOAD_EAGER
	OffloadLazy  OffloadMode = C.KVT_OFFLOAD_LAZY
)

// SlotState is a request's slot state (kvt_slot_state); String gives its C name.
type SlotState uint32

const (
	SlotInitialized    SlotState = C.KVT_SLOT_INITIALIZED
	SlotOnboardStaged  SlotState = C.KVT_SLOT_ONBOARD_STAGED
	SlotOnboarding     SlotState = C.KVT_SLOT_ONBOARDING
	SlotPrefilling     SlotState = C.KVT_SLOT_PREFILLING
	SlotDecoding       SlotState = C.KVT_SLOT_DECODING
	SlotSkippedPrefill SlotState = C.KVT_SLOT_SKIPPED_PREFILL
	SlotSkippedDecode  SlotState = C.KVT_SLOT_SKIPPED_DECODE
	SlotPreempted      SlotState = C.KVT_SLOT_PREEMPTED
	SlotFinishing      SlotState = C.KVT_SLOT_FINISHING
	SlotFinished       SlotState = C.KVT_SLOT_FINISHED
)

func (s SlotState) String() string { return C.GoString(C.kvt_slot_state_str(C.uint32_t(s))) }

// ConnectorConfig is the whole kvt_connector_config; DefaultConnectorConfig gives the
// library's defaults.
type ConnectorConfig struct {
	Role    ConnectorRole
	Offload OffloadMode
	// Where stores go: G2 or G3. Loads come from G2, then G3 for the rest of a prefix.
	StoreTier Tier
	// Scheduler: G1 block ids are 0..NumGPUBlocks-1; 0 takes the manager's G1Blocks.
	NumGPUBlocks uint64
	// Salt hash of the requests' block hashes (default: the empty salt's).
	SaltHash uint64
	// true: loads are asynchronous (the engine waits for the request in FinishedRecving);
	// false: they end within the step, before WaitForLayerLoad returns.
	LoadAsync bool
	// Serve the management endpoint on this Unix socket (which must not exist) for the
	// connector's life; "": none.
	EndpointPath string
	// How long a breakpoint's pause waits for a resume: 1 ms .. 1 hour.
	PauseTimeoutMs uint32
	// Tensor and pipeline parallelism: the scheduler half's workers (1..4096), and a worker
	// half's rank below it. RoleBoth needs 1.
	WorldSize uint32
	Rank      uint32
	// One KV cache group of a hybrid model with a sliding window of this many tokens
	// (0: full attention); both halves take the same value, and lazy offload is refused.
	SlidingWindow uint32
}

func initConnectorConfig(c *C.kvt_connector_config) {
	C.kvt_connector_config_init_sized(c, C.size_t(unsafe.Sizeof(*c)))
}

// DefaultConnectorConfig is the library's defaults.
func DefaultConnectorConfig() ConnectorConfig {
	var c C.kvt_connector_config
	initConnectorConfig(&c)
	return ConnectorConfig{
		Role: ConnectorRole(c.role), Offload: OffloadMode(c.offload), StoreTier: Tier(c.store_tier),
		NumGPUBlocks: uint64(c.num_gpu_blocks), SaltHash: uint64(c.salt_hash), LoadAsync: c.load_async != 0,
		PauseTimeoutMs: uint32(c.pause_timeout_ms), WorldSize: uint32(c.world_size), Rank: uint32(c.rank),
		SlidingWindow: uint32(c.sliding_window),
	}
}

// ScheduledRequest is one request in a step's schedule (kvt_scheduled_request).
type ScheduledRequest struct {
	ReqID              string
	NumComputedTokens  uint64   // before this step
	NumScheduledTokens uint64   // tokens whose KV this step computes
	NewBlockIDs        []uint32 // G1 blocks added since the connector last saw its list, in order
	NewTokenIDs        []uint32 // tokens appended since the last step (sampled ones); none in prefill
}

// Finished is what the worker finished since its last GetFinished (kvt_finished).
type Finished struct {
	FinishedSending   []string // finished requests whose stores all ended: free their G1 blocks
	FinishedRecving   []string // requests whose loads all ended
	LoadErrorBlockIDs []uint32 // G1 blocks whose load failed: recompute them
	Report            []byte   // for the scheduler's UpdateConnectorOutput
}

// ConnectorStats are the scheduler half's counters (kvt_connector_stats).
type ConnectorStats struct {
	Transitions   [11][11]uint64 // [from][to] by SlotState; from 0: slot created
	Preemptions   uint64
	MatchedTokens uint64 // reported by GetNumNewMatchedTokens and accepted
	LoadedBlocks  uint64 // loads the worker reported done
	LoadErrors    uint64 // blocks whose load failed
	StoredBlocks  uint64 // stores registered in their tier
	StoreFailures uint64 // stores dropped
}

// Connector is the request layer a serving engine plugs in, with vLLM's method names
// (KVConnectorBase_V1): a scheduler half that decides each step's loads and stores and
// passes them on as metadata bytes, and a worker half that copies and answers with a report.
// Both halves may live in one connector (RoleBoth) or in two processes. Its methods may be
// called from many goroutines at once (the worker half's waits block no other call); Close
// waits for the calls in progress.
type Connector struct {
	m *Manager
	s *connState
}

// connState is what the manager knows of its connector: no pointer back, so that a Connector
// and its Manager form no cycle (finalizers do not run on cycles), and the Connector's
// finalizer runs before the Manager's.
type connState struct {
	mu      sync.RWMutex // close takes it for writing, every call for reading
	c       *C.kvt_connector
	closing atomic.Bool // set when close begins: calls from then on are refused
	// The library's result buffers, one per half, each reused by the next call of its kind:
	// these keep that call off the buffer being copied. Two, so that a scheduler call paused
	// at a breakpoint does not hold up the worker's GetFinished.
	metaMu sync.Mutex // BuildConnectorMeta's
	finMu  sync.Mutex // GetFinished's
}

var errConnectorClosed = &Error{Status: StatusInvalidHandle, Message: "the connector or its manager is closed"}

// NewConnector creates the manager's connector (a manager has at most one) from every field
// of cfg: start from DefaultConnectorConfig(). Close it before the manager, or the
// manager's Close does.
func (m *Manager) NewConnector(cfg ConnectorConfig) (*Connector, error) {
	var c C.kvt_connector_config
	initConnectorConfig(&c)
	c.role, c.offload, c.store_tier = C.uint32_t(cfg.Role), C.uint32_t(cfg.Offload), C.uint32_t(cfg.StoreTier)
	c.num_gpu_blocks, c.salt_hash = C.uint64_t(cfg.NumGPUBlocks), C.uint64_t(cfg.SaltHash)
	if cfg.LoadAsync {
		c.load_async = 1
	}
	c.pause_timeout_ms = C.uint32_t(cfg.PauseTimeoutMs)
	c.world_size, c.rank = C.uint32_t(cfg.WorldSize), C.uint32_t(cfg.Rank)
	c.sliding_window = C.uint32_t(cfg.SlidingWindow)
	if cfg.EndpointPath != "" {
		p, err := cString("EndpointPath", cfg.EndpointPath)
		if err != nil {
			return nil, err
		}
		defer C.free(unsafe.Pointer(p))
		c.endpoint_path = p
	}
	var conn *Connector
	err := m.with(func(cm *C.kvt_manager) C.kvt_status {
		var cc *C.kvt_connector
		s := C.kvt_connector_create(&cc, cm, &c)
		if s == C.KVT_OK { // known to the manager before its Close can run
			conn = &Connector{m: m, s: &connState{c: cc}}
			m.waitMu.Lock()
			m.conn = conn.s
			m.waitMu.Unlock()
		}
		return s
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(conn, (*Connector).Close)
	return conn, nil
}

// Close closes the endpoints that serve the connector, waits for the worker's copies in
// flight, releases every pin and destroys the connector. Calls that begin once it has begun
// fail with ErrInvalidHandle; it lets a scheduler call paused at a breakpoint go on (and
// pauses to come end within 1 ms), ends WaitPaused, and waits for the calls in progress.
// Calling it again, or after the manager's Close, is a no-op.
func (c *Connector) Close() error {
	c.m.mu.RLock()
	defer c.m.mu.RUnlock()
	var eps []*endpointState
	c.m.waitMu.Lock()
	for e := range c.m.eps {
		if e.conn == c.s {
			eps = append(eps, e)
			delete(c.m.eps, e)
		}
	}
	if c.m.conn == c.s {
		c.m.conn = nil
	}
	c.m.waitMu.Unlock()
	for _, e := range eps { // they serve the connector: closed first
		e.close()
	}
	c.s.close()
	runtime.SetFinalizer(c, nil)
	return nil
}

// startClose begins the close: calls from now on are refused, and a scheduler call paused at
// a breakpoint (or by Pause), which holds the locks that close takes, is let go, as is one
// that pauses later (within 1 ms). Breakpoint calls take no lock of the library's.
func (s *connState) startClose() {
	s.closing.Store(true)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.c != nil { // alive, and so is its manager: both are destroyed under s.mu held for writing
		C.kvt_connector_set_pause_timeout(s.c, 1)
		C.kvt_connector_resume(s.c) // KVT_ERR_STATE when none is paused: nothing to do
	}
}

// close destroys the connector; the caller holds its manager's lock, and the manager is open
// or has closed the connector before.
func (s *connState) close() {
	s.startClose()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		hooks.Delete(unsafe.Pointer(s.c)) // before its address can be another connector's
		C.kvt_connector_destroy(s.c)
	}
	s.c = nil
}

// with runs f on the open connector of an open manager. Locks in Close's order: the
// manager's, then the connector's.
func (c *Connector) with(f func(*C.kvt_connector) C.kvt_status) error {
	if c.s.closing.Load() {
		return errConnectorClosed
	}
	c.m.mu.RLock()
	defer c.m.mu.RUnlock()
	c.s.mu.RLock()
	defer c.s.mu.RUnlock()
	if c.s.c == nil || c.m.m == nil || c.s.closing.Load() {
		return errConnectorClosed
	}
	return call(func() C.kvt_status { return f(c.s.c) })
}

// cStrings copies strings into C memory (one block: the pointers, then the bytes); free
// releases it. A string holding a NUL byte is refused.
func cStrings(ss []string) (p **C.char, free func(), err error) {
	size := len(ss) * int(unsafe.Sizeof(p))
	for _, s := range ss {
		if err := noNUL("request id", s); err != nil {
			return nil, nil, err
		}
		size += len(s) + 1
	}
	block := C.malloc(C.size_t(size + 1))
	ptrs := unsafe.Slice((**C.char)(block), len(ss))
	bytes := unsafe.Slice((*byte)(block), size+1)[len(ss)*int(unsafe.Sizeof(p)):]
	for i, s := range ss {
		ptrs[i] = (*C.char)(unsafe.Pointer(&bytes[0]))
		bytes = bytes[copy(bytes, s):]
		bytes[0] = 0
		bytes = bytes[1:]
	}
	return (**C.char)(block), func() { C.free(block) }, nil
}

// withID runs f with the request id as a C string.
func (c *Connector) withID(reqID string, f func(*C.kvt_connector, *C.char) C.kvt_status) error {
	ids, free, err := cStrings([]string{reqID})
	if err != nil {
		return err
	}
	defer free()
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return f(cc, *ids) })
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// --- scheduler half ---

// GetNumNewMatchedTokens says how many tokens beyond numComputedTokens (the engine's own
// prefix hit) kvtier can load, and whether the load is asynchronous. tokens: the request's
// tokens so far. The first call for an id creates its slot.
func (c *Connector) GetNumNewMatchedTokens(reqID string, tokens []uint32, numComputedTokens uint64) (uint64, bool, error) {
	var n C.uint64_t
	var async C.int32_t
	err := c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_get_num_new_matched_tokens(&n, &async, cc, id, u32ptr(tokens),
			C.size_t(len(tokens)), C.uint64_t(numComputedTokens))
	})
	return uint64(n), async != 0, err
}

// GetNumNewMatchedTokensSalted is GetNumNewMatchedTokens for a request whose blocks are named
// under its own saltHash (from HashSalt): what besides its tokens decides its KV (a tenant's
// salt, a LoRA adapter), so that requests share blocks only when salts and tokens are equal.
func (c *Connector) GetNumNewMatchedTokensSalted(reqID string, saltHash uint64, tokens []uint32, numComputedTokens uint64) (uint64, bool, error) {
	var n C.uint64_t
	var async C.int32_t
	err := c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_get_num_new_matched_tokens_salted(&n, &async, cc, id,
			C.uint64_t(saltHash), u32ptr(tokens), C.size_t(len(tokens)), C.uint64_t(numComputedTokens))
	})
	return uint64(n), async != 0, err
}

// UpdateStateAfterAlloc: the engine allocated blockIDs (all of the request's G1 blocks, in
// order) and wants numExternalTokens of them filled: 0, or what GetNumNewMatchedTokens said.
func (c *Connector) UpdateStateAfterAlloc(reqID string, blockIDs []uint32, numExternalTokens uint64) error {
	return c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_update_state_after_alloc(cc, id, u32ptr(blockIDs), C.size_t(len(blockIDs)),
			C.uint64_t(numExternalTokens))
	})
}

// BuildConnectorMeta gives one step's loads and stores as metadata bytes for the worker.
// Live requests missing from reqs are skipped. All or nothing.
func (c *Connector) BuildConnectorMeta(reqs []ScheduledRequest) ([]byte, error) {
	ids := make([]string, len(reqs))
	words := 0
	for i, r := range reqs {
		ids[i] = r.ReqID
		words += len(r.NewBlockIDs) + len(r.NewTokenIDs)
	}
	cids, free, err := cStrings(ids)
	if err != nil {
		return nil, err
	}
	defer free()
	// The structs and their arrays in C memory: cgo forbids C from holding Go pointers.
	size := C.size_t(len(reqs))*C.size_t(unsafe.Sizeof(C.kvt_scheduled_request{})) + C.size_t(4*words) + 1
	block := C.malloc(size)
	defer C.free(block)
	raw := unsafe.Slice((*C.kvt_scheduled_request)(block), len(reqs))
	arena := unsafe.Slice((*C.uint32_t)(unsafe.Add(block, len(reqs)*int(unsafe.Sizeof(C.kvt_scheduled_request{})))), words)
	idPtrs := unsafe.Slice(cids, len(reqs))
	put := func(v []uint32) (*C.uint32_t, C.size_t) {
		if len(v) == 0 {
			return nil, 0
		}
		for i, x := range v {
			arena[i] = C.uint32_t(x)
		}
		p := &arena[0]
		arena = arena[len(v):]
		return p, C.size_t(len(v))
	}
	for i, r := range reqs {
		raw[i].req_id = idPtrs[i]
		raw[i].num_computed_tokens = C.uint64_t(r.NumComputedTokens)
		raw[i].num_scheduled_tokens = C.uint64_t(r.NumScheduledTokens)
		raw[i].new_block_ids, raw[i].num_new_block_ids = put(r.NewBlockIDs)
		raw[i].new_token_ids, raw[i].num_new_token_ids = put(r.NewTokenIDs)
	}
	var out []byte
	err = c.with(func(cc *C.kvt_connector) C.kvt_status {
		c.s.metaMu.Lock()
		defer c.s.metaMu.Unlock()
		var p unsafe.Pointer
		var n C.size_t
		s := C.kvt_connector_build_connector_meta(&p, &n, cc, (*C.kvt_scheduled_request)(block), C.size_t(len(reqs)))
		if s == C.KVT_OK {
			out = C.GoBytes(p, C.int(n))
		}
		return s
	})
	return out, err
}

// UpdateConnectorOutput applies the worker's report (Finished.Report).
func (c *Connector) UpdateConnectorOutput(report []byte) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_update_connector_output(cc, bytesPtr(report), C.size_t(len(report)))
	})
}

// RequestFinished: the request is done. true: stores still read its G1 blocks, and the
// engine keeps them until the worker lists the request in FinishedSending.
func (c *Connector) RequestFinished(reqID string) (bool, error) {
	var delay C.int32_t
	err := c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_request_finished(&delay, cc, id)
	})
	return delay != 0, err
}

// RequestPreempted: the engine preempted the request and takes its G1 blocks back.
func (c *Connector) RequestPreempted(reqID string) error {
	return c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_request_preempted(cc, id)
	})
}

// ResetCache: nothing stored so far is served again (after a weight reload, say).
func (c *Connector) ResetCache() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_reset_cache(cc) })
}

// SlotState gives the slot's state and its states so far, from SlotInitialized on.
func (c *Connector) SlotState(reqID string) (SlotState, []SlotState, error) {
	hist := make([]C.uint32_t, 16)
	for {
		var state C.uint32_t
		var n C.size_t
		err := c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
			return C.kvt_connector_slot_state(&state, &hist[0], &n, C.size_t(len(hist)), cc, id)
		})
		if err != nil {
			return 0, nil, err
		}
		if int(n) > len(hist) { // it moved on meanwhile: ask again
			hist = make([]C.uint32_t, n)
			continue
		}
		out := make([]SlotState, n)
		for i := range out {
			out[i] = SlotState(hist[i])
		}
		return SlotState(state), out, nil
	}
}

// Stats gives the scheduler half's counters.
func (c *Connector) Stats() (ConnectorStats, error) {
	var s C.kvt_connector_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	err := c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_stats_get(&s, cc) })
	out := ConnectorStats{
		Preemptions: uint64(s.preemptions), MatchedTokens: uint64(s.matched_tokens),
		LoadedBlocks: uint64(s.loaded_blocks), LoadErrors: uint64(s.load_errors),
		StoredBlocks: uint64(s.stored_blocks), StoreFailures: uint64(s.store_failures),
	}
	for i := range out.Transitions {
		for j := range out.Transitions[i] {
			out.Transitions[i][j] = uint64(s.transitions[i][j])
		}
	}
	return out, err
}

// TakeEvents moves up to max pending events (BLOCK_STORED/REMOVED of G2 and G3) out,
// oldest first.
func (c *Connector) TakeEvents(max int) ([]Event, error) {
	if max <= 0 {
		return nil, nil
	}
	buf := make([]C.kvt_event, max)
	var n C.size_t
	err := c.with(func(cc *C.kvt_connector) C.kvt_status {
		n = C.kvt_connector_drain_events(cc, &buf[0], C.size_t(max))
		return C.KVT_OK
	})
	return events(buf[:n]), err
}

// --- worker half ---

// RegisterKVCaches gives the connector the engine's G1 memory: numBlocks blocks in layout,
// whose memory lies outside Go's heap and outlives the connector. Once, before the first
// bind.
func (c *Connector) RegisterKVCaches(layout *G1Layout, numBlocks uint64) error {
	if len(layout.Bases) != len(layout.Strides) {
		return &Error{Status: StatusInvalidArgument,
			Message: fmt.Sprintf("G1Layout: %d bases but %d strides", len(layout.Bases), len(layout.Strides))}
	}
	p, free := cLayout(layout)
	defer free()
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_register_kv_caches(cc, p, C.uint64_t(numBlocks))
	})
}

// BindConnectorMetadata decodes a step's metadata and holds it until
// ClearConnectorMetadata; bytes that do not decode give ErrCorrupt.
func (c *Connector) BindConnectorMetadata(meta []byte) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_bind_connector_metadata(cc, bytesPtr(meta), C.size_t(len(meta)))
	})
}

func (c *Connector) ClearConnectorMetadata() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_clear_connector_metadata(cc) })
}

// StartLoadKV starts the bound metadata's lazy stores and loads.
func (c *Connector) StartLoadKV() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_start_load_kv(cc) })
}

// WaitForLayerLoad waits until the step's lazy stores, and its loads unless asynchronous,
// have ended.
func (c *Connector) WaitForLayerLoad(layer uint32) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_wait_for_layer_load(cc, C.uint32_t(layer))
	})
}

// SaveKVLayer: the model wrote layer; after the last one the step's eager stores start.
func (c *Connector) SaveKVLayer(layer uint32) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_save_kv_layer(cc, C.uint32_t(layer))
	})
}

// WaitForSave starts the eager stores not started yet, and returns (GetFinished reports
// them).
func (c *Connector) WaitForSave() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_wait_for_save(cc) })
}

// GetFinished gives everything that ended since the last call; it never waits.
func (c *Connector) GetFinished() (Finished, error) {
	var out Finished
	err := c.with(func(cc *C.kvt_connector) C.kvt_status {
		c.s.finMu.Lock()
		defer c.s.finMu.Unlock()
		var f C.kvt_finished
		f.struct_size = C.uint32_t(unsafe.Sizeof(f))
		s := C.kvt_connector_get_finished(&f, cc)
		if s != C.KVT_OK {
			return s
		}
		strs := func(p **C.char, n C.size_t) []string {
			out := make([]string, n)
			if n > 0 {
				for i, s := range unsafe.Slice(p, n) {
					out[i] = C.GoString(s)
				}
			}
			return out
		}
		out.FinishedSending = strs(f.finished_sending, f.num_finished_sending)
		out.FinishedRecving = strs(f.finished_recving, f.num_finished_recving)
		out.LoadErrorBlockIDs = make([]uint32, f.num_load_errors)
		if f.num_load_errors > 0 {
			for i, b := range unsafe.Slice(f.load_error_block_ids, f.num_load_errors) {
				out.LoadErrorBlockIDs[i] = uint32(b)
			}
		}
		out.Report = C.GoBytes(f.report, C.int(f.report_len))
		return s
	})
	return out, err
}

// HandlePreemptions waits until no copy in flight uses the G1 blocks of these requests, so
// that the engine can reuse them. Unknown ids are ignored.
func (c *Connector) HandlePreemptions(reqIDs []string) error {
	ids, free, err := cStrings(reqIDs)
	if err != nil {
		return err
	}
	defer free()
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_handle_preemptions(cc, ids, C.size_t(len(reqIDs)))
	})
}

// GetNumNewMatchedTokensMax is GetNumNewMatchedTokensSalted with the hit capped at
// maxTokens: an engine with several KV cache groups (a connector each) lowers the cap to
// the smallest group's hit and asks each group again, until all agree.
func (c *Connector) GetNumNewMatchedTokensMax(reqID string, saltHash uint64, tokens []uint32, numComputedTokens, maxTokens uint64) (uint64, bool, error) {
	var n C.uint64_t
	var async C.int32_t
	err := c.withID(reqID, func(cc *C.kvt_connector, id *C.char) C.kvt_status {
		return C.kvt_connector_get_num_new_matched_tokens_max(&n, &async, cc, id, C.uint64_t(saltHash),
			u32ptr(tokens), C.size_t(len(tokens)), C.uint64_t(numComputedTokens), C.uint64_t(maxTokens))
	})
	return uint64(n), async != 0, err
}

// --- inspection and breakpoints (docs/EVENTS.md) ---

// SlotInfo is one live slot as the scheduler half sees it (kvt_slot_info).
type SlotInfo struct {
	ReqID    string
	State    SlotState
	Age      time.Duration // since its slot was created
	Tokens   uint64        // the request's tokens
	Computed uint64        // tokens computed or loaded
	Blocks   uint64        // its G1 blocks
	Batches  uint64        // its loads and stores not yet reported
}

// BatchInfo is one batch in flight, planned or sent and not yet reported (kvt_batch_info).
type BatchInfo struct {
	ReqID    string
	Src, Dst Tier // a load is G2/G3 -> G1, a store G1 -> G2/G3
	Batch    uint64
	Blocks   uint64
	Step     uint64 // the metadata that carried it; 0: planned for the next one
}

// list fills a C array that the library sizes: fill(out, cap, &n) until n fits.
func list[T any](c *Connector, fill func(*T, C.size_t, *C.size_t, *C.kvt_connector) C.kvt_status) ([]T, error) {
	var buf []T
	for {
		var n C.size_t
		err := c.with(func(cc *C.kvt_connector) C.kvt_status {
			var p *T
			if len(buf) > 0 {
				p = &buf[0]
			}
			return fill(p, C.size_t(len(buf)), &n, cc)
		})
		if err != nil || int(n) <= len(buf) {
			return buf[:n:n], err
		}
		buf = make([]T, n+n/8+1) // slots may come meanwhile: room for some
	}
}

// Slots lists the live slots; while the scheduler is paused, as they were at the pause.
func (c *Connector) Slots() ([]SlotInfo, error) {
	raw, err := list(c, func(p *C.kvt_slot_info, cap C.size_t, n *C.size_t, cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_slots(p, cap, n, cc)
	})
	out := make([]SlotInfo, len(raw))
	for i, s := range raw {
		out[i] = SlotInfo{C.GoString(&s.req_id[0]), SlotState(s.state), time.Duration(s.age_ns),
			uint64(s.tokens), uint64(s.computed), uint64(s.blocks), uint64(s.batches)}
	}
	return out, err
}

// Batches lists the batches in flight; while the scheduler is paused, as they were at the
// pause.
func (c *Connector) Batches() ([]BatchInfo, error) {
	raw, err := list(c, func(p *C.kvt_batch_info, cap C.size_t, n *C.size_t, cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_batches(p, cap, n, cc)
	})
	out := make([]BatchInfo, len(raw))
	for i, b := range raw {
		out[i] = BatchInfo{C.GoString(&b.req_id[0]), Tier(b.src), Tier(b.dst), uint64(b.batch),
			uint64(b.blocks), uint64(b.step)}
	}
	return out, err
}

// AddBreakpoint pauses the thread inside a scheduler call when a slot has entered state (0:
// any), for request reqID ("": any; with state 0, at the start of every call naming it).
// It returns the breakpoint's id (1, 2, ...).
func (c *Connector) AddBreakpoint(state SlotState, reqID string) (uint64, error) {
	var id C.uint64_t
	add := func(cc *C.kvt_connector, p *C.char) C.kvt_status {
		return C.kvt_connector_breakpoint_add(&id, cc, C.uint32_t(state), p)
	}
	var err error
	if reqID == "" {
		err = c.with(func(cc *C.kvt_connector) C.kvt_status { return add(cc, nil) })
	} else {
		err = c.withID(reqID, add)
	}
	return uint64(id), err
}

// RemoveBreakpoint removes a breakpoint (ErrNotFound for an unknown id); a thread paused at
// it stays paused until resumed.
func (c *Connector) RemoveBreakpoint(id uint64) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_breakpoint_remove(cc, C.uint64_t(id))
	})
}

// Pause pauses the scheduler at its next call or transition.
func (c *Connector) Pause() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_pause(cc) })
}

// Resume lets the paused thread go on; ErrState when none is paused.
func (c *Connector) Resume() error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_connector_resume(cc) })
}

// PauseInfo says where the scheduler paused (kvt_pause_info).
type PauseInfo struct {
	Trigger     Trigger   // the call that paused
	Prev, State SlotState // the transition; both 0 at a call's start
	Breakpoint  uint64    // 0 for Pause
	Pauses      uint64    // pauses so far, this one included
	ReqID       string
}

// WaitPaused waits up to timeout (negative: forever) for a paused thread and says where it
// paused; ErrTimeout when none paused in time. It waits in slices (waitSlice), and ends with
// ErrInvalidHandle once the connector's Close begins, so that Close waits for one slice at
// most.
func (c *Connector) WaitPaused(timeout time.Duration) (PauseInfo, error) {
	deadline := time.Now().Add(timeout) // saturates for a huge timeout
	for {
		slice := waitSlice
		if timeout >= 0 {
			if left := time.Until(deadline); left < slice {
				slice = left
			}
			if slice < 0 {
				slice = 0
			}
		}
		p, err := c.waitPaused(slice)
		if !errors.Is(err, ErrTimeout) {
			return p, err
		}
		if timeout >= 0 && !time.Now().Before(deadline) {
			return p, &Error{Status: StatusTimeout, Message: fmt.Sprintf("no scheduler call paused within %v", timeout)}
		}
	}
}

// waitPaused is one kvt_connector_pause_wait of up to timeout (>= 0; 0 only looks):
// ErrTimeout when no thread paused in time.
func (c *Connector) waitPaused(timeout time.Duration) (PauseInfo, error) {
	if timeout < 0 {
		timeout = 0 // a slice never waits forever: WaitPaused checks for Close between them
	}
	var p C.kvt_pause_info
	p.struct_size = C.uint32_t(unsafe.Sizeof(p))
	err := c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_pause_wait(&p, cc, C.int64_t(timeout.Nanoseconds()))
	})
	return PauseInfo{Trigger(p.trigger), SlotState(p.prev), SlotState(p.state), uint64(p.breakpoint),
		uint64(p.pauses), C.GoString(&p.req_id[0])}, err
}

// WaitPausedContext is WaitPaused until a thread pauses or ctx ends (then ctx.Err()).
func (c *Connector) WaitPausedContext(ctx context.Context) (p PauseInfo, err error) {
	err = waitSliced(ctx, func(slice time.Duration) error {
		p, err = c.WaitPaused(slice)
		return err
	})
	return p, err
}

// SetPauseTimeout sets how long a pause waits for Resume before it ends itself: 1 ms .. 1
// hour, in whole milliseconds.
func (c *Connector) SetPauseTimeout(timeout time.Duration) error {
	ms := timeout / time.Millisecond
	if timeout < 0 || ms > math.MaxUint32 {
		return &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf("pause timeout %v: 1ms .. 1h", timeout)}
	}
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_connector_set_pause_timeout(cc, C.uint32_t(ms))
	})
}
