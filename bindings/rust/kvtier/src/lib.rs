//! Safe Rust API for kvtier, a tiered KV-cache block manager with a C ABI.
//!
//! ```no_run
//! use kvtier::{Config, Manager, Tier};
//! let m = Manager::new(&Config { page_size: 16, g1_blocks: 4096, g2_blocks: 16384, ..Default::default() })?;
//! let hashes = kvtier::hash_sequence(&[1, 2, 3, 4], 4, kvtier::try_hash_salt(b"model")?)?;
//! let blocks = m.alloc(hashes.len(), Tier::G1)?;
//! let blocks = m.register_hashes(&blocks, &hashes, 0)?;
//! m.offload(&blocks, Tier::G2, None, 0)?.wait(None)?;
//! m.release(&blocks)?;
//! # Ok::<(), kvtier::Error>(())
//! ```
//!
//! Ownership follows the C contract: a [`Manager`] owns everything; a [`Transfer`], a
//! [`Fence`], a [`Connector`] and an [`Endpoint`] borrow their manager, so they cannot outlive
//! it. Block handles are plain values ([`Block`]): the library itself refuses stale and
//! foreign ones.
//!
//! A connector and an endpoint run threads of the library's that use their manager (and an
//! endpoint its connector) until they are destroyed, which only their `Drop` does. A borrow
//! does not make that happen: `mem::forget` (or a leaked `Rc` cycle) skips `Drop`. So each
//! also holds a lease on what it uses, and what is still leased when dropped is leaked
//! rather than destroyed (see [`Manager`] and [`Connector`]).
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::os::unix::io::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvtier_sys as sys;

mod block;
mod config;
mod connector;
mod endpoint;
mod g4;
mod log;
mod observe;
pub use block::{BlockInfo, BlockState, TierStats, TransferStats};
pub use config::{
    Config, CudaCopy, Eviction, G1Layout, G3Fault, G3Mismatch, IoEngine, KvEventsFormat,
    MemoryKind, Policy,
};
pub use connector::{
    BatchInfo, CandidateState, Connector, ConnectorConfig, ConnectorHooks, ConnectorStats,
    Finished, OffloadMode, PauseInfo, Role, ScheduledRequest, SlotInfo, SlotState, Trigger,
};
pub use endpoint::{Endpoint, EndpointConfig, EndpointStats};
pub use g4::G4Stats;
pub use log::{clear_log_handler, set_log_handler, LogLevel};
pub use observe::{
    read_event_log, replay_event_log, EventLog, EventLogReader, ObsEvent, Replay, Rerun,
    Subscription,
};

/// A kvt_status other than KVT_OK, kept as an enum: the errors, and the outcomes that are
/// not errors but end a call early (`Timeout`, `IterOver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// A wait ran out of time.
    Timeout,
    /// An iteration has no more items (KVT_ITEROVER, 0.5.0). Not an error: the crate's
    /// iterators ([`EventLogReader`]) end on it rather than return it.
    IterOver,
    InvalidArgument,
    InvalidHandle,
    State,
    NoSpace,
    Cancelled,
    Unsupported,
    Io,
    Corrupt,
    NoMemory,
    Cuda,
    /// No such id or key: an unknown request (never seen, or finished) or breakpoint, a
    /// missing G4 key.
    NotFound,
    Internal,
    Other(i32),
}

impl Status {
    fn from_raw(s: sys::kvt_status) -> Status {
        match s as i64 {
            x if x == sys::KVT_TIMEOUT as i64 => Status::Timeout,
            x if x == sys::KVT_ITEROVER as i64 => Status::IterOver,
            x if x == sys::KVT_ERR_INVALID_ARGUMENT as i64 => Status::InvalidArgument,
            x if x == sys::KVT_ERR_INVALID_HANDLE as i64 => Status::InvalidHandle,
            x if x == sys::KVT_ERR_STATE as i64 => Status::State,
            x if x == sys::KVT_ERR_NO_SPACE as i64 => Status::NoSpace,
            x if x == sys::KVT_ERR_CANCELLED as i64 => Status::Cancelled,
            x if x == sys::KVT_ERR_UNSUPPORTED as i64 => Status::Unsupported,
            x if x == sys::KVT_ERR_IO as i64 => Status::Io,
            x if x == sys::KVT_ERR_CORRUPT as i64 => Status::Corrupt,
            x if x == sys::KVT_ERR_NO_MEMORY as i64 => Status::NoMemory,
            x if x == sys::KVT_ERR_CUDA as i64 => Status::Cuda,
            x if x == sys::KVT_ERR_NOT_FOUND as i64 => Status::NotFound,
            x if x == sys::KVT_ERR_INTERNAL as i64 => Status::Internal,
            _ => Status::Other(s),
        }
    }

