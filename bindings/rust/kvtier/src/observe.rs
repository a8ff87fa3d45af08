//! The observe stream (docs/EVENTS.md): subscriptions, the event log, metrics.
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use kvtier_sys as sys;

use crate::{check, invalid, Connector, Manager, Result, Status};

/// One event of the observe stream; `kind` is its kvt_obs_kind by name ("SLOT",
/// "CANDIDATE", "BLOCK_STORED", ...), the other fields as in kvtier.h.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObsEvent {
    pub seq: u64,
    pub time_ns: u64,
    pub kind: String,
    pub state: u32,
    pub prev: u32,
    pub trigger: u32,
    pub src: u32,
    pub dst: u32,
    pub status: i32,
    pub batch: u64,
    pub hash: u64,
    pub parent_hash: u64,
    pub tokens: u64,
    pub computed: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub duration_ns: u64,
    pub count: u64,
    pub req_id: String,
}

fn obs_event(e: &sys::kvt_obs_event) -> ObsEvent {
    ObsEvent {
        seq: e.seq,
        time_ns: e.time_ns,
        kind: unsafe { CStr::from_ptr(sys::kvt_obs_kind_str(e.kind)) }.to_string_lossy().into_owned(),
        state: e.state,
        prev: e.prev,
        trigger: e.trigger,
        src: e.src,
        dst: e.dst,
        status: e.status,
        batch: e.batch,
        hash: e.hash,
        parent_hash: e.parent_hash,
        tokens: e.tokens,
        computed: e.computed,
        blocks: e.blocks,
        bytes: e.bytes,
        duration_ns: e.duration_ns,
        count: e.count,
        req_id: unsafe { CStr::from_ptr(e.req_id.as_ptr()) }.to_string_lossy().into_owned(),
    }
}

pub(crate) fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| invalid("the path holds a NUL byte"))
}

/// A reader of a manager's events through a bounded queue of its own; it may outlive the
/// manager (it then receives nothing more).
pub struct Subscription {
    s: *mut sys::kvt_subscription,
}

unsafe impl Send for Subscription {}

impl Subscription {
    /// Up to `max` queued events, oldest first (a DROPPED event first after an overflow).
    pub fn drain(&mut self, max: usize) -> Vec<ObsEvent> {
        let mut buf: Vec<sys::kvt_obs_event> = Vec::with_capacity(max);
        let n = unsafe { sys::kvt_subscription_drain(self.s, buf.as_mut_ptr(), max) };
        // Safety: the library wrote n <= max events into the reserved space.
        unsafe { buf.set_len(n) };
        buf.iter().map(obs_event).collect()
    }

    /// Readable while events are queued.
    pub fn fd(&self) -> i32 {
        unsafe { sys::kvt_subscription_fd(self.s) }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        unsafe { sys::kvt_subscription_destroy(self.s) };
    }
}

impl Manager {
    /// A reader with room for `capacity` events (1 ..= 2^24).
    pub fn subscribe(&self, capacity: usize) -> Result<Subscription> {
        let mut s = ptr::null_mut();
        check(unsafe { sys::kvt_subscription_create(&mut s, self.m, capacity) })?;
        Ok(Subscription { s })
    }

    /// Appends every event from now on to a new event log at `path`.
    pub fn record(&self, path: &Path) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { sys::kvt_manager_recorder_open(self.m, p.as_ptr()) })
    }

    /// Writes what is buffered and closes the event log.
    pub fn stop_recording(&self) -> Result<()> {
        check(unsafe { sys::kvt_manager_recorder_close(self.m) })
    }

    /// The Prometheus text exposition of the manager's counters.
    pub fn metrics_text(&self) -> Result<String> {
        let mut n = 0usize;
        unsafe { sys::kvt_metrics_text(ptr::null_mut(), 0, &mut n, self.m, ptr::null_mut()) };
        let mut buf = vec![0u8; n + 4096];
        check(unsafe {
            sys::kvt_metrics_text(buf.as_mut_ptr().cast(), buf.len(), &mut n, self.m,
                                  ptr::null_mut())
        })?;
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// The records of an event log, and where a torn tail (a writer killed mid-write) cut it.
pub struct EventLog {
    pub events: Vec<ObsEvent>,
    pub torn: Option<String>,
}

/// Reads an event log (kvt_manager_recorder_open, kvtier-replay --record).
pub fn read_event_log(path: &Path) -> Result<EventLog> {
    let p = c_path(path)?;
    let mut l = ptr::null_mut();
    check(unsafe { sys::kvt_event_log_open(&mut l, p.as_ptr()) })?;
    let mut out = EventLog { events: Vec::new(), torn: None };
    let mut e = std::mem::MaybeUninit::<sys::kvt_obs_event>::zeroed();
    let result = loop {
        match check(unsafe { sys::kvt_event_log_next(l, e.as_mut_ptr()) }) {
            Ok(()) => out.events.push(obs_event(unsafe { e.assume_init_ref() })),
            Err(err) if err.status == Status::NotFound => break Ok(()),
            Err(err) if err.status == Status::Corrupt => {
                out.torn = Some(err.message);
                break Ok(());
            }
            Err(err) => break Err(err),
        }
    };
    unsafe { sys::kvt_event_log_close(l) };
    result.map(|()| out)
}

/// What [`Connector::rerun`] made again: the calls, and the state the log's events leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rerun {
    pub calls: u64,
    pub events: u64,
    pub live_slots: u64,
    pub finished_slots: u64,
    /// Hashes registered at the end, by tier (index 1 = G1 .. 3 = G3).
    pub registered: [u64; 4],
}

impl Connector<'_> {
    /// kvt_event_log_rerun: the recorded calls of the log at `path`, made again on this
    /// fresh connector; an error (Corrupt) names the first difference from the log.
    pub fn rerun(&self, path: &Path) -> Result<Rerun> {
        let p = c_path(path)?;
        let mut r = std::mem::MaybeUninit::<sys::kvt_log_replay>::zeroed();
        unsafe { (*r.as_mut_ptr()).struct_size = std::mem::size_of::<sys::kvt_log_replay>() as u32 };
        check(unsafe { sys::kvt_event_log_rerun(r.as_mut_ptr(), self.c, p.as_ptr()) })?;
        let r = unsafe { r.assume_init() };
        Ok(Rerun { calls: r.calls, events: r.events, live_slots: r.live_slots,
                   finished_slots: r.finished_slots, registered: r.registered })
    }
}
