//! The whole config from Rust: engine-owned G1 memory, policies, G3's I/O and faults.
use kvtier::{Block, Config, CudaCopy, G1Layout, G3Fault, IoEngine, Manager, MemoryKind, Policy,
             Status, Tier};

const CHUNK: usize = 64;
const SLOTS: usize = 4;

fn small() -> Config {
    Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: CHUNK as u64, g1_blocks: 64,
             g2_blocks: 64, min_batch_size: 1, flush_interval_us: 1000, ..Default::default() }
}

fn stored(m: &Manager, hashes: &[u64]) -> Vec<Block> {
    let b = m.alloc(hashes.len(), Tier::G1).unwrap();
    m.register_hashes(&b, hashes, 0).unwrap()
}

/// The engine's own KV memory as G1 (2 layers x K/V, four strides): it writes a block into
/// its memory, offloads it to G2, G1 evicts it, an onboard brings it back into another
/// slot, and the engine reads the bytes there.
#[test]
fn engine_owned_g1_round_trip_through_g2() {
    let strides = [CHUNK, 2 * CHUNK, 3 * CHUNK, CHUNK + 16];
    let mut memory: Vec<Vec<u8>> = strides.iter().map(|s| vec![0u8; (SLOTS - 1) * s + CHUNK]).collect();
    let bases: Vec<*mut u8> = memory.iter_mut().map(|v| v.as_mut_ptr()).collect();
    // The engine reaches its memory through these pointers only, from here on.
    let chunk = |i: usize, slot: usize| unsafe {
        std::slice::from_raw_parts_mut(bases[i].add(slot * strides[i]), CHUNK)
    };
    // Safety: `memory` outlives the manager, and holds every slot.
    let layout = unsafe {
        G1Layout::new(MemoryKind::Host, 0, &bases, &strides.map(|s| s as u64))
    };
    let m = Manager::new(&Config { num_layers: 2, g1_blocks: SLOTS as u64, g2_blocks: 8,
                                   g1_layout: Some(layout), ..small() }).unwrap();
    let slot_of = |b: Block| -> usize {
        let slots: Vec<usize> = (0..4).map(|i| {
            let off = m.chunk(b, (i / 2) as u32, (i % 2) as u32).unwrap() as usize - bases[i] as usize;
            assert_eq!(off % strides[i], 0);
            off / strides[i]
        }).collect();
        assert!(slots.iter().all(|s| *s == slots[0] && *s < SLOTS), "{slots:?}");
        slots[0]
    };

    let a = m.alloc(1, Tier::G1).unwrap();
    let s = slot_of(a[0]);
    for i in 0..4 {
        chunk(i, s).iter_mut().enumerate().for_each(|(j, x)| *x = (17 * i + j) as u8);
    }
    let want: Vec<Vec<u8>> = (0..4).map(|i| chunk(i, s).to_vec()).collect();
    let a = m.register_hashes(&a, &[500], 0).unwrap();
    assert_eq!(m.offload(&a, Tier::G2, None, 0).unwrap().wait(None).unwrap(), 1);
    m.release(&a).unwrap();
    let held = m.alloc(SLOTS, Tier::G1).unwrap(); // evicts block 500 from G1
    assert!(m.match_prefix(&[500], Tier::G1).unwrap().is_empty());
    let (keep, others): (Vec<Block>, Vec<Block>) = held.iter().partition(|b| slot_of(**b) == s);
    m.release(&others).unwrap(); // slot s stays taken
    (0..4).for_each(|i| chunk(i, s).fill(0));
    let src = m.match_prefix(&[500], Tier::G2).unwrap();
    let dst = m.alloc(1, Tier::G1).unwrap();
    let x = m.onboard(&src, &dst, None, 0).unwrap();
    assert_eq!(x.wait(None).unwrap(), 1);
    let fin = x.blocks().unwrap();
    drop(x);
    let t = slot_of(fin[0]);
    assert_ne!(t, s);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(chunk(i, t), &w[..], "chunk {i}");
    }
    m.release(&src).unwrap();
    m.release(&fin).unwrap();
    m.release(&keep).unwrap();
    m.check().unwrap();
    drop(m);
    drop(memory);
}

#[test]
fn a_bad_layout_is_refused_with_a_message() {
    let mut memory = vec![0u8; SLOTS * CHUNK];
    let layout = unsafe { G1Layout::new(MemoryKind::Host, 0, &[memory.as_mut_ptr()], &[CHUNK as u64]) };
    // One base, but 1 layer x K/V needs two.
    let e = Manager::new(&Config { g1_blocks: SLOTS as u64, g1_layout: Some(layout), ..small() }).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(!e.message.is_empty());
    let uneven = unsafe { G1Layout::new(MemoryKind::Host, 0, &[memory.as_mut_ptr()], &[]) };
    let e = Manager::new(&Config { g1_layout: Some(uneven), ..small() }).err().unwrap();
    assert!(e.message.contains("strides"), "{}", e.message);
}

#[test]
fn a_frequency_policy_offloads_on_the_second_offer() {
    let m = Manager::new(&Config {
        policy_g1_g2: Policy { flags: Policy::FREQUENCY, min_frequency: 2 },
        max_concurrent_transfers: 2, copy_threads: 2, cuda_copy: CudaCopy::PerChunk,
        policy_timeout_us: 50_000, sweep_interval_us: 5_000, event_capacity: 1024, ..small()
    }).unwrap();
    let a = stored(&m, &[600]);
    for want in [0, 1] { // filtered out once, then copied
        assert_eq!(m.offload(&a, Tier::G2, None, 0).unwrap().wait(None).unwrap(), want);
    }
    m.release(&a).unwrap();
}

#[test]
fn g3_fault_fields_fail_one_write_then_let_the_rest_through() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-fault-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = Manager::new(&Config {
        g2_blocks: 0, g3_blocks: 8, g3_path: Some(dir.clone()), g3_io: IoEngine::Threads,
        g3_fault_op: G3Fault::Write, g3_fault_errno: 5, g3_fault_skip: 0, g3_fault_count: 1,
        // No presence filter: a failed offload's "on its way" mark may outlive its wait.
        policy_g1_g3: Policy { flags: Policy::PASS_ALL, min_frequency: 1 },
        ..small()
    }).unwrap();
    let a = stored(&m, &[700]);
    let e = m.offload(&a, Tier::G3, None, 0).unwrap().wait(None).unwrap_err();
    assert_eq!(e.status, Status::Io);
    assert!(e.message.contains("Input/output error"), "{}", e.message);
    assert_eq!(m.offload(&a, Tier::G3, None, 0).unwrap().wait(None).unwrap(), 1);
    m.release(&a).unwrap();
    drop(m);
    std::fs::remove_dir(&dir).unwrap(); // the G3 file went with the manager
}

#[test]
fn default_is_the_librarys_config() {
    let c = Config::default();
    assert_eq!((c.page_size, c.g1_blocks, c.max_batch_size, c.copy_threads), (16, 1024, 64, 4));
    assert_eq!(c.policy_g1_g2, Policy { flags: Policy::PRESENCE, min_frequency: c.policy_g1_g2.min_frequency });
    assert_eq!((c.g1_memory, c.g3_io, c.cuda_copy, c.g3_fault_op),
               (MemoryKind::Host, IoEngine::Auto, CudaCopy::Auto, G3Fault::Off));
}
