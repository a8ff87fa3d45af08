//! The whole `kvt_manager_config`, with the library's defaults.
use std::ffi::CString;
use std::path::PathBuf;
use std::ptr;

use kvtier_sys as sys;

use crate::{check, invalid, Result};

/// C enumerations as Rust enums.
macro_rules! c_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $value:path),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u32)]
        pub enum $name { $($(#[$vdoc])* $variant = $value as u32),+ }

        impl $name {
            /// The variant of a raw C value; the default one for a value this crate does not know.
            pub fn from_raw(v: u32) -> $name {
                [$($name::$variant),+].into_iter().find(|x| *x as u32 == v).unwrap_or_default()
            }
        }
    };
}

c_enum!(
    /// Where library-owned G1 lives, or which memory an engine layout is in.
    MemoryKind {
        /// CUDA memory when a device is present, else host memory.
        Auto = sys::KVT_MEMORY_AUTO,
        Host = sys::KVT_MEMORY_HOST,
        Cuda = sys::KVT_MEMORY_CUDA,
    }
);
c_enum!(
    /// How G3's file is read and written.
    IoEngine { Auto = sys::KVT_IO_AUTO, Uring = sys::KVT_IO_URING, Threads = sys::KVT_IO_THREADS }
);
c_enum!(
    /// How the CUDA engine copies the scattered chunks of a batch.
    CudaCopy {
        Batched = sys::KVT_CUDA_COPY_BATCHED,
        PerChunk = sys::KVT_CUDA_COPY_PER_CHUNK,
        Kernel = sys::KVT_CUDA_COPY_KERNEL,
        Auto = sys::KVT_CUDA_COPY_AUTO
    }
);
c_enum!(
    /// Which G3 operations the fault injector fails (for tests).
    G3Fault { Off = sys::KVT_G3_FAULT_OFF, Write = sys::KVT_G3_FAULT_WRITE, Read = sys::KVT_G3_FAULT_READ }
);

c_enum!(
    /// What creating a manager does with a persistent G3 file it cannot read as its own
    /// (another layout, namespace or format version).
    G3Mismatch {
        /// Fail with Status::InvalidArgument naming the difference.
        Refuse = sys::KVT_G3_REFUSE,
        /// Start the file empty, with a log message.
        Reset = sys::KVT_G3_RESET,
    }
);
c_enum!(
    /// Which inactive block a tier evicts first, among those of equal priority.
    Eviction {
        /// Least recently released first.
        Lru = sys::KVT_EVICT_LRU,
        /// Scan-resistant, for the lower tiers.
        S3Fifo = sys::KVT_EVICT_S3FIFO,
    }
);
c_enum!(
    /// Which vLLM wire format the KV events follow (docs/KV_EVENTS.md).
    KvEventsFormat {
        /// vLLM main: events are maps tagged by "type".
        Current = sys::KVT_KV_EVENTS_FORMAT_CURRENT,
        /// vLLM 0.10/0.11: events are tagged arrays.
        ArrayV0_11 = sys::KVT_KV_EVENTS_FORMAT_ARRAY_V0_11,
    }
);

impl Default for G3Mismatch {
    fn default() -> Self { G3Mismatch::Refuse }
}
impl Default for Eviction {
    fn default() -> Self { Eviction::Lru }
}
impl Default for KvEventsFormat {
    fn default() -> Self { KvEventsFormat::Current }
}
impl Default for MemoryKind {
    fn default() -> Self { MemoryKind::Auto }
}
impl Default for IoEngine {
    fn default() -> Self { IoEngine::Auto }
}
impl Default for CudaCopy {
    fn default() -> Self { CudaCopy::Auto }
}
impl Default for G3Fault {
    fn default() -> Self { G3Fault::Off }
}

/// An offload filter of one tier pair: `flags` of [`Policy::PRESENCE`] and
/// [`Policy::FREQUENCY`], all of which a block must pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub flags: u32,
    pub min_frequency: u32,
}

impl Policy {
    pub const PASS_ALL: u32 = sys::KVT_POLICY_PASS_ALL;
    /// Skip blocks already in, or on their way to, the destination.
    pub const PRESENCE: u32 = sys::KVT_POLICY_PRESENCE;
    /// Skip blocks offered fewer than `min_frequency` times.
    pub const FREQUENCY: u32 = sys::KVT_POLICY_FREQUENCY;

    fn from_raw(p: sys::kvt_policy) -> Policy {
        Policy { flags: p.flags, min_frequency: p.min_frequency }
    }

