//! The connector: the request layer a serving engine plugs in, with vLLM's method names
//! (`KVConnectorBase_V1`). A scheduler half decides the loads and stores of each step and
//! passes them to a worker half as metadata bytes; the worker copies and answers with a
//! report. Both halves may live in one connector (`Role::Both`) or in two processes.
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier_sys as sys;

#[allow(deprecated)]
use crate::Event;
use crate::{
    c_name, check, drain_events, fill_sized, invalid, outcome, G1Layout, Manager, ManagerEvent,
    Result, Status, Tier,
};

/// Which half (or both) a connector plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Role {
    Scheduler = sys::KVT_ROLE_SCHEDULER,
    Worker = sys::KVT_ROLE_WORKER,
    Both = sys::KVT_ROLE_BOTH,
}

/// When full blocks are stored: at the step that computes them, or when the engine is about
/// to overwrite their G1 block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum OffloadMode {
    Eager = sys::KVT_OFFLOAD_EAGER,
    Lazy = sys::KVT_OFFLOAD_LAZY,
}

/// A request's slot state (kvt_slot_state). Display gives the C name, e.g.
/// `KVT_SLOT_DECODING`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SlotState {
    Initialized = sys::KVT_SLOT_INITIALIZED,
    OnboardStaged = sys::KVT_SLOT_ONBOARD_STAGED,
    Onboarding = sys::KVT_SLOT_ONBOARDING,
    Prefilling = sys::KVT_SLOT_PREFILLING,
    Decoding = sys::KVT_SLOT_DECODING,
    SkippedPrefill = sys::KVT_SLOT_SKIPPED_PREFILL,
    SkippedDecode = sys::KVT_SLOT_SKIPPED_DECODE,
    Preempted = sys::KVT_SLOT_PREEMPTED,
    Finishing = sys::KVT_SLOT_FINISHING,
    Finished = sys::KVT_SLOT_FINISHED,
}

impl SlotState {
    const ALL: [SlotState; 10] = [
        SlotState::Initialized, SlotState::OnboardStaged, SlotState::Onboarding,
        SlotState::Prefilling, SlotState::Decoding, SlotState::SkippedPrefill,
        SlotState::SkippedDecode, SlotState::Preempted, SlotState::Finishing,
        SlotState::Finished,
    ];

    /// The state of a raw C value; None for a value this crate does not know.
    pub fn from_raw(v: u32) -> Option<SlotState> {
        SlotState::ALL.into_iter().find(|s| *s as u32 == v)
    }

    /// The C name (kvt_slot_state_str).
    pub fn name(self) -> &'static str {
        // Static strings of the library.
        unsafe { CStr::from_ptr(sys::kvt_slot_state_str(self as u32)) }.to_str().unwrap_or("?")
    }
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A C enumeration with printable names: `from_raw`, `name` (its kvt_*_str) and Display.
macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident, $str_fn:path { $($variant:ident = $value:path),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name { $($variant = $value),+ }

        impl $name {
            /// The variant of a raw C value; None for a value this crate does not know.
            pub fn from_raw(v: u32) -> Option<$name> {
                [$($name::$variant),+].into_iter().find(|x| *x as u32 == v)
            }

            /// The C name.
            pub fn name(self) -> &'static str {
                c_name(unsafe { $str_fn(self as u32) })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(
    /// The scheduler call that moved a slot or paused (kvt_obs_trigger); Display gives the C
    /// name, e.g. `UPDATE_STATE_AFTER_ALLOC`.
    Trigger, sys::kvt_obs_trigger_str {
        GetNumNewMatchedTokens = sys::KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS,
        UpdateStateAfterAlloc = sys::KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC,
        BuildConnectorMeta = sys::KVT_TRIGGER_BUILD_CONNECTOR_META,
        UpdateConnectorOutput = sys::KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT,
        RequestFinished = sys::KVT_TRIGGER_REQUEST_FINISHED,
        RequestPreempted = sys::KVT_TRIGGER_REQUEST_PREEMPTED,
        ResetCache = sys::KVT_TRIGGER_RESET_CACHE,
    }
);

named_enum!(
    /// A transfer candidate's state in the observe stream (kvt_candidate_state); Display
    /// gives the C name, e.g. `PROMOTED`.
    CandidateState, sys::kvt_candidate_state_str {
        PendingEvaluation = sys::KVT_CANDIDATE_PENDING_EVALUATION,
        Promoted = sys::KVT_CANDIDATE_PROMOTED,
        Skipped = sys::KVT_CANDIDATE_SKIPPED,
        Completed = sys::KVT_CANDIDATE_COMPLETED,
        Failed = sys::KVT_CANDIDATE_FAILED,
        Cancelled = sys::KVT_CANDIDATE_CANCELLED,
    }
);

/// A live slot as the scheduler half sees it (kvt_slot_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    pub req_id: String,
    pub state: SlotState,
    /// Since get_num_new_matched_tokens created the slot.
    pub age_ns: u64,
    pub tokens: u64,
    /// Tokens computed or loaded.
    pub computed: u64,
    /// Its G1 blocks.
    pub blocks: u64,
    /// Its loads and stores not yet reported.
    pub batches: u64,
}

/// A batch in flight, planned or sent and not yet reported (kvt_batch_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    pub req_id: String,
    /// A load is G2/G3 -> G1, a store G1 -> G2/G3.
    pub src: Tier,
    pub dst: Tier,
    pub batch: u64,
    pub blocks: u64,
    /// The metadata that carried it; 0: planned for the next one.
    pub step: u64,
}