    /// The C status code, e.g. -3 for `State`.
    pub fn code(self) -> i32 {
        match self {
            Status::Timeout => sys::KVT_TIMEOUT as i32,
            Status::IterOver => sys::KVT_ITEROVER as i32,
            Status::InvalidArgument => sys::KVT_ERR_INVALID_ARGUMENT,
            Status::InvalidHandle => sys::KVT_ERR_INVALID_HANDLE,
            Status::State => sys::KVT_ERR_STATE,
            Status::NoSpace => sys::KVT_ERR_NO_SPACE,
            Status::Cancelled => sys::KVT_ERR_CANCELLED,
            Status::Unsupported => sys::KVT_ERR_UNSUPPORTED,
            Status::Io => sys::KVT_ERR_IO,
            Status::Corrupt => sys::KVT_ERR_CORRUPT,
            Status::NoMemory => sys::KVT_ERR_NO_MEMORY,
            Status::Cuda => sys::KVT_ERR_CUDA,
            Status::NotFound => sys::KVT_ERR_NOT_FOUND,
            Status::Internal => sys::KVT_ERR_INTERNAL,
            Status::Other(s) => s,
        }
    }

    /// The C name (kvt_status_str), e.g. "KVT_ERR_STATE"; "KVT_UNKNOWN_STATUS" for `Other`
    /// codes the library does not know.
    pub fn name(self) -> &'static str {
        c_name(unsafe { sys::kvt_status_str(self.code()) })
    }
}

/// A static string of the library (the *_str calls), which are ASCII.
pub(crate) fn c_name(p: *const std::os::raw::c_char) -> &'static str {
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

/// An outcome carried in an event or a hook: Ok, or the error's status.
pub(crate) fn outcome(s: sys::kvt_status) -> std::result::Result<(), Status> {
    if s == sys::KVT_OK as sys::kvt_status { Ok(()) } else { Err(Status::from_raw(s)) }
}

/// A failed call: its status and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kvtier: {:?}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(s: sys::kvt_status) -> Result<()> {
    if s == sys::KVT_OK as sys::kvt_status {
        return Ok(());
    }
    // kvt_last_error is thread-local, and this runs on the calling thread.
    let message = unsafe { CStr::from_ptr(sys::kvt_last_error()) }.to_string_lossy().into_owned();
    Err(Error { status: Status::from_raw(s), message })
}

fn invalid(message: impl Into<String>) -> Error {
    Error { status: Status::InvalidArgument, message: message.into() }
}

/// A struct of the library's that begins with struct_size, zeroed, with struct_size set.
pub(crate) fn versioned<T>() -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    // Safety: the sys structs are plain C data, valid when zeroed; each begins with its
    // uint32_t struct_size.
    unsafe {
        v.as_mut_ptr().cast::<u32>().write(std::mem::size_of::<T>() as u32);
        v.assume_init()
    }
}

/// Fills an array the library sizes (`call(out, cap, &mut n)`, CONVENTIONS.md): asks again
/// with room for n until everything fitted. T is a plain C type, valid when zeroed.
pub(crate) fn fill_sized<T: Copy>(call: impl Fn(*mut T, usize, &mut usize) -> sys::kvt_status)
                                  -> Result<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    loop {
        let mut n = 0usize;
        check(call(out.as_mut_ptr(), out.len(), &mut n))?;
        if n <= out.len() {
            out.truncate(n);
            return Ok(out);
        }
        // Asked for the count, or more came meanwhile: ask again with room for them.
        out.resize(n, unsafe { std::mem::MaybeUninit::zeroed().assume_init() });
    }
}

