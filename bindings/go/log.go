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

var logHandler atomic.Pointer[func(LogLevel, string)]

// SetLogHandler sends the library's diagnostics at or below level to fn; nil turns them off
// (the default). Process-wide. fn runs on whichever thread noticed the condition, possibly
// one of the library's, with the library's locks held: it must not call kvtier, and should
// return quickly (hand the message to a logger or a channel).
func SetLogHandler(level LogLevel, fn func(level LogLevel, message string)) {
	if fn == nil {
		C.kvt_log_set_callback(C.KVT_LOG_OFF, nil, nil)
		logHandler.Store(nil)
		return
	}
	logHandler.Store(&fn)
	C.kvt_log_set_callback(C.int(level), C.kvt_log_fn(C.kvtierGoLog), nil)
}

//export kvtierGoLog
func kvtierGoLog(level C.int, message *C.char, _ unsafe.Pointer) {
	if fn := logHandler.Load(); fn != nil {
		(*fn)(LogLevel(level), C.GoString(message))
	}
}