/// Where a scheduler thread paused (kvt_pause_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseInfo {
    /// The call that paused.
    pub trigger: Trigger,
    /// The transition from `prev` (None: a new slot) to `state`; both None at a call's start.
    pub prev: Option<SlotState>,
    pub state: Option<SlotState>,
    /// The breakpoint's id; 0 for [`Connector::pause`].
    pub breakpoint: u64,
    /// Pauses so far, this one included.
    pub pauses: u64,
    pub req_id: String,
}

/// Interceptors around the scheduler half's six calls, for tracing and tests
/// ([`Connector::set_hooks`]). They run on the calling thread under the connector's lock:
/// they must not call into this connector. A panic in one is dropped. Calls and states of
/// a newer library than this crate knows are not passed on.
pub trait ConnectorHooks: Send + Sync {
    /// At the start of a call; `req_id` None for build_connector_meta and
    /// update_connector_output.
    fn will_call(&self, _trigger: Trigger, _req_id: Option<&str>) {}
    /// At its end, with its outcome.
    fn finished_call(&self, _trigger: Trigger, _req_id: Option<&str>,
                     _result: std::result::Result<(), Status>) {}
    /// After each slot transition; `from` None for a new slot.
    fn transition(&self, _req_id: &str, _from: Option<SlotState>, _to: SlotState,
                  _trigger: Trigger) {}
}

/// Shared hooks: the caller keeps a handle to read what they gathered.
impl<T: ConnectorHooks + ?Sized> ConnectorHooks for std::sync::Arc<T> {
    fn will_call(&self, trigger: Trigger, req_id: Option<&str>) {
        (**self).will_call(trigger, req_id)
    }
    fn finished_call(&self, trigger: Trigger, req_id: Option<&str>,
                     result: std::result::Result<(), Status>) {
        (**self).finished_call(trigger, req_id, result)
    }
    fn transition(&self, req_id: &str, from: Option<SlotState>, to: SlotState, trigger: Trigger) {
        (**self).transition(req_id, from, to, trigger)
    }
}

// The hooks' user pointer is a Box<dyn ConnectorHooks> that the connector keeps; every
// trampoline stops a panic before it unwinds into C.
type Hooks = Box<dyn ConnectorHooks>;

unsafe fn opt_str<'a>(p: *const c_char) -> Option<std::borrow::Cow<'a, str>> {
    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy())
}