/// The library's version string.
pub fn version() -> String {
    unsafe { CStr::from_ptr(sys::kvt_version()) }.to_string_lossy().into_owned()
}

/// A storage tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Tier {
    G1 = sys::KVT_TIER_G1,
    G2 = sys::KVT_TIER_G2,
    G3 = sys::KVT_TIER_G3,
    /// The remote tier on Redis (`Config::g4_url`): a destination of [`Manager::offload`]
    /// and the source of [`Manager::g4_onboard`]; it holds no block handles.
    G4 = sys::KVT_TIER_G4,
}

impl Tier {
    /// The tier of a raw C value; None for 0 or a value this crate does not know.
    pub fn from_raw(v: u32) -> Option<Tier> {
        [Tier::G1, Tier::G2, Tier::G3, Tier::G4].into_iter().find(|t| *t as u32 == v)
    }
}

/// A block handle. 0 is never valid; the library detects stale, forged and foreign ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct Block(pub u64);

// Block is repr(transparent) over u64, the C handle type: slices convert in place.
fn raw(blocks: &[Block]) -> *const sys::kvt_block {
    blocks.as_ptr().cast()
}

/// The salt hash for [`hash_sequence`].
#[deprecated(note = "drops the call's status: use try_hash_salt")]
pub fn hash_salt(salt: &[u8]) -> u64 {
    try_hash_salt(salt).unwrap_or(0)
}

/// The salt hash for [`hash_sequence`] and the connector's salted calls.
pub fn try_hash_salt(salt: &[u8]) -> Result<u64> {
    let mut out = 0u64;
    check(unsafe { sys::kvt_hash_salt(&mut out, salt.as_ptr().cast(), salt.len()) })?;
    Ok(out)
}

/// The sequence hashes of the full blocks of `tokens`.
pub fn hash_sequence(tokens: &[u32], page_size: u32, salt_hash: u64) -> Result<Vec<u64>> {
    let cap = if page_size == 0 { 0 } else { tokens.len() / page_size as usize };
    let mut out = vec![0u64; cap];
    let n = hash_sequence_into(tokens, page_size, salt_hash, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// The sequence hashes of the first `out.len()` full blocks of `tokens` into `out`, as
/// [`hash_sequence`] gives them; returns how many full blocks `tokens` has, which may be more
/// than were written (an empty `out` only asks for that number).
pub fn hash_sequence_into(tokens: &[u32], page_size: u32, salt_hash: u64, out: &mut [u64])
                          -> Result<usize> {
    let mut n = 0usize;
    check(unsafe {
        sys::kvt_hash_tokens(out.as_mut_ptr(), out.len(), &mut n, salt_hash, tokens.as_ptr(),
                             tokens.len(), page_size)
    })?;
    Ok(n)
}

/// Incremental hasher. Send but not Sync: the C contract forbids use from two threads at once.
pub struct Seq {
    s: *mut sys::kvt_seq,
}

unsafe impl Send for Seq {}

impl Seq {
    pub fn new(page_size: u32, salt_hash: u64) -> Result<Seq> {
        let mut s = ptr::null_mut();
        check(unsafe { sys::kvt_seq_create(&mut s, salt_hash, page_size) })?;
        Ok(Seq { s })
    }

    pub fn append(&mut self, tokens: &[u32]) -> Result<()> {
        check(unsafe { sys::kvt_seq_append(self.s, tokens.as_ptr(), tokens.len()) })
    }

    /// The sequence hashes of the blocks completed so far.
    pub fn hashes(&self) -> Result<Vec<u64>> {
        let (mut t, mut b) = (0usize, 0usize);
        check(unsafe { sys::kvt_seq_info(&mut t, &mut b, self.s) })?;
        let mut out = vec![0u64; b];
        let mut n = 0usize;
        check(unsafe {
            sys::kvt_seq_copy_hashes(ptr::null_mut(), out.as_mut_ptr(), b, &mut n, self.s, 0)
        })?;
        out.truncate(n.min(b));
        Ok(out)
    }
}

impl Drop for Seq {
    fn drop(&mut self) {
        unsafe { sys::kvt_seq_destroy(self.s) }
    }
}

/// One event from [`Manager::poll`], its tiers as raw numbers.
#[deprecated(note = "use ManagerEvent, whose tiers are typed (Manager::poll_events)")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    XferDone { status: std::result::Result<(), Status>, tier: u32, user_data: u64, count: u64 },
    BlockStored { tier: u32, hash: u64, parent: u64 },
    BlockRemoved { tier: u32, hash: u64 },
    EventsDropped { count: u64 },
    /// [`Manager::reset`] emptied this tier's registry (after its `BlockRemoved` events).
    TierCleared { tier: u32 },
}

#[allow(deprecated)]
impl Event {
    fn from_raw(e: &sys::kvt_event) -> Event {
        match e.type_ {
            sys::KVT_EVENT_XFER_DONE => Event::XferDone {
                status: outcome(e.status),
                tier: e.tier,
                user_data: e.user_data,
                count: e.count,
            },
            sys::KVT_EVENT_BLOCK_STORED => {
                Event::BlockStored { tier: e.tier, hash: e.hash, parent: e.parent_hash }
            }
            sys::KVT_EVENT_BLOCK_REMOVED => Event::BlockRemoved { tier: e.tier, hash: e.hash },
            sys::KVT_EVENT_TIER_CLEARED => Event::TierCleared { tier: e.tier },
            _ => Event::EventsDropped { count: e.count },
        }
    }
}

/// One event of a manager's queue ([`Manager::poll_events`], [`Connector::poll_events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManagerEvent {
    /// A transfer ended: its status, its destination tier, the user_data it was enqueued
    /// with and the blocks it moved.
    XferDone { status: std::result::Result<(), Status>, tier: Tier, user_data: u64, count: u64 },
    BlockStored { tier: Tier, hash: u64, parent: u64 },
    BlockRemoved { tier: Tier, hash: u64 },
    /// The queue was full: `count` BLOCK_* events were lost before the next one.
    EventsDropped { count: u64 },
    /// [`Manager::reset`] emptied this tier's registry (after its `BlockRemoved` events).
    TierCleared { tier: Tier },
    /// An event type or tier of a newer library than this crate knows.
    Unknown { kind: u32, tier: u32 },
}

