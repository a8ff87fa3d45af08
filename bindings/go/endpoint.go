package kvtier

/*
#include <stdlib.h>
#include <kvtier.h>
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// EndpointConfig is the whole kvt_endpoint_config: who may connect to the management
// endpoint, and what a client may cost. DefaultEndpointConfig gives the library's defaults.
type EndpointConfig struct {
	MaxClients        uint32 // clients served at once: 1 .. 4096
	AllowUID          int64  // -1: none besides the process's user and root; else that user too
	AllowGID          int64  // -1: none; else that group's members too
	ClientBufferBytes uint64 // replies held for a client before its requests wait: 4 KiB .. 64 MiB
}

func initEndpointConfig(c *C.kvt_endpoint_config) {
	C.kvt_endpoint_config_init_sized(c, C.size_t(unsafe.Sizeof(*c)))
}

// DefaultEndpointConfig is the library's defaults.
func DefaultEndpointConfig() EndpointConfig {
	var c C.kvt_endpoint_config
	initEndpointConfig(&c)
	return EndpointConfig{uint32(c.max_clients), int64(c.allow_uid), int64(c.allow_gid),
		uint64(c.client_buffer_bytes)}
}

// EndpointStats are the endpoint's counters (kvt_endpoint_stats).
type EndpointStats struct {
	Clients           uint64 // connected now
	Refused           uint64 // turned away: beyond MaxClients, or a user not allowed
	Dropped           uint64 // closed for a line over 64 KiB, or replies unread for 30 s
	PeakBufferedBytes uint64 // the most reply bytes one client has had waiting
}

// Endpoint is the management socket (docs/EVENTS.md): a manager, and its connector if
// given, served on a Unix socket as one JSON object per line each way, from threads of its
// own. Close it before its connector and manager, or their Close does.
type Endpoint struct {
	m *Manager
	s *endpointState
}

// endpointState is what the manager knows of an endpoint, without a pointer back (see
// connState).
type endpointState struct {
	mu   sync.RWMutex // close takes it for writing, Stats for reading
	e    *C.kvt_endpoint
	conn *connState // the connector it serves, or nil
}

// OpenEndpoint serves m, and c when not nil (a connector of m), on a new Unix socket at
// path, with the defaults of EndpointConfig.
func (m *Manager) OpenEndpoint(path string, c *Connector) (*Endpoint, error) {
	return m.openEndpoint(path, c, nil)
}

// OpenEndpointWith is OpenEndpoint with a config: start from DefaultEndpointConfig().
func (m *Manager) OpenEndpointWith(path string, c *Connector, cfg EndpointConfig) (*Endpoint, error) {
	return m.openEndpoint(path, c, &cfg)
}

func (m *Manager) openEndpoint(path string, c *Connector, cfg *EndpointConfig) (*Endpoint, error) {
	if c != nil && c.m != m {
		return nil, &Error{Status: StatusInvalidArgument, Message: "the connector is another manager's"}
	}
	p, err := cString("path", path)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(p))
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.m == nil {
		return nil, errClosed
	}
	s := &endpointState{}
	var cc *C.kvt_connector
	if c != nil {
		c.s.mu.RLock()
		defer c.s.mu.RUnlock()
		if c.s.c == nil {
			return nil, errConnectorClosed
		}
		cc, s.conn = c.s.c, c.s
	}
	err = call(func() C.kvt_status {
		if cfg == nil {
			return C.kvt_endpoint_open(&s.e, m.m, cc, p)
		}
		var ccfg C.kvt_endpoint_config
		initEndpointConfig(&ccfg)
		ccfg.max_clients, ccfg.allow_uid = C.uint32_t(cfg.MaxClients), C.int64_t(cfg.AllowUID)
		ccfg.allow_gid, ccfg.client_buffer_bytes = C.int64_t(cfg.AllowGID), C.uint64_t(cfg.ClientBufferBytes)
		return C.kvt_endpoint_open_with(&s.e, m.m, cc, p, &ccfg)
	})
	if err != nil {
		return nil, err
	}
	m.waitMu.Lock()
	m.eps[s] = true
	m.waitMu.Unlock()
	e := &Endpoint{m: m, s: s}
	runtime.SetFinalizer(e, (*Endpoint).Close)
	return e, nil
}

// Stats gives the endpoint's counters.
func (e *Endpoint) Stats() (EndpointStats, error) {
	e.s.mu.RLock()
	defer e.s.mu.RUnlock()
	if e.s.e == nil {
		return EndpointStats{}, &Error{Status: StatusInvalidHandle, Message: "the endpoint is closed"}
	}
	var s C.kvt_endpoint_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	err := call(func() C.kvt_status { return C.kvt_endpoint_stats_get(&s, e.s.e) })
	return EndpointStats{uint64(s.clients), uint64(s.refused), uint64(s.dropped),
		uint64(s.peak_buffered_bytes)}, err
}

// Close stops serving and removes the socket. Calling it again, or after the manager's or
// connector's Close, is a no-op.
func (e *Endpoint) Close() error {
	e.m.mu.RLock() // the manager outlives the close
	defer e.m.mu.RUnlock()
	e.m.waitMu.Lock()
	delete(e.m.eps, e.s)
	e.m.waitMu.Unlock()
	e.s.close()
	runtime.SetFinalizer(e, nil)
	return nil
}

func (s *endpointState) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		C.kvt_endpoint_close(s.e)
	}
	s.e = nil
}
