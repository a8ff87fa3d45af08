//! The observe stream (docs/EVENTS.md): subscriptions, the event log, metrics.
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::ptr;

use kvtier_sys as sys;

use crate::{check, invalid, versioned, Connector, Manager, Result, Status, Tier};

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

impl ObsEvent {
    /// `src` as a tier (CANDIDATE, TRANSFER); None where the kind has none.
    pub fn src_tier(&self) -> Option<Tier> {
        Tier::from_raw(self.src)
    }

    /// `dst` as a tier (CANDIDATE, TRANSFER, BLOCK_*, TIER_CLEARED); None where the kind has none.
    pub fn dst_tier(&self) -> Option<Tier> {
        Tier::from_raw(self.dst)
    }

    /// This event as one line of JSON: the library's one mapping (kvt_obs_event_json), the
    /// text that the management endpoint and `kvtier-events --json` give.
    pub fn to_json(&self) -> Result<String> {
        // The kind's number back from its name; a kind this library lacks maps to 0.
        let kind = (1..=255u32)
            .find(|&k| unsafe { CStr::from_ptr(sys::kvt_obs_kind_str(k)) }.to_bytes()
                == self.kind.as_bytes())
            .unwrap_or(0);
        // Safety: kvt_obs_event is plain data, for which all zeros is a valid value.
        let mut e: sys::kvt_obs_event = unsafe { std::mem::zeroed() };
        e.seq = self.seq;
        e.time_ns = self.time_ns;
        e.kind = kind;
        e.state = self.state;
        e.prev = self.prev;
        e.trigger = self.trigger;
        e.src = self.src;
        e.dst = self.dst;
        e.status = self.status;
        e.batch = self.batch;
        e.hash = self.hash;
        e.parent_hash = self.parent_hash;
        e.tokens = self.tokens;
        e.computed = self.computed;
        e.blocks = self.blocks;
        e.bytes = self.bytes;
        e.duration_ns = self.duration_ns;
        e.count = self.count;
        let id = self.req_id.as_bytes();
        let room = e.req_id.len() - 1; // the NUL's
        for (d, s) in e.req_id.iter_mut().zip(id.iter().take(room)) {
            *d = *s as std::os::raw::c_char;
        }
        let mut len = 0usize;
        check(unsafe { sys::kvt_obs_event_json(ptr::null_mut(), 0, &mut len, &e) })?;
        let mut buf = vec![0u8; len + 1];
        check(unsafe {
            sys::kvt_obs_event_json(buf.as_mut_ptr() as *mut std::os::raw::c_char, buf.len(),
                                    &mut len, &e)
        })?;
        buf.truncate(len);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
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
    #[deprecated(note = "use as_fd or as_raw_fd (AsFd, AsRawFd)")]
    pub fn fd(&self) -> i32 {
        self.as_raw_fd()
    }
}

impl AsFd for Subscription {
    /// Readable while events are queued; owned by the subscription: never read or close it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // Safety: the subscription keeps its descriptor open until it is destroyed, which
        // the borrow of self outlives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for Subscription {
    fn as_raw_fd(&self) -> RawFd {
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

    /// Keeps the manager's last `events` events in memory (0: none, up to 2^24), for
    /// [`Manager::dump_recorder`].
    pub fn set_recorder_ring(&self, events: usize) -> Result<()> {
        check(unsafe { sys::kvt_manager_recorder_ring(self.m, events) })
    }

    /// Writes the ring's events to a new event log at `path`.
    pub fn dump_recorder(&self, path: &Path) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { sys::kvt_manager_recorder_dump(self.m, p.as_ptr()) })
    }

    /// The Prometheus text exposition of the manager's counters.
    pub fn metrics_text(&self) -> Result<String> {
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let mut n = 0usize;
            let s = unsafe {
                sys::kvt_metrics_text(buf.as_mut_ptr().cast(), buf.len(), &mut n, self.m,
                                      ptr::null_mut())
            };
            // A buffer too small (the first call's is empty) fails with the text's length
            // in n: grow it, with room for counters that grow meanwhile, and ask again.
            if s == sys::KVT_ERR_INVALID_ARGUMENT && n >= buf.len() {
                buf.resize(n + 4096, 0);
                continue;
            }
            check(s)?;
            buf.truncate(n);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
    }
}