impl ManagerEvent {
    fn from_raw(e: &sys::kvt_event) -> ManagerEvent {
        let unknown = ManagerEvent::Unknown { kind: e.type_, tier: e.tier };
        if e.type_ == sys::KVT_EVENT_EVENTS_DROPPED {
            return ManagerEvent::EventsDropped { count: e.count };
        }
        let tier = match Tier::from_raw(e.tier) {
            Some(t) => t,
            None => return unknown,
        };
        match e.type_ {
            sys::KVT_EVENT_XFER_DONE => ManagerEvent::XferDone {
                status: outcome(e.status),
                tier,
                user_data: e.user_data,
                count: e.count,
            },
            sys::KVT_EVENT_BLOCK_STORED => {
                ManagerEvent::BlockStored { tier, hash: e.hash, parent: e.parent_hash }
            }
            sys::KVT_EVENT_BLOCK_REMOVED => ManagerEvent::BlockRemoved { tier, hash: e.hash },
            sys::KVT_EVENT_TIER_CLEARED => ManagerEvent::TierCleared { tier },
            _ => unknown,
        }
    }
}

/// Moves up to `max` events out of a queue through `drain` (kvt_manager_poll,
/// kvt_connector_drain_events), which returns how many it wrote.
pub(crate) fn drain_events<T>(max: usize, drain: impl FnOnce(*mut sys::kvt_event) -> usize,
                              convert: fn(&sys::kvt_event) -> T) -> Vec<T> {
    let mut buf: Vec<sys::kvt_event> = Vec::with_capacity(max);
    let n = drain(buf.as_mut_ptr());
    // Safety: the library wrote n <= max events into the reserved space.
    unsafe { buf.set_len(n) };
    buf.iter().map(convert).collect()
}