fn shielded(f: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

unsafe extern "C" fn will_call(user: *mut c_void, trigger: u32, req_id: *const c_char) {
    let hooks = &*(user as *const Hooks);
    if let Some(t) = Trigger::from_raw(trigger) {
        shielded(|| hooks.will_call(t, opt_str(req_id).as_deref()));
    }
}

unsafe extern "C" fn finished_call(user: *mut c_void, trigger: u32, req_id: *const c_char,
                                   status: sys::kvt_status) {
    let hooks = &*(user as *const Hooks);
    if let Some(t) = Trigger::from_raw(trigger) {
        shielded(|| hooks.finished_call(t, opt_str(req_id).as_deref(), outcome(status)));
    }
}

unsafe extern "C" fn transition(user: *mut c_void, req_id: *const c_char, from: u32, to: u32,
                                trigger: u32) {
    let hooks = &*(user as *const Hooks);
    if let (Some(to), Some(t)) = (SlotState::from_raw(to), Trigger::from_raw(trigger)) {
        let id = opt_str(req_id).unwrap_or_default();
        shielded(|| hooks.transition(&id, SlotState::from_raw(from), to, t));
    }
}

fn c_str(buf: &[c_char]) -> String {
    // Safety: the library's fixed-size, NUL-terminated req_id fields.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// The whole `kvt_connector_config`; `Default` gives the library's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorConfig {
    pub role: Role,
    pub offload: OffloadMode,
    /// Where stores go: G2 or G3. Loads come from G2, then G3 for the rest of a prefix.
    pub store_tier: Tier,
    /// Scheduler: G1 block ids are 0..num_gpu_blocks; 0 takes the manager's g1_blocks.
    pub num_gpu_blocks: u64,
    /// Salt hash of the requests' block hashes (default: the empty salt's).
    pub salt_hash: u64,
    /// true: loads are asynchronous (the engine waits for the request in
    /// finished_recving); false: they end within the step, before wait_for_layer_load returns.
    pub load_async: bool,
    /// Serve the management endpoint on this Unix socket (which must not exist) for the
    /// connector's life; None: none.
    pub endpoint_path: Option<std::path::PathBuf>,
    /// How long a breakpoint's pause waits for a resume: 1 ms ..= 1 hour.
    pub pause_timeout_ms: u32,
    /// Tensor and pipeline parallelism: the scheduler half's workers (1..=4096), and a
    /// worker half's rank below it. Role::Both needs 1.
    pub world_size: u32,
    pub rank: u32,
    /// One KV cache group of a hybrid model with a sliding window of this many tokens
    /// (0: full attention); both halves take the same value, and lazy offload is refused.
    pub sliding_window: u32,
}

fn config_defaults() -> sys::kvt_connector_config {
    let mut c = std::mem::MaybeUninit::<sys::kvt_connector_config>::zeroed();
    unsafe {
        sys::kvt_connector_config_init_sized(c.as_mut_ptr(),
                                             std::mem::size_of::<sys::kvt_connector_config>());
        c.assume_init()
    }
}

impl Default for ConnectorConfig {
    fn default() -> ConnectorConfig {
        let c = config_defaults();
        ConnectorConfig {
            role: if c.role == Role::Scheduler as u32 {
                Role::Scheduler
            } else if c.role == Role::Worker as u32 {
                Role::Worker
            } else {
                Role::Both
            },
            offload: if c.offload == OffloadMode::Lazy as u32 { OffloadMode::Lazy } else { OffloadMode::Eager },
            store_tier: if c.store_tier == Tier::G3 as u32 { Tier::G3 } else { Tier::G2 },
            num_gpu_blocks: c.num_gpu_blocks,
            salt_hash: c.salt_hash,
            load_async: c.load_async != 0,
            endpoint_path: None,
            pause_timeout_ms: c.pause_timeout_ms,
            world_size: c.world_size,
            rank: c.rank,
            sliding_window: c.sliding_window,
        }
    }
}

/// One request in a step's schedule (kvt_scheduled_request).
#[derive(Clone, Copy, Debug, Default)]
pub struct ScheduledRequest<'a> {
    pub req_id: &'a str,
    /// Before this step.
    pub num_computed_tokens: u64,
    /// Tokens whose KV this step computes.
    pub num_scheduled_tokens: u64,
    /// G1 blocks added to it since the connector last saw its list, in order.
    pub new_block_ids: &'a [u32],
    /// Tokens appended to its sequence since the last step (sampled ones); empty in prefill.
    pub new_token_ids: &'a [u32],
}

/// What the worker finished since its last [`Connector::get_finished`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Finished requests whose stores all ended: the engine may free their G1 blocks.
    pub finished_sending: Vec<String>,
    /// Requests whose loads all ended.
    pub finished_recving: Vec<String>,
    /// G1 blocks whose load failed: recompute them.
    pub load_error_block_ids: Vec<u32>,
    /// For the scheduler's [`Connector::update_connector_output`].
    pub report: Vec<u8>,
}