/// The records of an event log, and where a torn tail (a writer killed mid-write) cut it.
pub struct EventLog {
    pub events: Vec<ObsEvent>,
    pub torn: Option<String>,
}

/// Reads an event log (kvt_manager_recorder_open, kvtier-replay --record) whole.
pub fn read_event_log(path: &Path) -> Result<EventLog> {
    let mut out = EventLog { events: Vec::new(), torn: None };
    for e in EventLogReader::open(path)? {
        match e {
            Ok(e) => out.events.push(e),
            Err(err) if err.status == Status::Corrupt => out.torn = Some(err.message),
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}

/// Reads an event log one record at a time: an iterator of its events, which ends after the
/// last one, or after one Status::Corrupt error where a record is torn or damaged (a writer
/// killed mid-write; the message says at which byte), or after any other error. Send, not
/// Sync: a reader has a position.
pub struct EventLogReader {
    l: *mut sys::kvt_event_log,
    done: bool,
}

unsafe impl Send for EventLogReader {}

impl EventLogReader {
    pub fn open(path: &Path) -> Result<EventLogReader> {
        let p = c_path(path)?;
        let mut l = ptr::null_mut();
        check(unsafe { sys::kvt_event_log_open(&mut l, p.as_ptr()) })?;
        Ok(EventLogReader { l, done: false })
    }
}

impl Iterator for EventLogReader {
    type Item = Result<ObsEvent>;

    fn next(&mut self) -> Option<Result<ObsEvent>> {
        if self.done {
            return None;
        }
        let mut e = std::mem::MaybeUninit::<sys::kvt_obs_event>::zeroed();
        let s = unsafe { sys::kvt_event_log_read(e.as_mut_ptr(), self.l) };
        if s == sys::KVT_ITEROVER as sys::kvt_status {
            // Past the last record: the end, not an error.
            self.done = true;
            return None;
        }
        match check(s) {
            Ok(()) => Some(Ok(obs_event(unsafe { e.assume_init_ref() }))),
            Err(err) => {
                self.done = true;
                Some(Err(err))
            }
        }
    }
}

impl Drop for EventLogReader {
    fn drop(&mut self) {
        unsafe { sys::kvt_event_log_close(self.l) }
    }
}

/// What [`replay_event_log`] found: a log whose events all followed the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// A torn tail ended the replay early.
    pub torn: bool,
    /// Records applied.
    pub events: u64,
    /// Slots not finished at the end, and finished ones.
    pub live_slots: u64,
    pub finished_slots: u64,
    /// Promoted batches without an end.
    pub open_batches: u64,
    /// Blocks of completed loads.
    pub loaded_blocks: u64,
    /// `[from][to]` by kvt_slot_state value, as [`crate::ConnectorStats::transitions`].
    pub transitions: [[u64; 11]; 11],
    /// Hashes registered at the end, by tier (index 1 = G1 .. 3 = G3).
    pub registered: [u64; 4],
}

/// kvt_event_log_replay: applies the log's events in order and checks them (sequence
/// numbers, slot transitions, batch ends, and with `into`, a fresh manager with the
/// recorded one's tiers, every BLOCK_STORED and BLOCK_REMOVED, leaving it the recorded
/// registry). A violation is a Status::Corrupt error naming the first one and their number.
pub fn replay_event_log(path: &Path, into: Option<&Manager>) -> Result<Replay> {
    let p = c_path(path)?;
    let mut r: sys::kvt_log_replay = versioned();
    let s = unsafe { sys::kvt_event_log_replay(&mut r, into.map_or(ptr::null_mut(), |m| m.m), p.as_ptr()) };
    if let Err(mut err) = check(s) {
        if err.status == Status::Corrupt && r.violations > 0 {
            err.message = format!("{} ({} violations)", err.message, r.violations);
        }
        return Err(err);
    }
    Ok(Replay { torn: r.torn != 0, events: r.events, live_slots: r.live_slots,
                finished_slots: r.finished_slots, open_batches: r.open_batches,
                loaded_blocks: r.loaded_blocks, transitions: r.transitions,
                registered: r.registered })
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
        let mut r: sys::kvt_log_replay = versioned();
        check(unsafe { sys::kvt_event_log_rerun(&mut r, self.c, p.as_ptr()) })?;
        Ok(Rerun { calls: r.calls, events: r.events, live_slots: r.live_slots,
                   finished_slots: r.finished_slots, registered: r.registered })
    }
}