/// What a manager's connector and endpoints hold a clone of while the library may still use
/// the manager for them (their leases): the manager is destroyed only when no clone but its
/// own is left.
#[derive(Default)]
pub(crate) struct Lease {
    /// The library was given memory of the engine's (a [`G1Layout`], in the config or in
    /// [`Connector::register_kv_caches`]), which it would keep using if the manager leaked.
    engine_memory: AtomicBool,
}

impl Lease {
    pub(crate) fn note_engine_memory(&self) {
        self.engine_memory.store(true, Ordering::SeqCst);
    }
}

/// Owns a kvt_manager. Send and Sync: every function of a manager may be called from any
/// thread at once (kvtier.h); destruction happens in Drop, which needs exclusive access.
///
/// # Leaked children
/// Dropping (or [`closing`](Manager::close)) a manager destroys it, unless one of its
/// [`Connector`]s or [`Endpoint`]s was never dropped (`mem::forget`, an `Rc` cycle): the
/// library's threads for that child still use the manager, so destroying it would free memory
/// in use. Then:
/// - the manager is leaked instead: never destroyed, its memory, threads, event descriptor
///   and G3 file kept for the rest of the process, and the leaked child keeps working;
///   nothing is logged or printed;
/// - except when the library was handed memory of the engine's (a [`G1Layout`] in the
///   config, or [`Connector::register_kv_caches`]): a leaked manager would go on reading and
///   writing it after the engine may have freed it, so the process aborts
///   (`std::process::abort`) instead.
///
/// A child dropped normally releases its lease first; only a forgotten one leaks.
pub struct Manager {
    m: *mut sys::kvt_manager,
    /// Tokens per block, to size the token arrays of [`Manager::note_tokens`].
    page_size: u32,
    /// Cloned by each connector and endpoint of this manager (see "Leaked children").
    pub(crate) lease: Arc<Lease>,
}

unsafe impl Send for Manager {}
unsafe impl Sync for Manager {}

impl Manager {
    /// Creates a manager. A `g1_layout`'s memory must outlive it (see [`G1Layout::new`]).
    pub fn new(cfg: &Config) -> Result<Manager> {
        let lease = Arc::new(Lease::default());
        if cfg.g1_layout.is_some() {
            lease.note_engine_memory();
        }
        Ok(Manager { m: cfg.create()?, page_size: cfg.page_size, lease })
    }

    /// Whether a connector or endpoint of this manager was leaked, so that the manager must
    /// not be destroyed; aborts when leaking it would leave engine memory in use (see
    /// "Leaked children").
    fn leased(&self) -> bool {
        // Exclusive access (drop, close): every child that borrowed the manager has been
        // dropped, and its clone with it, so those left belong to children never dropped.
        if Arc::strong_count(&self.lease) == 1 {
            return false;
        }
        if self.lease.engine_memory.load(Ordering::SeqCst) {
            std::process::abort();
        }
        true
    }

    pub fn alloc(&self, n: usize, tier: Tier) -> Result<Vec<Block>> {
        let mut out = vec![Block(0); n];
        check(unsafe {
            sys::kvt_block_alloc(out.as_mut_ptr().cast(), n, self.m, tier as sys::kvt_tier)
        })?;
        Ok(out)
    }

    pub fn release(&self, blocks: &[Block]) -> Result<()> {
        check(unsafe { sys::kvt_block_release(self.m, raw(blocks), blocks.len()) })
    }

    pub fn retain(&self, b: Block) -> Result<()> {
        check(unsafe { sys::kvt_block_retain(self.m, b.0) })
    }

    /// Registers a chain of filled blocks; returns the handles to use (dedup swaps in
    /// blocks already registered).
    pub fn register_hashes(&self, blocks: &[Block], hashes: &[u64], parent: u64) -> Result<Vec<Block>> {
        if blocks.len() != hashes.len() {
            return Err(invalid(format!("{} blocks but {} hashes", blocks.len(), hashes.len())));
        }
        let mut out = vec![Block(0); blocks.len()];
        check(unsafe {
            sys::kvt_block_register_hashes(out.as_mut_ptr().cast(), self.m, raw(blocks),
                                           hashes.as_ptr(), blocks.len(), parent)
        })?;
        Ok(out)
    }

