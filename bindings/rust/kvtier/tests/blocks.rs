//! Blocks, tiers and the manager's own calls from Rust against the real library: the token
//! path's states read back, dedup, priorities and pins as eviction sees them, the tiers'
//! and transfers' counters, typed events, the event fd, statuses and an explicit close.
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::os::unix::io::{AsFd, AsRawFd};

use kvtier::{Block, BlockState, Config, Eviction, Manager, ManagerEvent, MemoryKind, Status,
             Tier};

const BLOCK_BYTES: u64 = 64 * 2; // chunk_bytes * num_layers * num_outer

fn manager(g1_blocks: u64) -> Manager {
    Manager::new(&Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64, g1_blocks,
                           g2_blocks: 16, min_batch_size: 1, flush_interval_us: 1000,
                           ..Default::default() })
    .unwrap()
}

fn stored(m: &Manager, hashes: &[u64], fill: u8) -> Vec<Block> {
    let b = m.alloc(hashes.len(), Tier::G1).unwrap();
    for x in &b {
        unsafe { m.data(*x).unwrap() }.fill(fill);
    }
    m.register_hashes(&b, hashes, 0).unwrap()
}

#[test]
fn the_token_path_walks_a_block_through_its_states() {
    let m = manager(16);
    let salt = kvtier::try_hash_salt(b"salt").unwrap();
    let state = |b: Block| m.block_info(b).unwrap().state;
    let b = m.alloc(1, Tier::G1).unwrap()[0];
    let info = m.block_info(b).unwrap();
    assert_eq!((info.state, info.tier, info.refs, info.tokens), (BlockState::Empty, Tier::G1, 1, 0));
    assert_eq!(m.append_tokens(b, &[1]).unwrap_err().status, Status::State); // not initialized
    m.init_block(b, salt, 0).unwrap();
    assert_eq!(state(b), BlockState::Partial);
    m.append_tokens(b, &[1, 2]).unwrap();
    assert_eq!((state(b), m.block_info(b).unwrap().tokens), (BlockState::Ready, 2));
    m.unschedule(b).unwrap();
    assert_eq!((state(b), m.block_info(b).unwrap().tokens), (BlockState::Partial, 2));
    assert_eq!(m.append_tokens(b, &[3, 4, 5]).unwrap_err().status, Status::InvalidArgument);
    m.append_tokens(b, &[3, 4]).unwrap();
    m.schedule(b).unwrap();
    assert_eq!(state(b), BlockState::Inflight);
    m.compute_done(b).unwrap();
    assert_eq!(state(b), BlockState::Complete);
    let r = m.register(b).unwrap();
    let info = m.block_info(r).unwrap();
    assert_eq!(info.state, BlockState::Registered);
    assert_eq!(info.seq_hash, kvtier::hash_sequence(&[1, 2, 3, 4], 4, salt).unwrap()[0]);
    assert_eq!(info.parent_hash, 0);
    assert_eq!(m.schedule(r).unwrap_err().status, Status::State);

    // A block not full goes back to Partial when its compute ends.
    let c = m.alloc(1, Tier::G1).unwrap()[0];
    m.init_block(c, salt, info.seq_hash).unwrap();
    m.append_tokens(c, &[5]).unwrap();
    m.schedule(c).unwrap();
    m.compute_done(c).unwrap();
    assert_eq!((state(c), m.block_info(c).unwrap().tokens), (BlockState::Partial, 1));

    m.release(&[r, c]).unwrap();
    assert_eq!(state(r), BlockState::Inactive);
    assert_eq!(m.block_info(r).unwrap().refs, 0);
    assert_eq!(m.block_info(c).unwrap_err().status, Status::InvalidHandle); // freed: stale
    m.check().unwrap();
}

#[test]
fn register_hash_dedups_to_the_registered_block() {
    let m = manager(16);
    let a = m.alloc(1, Tier::G1).unwrap()[0];
    assert_eq!(m.register_hash(a, 7, 3).unwrap(), a);
    let b = m.alloc(1, Tier::G1).unwrap()[0];
    assert_eq!(m.register_hash(b, 7, 3).unwrap(), a);
    let info = m.block_info(a).unwrap();
    assert_eq!((info.refs, info.seq_hash, info.parent_hash), (2, 7, 3));
    assert_eq!(m.block_info(b).unwrap_err().status, Status::InvalidHandle);
    let s = m.tier_stats(Tier::G1).unwrap();
    assert_eq!((s.registrations, s.dedups, s.registered, s.active), (1, 1, 1, 1));
    m.release(&[a, a]).unwrap();
}

