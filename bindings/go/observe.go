package kvtier

/*
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"
)

// Trigger is the connector call behind a slot transition or a CALL event (kvt_obs_trigger);
// String gives its name.
type Trigger uint32

const (
	TriggerGetNumNewMatchedTokens Trigger = C.KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS
	TriggerUpdateStateAfterAlloc  Trigger = C.KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC
	TriggerBuildConnectorMeta     Trigger = C.KVT_TRIGGER_BUILD_CONNECTOR_META
	TriggerUpdateConnectorOutput  Trigger = C.KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT
	TriggerRequestFinished        Trigger = C.KVT_TRIGGER_REQUEST_FINISHED
	TriggerRequestPreempted       Trigger = C.KVT_TRIGGER_REQUEST_PREEMPTED
	TriggerResetCache             Trigger = C.KVT_TRIGGER_RESET_CACHE
)

func (t Trigger) String() string { return C.GoString(C.kvt_obs_trigger_str(C.uint32_t(t))) }

// CandidateState is a transfer candidate's state in CANDIDATE events (kvt_candidate_state);
// String gives its name.
type CandidateState uint32

const (
	CandidatePendingEvaluation CandidateState = C.KVT_CANDIDATE_PENDING_EVALUATION
	CandidatePromoted          CandidateState = C.KVT_CANDIDATE_PROMOTED
	CandidateSkipped           CandidateState = C.KVT_CANDIDATE_SKIPPED
	CandidateCompleted         CandidateState = C.KVT_CANDIDATE_COMPLETED
	CandidateFailed            CandidateState = C.KVT_CANDIDATE_FAILED
	CandidateCancelled         CandidateState = C.KVT_CANDIDATE_CANCELLED
)

func (s CandidateState) String() string {
	return C.GoString(C.kvt_candidate_state_str(C.uint32_t(s)))
}

// ObsEvent is one event of the observe stream (docs/EVENTS.md); Kind is its kvt_obs_kind
// by name ("SLOT", "CANDIDATE", "BLOCK_STORED", ...). State is a SlotState in SLOT events
// and a CandidateState in CANDIDATE events; Trigger is a Trigger.
type ObsEvent struct {
	Seq, TimeNs                     uint64
	Kind                            string
	State, Prev, Trigger, Src, Dst  uint32
	Status                          Status
	Batch, Hash, ParentHash         uint64
	Tokens, Computed, Blocks, Bytes uint64
	DurationNs, Count               uint64
	ReqID                           string
}

func obsEvent(e *C.kvt_obs_event) ObsEvent {
	return ObsEvent{
		Seq: uint64(e.seq), TimeNs: uint64(e.time_ns), Kind: C.GoString(C.kvt_obs_kind_str(e.kind)),
		State: uint32(e.state), Prev: uint32(e.prev), Trigger: uint32(e.trigger),
		Src: uint32(e.src), Dst: uint32(e.dst), Status: Status(e.status),
		Batch: uint64(e.batch), Hash: uint64(e.hash), ParentHash: uint64(e.parent_hash),
		Tokens: uint64(e.tokens), Computed: uint64(e.computed), Blocks: uint64(e.blocks),
		Bytes: uint64(e.bytes), DurationNs: uint64(e.duration_ns), Count: uint64(e.count),
		ReqID: C.GoString(&e.req_id[0]),
	}
}

// JSON is the event as one line of JSON: the library's one mapping (kvt_obs_event_json),
// the text that the management endpoint and kvtier-events --json give.
func (e ObsEvent) JSON() (string, error) {
	var c C.kvt_obs_event
	// The kind's number back from its name; a kind this library lacks maps to 0.
	for k := C.uint32_t(1); k < 256; k++ {
		if C.GoString(C.kvt_obs_kind_str(k)) == e.Kind {
			c.kind = k
			break
		}
	}
	c.seq, c.time_ns = C.uint64_t(e.Seq), C.uint64_t(e.TimeNs)
	c.state, c.prev, c.trigger = C.uint32_t(e.State), C.uint32_t(e.Prev), C.uint32_t(e.Trigger)
	c.src, c.dst, c.status = C.uint32_t(e.Src), C.uint32_t(e.Dst), C.int32_t(e.Status)
	c.batch, c.hash, c.parent_hash = C.uint64_t(e.Batch), C.uint64_t(e.Hash), C.uint64_t(e.ParentHash)
	c.tokens, c.computed = C.uint64_t(e.Tokens), C.uint64_t(e.Computed)
	c.blocks, c.bytes = C.uint64_t(e.Blocks), C.uint64_t(e.Bytes)
	c.duration_ns, c.count = C.uint64_t(e.DurationNs), C.uint64_t(e.Count)
	for i := 0; i < len(e.ReqID) && i < len(c.req_id)-1; i++ {
		c.req_id[i] = C.char(e.ReqID[i])
	}
	var n C.size_t
	if err := call(func() C.kvt_status { return C.kvt_obs_event_json(nil, 0, &n, &c) }); err != nil {
		return "", err
	}
	buf := make([]byte, int(n)+1)
	if err := call(func() C.kvt_status {
		return C.kvt_obs_event_json((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n, &c)
	}); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Subscription reads a manager's observe events through a bounded queue of its own: a
// reader that falls behind loses the oldest events, and its next Drain starts with a
// DROPPED event that counts them.
type Subscription struct {
	mu sync.Mutex
	s  *C.kvt_subscription
}

var errSubscriptionClosed = &Error{Status: StatusInvalidHandle, Message: "the subscription is closed"}

// Subscribe starts a reader with room for capacity events (1 .. 2^24).
func (m *Manager) Subscribe(capacity int) (*Subscription, error) {
	var s *C.kvt_subscription
	if err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_subscription_create(&s, c, C.size_t(capacity))
	}); err != nil {
		return nil, err
	}
	sub := &Subscription{s: s}
	runtime.SetFinalizer(sub, (*Subscription).Close) // it may outlive its manager
	return sub, nil
}

// Drain returns up to max queued events, oldest first.
func (s *Subscription) Drain(max int) ([]ObsEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil, errSubscriptionClosed
	}
	if max <= 0 {
		return nil, nil
	}
	buf := (*C.kvt_obs_event)(C.calloc(C.size_t(max), C.size_t(unsafe.Sizeof(C.kvt_obs_event{}))))
	defer C.free(unsafe.Pointer(buf))
	n := int(C.kvt_subscription_drain(s.s, buf, C.size_t(max)))
	events := unsafe.Slice(buf, max)
	out := make([]ObsEvent, n)
	for i := 0; i < n; i++ {
		out[i] = obsEvent(&events[i])
	}
	return out, nil
}

// FD is readable while events are queued; -1 once closed.
func (s *Subscription) FD() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return -1
	}
	return int(C.kvt_subscription_fd(s.s))
}

// Fd is FD.
//
// Deprecated: use FD.
func (s *Subscription) Fd() int { return s.FD() }

// Close ends the subscription; closing twice is a no-op.
func (s *Subscription) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	C.kvt_subscription_destroy(s.s)
	s.s = nil
	runtime.SetFinalizer(s, nil)
	return nil
}

func (m *Manager) withPath(path string, f func(*C.kvt_manager, *C.char) C.kvt_status) error {
	p, err := cString("path", path)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(p))
	return m.with(func(c *C.kvt_manager) C.kvt_status { return f(c, p) })
}

// RecorderOpen appends every event from now on to a new event log at path (replaced if it
// exists); ErrState while a log is open.
func (m *Manager) RecorderOpen(path string) error {
	return m.withPath(path, func(c *C.kvt_manager, p *C.char) C.kvt_status { return C.kvt_manager_recorder_open(c, p) })
}

// RecorderClose writes what is buffered and closes the event log.
func (m *Manager) RecorderClose() error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_recorder_close(c) })
}

// RecorderRing keeps the manager's last events in memory (0: none, up to 2^24), for
// RecorderDump.
func (m *Manager) RecorderRing(events int) error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_recorder_ring(c, C.size_t(events)) })
}

// RecorderDump writes the events RecorderRing keeps to a new event log at path.
func (m *Manager) RecorderDump(path string) error {
	return m.withPath(path, func(c *C.kvt_manager, p *C.char) C.kvt_status { return C.kvt_manager_recorder_dump(c, p) })
}

// Record is RecorderOpen.
//
// Deprecated: use RecorderOpen.
func (m *Manager) Record(path string) error { return m.RecorderOpen(path) }

// StopRecording is RecorderClose.
//
// Deprecated: use RecorderClose.
func (m *Manager) StopRecording() error { return m.RecorderClose() }

// MetricsText is the Prometheus text exposition of the manager's counters.
func (m *Manager) MetricsText() (string, error) {
	var n C.size_t // the size query: INVALID_ARGUMENT with n set, unless the text is empty
	err := m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_metrics_text(nil, 0, &n, c, nil) })
	if err != nil && !errors.Is(err, ErrInvalidArgument) {
		return "", err
	}
	for {
		size := n + 1 + 4096 // the text, its NUL, and room to grow meanwhile
		text, err := metricsText(m, size, &n)
		if err == nil || !errors.Is(err, ErrInvalidArgument) || n+1 <= size {
			return text, err // done, failed, or refused for a reason other than the size
		}
		// the text grew beyond the buffer meanwhile: again, with n its new length
	}
}

// metricsText is one kvt_metrics_text into a buffer of size bytes; *n gets the length.
func metricsText(m *Manager, size C.size_t, n *C.size_t) (string, error) {
	buf := (*C.char)(C.malloc(size))
	defer C.free(unsafe.Pointer(buf))
	if err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_metrics_text(buf, size, n, c, nil)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(buf, C.int(*n)), nil
}

// LogReplay is what a replay or rerun of an event log found (kvt_log_replay).
type LogReplay struct {
	Torn          bool   // the log ended in a torn record, where the replay stopped
	Events        uint64 // records applied
	Violations    uint64 // with ErrCorrupt: violations and differences found
	LiveSlots     uint64 // slots not finished at the end
	FinishedSlots uint64
	OpenBatches   uint64         // promoted batches without an end
	LoadedBlocks  uint64         // blocks of completed loads
	Transitions   [11][11]uint64 // as ConnectorStats.Transitions
	Registered    [4]uint64      // hashes registered at the end, by tier (1 = G1 .. 3 = G3)
	Calls         uint64         // Rerun: the calls made again
}

// Rerun is LogReplay.
//
// Deprecated: use LogReplay.
type Rerun = LogReplay

func logReplay(r *C.kvt_log_replay) LogReplay {
	out := LogReplay{Torn: r.torn != 0, Events: uint64(r.events), Violations: uint64(r.violations),
		LiveSlots: uint64(r.live_slots), FinishedSlots: uint64(r.finished_slots),
		OpenBatches: uint64(r.open_batches), LoadedBlocks: uint64(r.loaded_blocks), Calls: uint64(r.calls)}
	for i := range out.Transitions {
		for j := range out.Transitions[i] {
			out.Transitions[i][j] = uint64(r.transitions[i][j])
		}
	}
	for i := range out.Registered {
		out.Registered[i] = uint64(r.registered[i])
	}
	return out
}

// Rerun (kvt_event_log_rerun) makes the recorded calls of the log at path again on this
// fresh connector; an ErrCorrupt error names the first difference from the log, and the
// result counts them.
func (c *Connector) Rerun(path string) (LogReplay, error) {
	p, err := cString("path", path)
	if err != nil {
		return LogReplay{}, err
	}
	defer C.free(unsafe.Pointer(p))
	var r C.kvt_log_replay
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	err = c.with(func(cc *C.kvt_connector) C.kvt_status { return C.kvt_event_log_rerun(&r, cc, p) })
	return logReplay(&r), err
}

// ReplayEventLog applies the events of the log at path, checking them as it goes, to m (a
// fresh manager with the recorded one's tiers, which ends with its registry), or to
// nothing when m is nil. An ErrCorrupt error names the first violation, and the result
// counts them.
func ReplayEventLog(m *Manager, path string) (LogReplay, error) {
	p, err := cString("path", path)
	if err != nil {
		return LogReplay{}, err
	}
	defer C.free(unsafe.Pointer(p))
	var r C.kvt_log_replay
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	replay := func(c *C.kvt_manager) C.kvt_status { return C.kvt_event_log_replay(&r, c, p) }
	if m == nil {
		err = call(func() C.kvt_status { return replay(nil) })
	} else {
		err = m.with(replay)
	}
	return logReplay(&r), err
}

// ReadEventLog returns the records of an event log. A torn tail (a writer killed
// mid-write) ends the records; torn then says so and why where.
func ReadEventLog(path string) (events []ObsEvent, torn bool, why string, err error) {
	p, err := cString("path", path)
	if err != nil {
		return nil, false, "", err
	}
	defer C.free(unsafe.Pointer(p))
	var l *C.kvt_event_log
	if err := call(func() C.kvt_status { return C.kvt_event_log_open(&l, p) }); err != nil {
		return nil, false, "", err
	}
	defer C.kvt_event_log_close(l)
	e := (*C.kvt_obs_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvt_obs_event{}))))
	defer C.free(unsafe.Pointer(e))
	for {
		err := call(func() C.kvt_status { return C.kvt_event_log_read(e, l) })
		var ke *Error
		switch {
		case err == nil:
			events = append(events, obsEvent(e))
		case errors.As(err, &ke) && ke.Status == StatusIterOver: // past the last record
			return events, false, "", nil
		case errors.As(err, &ke) && ke.Status == StatusCorrupt:
			return events, true, ke.Message, nil
		default:
			return events, false, "", err
		}
	}
}