    /// The pinned blocks of the longest registered prefix of `hashes` in a tier.
    pub fn match_prefix(&self, hashes: &[u64], tier: Tier) -> Result<Vec<Block>> {
        let mut out = Vec::new();
        self.match_prefix_into(hashes, tier, &mut out)?;
        Ok(out)
    }

    /// Like [`Manager::match_prefix`], into a vector the caller reuses (no allocation once it
    /// has grown): `out` is cleared, then holds the pinned blocks.
    pub fn match_prefix_into(&self, hashes: &[u64], tier: Tier, out: &mut Vec<Block>) -> Result<()> {
        out.clear();
        out.reserve(hashes.len());
        let mut n = 0usize;
        check(unsafe {
            sys::kvt_tier_match_prefix(&mut n, out.as_mut_ptr().cast(), self.m,
                                       tier as sys::kvt_tier, hashes.as_ptr(), hashes.len())
        })?;
        // Safety: the library wrote n <= hashes.len() handles into the reserved space.
        unsafe { out.set_len(n) };
        Ok(())
    }

    /// The block's bytes. Unsafe to hold on to: valid only while a reference to the block is
    /// held, and another thread may write the same block; hence a raw slice with the
    /// manager's lifetime and the caller's promise.
    ///
    /// # Safety
    /// The caller holds a reference to `b` for as long as it uses the slice, and no one else
    /// writes the block meanwhile.
    pub unsafe fn data(&self, b: Block) -> Result<&mut [u8]> {
        let mut p = ptr::null_mut();
        let mut n = 0usize;
        check(sys::kvt_block_data(&mut p, &mut n, self.m, b.0))?;
        Ok(if n == 0 { &mut [] } else { std::slice::from_raw_parts_mut(p.cast(), n) })
    }

    /// The address of chunk (layer, outer) of a block, in the memory of its tier (a device
    /// address for CUDA memory), `chunk_bytes` long; valid while a reference is held.
    pub fn chunk(&self, b: Block, layer: u32, outer: u32) -> Result<*mut u8> {
        let mut p = ptr::null_mut();
        check(unsafe { sys::kvt_block_chunk(&mut p, self.m, b.0, layer, outer) })?;
        Ok(p.cast())
    }

    pub fn check(&self) -> Result<()> {
        check(unsafe { sys::kvt_manager_check(self.m) })
    }

    /// Empties one tier's registry, or every tier's (`None`): transfers not yet committed
    /// that touch it end cancelled, copies in flight are waited for, and blocks still held
    /// stay readable until released. Events: `BlockRemoved` per block, then `TierCleared`.
    pub fn reset(&self, tier: Option<Tier>) -> Result<()> {
        let t = tier.map_or(0, |t| t as i32);
        check(unsafe { sys::kvt_manager_reset(self.m, t) })
    }

