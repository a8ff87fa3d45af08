//! Blocks' states and references (the token and hash paths, priorities and pins), and the
//! tiers' and transfers' counters.
use std::ptr;

use kvtier_sys as sys;

use crate::{check, fill_sized, invalid, raw, versioned, Block, Manager, MemoryKind, Result, Tier};

/// A block's state (kvt_block_state):
/// `Empty -init-> Partial -append-> Ready -schedule-> Inflight -compute_done-> Complete
/// -register-> Registered`; `Inactive`: registered without references, evictable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockState {
    Empty = sys::KVT_BLOCK_EMPTY,
    Partial = sys::KVT_BLOCK_PARTIAL,
    Ready = sys::KVT_BLOCK_READY,
    Inflight = sys::KVT_BLOCK_INFLIGHT,
    Complete = sys::KVT_BLOCK_COMPLETE,
    Registered = sys::KVT_BLOCK_REGISTERED,
    Inactive = sys::KVT_BLOCK_INACTIVE,
}

impl BlockState {
    /// The state of a raw C value; None for a value this crate does not know.
    pub fn from_raw(v: u32) -> Option<BlockState> {
        use BlockState::*;
        [Empty, Partial, Ready, Inflight, Complete, Registered, Inactive].into_iter().find(|s| *s as u32 == v)
    }
}

/// A snapshot of one block (kvt_block_info).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub state: BlockState,
    pub tier: Tier,
    /// References held.
    pub refs: u32,
    /// Tokens staged (token path, before registration).
    pub tokens: u32,
    /// Registered blocks: the sequence hash, and the parent's (0 for a first block).
    pub seq_hash: u64,
    pub parent_hash: u64,
}

/// A snapshot of one tier (kvt_tier_stats); free + active + inactive + retired = capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierStats {
    /// Memory holding the tier's bytes; None for G3 (a file).
    pub memory: Option<MemoryKind>,
    pub capacity: u64,
    pub free: u64,
    pub active: u64,
    pub inactive: u64,
    pub registered: u64,
    pub block_bytes: u64,
    pub metadata_bytes: u64,
    pub allocs: u64,
    pub evictions: u64,
    pub registrations: u64,
    pub dedups: u64,
    pub match_queried: u64,
    pub match_hit: u64,
    pub retired: u64,
    /// G3: blocks recovered from a persistent file at create.
    pub recovered: u64,
    pub pinned: u64,
}

/// Counters of one transfer direction since the manager was created (kvt_transfer_stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferStats {
    pub completed: u64,
    pub cancelled: u64,
    pub failed: u64,
    /// Blocks copied and registered at the destination.
    pub blocks: u64,
    pub bytes: u64,
    /// Time the copy engines spent on this direction.
    pub busy_ns: u64,
}

impl Manager {
    // --- token path: kvtier computes the hash ---

    /// Empty -> Partial: the block follows `parent_seq_hash` (0 for a first block) in a
    /// sequence of salt `salt_hash` (from [`crate::try_hash_salt`]).
    pub fn init_block(&self, b: Block, salt_hash: u64, parent_seq_hash: u64) -> Result<()> {
        check(unsafe { sys::kvt_block_init(self.m, b.0, salt_hash, parent_seq_hash) })
    }

    /// Partial or Ready -> Ready: stages 1 or more tokens, no more than the block has room for.
    pub fn append_tokens(&self, b: Block, tokens: &[u32]) -> Result<()> {
        check(unsafe { sys::kvt_block_append(self.m, b.0, tokens.as_ptr(), tokens.len()) })
    }

    /// Ready -> Inflight.
    pub fn schedule(&self, b: Block) -> Result<()> {
        check(unsafe { sys::kvt_block_schedule(self.m, b.0) })
    }

    /// Ready -> Partial, tokens kept.
    pub fn unschedule(&self, b: Block) -> Result<()> {
        check(unsafe { sys::kvt_block_unschedule(self.m, b.0) })
    }

    /// Inflight -> Complete when the block holds page_size tokens, else back to Partial.
    pub fn compute_done(&self, b: Block) -> Result<()> {
        check(unsafe { sys::kvt_block_compute_done(self.m, b.0) })
    }

    /// Complete -> Registered under the chained hash of its tokens; returns the handle to
    /// use (a block registered already under that hash, when it deduplicates).
    pub fn register(&self, b: Block) -> Result<Block> {
        let mut out = 0u64;
        check(unsafe { sys::kvt_block_register(&mut out, self.m, b.0) })?;
        Ok(Block(out))
    }

    // --- hash path: the engine computed the hash ---