#[test]
fn priorities_and_pins_order_what_eviction_takes() {
    let m = Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks: 4, g2_blocks: 0,
                                   max_pinned_percent: 25, eviction: [Eviction::Lru; 3],
                                   ..Default::default() })
        .unwrap();
    let b = stored(&m, &[1, 2, 3], 0);
    m.release(&b).unwrap();
    let order = m.evictable(Tier::G1, 8).unwrap();
    let mut sorted = order.clone();
    sorted.sort();
    let mut want = b.clone();
    want.sort();
    assert_eq!(sorted, want);
    assert_eq!(m.evictable(Tier::G1, 1).unwrap(), order[..1]);

    m.set_priority(&order[..1], 5).unwrap(); // the first victim now goes last
    let after = m.evictable(Tier::G1, 8).unwrap();
    assert_eq!(after, [order[1], order[2], order[0]]);

    m.pin(&[after[0]]).unwrap();
    assert_eq!(m.evictable(Tier::G1, 8).unwrap(), [order[2], order[0]]);
    assert_eq!(m.pin(&[after[1]]).unwrap_err().status, Status::NoSpace); // 25% of 4 is 1
    let s = m.tier_stats(Tier::G1).unwrap();
    assert_eq!((s.pinned, s.inactive, s.registered, s.free), (1, 3, 3, 1));
    // Filling the tier evicts everything but the pinned block.
    let fresh = m.alloc(3, Tier::G1).unwrap();
    assert_eq!(m.tier_hashes(Tier::G1).unwrap(), [m.block_info(after[0]).unwrap().seq_hash]);
    assert_eq!(m.alloc(1, Tier::G1).unwrap_err().status, Status::NoSpace);
    m.unpin(&[after[0]]).unwrap();
    assert_eq!(m.evictable(Tier::G1, 8).unwrap(), [after[0]]);
    m.release(&fresh).unwrap();
    let s = m.tier_stats(Tier::G1).unwrap();
    assert_eq!((s.pinned, s.evictions, s.capacity, s.allocs), (0, 2, 4, 6));
    assert_eq!(m.pin(&fresh[..1]).unwrap_err().status, Status::InvalidHandle); // freed
}

#[test]
fn tier_and_transfer_stats_count_an_offload() {
    let m = manager(16);
    let g1 = m.tier_stats(Tier::G1).unwrap();
    assert_eq!((g1.capacity, g1.free, g1.block_bytes, g1.memory), (16, 16, BLOCK_BYTES, Some(MemoryKind::Host)));
    assert_eq!(m.tier_stats(Tier::G3).unwrap().capacity, 0); // absent: zeros
    assert_eq!(m.tier_stats(Tier::G4).unwrap_err().status, Status::InvalidArgument);

    let a = stored(&m, &[10, 11], 0x5a);
    m.pending_events().for_each(drop);
    let x = m.offload(&a, Tier::G2, None, 77).unwrap(); // kept: a released transfer's XferDone is withdrawn
    assert_eq!(x.wait(None).unwrap(), 2);
    let t = m.transfer_stats(Tier::G1, Tier::G2).unwrap();
    assert_eq!((t.completed, t.cancelled, t.failed, t.blocks, t.bytes), (1, 0, 0, 2, 2 * BLOCK_BYTES));
    assert_eq!(m.transfer_stats(Tier::G2, Tier::G1).unwrap().completed, 0);
    assert_eq!(m.transfer_stats(Tier::G2, Tier::G2).unwrap_err().status, Status::InvalidArgument);
    let mut hashes = m.tier_hashes(Tier::G2).unwrap();
    hashes.sort();
    assert_eq!(hashes, [10, 11]);
    let g2 = m.tier_stats(Tier::G2).unwrap();
    assert_eq!((g2.registered, g2.inactive), (2, 2));

    let ev: Vec<ManagerEvent> = m.pending_events().collect();
    assert!(ev.contains(&ManagerEvent::BlockStored { tier: Tier::G2, hash: 10, parent: 0 }), "{ev:?}");
    assert!(ev.contains(&ManagerEvent::BlockStored { tier: Tier::G2, hash: 11, parent: 10 }), "{ev:?}");
    assert!(ev.contains(&ManagerEvent::XferDone { status: Ok(()), tier: Tier::G2, user_data: 77, count: 2 }));
    drop(x);
    m.release(&a).unwrap();
}

