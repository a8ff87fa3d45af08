package kvtier

/*
#include <kvtier.h>
extern void kvtierGoLog(int level, char *message, void *user_data);
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// LogLevel is a kvt_log_level: how much the library says.
type LogLevel int

const (
	LogOff   LogLevel = C.KVT_LOG_OFF
	LogError LogLevel = C.KVT_LOG_ERROR
	LogWarn  LogLevel = C.KVT_LOG_WARN
	LogInfo  LogLevel = C.KVT_LOG_INFO
	LogDebug LogLevel = C.KVT_LOG_DEBUG
)

var (
	logHandler atomic.Pointer[func(LogLevel, string)]
	logLevel   atomic.Int32 // the handler's level, for the binding's own messages (goLog)
)

// SetLogHandler sends the library's diagnostics at or below level to fn; nil turns them off
// (the default). Process-wide. fn runs on whichever thread noticed the condition, possibly
// one of the library's, with the library's locks held: it must not call kvtier, and should
// return quickly (hand the message to a logger or a channel). A panic in fn is recovered
// and the message dropped: it must not unwind the library's frames.
func SetLogHandler(level LogLevel, fn func(level LogLevel, message string)) {
	if fn == nil {
		C.kvt_log_set_callback(C.KVT_LOG_OFF, nil, nil)
		logHandler.Store(nil)
		logLevel.Store(int32(LogOff))
		return
	}
	logLevel.Store(int32(level))
	logHandler.Store(&fn)
	C.kvt_log_set_callback(C.int(level), C.kvt_log_fn(C.kvtierGoLog), nil)
}

//export kvtierGoLog
func kvtierGoLog(level C.int, message *C.char, _ unsafe.Pointer) {
	defer func() { recover() }() // a panic must not cross into C: the message is dropped
	if fn := logHandler.Load(); fn != nil {
		(*fn)(LogLevel(level), C.GoString(message))
	}
}

// goLog gives the handler a message of the binding's own, at level, if the handler takes
// that level. A panic in the handler is recovered.
func goLog(level LogLevel, message string) {
	defer func() { recover() }()
	if fn := logHandler.Load(); fn != nil && level != LogOff && int32(level) <= logLevel.Load() {
		(*fn)(level, message)
	}
}
