package kvtier

/*
#include <stdint.h>
#include <kvtier.h>
extern void kvtierGoWillCall(void *user, uint32_t trigger, char *req_id);
extern void kvtierGoFinishedCall(void *user, uint32_t trigger, char *req_id, int32_t status);
extern void kvtierGoTransition(void *user, char *req_id, uint32_t from, uint32_t to, uint32_t trigger);
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Hooks are interceptors around the scheduler half, for tracing and tests. They run on the
// calling goroutine's thread under the connector's lock, so they must not call this
// connector. A nil member is skipped. A hook that panics is stopped there (a panic must not
// unwind the library's frames, which hold the lock): the call goes on, and the log handler
// (SetLogHandler) gets the panic as a LogError message. reqID is "" for BuildConnectorMeta and
// UpdateConnectorOutput.
type Hooks struct {
	WillCall     func(trigger Trigger, reqID string)                // at the start of each call
	FinishedCall func(trigger Trigger, reqID string, status Status) // at its end
	Transition   func(reqID string, from, to SlotState, trigger Trigger)
}

// hooks maps a C connector (the hooks' user pointer: C memory, which C may hold) to its
// Go hooks.
var hooks sync.Map

// SetHooks installs h in place of the connector's hooks; nil removes them.
func (c *Connector) SetHooks(h *Hooks) error {
	return c.with(func(cc *C.kvt_connector) C.kvt_status {
		if h == nil {
			hooks.Delete(unsafe.Pointer(cc))
			return C.kvt_connector_set_hooks(cc, nil)
		}
		var ch C.kvt_connector_hooks
		ch.struct_size = C.uint32_t(unsafe.Sizeof(ch))
		ch.user = unsafe.Pointer(cc)
		if h.WillCall != nil {
			ch.will_call = (*[0]byte)(C.kvtierGoWillCall)
		}
		if h.FinishedCall != nil {
			ch.finished_call = (*[0]byte)(C.kvtierGoFinishedCall)
		}
		if h.Transition != nil {
			ch.transition = (*[0]byte)(C.kvtierGoTransition)
		}
		hooks.Store(unsafe.Pointer(cc), h)
		return C.kvt_connector_set_hooks(cc, &ch)
	})
}

func hooksOf(user unsafe.Pointer) *Hooks {
	if h, ok := hooks.Load(user); ok {
		return h.(*Hooks)
	}
	return nil
}

// recoverHook, deferred by each trampoline, keeps a hook's panic from crossing into C.
func recoverHook(which string) {
	if r := recover(); r != nil {
		goLog(LogError, fmt.Sprintf("kvtier: the %s hook panicked: %v", which, r))
	}
}

//export kvtierGoWillCall
func kvtierGoWillCall(user unsafe.Pointer, trigger C.uint32_t, reqID *C.char) {
	defer recoverHook("WillCall")
	if h := hooksOf(user); h != nil && h.WillCall != nil {
		h.WillCall(Trigger(trigger), C.GoString(reqID))
	}
}

//export kvtierGoFinishedCall
func kvtierGoFinishedCall(user unsafe.Pointer, trigger C.uint32_t, reqID *C.char, status C.int32_t) {
	defer recoverHook("FinishedCall")
	if h := hooksOf(user); h != nil && h.FinishedCall != nil {
		h.FinishedCall(Trigger(trigger), C.GoString(reqID), Status(status))
	}
}

//export kvtierGoTransition
func kvtierGoTransition(user unsafe.Pointer, reqID *C.char, from, to, trigger C.uint32_t) {
	defer recoverHook("Transition")
	if h := hooksOf(user); h != nil && h.Transition != nil {
		h.Transition(C.GoString(reqID), SlotState(from), SlotState(to), Trigger(trigger))
	}
}
