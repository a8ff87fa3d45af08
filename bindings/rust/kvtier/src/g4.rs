//! G4: a remote tier on Redis, shared by every manager of the same `g4_url`, key prefix,
//! namespace and block layout (docs/G4.md). Offloads to it are [`Manager::offload`] with
//! [`Tier::G4`](crate::Tier::G4).
use std::marker::PhantomData;
use std::ptr;

use kvtier_sys as sys;

use crate::{check, invalid, raw, versioned, Block, Fence, Manager, Result, Transfer};

/// G4's counters (kvt_g4_stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct G4Stats {
    /// Redis endpoints (a cluster's masters).
    pub shards: u32,
    /// Hashes asked by [`Manager::g4_match`], and of those, found.
    pub lookups: u64,
    pub hits: u64,
    pub stored_blocks: u64,
    pub loaded_blocks: u64,
    /// Onboards that found no key.
    pub missing_blocks: u64,
    /// Values that failed their header, checksum or MAC.
    pub corrupt_blocks: u64,
    /// Blocks of transfers that failed with Status::Io.
    pub failed_blocks: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Pipelined command batches sent.
    pub round_trips: u64,
    pub reconnects: u64,
    /// Redis Cluster: commands sent again after MOVED or ASK, and slot maps read.
    pub redirects: u64,
    pub slot_map_reads: u64,
}

impl Manager {
    /// The length of the longest prefix of `seq_hashes` that G4 holds. Blocks for up to
    /// g4_timeout_us; Status::Io when Redis cannot be reached, Unsupported without G4.
    pub fn g4_match(&self, seq_hashes: &[u64]) -> Result<usize> {
        let mut n = 0usize;
        check(unsafe { sys::kvt_g4_match(&mut n, self.m, seq_hashes.as_ptr(), seq_hashes.len()) })?;
        Ok(n)
    }

    /// Copies the G4 values of the chain `seq_hashes` (the first a child of
    /// `parent_seq_hash`) into `dst`, Empty blocks of G1 or G2 that the caller allocated,
    /// and registers them there, as [`Manager::onboard`] does. A transfer that ends with an
    /// error registered the prefix before the first block it could not have (Status::NotFound:
    /// no such key, Corrupt: a bad value, Io: Redis unreachable).
    pub fn g4_onboard<'m>(&'m self, seq_hashes: &[u64], parent_seq_hash: u64, dst: &[Block],
                          fence: Option<&Fence<'m>>, user_data: u64) -> Result<Transfer<'m>> {
        if seq_hashes.len() != dst.len() {
            return Err(invalid(format!("g4_onboard: {} hashes but {} blocks", seq_hashes.len(),
                                       dst.len())));
        }
        let mut x = ptr::null_mut();
        check(unsafe {
            sys::kvt_g4_onboard(&mut x, self.m, seq_hashes.as_ptr(), dst.len(), parent_seq_hash,
                                raw(dst), fence.map_or(ptr::null_mut(), |f| f.f), user_data)
        })?;
        Ok(Transfer { x, n: dst.len(), _m: PhantomData })
    }

    /// G4's counters; Status::Unsupported without G4.
    pub fn g4_stats(&self) -> Result<G4Stats> {
        let mut s: sys::kvt_g4_stats = versioned();
        check(unsafe { sys::kvt_g4_stats_get(&mut s, self.m) })?;
        Ok(G4Stats {
            shards: s.shards,
            lookups: s.lookups,
            hits: s.hits,
            stored_blocks: s.stored_blocks,
            loaded_blocks: s.loaded_blocks,
            missing_blocks: s.missing_blocks,
            corrupt_blocks: s.corrupt_blocks,
            failed_blocks: s.failed_blocks,
            bytes_written: s.bytes_written,
            bytes_read: s.bytes_read,
            round_trips: s.round_trips,
            reconnects: s.reconnects,
            redirects: s.redirects,
            slot_map_reads: s.slot_map_reads,
        })
    }
}
