//! The whole `kvt_manager_config`, with the library's defaults.
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
        let path = match &self.g3_path {
            Some(p) => {
                use std::os::unix::ffi::OsStrExt;
                Some(std::ffi::CString::new(p.as_os_str().as_bytes())
                    .map_err(|_| invalid("g3_path holds a NUL byte"))?)
            }
            None => None,
        };
        c.g3_path = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        let layout = self.g1_layout.as_ref().map(G1Layout::raw).transpose()?;
        c.g1_layout = layout.as_ref().map_or(ptr::null(), |l| l as *const _);
        let mut m = ptr::null_mut();
        check(unsafe { sys::kvt_manager_create(&mut m, &c) })?;
        Ok(m)
    }
}
