//! The library's diagnostics, to a closure of the host's.
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::RwLock;

use kvtier_sys as sys;

/// How much the library says: messages at or below the level are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub enum LogLevel {
    Error = sys::KVT_LOG_ERROR as i32,
    Warn = sys::KVT_LOG_WARN as i32,
    Info = sys::KVT_LOG_INFO as i32,
    Debug = sys::KVT_LOG_DEBUG as i32,
}

type Handler = Box<dyn Fn(LogLevel, &str) + Send + Sync>;

// The one C callback reads the handler here, so a replaced closure is dropped only once no
// call of it is running.
static HANDLER: RwLock<Option<Handler>> = RwLock::new(None);

unsafe extern "C" fn trampoline(level: c_int, message: *const c_char, _: *mut c_void) {
    let level = match level {
        l if l == LogLevel::Error as c_int => LogLevel::Error,
        l if l == LogLevel::Warn as c_int => LogLevel::Warn,
        l if l == LogLevel::Info as c_int => LogLevel::Info,
        _ => LogLevel::Debug,
    };
    let message = CStr::from_ptr(message).to_string_lossy();
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Some(h) = HANDLER.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            h(level, &message);
        }
    }));
}

/// Sends the library's diagnostics at or below `level` to `handler`. Process-wide. The
/// handler runs on whichever thread noticed the condition, possibly one of the library's,
/// with the library's locks held: it must not call kvtier. A panic in it is dropped.
pub fn set_log_handler(level: LogLevel, handler: impl Fn(LogLevel, &str) + Send + Sync + 'static) {
    *HANDLER.write().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(handler));
    unsafe { sys::kvt_log_set_callback(level as c_int, Some(trampoline), std::ptr::null_mut()) }
}

/// Turns the library's diagnostics off (the default).
pub fn clear_log_handler() {
    unsafe { sys::kvt_log_set_callback(sys::KVT_LOG_OFF as c_int, None, std::ptr::null_mut()) }
    *HANDLER.write().unwrap_or_else(|e| e.into_inner()) = None;
}