    /// Offloads registered blocks down to `dst`; `fence` may hold it back.
    pub fn offload<'m>(&'m self, blocks: &[Block], dst: Tier, fence: Option<&Fence<'m>>,
                       user_data: u64) -> Result<Transfer<'m>> {
        let mut x = ptr::null_mut();
        check(unsafe {
            sys::kvt_xfer_offload(&mut x, self.m, raw(blocks), blocks.len(), dst as sys::kvt_tier,
                                  fence.map_or(ptr::null_mut(), |f| f.f), user_data)
        })?;
        Ok(Transfer { x, n: blocks.len(), _m: PhantomData })
    }

    /// Onboards registered G2 or G3 blocks into the empty G1 blocks `dst`.
    pub fn onboard<'m>(&'m self, src: &[Block], dst: &[Block], fence: Option<&Fence<'m>>,
                       user_data: u64) -> Result<Transfer<'m>> {
        if src.len() != dst.len() {
            return Err(invalid("onboard: src and dst differ in length"));
        }
        let mut x = ptr::null_mut();
        check(unsafe {
            sys::kvt_xfer_onboard(&mut x, self.m, raw(src), raw(dst), src.len(),
                                  fence.map_or(ptr::null_mut(), |f| f.f), user_data)
        })?;
        Ok(Transfer { x, n: src.len(), _m: PhantomData })
    }

    pub fn fence(&self) -> Result<Fence<'_>> {
        let mut f = ptr::null_mut();
        check(unsafe { sys::kvt_fence_create(&mut f, self.m) })?;
        Ok(Fence { f, _m: PhantomData })
    }

    /// A fence signalled when a CUDA event recorded on the host's stream completes.
    /// Status::Unsupported without CUDA.
    ///
    /// # Safety
    /// `cuda_event` is a live `cudaEvent_t` of this process, which the caller keeps alive
    /// until the fence is signalled (the library borrows it until then).
    pub unsafe fn fence_from_cuda_event(&self, cuda_event: *mut std::ffi::c_void) -> Result<Fence<'_>> {
        let mut f = ptr::null_mut();
        check(sys::kvt_fence_from_cuda_event(&mut f, self.m, cuda_event))?;
        Ok(Fence { f, _m: PhantomData })
    }

    /// Moves up to `max` pending events out, oldest first.
    #[deprecated(note = "use poll_events, whose events have typed tiers")]
    #[allow(deprecated)]
    pub fn poll(&self, max: usize) -> Vec<Event> {
        drain_events(max, |out| unsafe { sys::kvt_manager_poll(self.m, out, max) }, Event::from_raw)
    }

    /// Moves up to `max` pending events out, oldest first.
    pub fn poll_events(&self, max: usize) -> Vec<ManagerEvent> {
        drain_events(max, |out| unsafe { sys::kvt_manager_poll(self.m, out, max) },
                     ManagerEvent::from_raw)
    }

    /// An iterator that drains the pending events.
    #[deprecated(note = "use pending_events, whose events have typed tiers")]
    #[allow(deprecated)]
    pub fn events(&self) -> Events<'_> {
        Events { m: self, buf: Vec::new().into_iter() }
    }

    /// An iterator that drains the pending events; it ends when none is left.
    pub fn pending_events(&self) -> PendingEvents<'_> {
        PendingEvents { m: self, buf: Vec::new().into_iter() }
    }

    /// Readable while events are pending (epoll, mio, tokio's AsyncFd). Owned by the manager.
    #[deprecated(note = "use as_fd or as_raw_fd (AsFd, AsRawFd)")]
    pub fn event_fd(&self) -> i32 {
        self.as_raw_fd()
    }

    /// Tells the KV events publisher the tokens of full blocks: `tokens[i * page_size..]`
    /// are those of the block whose sequence hash is `seq_hashes[i]`. Note them before the
    /// blocks are registered by hash; a no-op without a publisher.
    pub fn note_tokens(&self, seq_hashes: &[u64], tokens: &[u32]) -> Result<()> {
        // The library reads seq_hashes.len() * page_size tokens.
        if tokens.len() as u64 != seq_hashes.len() as u64 * u64::from(self.page_size) {
            return Err(invalid(format!("note_tokens: {} tokens for {} blocks of {}", tokens.len(),
                                       seq_hashes.len(), self.page_size)));
        }
        check(unsafe {
            sys::kvt_manager_note_tokens(self.m, seq_hashes.as_ptr(), seq_hashes.len(),
                                         tokens.as_ptr())
        })
    }

    /// Destroys the manager, returning what dropping it would lose: the status of closing
    /// its recorder's event log (Status::Io when a write to it failed). Status::State, with
    /// the manager leaked and its recorder left open, when a connector or endpoint of it was
    /// leaked (see "Leaked children" on [`Manager`], which also says when this aborts).
    pub fn close(self) -> Result<()> {
        let m = std::mem::ManuallyDrop::new(self);
        if m.leased() {
            return Err(Error {
                status: Status::State,
                message: "a connector or endpoint of this manager was leaked without being \
                          dropped: the manager is leaked too, not destroyed"
                    .into(),
            });
        }
        let closed = check(unsafe { sys::kvt_manager_recorder_close(m.m) });
        unsafe { sys::kvt_manager_destroy(m.m) };
        // Safety: read once, from a value that is never dropped or used again.
        drop(unsafe { ptr::read(&m.lease) });
        closed
    }
}

impl Drop for Manager {
    /// Destroys the manager, or leaks it while a leaked child still uses it (see "Leaked
    /// children" above).
    fn drop(&mut self) {
        if !self.leased() {
            unsafe { sys::kvt_manager_destroy(self.m) }
        }
    }
}

