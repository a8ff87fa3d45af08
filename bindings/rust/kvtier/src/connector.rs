//! The connector: the request layer a serving engine plugs in, with vLLM's method names
//! (`KVConnectorBase_V1`). A scheduler half decides the loads and stores of each step and
//! passes them to a worker half as metadata bytes; the worker copies and answers with a
//! report. Both halves may live in one connector (`Role::Both`) or in two processes.
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Mutex;

use kvtier_sys as sys;

use crate::{check, invalid, Event, G1Layout, Manager, Result, Tier};

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
/// thread and the other on another. build_connector_meta and get_finished copy out buffers that the connector owns
/// until its next such call; `buffers` keeps that next call waiting until the copy is made.
pub struct Connector<'m> {
    pub(crate) c: *mut sys::kvt_connector,
    buffers: Mutex<()>,
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
        Ok(Connector { c: out, buffers: Mutex::new(()), _m: PhantomData })
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
        let _held = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
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
    pub fn take_events(&self, max: usize) -> Vec<Event> {
        let mut buf: Vec<sys::kvt_event> = Vec::with_capacity(max);
        let n = unsafe { sys::kvt_connector_take_events(buf.as_mut_ptr(), max, self.c) };
        unsafe { buf.set_len(n) };
        buf.iter().map(Event::from_raw).collect()
    }

    // --- worker half ---

    /// The engine's G1 memory: `num_blocks` blocks in `layout`, whose memory (see
    /// [`G1Layout::new`]) outlives the manager and so this connector. Once, before the first
    /// bind.
    pub fn register_kv_caches(&self, layout: &G1Layout, num_blocks: u64) -> Result<()> {
        let l = layout.raw()?;
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
        let _held = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
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
    /// Waits for the worker's copies in flight, releases every pin and frees the connector.
    fn drop(&mut self) {
        unsafe { sys::kvt_connector_destroy(self.c) }
    }
}