    fn raw(self) -> sys::kvt_policy {
        sys::kvt_policy { flags: self.flags, min_frequency: self.min_frequency }
    }
}

/// Engine-owned G1 memory: chunk (layer, outer) of slot b lives at
/// `bases[layer * num_outer + outer] + b * strides[same index]`, `chunk_bytes` long.
#[derive(Clone, Debug)]
pub struct G1Layout {
    memory: MemoryKind,
    cuda_device: i32,
    bases: Vec<usize>,
    strides: Vec<u64>,
}

impl G1Layout {
    /// A layout over the engine's memory (`MemoryKind::Host` or `MemoryKind::Cuda`).
    ///
    /// # Safety
    /// Each base points to memory of that kind that holds every slot
    /// (`(g1_blocks - 1) * stride + chunk_bytes` bytes) and outlives every manager created
    /// with this layout; while a manager lives, the engine touches a slot's bytes only as
    /// the block rules allow (its own blocks, or registered blocks it holds and only reads).
    /// (Dropping such a manager while a connector or endpoint of it was leaked aborts the
    /// process rather than leave the library using this memory: see [`Manager`](crate::Manager).)
    pub unsafe fn new(memory: MemoryKind, cuda_device: i32, bases: &[*mut u8], strides: &[u64]) -> G1Layout {
        G1Layout { memory, cuda_device, bases: bases.iter().map(|p| *p as usize).collect(),
                   strides: strides.to_vec() }
    }

    /// The C struct, borrowing this layout's arrays.
    pub(crate) fn raw(&self) -> Result<sys::kvt_g1_layout> {
        if self.bases.len() != self.strides.len() {
            return Err(invalid(format!("g1_layout: {} bases but {} strides", self.bases.len(),
                                       self.strides.len())));
        }
        Ok(sys::kvt_g1_layout {
            struct_size: std::mem::size_of::<sys::kvt_g1_layout>() as u32,
            memory: self.memory as u32,
            cuda_device: self.cuda_device,
            reserved: 0,
            bases: self.bases.as_ptr().cast(),
            strides: self.strides.as_ptr(),
        })
    }
}

/// The manager's configuration: every field of `kvt_manager_config`. `Default` gives the
/// library's defaults, with G1 in host memory (the embedded stand-in for GPU memory).
#[derive(Clone, Debug)]
pub struct Config {
    pub page_size: u32,
    pub num_layers: u32,
    pub num_outer: u32,
    pub chunk_bytes: u64,
    pub g1_blocks: u64,
    pub g2_blocks: u64,
    pub g3_blocks: u64,
    /// None: a temporary directory.
    pub g3_path: Option<PathBuf>,
    pub event_capacity: u64,
    /// None: library-owned G1, in `g1_memory`.
    pub g1_layout: Option<G1Layout>,
    pub g1_memory: MemoryKind,
    pub cuda_device: i32,
    pub max_batch_size: u32,
    pub min_batch_size: u32,
    pub flush_interval_us: u64,
    pub policy_timeout_us: u64,
    pub sweep_interval_us: u64,
    pub max_concurrent_transfers: u32,
    pub copy_threads: u32,
    pub policy_g1_g2: Policy,
    pub policy_g1_g3: Policy,
    pub policy_g2_g3: Policy,
    pub g3_io: IoEngine,
    pub cuda_copy: CudaCopy,
    /// Fault injection (tests): of the G3 operations of kind `g3_fault_op`, the first
    /// `g3_fault_skip` go through, the next `g3_fault_count` fail with `g3_fault_errno`.
    pub g3_fault_op: G3Fault,
    pub g3_fault_errno: i32,
    pub g3_fault_skip: u64,
    pub g3_fault_count: u64,
    /// true: G3's file (in `g3_path`, required) outlives the manager, and the next manager
    /// recovers the blocks it holds; false: a fresh file, removed at drop.
    pub g3_persist: bool,
    pub g3_on_mismatch: G3Mismatch,
    /// A persistent file's owner tag (the salt hash of the model, say): a file of another
    /// namespace is a mismatch.
    pub g3_namespace: u64,
    /// Eviction policy of G1, G2 and G3.
    pub eviction: [Eviction; 3],
    /// Share of a tier, 0 ..= 100, that pinned blocks may hold.
    pub max_pinned_percent: u32,
    /// The ZMQ endpoint of the KV events' PUB socket (vLLM's format); None: no publisher.
    pub kv_events_endpoint: Option<String>,
    /// A ROUTER socket there answers replay requests; None: none.
    pub kv_events_replay_endpoint: Option<String>,
    /// The first frame of every message; None: "".
    pub kv_events_topic: Option<String>,
    /// Batches kept for replay, 1 ..= 2^24.
    pub kv_events_buffer: u64,
    pub kv_events_dp_rank: i32,
    /// The tiers whose events are published: bit `1 << tier` (by default G1 | G2 | G3).
    pub kv_events_tiers: u32,
    pub kv_events_format: KvEventsFormat,
    /// The Redis of G4: "redis://host:port[/db]", "unix:///path[?db=N]", several separated
    /// by commas (shards), or "redis+cluster://host:port[,...]"; None: no G4.
    pub g4_url: Option<String>,
    /// The name of an environment variable holding Redis's password, read at create.
    pub g4_password_env: Option<String>,
    /// Prefix of every key; None: "kvtier".
    pub g4_key_prefix: Option<String>,
    /// In every key (the salt hash of the model, say): namespaces never see each other's values.
    pub g4_namespace: u64,
    /// Connect and command timeout.
    pub g4_timeout_us: u64,
    /// The name of an environment variable holding G4's key (64 hex digits): values are
    /// then authenticated, not only checksummed. None: checksums only.
    pub g4_key_env: Option<String>,
    /// The same for G3's slots, on a filesystem others can write.
    pub g3_key_env: Option<String>,
}