impl AsFd for Manager {
    /// Readable while events are pending (epoll, mio, tokio's AsyncFd); owned by the
    /// manager: never read or close it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // Safety: the manager owns the descriptor and keeps it open until it is destroyed,
        // which the borrow of self outlives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for Manager {
    fn as_raw_fd(&self) -> RawFd {
        unsafe { sys::kvt_manager_event_fd(self.m) }
    }
}

/// Drains the manager's pending events; ends when none is left.
#[deprecated(note = "use PendingEvents (Manager::pending_events)")]
#[allow(deprecated)]
pub struct Events<'m> {
    m: &'m Manager,
    buf: std::vec::IntoIter<Event>,
}

#[allow(deprecated)]
impl Iterator for Events<'_> {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        if let Some(e) = self.buf.next() {
            return Some(e);
        }
        self.buf = self.m.poll(64).into_iter();
        self.buf.next()
    }
}

/// Drains the manager's pending events; ends when none is left.
pub struct PendingEvents<'m> {
    m: &'m Manager,
    buf: std::vec::IntoIter<ManagerEvent>,
}

impl Iterator for PendingEvents<'_> {
    type Item = ManagerEvent;
    fn next(&mut self) -> Option<ManagerEvent> {
        if let Some(e) = self.buf.next() {
            return Some(e);
        }
        self.buf = self.m.poll_events(64).into_iter();
        self.buf.next()
    }
}

/// An enqueued offload or onboard, borrowing its manager. Dropping it releases it (one not
/// yet committed is cancelled). Send and Sync: its functions may run on any thread, and on
/// several at once (one thread waits while another cancels); Drop, which releases it, needs
/// every borrow to have ended, so no wait is left inside the library then.
pub struct Transfer<'m> {
    x: *mut sys::kvt_xfer,
    n: usize,
    _m: PhantomData<&'m Manager>,
}

unsafe impl Send for Transfer<'_> {}
unsafe impl Sync for Transfer<'_> {}

impl Transfer<'_> {
    pub fn cancel(&self) -> Result<()> {
        check(unsafe { sys::kvt_xfer_cancel(self.x) })
    }

    /// Waits for the end (None: forever) and returns the blocks moved. A cancelled transfer
    /// gives Status::Cancelled, a wait that ran out Status::Timeout.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Result<u64> {
        let ns = timeout.map_or(-1, |d| d.as_nanos().min(i64::MAX as u128) as i64);
        let s = unsafe { sys::kvt_xfer_wait(self.x, ns) };
        if s == sys::KVT_TIMEOUT as sys::kvt_status {
            // A message of its own: kvt_last_error may still hold an older failure.
            let message = format!("the transfer did not end within {:?}", timeout.unwrap_or_default());
            return Err(Error { status: Status::Timeout, message });
        }
        check(s)?;
        let mut count = 0u64;
        check(unsafe { sys::kvt_xfer_status(ptr::null_mut(), ptr::null_mut(), &mut count, self.x) })?;
        Ok(count)
    }

    /// After an onboard ended: the final G1 handles.
    pub fn blocks(&self) -> Result<Vec<Block>> {
        let mut out = vec![Block(0); self.n];
        check(unsafe { sys::kvt_xfer_blocks(out.as_mut_ptr().cast(), self.n, self.x) })?;
        Ok(out)
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        unsafe { sys::kvt_xfer_release(self.x) }
    }
}

/// A precondition the host signals. Dropping it destroys it: transfers still waiting on an
/// unsignalled fence end cancelled.
pub struct Fence<'m> {
    f: *mut sys::kvt_fence,
    _m: PhantomData<&'m Manager>,
}

unsafe impl Send for Fence<'_> {}
unsafe impl Sync for Fence<'_> {}

impl Fence<'_> {
    pub fn signal(&self) -> Result<()> {
        check(unsafe { sys::kvt_fence_signal(self.f) })
    }
}

impl Drop for Fence<'_> {
    fn drop(&mut self) {
        unsafe { sys::kvt_fence_destroy(self.f) }
    }
}