    /// Registers a filled mutable block under `seq_hash`; returns the handle to use (when
    /// the hash is registered already, that block with one more reference, and `b` is freed).
    pub fn register_hash(&self, b: Block, seq_hash: u64, parent_seq_hash: u64) -> Result<Block> {
        let mut out = 0u64;
        check(unsafe { sys::kvt_block_register_hash(&mut out, self.m, b.0, seq_hash, parent_seq_hash) })?;
        Ok(Block(out))
    }

    // --- priorities and pins: what eviction spares ---

    /// Among inactive registered blocks, lower priorities are evicted first (default 0).
    pub fn set_priority(&self, blocks: &[Block], priority: i32) -> Result<()> {
        check(unsafe { sys::kvt_block_set_priority(self.m, raw(blocks), blocks.len(), priority) })
    }

    /// Pinned registered blocks are never evicted, up to the config's max_pinned_percent of
    /// a tier (Status::NoSpace beyond).
    pub fn pin(&self, blocks: &[Block]) -> Result<()> {
        check(unsafe { sys::kvt_block_pin(self.m, raw(blocks), blocks.len()) })
    }

    pub fn unpin(&self, blocks: &[Block]) -> Result<()> {
        check(unsafe { sys::kvt_block_unpin(self.m, raw(blocks), blocks.len()) })
    }

    /// A snapshot of one block.
    pub fn block_info(&self, b: Block) -> Result<BlockInfo> {
        let mut i: sys::kvt_block_info = versioned();
        check(unsafe { sys::kvt_block_info_get(&mut i, self.m, b.0) })?;
        Ok(BlockInfo {
            state: BlockState::from_raw(i.state)
                .ok_or_else(|| invalid(format!("unknown block state {}", i.state)))?,
            tier: Tier::from_raw(i.tier).ok_or_else(|| invalid(format!("unknown tier {}", i.tier)))?,
            refs: i.refs,
            tokens: i.tokens,
            seq_hash: i.seq_hash,
            parent_hash: i.parent_hash,
        })
    }

    // --- tiers ---

    /// A snapshot of one tier (all zeros for an absent one).
    pub fn tier_stats(&self, tier: Tier) -> Result<TierStats> {
        let mut s: sys::kvt_tier_stats = versioned();
        check(unsafe { sys::kvt_tier_stats_get(&mut s, self.m, tier as sys::kvt_tier) })?;
        Ok(TierStats {
            memory: (tier != Tier::G3).then(|| MemoryKind::from_raw(s.memory)),
            capacity: s.capacity,
            free: s.free,
            active: s.active,
            inactive: s.inactive,
            registered: s.registered,
            block_bytes: s.block_bytes,
            metadata_bytes: s.metadata_bytes,
            allocs: s.allocs,
            evictions: s.evictions,
            registrations: s.registrations,
            dedups: s.dedups,
            match_queried: s.match_queried,
            match_hit: s.match_hit,
            retired: s.retired,
            recovered: s.recovered,
            pinned: s.pinned,
        })
    }

    /// The blocks the next allocations in a tier would evict, in that order (up to `max`;
    /// pinned ones are not listed). Nothing is held: another call may evict them meanwhile.
    pub fn evictable(&self, tier: Tier, max: usize) -> Result<Vec<Block>> {
        let mut out = vec![Block(0); max];
        let mut n = 0usize;
        check(unsafe {
            sys::kvt_tier_evictable_blocks(out.as_mut_ptr().cast(), max, &mut n, self.m,
                                           tier as sys::kvt_tier)
        })?;
        // n counts every block the tier could evict; only the first max were written.
        out.truncate(n.min(max));
        Ok(out)
    }

    /// How many blocks a tier could evict now: those [`evictable`](Manager::evictable) would
    /// list with no limit.
    pub fn evictable_count(&self, tier: Tier) -> Result<usize> {
        let mut n = 0usize;
        check(unsafe {
            sys::kvt_tier_evictable_blocks(ptr::null_mut(), 0, &mut n, self.m, tier as sys::kvt_tier)
        })?;
        Ok(n)
    }

    /// The hashes a tier holds registered now, in no particular order.
    pub fn tier_hashes(&self, tier: Tier) -> Result<Vec<u64>> {
        fill_sized(|out, cap, n| unsafe {
            sys::kvt_tier_hashes(out, cap, n, self.m, tier as sys::kvt_tier)
        })
    }

    /// The counters of transfers from `src` to `dst` (a direction: G1->G2, G2->G1, G1->G4, ...).
    pub fn transfer_stats(&self, src: Tier, dst: Tier) -> Result<TransferStats> {
        let mut s: sys::kvt_transfer_stats = versioned();
        check(unsafe {
            sys::kvt_transfer_stats_get(&mut s, self.m, src as sys::kvt_tier, dst as sys::kvt_tier)
        })?;
        Ok(TransferStats { completed: s.completed, cancelled: s.cancelled, failed: s.failed,
                           blocks: s.blocks, bytes: s.bytes, busy_ns: s.busy_ns })
    }
}
