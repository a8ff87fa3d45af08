//! The config fields of 0.3 to 0.5 from Rust: a persistent G3 that the next manager
//! recovers (bytes compared), its namespace check, eviction and pin limits, KV events, and
//! fields that do not validate.
use kvtier::{Block, Config, Eviction, G3Mismatch, IoEngine, KvEventsFormat, Manager, Status, Tier};

fn small() -> Config {
    Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64, g1_blocks: 8, g2_blocks: 0,
             min_batch_size: 1, flush_interval_us: 1000, ..Default::default() }
}

fn persistent(dir: &std::path::Path, namespace: u64, on_mismatch: G3Mismatch) -> kvtier::Result<Manager> {
    Manager::new(&Config { g3_blocks: 8, g3_path: Some(dir.into()), g3_io: IoEngine::Threads,
                           g3_persist: true, g3_namespace: namespace, g3_on_mismatch: on_mismatch,
                           ..small() })
}

fn onboard_bytes(m: &Manager, hash: u64) -> Vec<u8> {
    let src = m.match_prefix(&[hash], Tier::G3).unwrap();
    let dst = m.alloc(1, Tier::G1).unwrap();
    let x = m.onboard(&src, &dst, None, 0).unwrap();
    assert_eq!(x.wait(None).unwrap(), 1);
    let got: Vec<Block> = x.blocks().unwrap();
    let bytes = unsafe { m.data(got[0]).unwrap() }.to_vec();
    drop(x);
    m.release(&src).unwrap();
    m.release(&got).unwrap();
    bytes
}

#[test]
fn a_persistent_g3_survives_its_manager_in_its_namespace() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    {
        let m = persistent(&dir, 42, G3Mismatch::Refuse).unwrap();
        let b = m.alloc(1, Tier::G1).unwrap();
        unsafe { m.data(b[0]).unwrap() }.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8 ^ 0x3c);
        let b = m.register_hashes(&b, &[900], 0).unwrap();
        assert_eq!(m.offload(&b, Tier::G3, None, 0).unwrap().wait(None).unwrap(), 1);
        m.release(&b).unwrap();
        m.close().unwrap();
    }
    let m = persistent(&dir, 42, G3Mismatch::Refuse).unwrap();
    assert_eq!(m.tier_stats(Tier::G3).unwrap().recovered, 1);
    let want: Vec<u8> = (0..128).map(|i| i as u8 ^ 0x3c).collect();
    assert_eq!(onboard_bytes(&m, 900), want);
    drop(m);
    let e = persistent(&dir, 43, G3Mismatch::Refuse).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("namespace"), "{}", e.message);
    let m = persistent(&dir, 43, G3Mismatch::Reset).unwrap();
    assert_eq!(m.tier_stats(Tier::G3).unwrap().recovered, 0);
    drop(m);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn eviction_and_pin_limits() {
    let c = Config::default();
    assert_eq!((c.eviction, c.max_pinned_percent, c.g3_persist, c.g3_on_mismatch),
               ([Eviction::Lru; 3], 50, false, G3Mismatch::Refuse));
    let m = Manager::new(&Config { g1_blocks: 4, eviction: [Eviction::S3Fifo; 3], max_pinned_percent: 50, ..small() })
        .unwrap();
    let b = m.alloc(3, Tier::G1).unwrap();
    let b = m.register_hashes(&b, &[1, 2, 3], 0).unwrap();
    m.release(&b).unwrap();
    m.pin(&b[..2]).unwrap();
    assert_eq!(m.pin(&b[2..]).unwrap_err().status, Status::NoSpace); // 50% of 4
    m.alloc(2, Tier::G1).unwrap(); // one free, one evicted: never a pinned one
    assert_eq!(m.tier_stats(Tier::G1).unwrap().evictions, 1);
    let mut left = m.tier_hashes(Tier::G1).unwrap();
    left.sort();
    assert_eq!(left, [1, 2]);
    let e = Manager::new(&Config { max_pinned_percent: 101, ..small() }).err().unwrap();
    assert!(e.message.contains("max_pinned_percent"), "{}", e.message);
}

#[test]
fn kv_events_fields_create_a_publisher_and_bad_ones_are_refused() {
    let id = std::process::id();
    let events = Config {
        kv_events_endpoint: Some(format!("inproc://kvtier-rust-{id}")),
        kv_events_replay_endpoint: Some(format!("inproc://kvtier-rust-replay-{id}")),
        kv_events_topic: Some("kv".into()),
        kv_events_buffer: 16,
        kv_events_dp_rank: 1,
        kv_events_tiers: 1 << Tier::G1 as u32,
        kv_events_format: KvEventsFormat::ArrayV0_11,
        ..small()
    };
    let m = Manager::new(&events).unwrap();
    m.note_tokens(&[77], &[1, 2, 3, 4]).unwrap();
    let b = m.alloc(1, Tier::G1).unwrap();
    m.release(&m.register_hashes(&b, &[77], 0).unwrap()).unwrap();
    m.close().unwrap();
    let d = Config::default();
    assert_eq!((d.kv_events_buffer, d.kv_events_tiers, d.kv_events_format), (10000, 0b1110, KvEventsFormat::Current));
    for (bad, field) in [
        (Config { kv_events_buffer: 0, ..events.clone() }, "kv_events_buffer"),
        (Config { kv_events_dp_rank: -1, ..events.clone() }, "kv_events_dp_rank"),
        (Config { kv_events_topic: Some("a\0b".into()), ..events.clone() }, "kv_events_topic"),
    ] {
        let e = Manager::new(&bad).err().unwrap();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains(field), "{}", e.message);
    }
}
