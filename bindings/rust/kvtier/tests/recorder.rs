//! The recorder's ring and dump, the streaming event-log reader, and replay checking a log
//! against the rules and into a fresh manager.
use kvtier::{replay_event_log, Config, EventLogReader, Manager, Status, Tier};

fn manager() -> Manager {
    Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks: 4, g2_blocks: 0, ..Default::default() })
        .unwrap()
}

#[test]
fn a_dumped_ring_streams_back_and_replays() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-recorder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log, cut) = (dir.join("ring.kvtlog"), dir.join("cut.kvtlog"));
    let m = manager();
    assert_eq!(m.set_recorder_ring(1 << 25).unwrap_err().status, Status::InvalidArgument);
    m.set_recorder_ring(64).unwrap();
    let mut sub = m.subscribe(64).unwrap();
    for h in 101..=106u64 {
        let b = m.alloc(1, Tier::G1).unwrap();
        m.release(&m.register_hashes(&b, &[h], 0).unwrap()).unwrap();
    }
    m.dump_recorder(&log).unwrap();
    let live = sub.drain(64);
    assert_eq!(live.len(), 8); // six stored, two evicted
    let streamed: Vec<_> = EventLogReader::open(&log).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(streamed, live);
    assert!(streamed.iter().all(|e| e.dst_tier() == Some(Tier::G1)));

    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let mut r = EventLogReader::open(&cut).unwrap();
    for want in &live[..7] {
        assert_eq!(&r.next().unwrap().unwrap(), want);
    }
    assert_eq!(r.next().unwrap().unwrap_err().status, Status::Corrupt);
    assert!(r.next().is_none());

    let replay = replay_event_log(&log, None).unwrap();
    assert_eq!((replay.events, replay.torn, replay.registered), (8, false, [0, 4, 0, 0]));
    assert!(replay_event_log(&cut, None).unwrap().torn);
    let fresh = manager();
    replay_event_log(&log, Some(&fresh)).unwrap();
    let mut held = fresh.tier_hashes(Tier::G1).unwrap();
    held.sort();
    assert_eq!(held, [103, 104, 105, 106]);
    // A manager whose every block is held cannot take the log's registry: violations.
    let full = manager();
    let held = full.alloc(4, Tier::G1).unwrap();
    let e = replay_event_log(&log, Some(&full)).unwrap_err();
    assert_eq!(e.status, Status::Corrupt);
    assert!(e.message.contains("no room in G1") && e.message.contains("violations)"), "{}", e.message);
    full.release(&held).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