fn c_string(field: &str, v: &Option<String>) -> Result<Option<CString>> {
    v.as_deref().map(|v| CString::new(v).map_err(|_| invalid(format!("{field} holds a NUL byte"))))
        .transpose()
}

fn ptr_of(s: &Option<CString>) -> *const std::os::raw::c_char {
    s.as_ref().map_or(ptr::null(), |s| s.as_ptr())
}

fn defaults() -> sys::kvt_manager_config {
    let mut c = std::mem::MaybeUninit::<sys::kvt_manager_config>::zeroed();
    unsafe {
        sys::kvt_manager_config_init_sized(c.as_mut_ptr(), std::mem::size_of::<sys::kvt_manager_config>());
        c.assume_init()
    }
}

impl Default for Config {
    fn default() -> Config {
        let c = defaults();
        Config {
            page_size: c.page_size,
            num_layers: c.num_layers,
            num_outer: c.num_outer,
            chunk_bytes: c.chunk_bytes,
            g1_blocks: c.g1_blocks,
            g2_blocks: c.g2_blocks,
            g3_blocks: c.g3_blocks,
            g3_path: None,
            event_capacity: c.event_capacity,
            g1_layout: None,
            g1_memory: MemoryKind::Host,
            cuda_device: c.cuda_device,
            max_batch_size: c.max_batch_size,
            min_batch_size: c.min_batch_size,
            flush_interval_us: c.flush_interval_us,
            policy_timeout_us: c.policy_timeout_us,
            sweep_interval_us: c.sweep_interval_us,
            max_concurrent_transfers: c.max_concurrent_transfers,
            copy_threads: c.copy_threads,
            policy_g1_g2: Policy::from_raw(c.policy_g1_g2),
            policy_g1_g3: Policy::from_raw(c.policy_g1_g3),
            policy_g2_g3: Policy::from_raw(c.policy_g2_g3),
            g3_io: IoEngine::from_raw(c.g3_io),
            cuda_copy: CudaCopy::from_raw(c.cuda_copy),
            g3_fault_op: G3Fault::from_raw(c.g3_fault_op),
            g3_fault_errno: c.g3_fault_errno,
            g3_fault_skip: c.g3_fault_skip,
            g3_fault_count: c.g3_fault_count,
            g3_persist: c.g3_persist != 0,
            g3_on_mismatch: G3Mismatch::from_raw(c.g3_on_mismatch),
            g3_namespace: c.g3_namespace,
            eviction: c.eviction.map(Eviction::from_raw),
            max_pinned_percent: c.max_pinned_percent,
            kv_events_endpoint: None,
            kv_events_replay_endpoint: None,
            kv_events_topic: None,
            kv_events_buffer: c.kv_events_buffer,
            kv_events_dp_rank: c.kv_events_dp_rank,
            kv_events_tiers: c.kv_events_tiers,
            kv_events_format: KvEventsFormat::from_raw(c.kv_events_format),
            g4_url: None,
            g4_password_env: None,
            g4_key_prefix: None,
            g4_namespace: c.g4_namespace,
            g4_timeout_us: c.g4_timeout_us,
            g4_key_env: None,
            g3_key_env: None,
        }
    }
}

