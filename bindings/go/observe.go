package kvtier

/*
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"
)

// ObsEvent is one event of the observe stream (docs/EVENTS.md); Kind is its kvt_obs_kind
// by name ("SLOT", "CANDIDATE", "BLOCK_STORED", ...).
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
	return &Subscription{s: s}, nil
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

// Fd is readable while events are queued; -1 once closed.
func (s *Subscription) Fd() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return -1
	}
	return int(C.kvt_subscription_fd(s.s))
}

// Close ends the subscription; closing twice is a no-op.
func (s *Subscription) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s != nil {
		C.kvt_subscription_destroy(s.s)
		s.s = nil
	}
}

// Record appends every event from now on to a new event log at path.
func (m *Manager) Record(path string) error {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_recorder_open(c, p) })
}

// StopRecording writes what is buffered and closes the event log.
func (m *Manager) StopRecording() error {
	return m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_manager_recorder_close(c) })
}

// MetricsText is the Prometheus text exposition of the manager's counters.
func (m *Manager) MetricsText() (string, error) {
	var n C.size_t
	m.with(func(c *C.kvt_manager) C.kvt_status { return C.kvt_metrics_text(nil, 0, &n, c, nil) })
	size := n + 4096
	buf := (*C.char)(C.malloc(size))
	defer C.free(unsafe.Pointer(buf))
	if err := m.with(func(c *C.kvt_manager) C.kvt_status {
		return C.kvt_metrics_text(buf, size, &n, c, nil)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(buf, C.int(n)), nil
}

// Rerun is what Connector.Rerun made again: the calls, and the state the log's events leave.
type Rerun struct {
	Calls, Events, LiveSlots, FinishedSlots uint64
	Registered                              [4]uint64 // hashes at the end, by tier (1 = G1 .. 3 = G3)
}

// Rerun (kvt_event_log_rerun) makes the recorded calls of the log at path again on this
// fresh connector; an error (StatusCorrupt) names the first difference from the log.
func (c *Connector) Rerun(path string) (Rerun, error) {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var r C.kvt_log_replay
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	if err := c.with(func(cc *C.kvt_connector) C.kvt_status {
		return C.kvt_event_log_rerun(&r, cc, p)
	}); err != nil {
		return Rerun{}, err
	}
	out := Rerun{Calls: uint64(r.calls), Events: uint64(r.events), LiveSlots: uint64(r.live_slots),
		FinishedSlots: uint64(r.finished_slots)}
	for i := range out.Registered {
		out.Registered[i] = uint64(r.registered[i])
	}
	return out, nil
}

// ReadEventLog returns the records of an event log. A torn tail (a writer killed
// mid-write) ends the records; torn then says so and why where.
func ReadEventLog(path string) (events []ObsEvent, torn bool, why string, err error) {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var l *C.kvt_event_log
	if err := call(func() C.kvt_status { return C.kvt_event_log_open(&l, p) }); err != nil {
		return nil, false, "", err
	}
	defer C.kvt_event_log_close(l)
	e := (*C.kvt_obs_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvt_obs_event{}))))
	defer C.free(unsafe.Pointer(e))
	for {
		err := call(func() C.kvt_status { return C.kvt_event_log_next(l, e) })
		var ke *Error
		switch {
		case err == nil:
			events = append(events, obsEvent(e))
		case errors.As(err, &ke) && ke.Status == StatusNotFound:
			return events, false, "", nil
		case errors.As(err, &ke) && ke.Status == StatusCorrupt:
			return events, true, ke.Message, nil
		default:
			return events, false, "", err
		}
	}
}