/// Counters of the scheduler half (kvt_connector_stats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorStats {
    /// `[from][to]` by kvt_slot_state value; from 0: slot created.
    pub transitions: [[u64; 11]; 11],
    pub preemptions: u64,
    /// Reported by get_num_new_matched_tokens and accepted.
    pub matched_tokens: u64,
    /// Loads the worker reported done.
    pub loaded_blocks: u64,
    /// Blocks whose load failed.
    pub load_errors: u64,
    /// Stores registered in their tier.
    pub stored_blocks: u64,
    /// Stores dropped.
    pub store_failures: u64,
}

fn c_id(id: &str) -> Result<CString> {
    CString::new(id).map_err(|_| invalid(format!("request id {id:?} holds a NUL byte")))
}

fn ptr_or_null<T>(v: &[T]) -> *const T {
    if v.is_empty() { ptr::null() } else { v.as_ptr() }
}

fn strings(p: *const *const std::os::raw::c_char, n: usize) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    // Safety: the connector's n NUL-terminated strings, valid until its next get_finished.
    unsafe { std::slice::from_raw_parts(p, n) }
        .iter()
        .map(|s| unsafe { CStr::from_ptr(*s) }.to_string_lossy().into_owned())
        .collect()
}

/// Owns a kvt_connector over a manager, which it borrows. Send and Sync: any thread may call
/// a connector, and the worker half's waits block no other call, so one half may run on one
/// thread and the other on another. build_connector_meta and get_finished each copy out a
/// buffer that the connector owns until its next call of the same kind; a lock per buffer
/// (`meta_buffer`, `finished_buffer`) keeps that next call waiting until the copy is made,
/// and holds off nothing else, so a scheduler call paused at a breakpoint does not stall
/// the worker's get_finished.
///
/// # Leaks
/// The connector holds a lease on its manager until it is destroyed: one never dropped
/// (`mem::forget`) leaks its manager too (see "Leaked children" on [`Manager`]). Likewise an
/// [`Endpoint`](crate::Endpoint) serving this connector leases it: dropping the connector
/// while such an endpoint was leaked leaks the connector (its copies, pins and hooks kept, the
/// endpoint still serving it) and so its manager, instead of destroying what the endpoint's
/// thread uses.
pub struct Connector<'m> {
    pub(crate) c: *mut sys::kvt_connector,
    /// Held while build_connector_meta's buffer is read.
    meta_buffer: Mutex<()>,
    /// Held while get_finished's buffers are read.
    finished_buffer: Mutex<()>,
    /// The manager's lease, held until the connector is destroyed.
    manager: Arc<crate::Lease>,
    /// Cloned by each endpoint serving this connector, until it is closed.
    pub(crate) lease: Arc<()>,
    /// The hooks the library calls (their user pointer), kept until replaced or dropped.
    hooks: Mutex<Option<Box<Hooks>>>,
    _m: PhantomData<&'m Manager>,
}

unsafe impl Send for Connector<'_> {}
unsafe impl Sync for Connector<'_> {}