/// The eventfd's counter, as the kernel shows it: nonzero while it is readable.
fn eventfd_count(fd: i32) -> u64 {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let line = info.lines().find(|l| l.starts_with("eventfd-count:")).unwrap();
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn the_event_fd_is_readable_while_events_are_pending() {
    let m = manager(16);
    let fd = m.as_fd().as_raw_fd();
    assert_eq!(fd, m.as_raw_fd());
    assert_eq!(eventfd_count(fd), 0);
    let a = stored(&m, &[20], 1);
    assert_ne!(eventfd_count(fd), 0);
    assert_eq!(m.poll_events(8), [ManagerEvent::BlockStored { tier: Tier::G1, hash: 20, parent: 0 }]);
    assert_eq!(eventfd_count(fd), 0);

    let mut sub = m.subscribe(16).unwrap();
    let sfd = sub.as_raw_fd();
    assert_eq!(sub.as_fd().as_raw_fd(), sfd);
    assert_eq!(eventfd_count(sfd), 0);
    m.release(&a).unwrap();
    m.alloc(16, Tier::G1).unwrap(); // evicts block 20
    assert_ne!(eventfd_count(sfd), 0);
    let ev = sub.drain(16);
    assert_eq!((ev[0].kind.as_str(), ev[0].hash, ev[0].dst_tier()), ("BLOCK_REMOVED", 20, Some(Tier::G1)));
    assert_eq!(eventfd_count(sfd), 0);
}

#[test]
fn statuses_have_their_c_names() {
    assert_eq!(Status::State.name(), "KVT_ERR_STATE");
    assert_eq!(Status::Timeout.name(), "KVT_TIMEOUT");
    assert_eq!(Status::NotFound.code(), -11);
    assert_eq!(Status::Other(-77).name(), "KVT_UNKNOWN_STATUS");
    let m = manager(16);
    let e = m.release(&[Block(12345)]).unwrap_err();
    assert_eq!(e.status.name(), "KVT_ERR_INVALID_HANDLE");
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// A CUDA runtime call (`name` NUL-terminated) of the library's process, when the library
/// was built with CUDA. F is the call's function pointer type.
unsafe fn cuda_fn<F: Copy>(name: &[u8]) -> Option<F> {
    let p = dlsym(std::ptr::null_mut(), CStr::from_bytes_with_nul(name).unwrap().as_ptr()); // RTLD_DEFAULT
    (!p.is_null()).then(|| std::mem::transmute_copy(&p))
}

#[test]
fn a_cuda_event_fence_waits_for_its_event() {
    let m = manager(16);
    let e = unsafe { m.fence_from_cuda_event(std::ptr::null_mut()) }.err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("kvt_fence_from_cuda_event"), "{}", e.message);
    type Count = unsafe extern "C" fn(*mut i32) -> i32;
    type Create = unsafe extern "C" fn(*mut *mut c_void) -> i32;
    type Record = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;
    type Destroy = unsafe extern "C" fn(*mut c_void) -> i32;
    let count = match unsafe { cuda_fn::<Count>(b"cudaGetDeviceCount\0") } {
        Some(f) => f,
        None => {
            // Built without CUDA: any event is refused before it is touched.
            let mut not_an_event = 0u64;
            let e = unsafe { m.fence_from_cuda_event((&mut not_an_event as *mut u64).cast()) }
                .err().unwrap();
            assert_eq!(e.status, Status::Unsupported);
            return;
        }
    };
    let mut devices = 0;
    if unsafe { count(&mut devices) } != 0 || devices == 0 {
        eprintln!("a_cuda_event_fence_waits_for_its_event: SKIPPED the event: CUDA without a device");
        return;
    }
    let (create, record, destroy) = unsafe {
        (cuda_fn::<Create>(b"cudaEventCreate\0").unwrap(),
         cuda_fn::<Record>(b"cudaEventRecord\0").unwrap(),
         cuda_fn::<Destroy>(b"cudaEventDestroy\0").unwrap())
    };
    let mut event = std::ptr::null_mut();
    assert_eq!(unsafe { create(&mut event) }, 0);
    assert_eq!(unsafe { record(event, std::ptr::null_mut()) }, 0); // the default stream
    let f = unsafe { m.fence_from_cuda_event(event) }.unwrap();
    assert_eq!(f.signal().unwrap_err().status, Status::State); // its event signals it
    let a = stored(&m, &[40], 4);
    assert_eq!(m.offload(&a, Tier::G2, Some(&f), 0).unwrap().wait(None).unwrap(), 1);
    drop(f);
    unsafe { destroy(event) };
    m.release(&a).unwrap();
}

#[test]
fn note_tokens_takes_a_page_of_tokens_per_hash() {
    let m = manager(16);
    m.note_tokens(&[1, 2], &[0; 8]).unwrap(); // no publisher: a no-op
    assert_eq!(m.note_tokens(&[1, 2], &[0; 7]).unwrap_err().status, Status::InvalidArgument);
}

#[test]
fn close_ends_the_recorder_and_reports_it() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-close-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("run.kvtlog");
    let m = manager(16);
    m.record(&log).unwrap();
    let a = stored(&m, &[30, 31], 0);
    m.release(&a).unwrap();
    m.close().unwrap();
    let kinds: Vec<String> = kvtier::read_event_log(&log).unwrap().events.into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["BLOCK_STORED", "BLOCK_STORED"]);
    manager(16).close().unwrap(); // no recorder: nothing to report
    std::fs::remove_dir_all(&dir).unwrap();
}