impl Config {
    /// Creates the C manager from this config; the C strings and arrays live only during
    /// the call, as kvt_manager_create copies them.
    pub(crate) fn create(&self) -> Result<*mut sys::kvt_manager> {
        let mut c = defaults();
        c.page_size = self.page_size;
        c.num_layers = self.num_layers;
        c.num_outer = self.num_outer;
        c.chunk_bytes = self.chunk_bytes;
        c.g1_blocks = self.g1_blocks;
        c.g2_blocks = self.g2_blocks;
        c.g3_blocks = self.g3_blocks;
        c.event_capacity = self.event_capacity;
        c.g1_memory = self.g1_memory as u32;
        c.cuda_device = self.cuda_device;
        c.max_batch_size = self.max_batch_size;
        c.min_batch_size = self.min_batch_size;
        c.flush_interval_us = self.flush_interval_us;
        c.policy_timeout_us = self.policy_timeout_us;
        c.sweep_interval_us = self.sweep_interval_us;
        c.max_concurrent_transfers = self.max_concurrent_transfers;
        c.copy_threads = self.copy_threads;
        c.policy_g1_g2 = self.policy_g1_g2.raw();
        c.policy_g1_g3 = self.policy_g1_g3.raw();
        c.policy_g2_g3 = self.policy_g2_g3.raw();
        c.g3_io = self.g3_io as u32;
        c.cuda_copy = self.cuda_copy as u32;
        c.g3_fault_op = self.g3_fault_op as u32;
        c.g3_fault_errno = self.g3_fault_errno;
        c.g3_fault_skip = self.g3_fault_skip;
        c.g3_fault_count = self.g3_fault_count;
        c.g3_persist = self.g3_persist as u32;
        c.g3_on_mismatch = self.g3_on_mismatch as u32;
        c.g3_namespace = self.g3_namespace;
        c.eviction = self.eviction.map(|e| e as u32);
        c.max_pinned_percent = self.max_pinned_percent;
        c.kv_events_buffer = self.kv_events_buffer;
        c.kv_events_dp_rank = self.kv_events_dp_rank;
        c.kv_events_tiers = self.kv_events_tiers;
        c.kv_events_format = self.kv_events_format as u32;
        c.g4_namespace = self.g4_namespace;
        c.g4_timeout_us = self.g4_timeout_us;
        let path = match &self.g3_path {
            Some(p) => {
                use std::os::unix::ffi::OsStrExt;
                Some(CString::new(p.as_os_str().as_bytes())
                    .map_err(|_| invalid("g3_path holds a NUL byte"))?)
            }
            None => None,
        };
        c.g3_path = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        // The strings live until create returns, which copies them.
        let kv_events_endpoint = c_string("kv_events_endpoint", &self.kv_events_endpoint)?;
        let kv_events_replay_endpoint =
            c_string("kv_events_replay_endpoint", &self.kv_events_replay_endpoint)?;
        let kv_events_topic = c_string("kv_events_topic", &self.kv_events_topic)?;
        let g4_url = c_string("g4_url", &self.g4_url)?;
        let g4_password_env = c_string("g4_password_env", &self.g4_password_env)?;
        let g4_key_prefix = c_string("g4_key_prefix", &self.g4_key_prefix)?;
        let g4_key_env = c_string("g4_key_env", &self.g4_key_env)?;
        let g3_key_env = c_string("g3_key_env", &self.g3_key_env)?;
        c.kv_events_endpoint = ptr_of(&kv_events_endpoint);
        c.kv_events_replay_endpoint = ptr_of(&kv_events_replay_endpoint);
        c.kv_events_topic = ptr_of(&kv_events_topic);
        c.g4_url = ptr_of(&g4_url);
        c.g4_password_env = ptr_of(&g4_password_env);
        c.g4_key_prefix = ptr_of(&g4_key_prefix);
        c.g4_key_env = ptr_of(&g4_key_env);
        c.g3_key_env = ptr_of(&g3_key_env);
        let layout = self.g1_layout.as_ref().map(G1Layout::raw).transpose()?;
        c.g1_layout = layout.as_ref().map_or(ptr::null(), |l| l as *const _);
        let mut m = ptr::null_mut();
        check(unsafe { sys::kvt_manager_create(&mut m, &c) })?;
        Ok(m)
    }
}