impl<'m> Connector<'m> {
    /// Creates the manager's connector (a manager has at most one).
    pub fn new(m: &'m Manager, cfg: &ConnectorConfig) -> Result<Connector<'m>> {
        let mut c = config_defaults();
        c.role = cfg.role as u32;
        c.offload = cfg.offload as u32;
        c.store_tier = cfg.store_tier as u32;
        c.num_gpu_blocks = cfg.num_gpu_blocks;
        c.salt_hash = cfg.salt_hash;
        c.load_async = cfg.load_async as u32;
        c.pause_timeout_ms = cfg.pause_timeout_ms;
        c.world_size = cfg.world_size;
        c.rank = cfg.rank;
        c.sliding_window = cfg.sliding_window;
        let endpoint = cfg.endpoint_path.as_deref().map(crate::observe::c_path).transpose()?;
        if let Some(p) = &endpoint {
            c.endpoint_path = p.as_ptr();
        }
        let mut out = ptr::null_mut();
        check(unsafe { sys::kvt_connector_create(&mut out, m.m, &c) })?;
        Ok(Connector { c: out, meta_buffer: Mutex::new(()), finished_buffer: Mutex::new(()),
                       manager: Arc::clone(&m.lease), lease: Arc::new(()), hooks: Mutex::new(None),
                       _m: PhantomData })
    }

    // --- scheduler half ---

    /// How many tokens beyond `num_computed_tokens` kvtier can load, and whether the load is
    /// asynchronous. The first call for an id creates its slot.
    pub fn get_num_new_matched_tokens(&self, req_id: &str, tokens: &[u32],
                                      num_computed_tokens: u64) -> Result<(u64, bool)> {
        let id = c_id(req_id)?;
        let (mut n, mut load_async) = (0u64, 0i32);
        check(unsafe {
            sys::kvt_connector_get_num_new_matched_tokens(&mut n, &mut load_async, self.c,
                                                          id.as_ptr(), ptr_or_null(tokens),
                                                          tokens.len(), num_computed_tokens)
        })?;
        Ok((n, load_async != 0))
    }

    /// The same for a request whose blocks are named under its own `salt_hash` (from
    /// `hash_salt`): what besides its tokens decides its KV (a tenant's salt, a LoRA adapter),
    /// so that requests share blocks only when their salts and tokens are equal.
    pub fn get_num_new_matched_tokens_salted(&self, req_id: &str, salt_hash: u64,
                                             tokens: &[u32], num_computed_tokens: u64)
                                             -> Result<(u64, bool)> {
        let id = c_id(req_id)?;
        let (mut n, mut load_async) = (0u64, 0i32);
        check(unsafe {
            sys::kvt_connector_get_num_new_matched_tokens_salted(
                &mut n, &mut load_async, self.c, id.as_ptr(), salt_hash, ptr_or_null(tokens),
                tokens.len(), num_computed_tokens)
        })?;
        Ok((n, load_async != 0))
    }

    /// The same, with the hit capped at `max_tokens`: an engine with several KV cache groups
    /// lowers the cap to the smallest group's hit and asks each group again until all agree.
    pub fn get_num_new_matched_tokens_max(&self, req_id: &str, salt_hash: u64, tokens: &[u32],
                                          num_computed_tokens: u64, max_tokens: u64)
                                          -> Result<(u64, bool)> {
        let id = c_id(req_id)?;
        let (mut n, mut load_async) = (0u64, 0i32);
        check(unsafe {
            sys::kvt_connector_get_num_new_matched_tokens_max(
                &mut n, &mut load_async, self.c, id.as_ptr(), salt_hash, ptr_or_null(tokens),
                tokens.len(), num_computed_tokens, max_tokens)
        })?;
        Ok((n, load_async != 0))
    }

    /// The engine allocated `block_ids` (all of the request's G1 blocks, in order) and wants
    /// `num_external_tokens` of them filled: 0, or what get_num_new_matched_tokens reported.
    pub fn update_state_after_alloc(&self, req_id: &str, block_ids: &[u32],
                                    num_external_tokens: u64) -> Result<()> {
        let id = c_id(req_id)?;
        check(unsafe {
            sys::kvt_connector_update_state_after_alloc(self.c, id.as_ptr(), ptr_or_null(block_ids),
                                                        block_ids.len(), num_external_tokens)
        })
    }

    /// One step's loads and stores, as metadata bytes for the worker. All or nothing.
    pub fn build_connector_meta(&self, reqs: &[ScheduledRequest<'_>]) -> Result<Vec<u8>> {
        let ids = reqs.iter().map(|r| c_id(r.req_id)).collect::<Result<Vec<_>>>()?;
        let raw: Vec<sys::kvt_scheduled_request> = reqs
            .iter()
            .zip(&ids)
            .map(|(r, id)| sys::kvt_scheduled_request {
                req_id: id.as_ptr(),
                num_computed_tokens: r.num_computed_tokens,
                num_scheduled_tokens: r.num_scheduled_tokens,
                new_block_ids: ptr_or_null(r.new_block_ids),
                num_new_block_ids: r.new_block_ids.len(),
                new_token_ids: ptr_or_null(r.new_token_ids),
                num_new_token_ids: r.new_token_ids.len(),
            })
            .collect();
        let (mut p, mut n) = (ptr::null(), 0usize);
        let _held = self.meta_buffer.lock().unwrap_or_else(|e| e.into_inner());
        check(unsafe {
            sys::kvt_connector_build_connector_meta(&mut p, &mut n, self.c, ptr_or_null(&raw),
                                                    raw.len())
        })?;
        // Safety: the connector's n bytes, valid until its next build (held off by _held).
        Ok(if n == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec() })
    }

    /// Applies the worker's report ([`Finished::report`]).
    pub fn update_connector_output(&self, report: &[u8]) -> Result<()> {
        check(unsafe {
            sys::kvt_connector_update_connector_output(self.c, ptr_or_null(report).cast(),
                                                       report.len())
        })
    }

    /// The request is done. true: stores still read its G1 blocks, and the engine keeps them
    /// until the worker lists the request in finished_sending.
    pub fn request_finished(&self, req_id: &str) -> Result<bool> {
        let id = c_id(req_id)?;
        let mut delay = 0i32;
        check(unsafe { sys::kvt_connector_request_finished(&mut delay, self.c, id.as_ptr()) })?;
        Ok(delay != 0)
    }

    /// The engine preempted the request and takes its G1 blocks back.
    pub fn request_preempted(&self, req_id: &str) -> Result<()> {
        let id = c_id(req_id)?;
        check(unsafe { sys::kvt_connector_request_preempted(self.c, id.as_ptr()) })
    }

    /// Nothing stored so far is served again (after a weight reload, say).
    pub fn reset_cache(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_reset_cache(self.c) })
    }

    /// The slot's state and its states so far, from INITIALIZED on.
    pub fn slot_state(&self, req_id: &str) -> Result<(SlotState, Vec<SlotState>)> {
        let id = c_id(req_id)?;
        let mut hist = vec![0u32; 16];
        loop {
            let (mut state, mut n) = (0u32, 0usize);
            check(unsafe {
                sys::kvt_connector_slot_state(&mut state, hist.as_mut_ptr(), &mut n, hist.len(),
                                              self.c, id.as_ptr())
            })?;
            if n > hist.len() {
                hist.resize(n, 0); // another thread moved it on meanwhile: ask again
                continue;
            }
            let known = |v: u32| {
                SlotState::from_raw(v).ok_or_else(|| invalid(format!("unknown slot state {v}")))
            };
            let history = hist[..n].iter().map(|v| known(*v)).collect::<Result<Vec<_>>>()?;
            return Ok((known(state)?, history));
        }
    }

    /// Counters of the scheduler half.
    pub fn stats(&self) -> Result<ConnectorStats> {
        let mut s: sys::kvt_connector_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::kvt_connector_stats>() as u32;
        check(unsafe { sys::kvt_connector_stats_get(&mut s, self.c) })?;
        Ok(ConnectorStats {
            transitions: s.transitions,
            preemptions: s.preemptions,
            matched_tokens: s.matched_tokens,
            loaded_blocks: s.loaded_blocks,
            load_errors: s.load_errors,
            stored_blocks: s.stored_blocks,
            store_failures: s.store_failures,
        })
    }

    /// Moves up to `max` pending events (BLOCK_STORED/REMOVED of G2 and G3) out, oldest first.
    #[deprecated(note = "use poll_events, whose events have typed tiers")]
    #[allow(deprecated)]
    pub fn take_events(&self, max: usize) -> Vec<Event> {
        drain_events(max, |out| unsafe { sys::kvt_connector_drain_events(self.c, out, max) },
                     Event::from_raw)
    }

    /// Moves up to `max` of the manager's pending events (BLOCK_STORED/REMOVED of G2 and
    /// G3) out, oldest first: vLLM's take_events.
    pub fn poll_events(&self, max: usize) -> Vec<ManagerEvent> {
        drain_events(max, |out| unsafe { sys::kvt_connector_drain_events(self.c, out, max) },
                     ManagerEvent::from_raw)
    }

    // --- inspection and breakpoints (while paused, inspection answers from the pause) ---

    /// The live slots.
    pub fn slots(&self) -> Result<Vec<SlotInfo>> {
        let raw = fill_sized(|out, cap, n| unsafe { sys::kvt_connector_slots(out, cap, n, self.c) })?;
        raw.iter()
            .map(|s| Ok(SlotInfo {
                req_id: c_str(&s.req_id),
                state: SlotState::from_raw(s.state)
                    .ok_or_else(|| invalid(format!("unknown slot state {}", s.state)))?,
                age_ns: s.age_ns,
                tokens: s.tokens,
                computed: s.computed,
                blocks: s.blocks,
                batches: s.batches,
            }))
            .collect()
    }

    /// The batches in flight: planned, or sent and not yet reported.
    pub fn batches(&self) -> Result<Vec<BatchInfo>> {
        let raw = fill_sized(|out, cap, n| unsafe { sys::kvt_connector_batches(out, cap, n, self.c) })?;
        let tier = |t: u32| Tier::from_raw(t).ok_or_else(|| invalid(format!("unknown tier {t}")));
        raw.iter()
            .map(|b| Ok(BatchInfo { req_id: c_str(&b.req_id), src: tier(b.src)?, dst: tier(b.dst)?,
                                    batch: b.batch, blocks: b.blocks, step: b.step }))
            .collect()
    }

    /// Pauses the scheduler thread inside a call when a slot has entered `state` (None: any)
    /// for `req_id` (None: any; with no state, at the start of every call that names it).
    /// Returns the breakpoint's id.
    pub fn breakpoint_add(&self, state: Option<SlotState>, req_id: Option<&str>) -> Result<u64> {
        let id = req_id.map(c_id).transpose()?;
        let mut out = 0u64;
        check(unsafe {
            sys::kvt_connector_breakpoint_add(&mut out, self.c, state.map_or(0, |s| s as u32),
                                              id.as_ref().map_or(ptr::null(), |i| i.as_ptr()))
        })?;
        Ok(out)
    }

    /// Status::NotFound for an unknown id. A thread paused at it stays paused until resumed.
    pub fn breakpoint_remove(&self, id: u64) -> Result<()> {
        check(unsafe { sys::kvt_connector_breakpoint_remove(self.c, id) })
    }

    /// Pauses the scheduler at its next call or transition.
    pub fn pause(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_pause(self.c) })
    }

    /// Resumes the paused thread; Status::State when none is paused.
    pub fn resume(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_resume(self.c) })
    }

    /// Waits up to `timeout` for a paused thread and describes its pause; None when none
    /// paused in time. `Duration::ZERO` only looks; `Duration::MAX` (any timeout beyond
    /// `i64::MAX` nanoseconds) waits forever.
    pub fn wait_paused(&self, timeout: Duration) -> Result<Option<PauseInfo>> {
        let mut p: sys::kvt_pause_info = crate::versioned();
        let ns = i64::try_from(timeout.as_nanos()).unwrap_or(-1);
        let s = unsafe { sys::kvt_connector_pause_wait(&mut p, self.c, ns) };
        if s == sys::KVT_TIMEOUT as sys::kvt_status {
            return Ok(None);
        }
        check(s)?;
        Ok(Some(PauseInfo {
            trigger: Trigger::from_raw(p.trigger)
                .ok_or_else(|| invalid(format!("unknown trigger {}", p.trigger)))?,
            prev: SlotState::from_raw(p.prev),
            state: SlotState::from_raw(p.state),
            breakpoint: p.breakpoint,
            pauses: p.pauses,
            req_id: c_str(&p.req_id),
        }))
    }

    /// How long a pause waits for a resume before it ends itself: 1 ms ..= 1 hour.
    pub fn set_pause_timeout(&self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        check(unsafe { sys::kvt_connector_set_pause_timeout(self.c, ms) })
    }

    /// Calls `hooks` around the scheduler half's calls from now on, in place of any before.
    pub fn set_hooks(&self, hooks: impl ConnectorHooks + 'static) -> Result<()> {
        self.install_hooks(Some(Box::new(Box::new(hooks))))
    }

    /// Removes the hooks.
    pub fn clear_hooks(&self) -> Result<()> {
        self.install_hooks(None)
    }

    fn install_hooks(&self, hooks: Option<Box<Hooks>>) -> Result<()> {
        // Held across the call, so that concurrent installs keep the library's pointer and
        // the kept box the same; the library swaps them under the lock its hooks run under,
        // so the old box is unused once the call returns.
        let mut kept = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        let raw = hooks.as_ref().map(|h| sys::kvt_connector_hooks {
            struct_size: std::mem::size_of::<sys::kvt_connector_hooks>() as u32,
            reserved: 0,
            will_call: Some(will_call),
            finished_call: Some(finished_call),
            transition: Some(transition),
            user: &**h as *const Hooks as *mut c_void,
        });
        check(unsafe {
            sys::kvt_connector_set_hooks(self.c, raw.as_ref().map_or(ptr::null(), |r| r as *const _))
        })?;
        *kept = hooks;
        Ok(())
    }

    // --- worker half ---

    /// The engine's G1 memory: `num_blocks` blocks in `layout`, whose memory (see
    /// [`G1Layout::new`]) outlives the manager and so this connector. Once, before the first
    /// bind. From then on, dropping the manager while this connector (or an endpoint) was
    /// leaked aborts the process (see "Leaked children" on [`Manager`]).
    pub fn register_kv_caches(&self, layout: &G1Layout, num_blocks: u64) -> Result<()> {
        let l = layout.raw()?;
        self.manager.note_engine_memory();
        check(unsafe { sys::kvt_connector_register_kv_caches(self.c, &l, num_blocks) })
    }

    /// Decodes a step's metadata and holds it until clear_connector_metadata.
    pub fn bind_connector_metadata(&self, meta: &[u8]) -> Result<()> {
        check(unsafe {
            sys::kvt_connector_bind_connector_metadata(self.c, ptr_or_null(meta).cast(), meta.len())
        })
    }

    pub fn clear_connector_metadata(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_clear_connector_metadata(self.c) })
    }

    /// Starts the bound metadata's lazy stores and loads.
    pub fn start_load_kv(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_start_load_kv(self.c) })
    }

    /// Waits until the step's lazy stores, and its loads unless asynchronous, have ended.
    pub fn wait_for_layer_load(&self, layer: u32) -> Result<()> {
        check(unsafe { sys::kvt_connector_wait_for_layer_load(self.c, layer) })
    }

    /// The model wrote layer `layer`; after the last one the step's eager stores start.
    pub fn save_kv_layer(&self, layer: u32) -> Result<()> {
        check(unsafe { sys::kvt_connector_save_kv_layer(self.c, layer) })
    }

    /// Starts the eager stores not started yet, and returns (get_finished reports them).
    pub fn wait_for_save(&self) -> Result<()> {
        check(unsafe { sys::kvt_connector_wait_for_save(self.c) })
    }

    /// Everything that ended since the last call; never waits.
    pub fn get_finished(&self) -> Result<Finished> {
        let mut f: sys::kvt_finished = unsafe { std::mem::zeroed() };
        f.struct_size = std::mem::size_of::<sys::kvt_finished>() as u32;
        let _held = self.finished_buffer.lock().unwrap_or_else(|e| e.into_inner());
        check(unsafe { sys::kvt_connector_get_finished(&mut f, self.c) })?;
        // Safety: connector-owned arrays, valid until its next get_finished (held off by
        // _held).
        let errors = if f.num_load_errors == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(f.load_error_block_ids, f.num_load_errors) }.to_vec()
        };
        let report = if f.report_len == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(f.report.cast::<u8>(), f.report_len) }.to_vec()
        };
        Ok(Finished {
            finished_sending: strings(f.finished_sending, f.num_finished_sending),
            finished_recving: strings(f.finished_recving, f.num_finished_recving),
            load_error_block_ids: errors,
            report,
        })
    }

    /// Waits until no copy in flight uses the G1 blocks of these requests; unknown ids are
    /// ignored.
    pub fn handle_preemptions(&self, req_ids: &[&str]) -> Result<()> {
        let ids = req_ids.iter().map(|s| c_id(s)).collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = ids.iter().map(|s| s.as_ptr()).collect();
        check(unsafe { sys::kvt_connector_handle_preemptions(self.c, ptr_or_null(&ptrs), ptrs.len()) })
    }
}

impl Drop for Connector<'_> {
    /// Waits for the worker's copies in flight, releases every pin and frees the connector;
    /// leaks it instead while a leaked endpoint serves it (see "Leaks" above).
    fn drop(&mut self) {
        // Exclusive access: every endpoint that borrowed this connector has been dropped, and
        // its clone with it, so those left belong to endpoints never dropped.
        if Arc::strong_count(&self.lease) > 1 {
            // The library keeps calling the hooks for the endpoint's requests, and keeps using
            // the manager: leak both (the manager's lease keeps it from being destroyed).
            std::mem::forget(self.hooks.get_mut().unwrap_or_else(|e| e.into_inner()).take());
            std::mem::forget(Arc::clone(&self.manager));
            return;
        }
        unsafe { sys::kvt_connector_destroy(self.c) }
    }
}
