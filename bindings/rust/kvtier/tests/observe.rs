//! The observe stream from Rust against the real library: a subscription sees G1's
//! registrations and evictions in sequence, the event log holds the same events, the
//! metrics count them, and a log cut short reads to its last whole record.
use kvtier::{read_event_log, Config, Manager, Tier};

#[test]
fn subscription_log_and_metrics() {
    let m = Manager::new(&Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64,
                                   g1_blocks: 4, g2_blocks: 4, g3_blocks: 0,
                                   ..Default::default() })
    .unwrap();
    let mut sub = m.subscribe(1000).unwrap();
    let dir = std::env::temp_dir().join(format!("kvtier-rust-observe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("run.kvtlog");
    m.record(&log).unwrap();
    let hashes = [101u64, 102, 103, 104, 105, 106];
    for h in hashes {
        let b = m.alloc(1, Tier::G1).unwrap();
        let r = m.register_hashes(&b, &[h], 0).unwrap();
        m.release(&r).unwrap();
    }
    m.stop_recording().unwrap();
    let ev = sub.drain(1000);
    assert!(ev.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1));
    let stored: Vec<u64> = ev.iter().filter(|e| e.kind == "BLOCK_STORED").map(|e| e.hash).collect();
    let removed: Vec<u64> = ev.iter().filter(|e| e.kind == "BLOCK_REMOVED").map(|e| e.hash).collect();
    assert_eq!(stored, hashes);
    assert_eq!(removed, [101, 102]);
    // The library's JSON of each event: names, not numbers.
    let first = ev.iter().find(|e| e.kind == "BLOCK_STORED").unwrap();
    assert_eq!(first.to_json().unwrap(),
               format!("{{\"seq\":{},\"time_ns\":{},\"kind\":\"BLOCK_STORED\",\"parent_hash\":0,\
                        \"hash\":101,\"tier\":\"G1\"}}", first.seq, first.time_ns));
    let logged = read_event_log(&log).unwrap();
    assert!(logged.torn.is_none());
    assert_eq!(logged.events, ev);
    assert!(m.metrics_text().unwrap().contains("kvtier_tier_evictions_total{tier=\"G1\"} 2"));

    let bytes = std::fs::read(&log).unwrap();
    let cut = dir.join("cut.kvtlog");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let part = read_event_log(&cut).unwrap();
    assert_eq!(part.events.len(), ev.len() - 1);
    assert!(part.torn.unwrap().contains("the log is cut there"));
    assert!(read_event_log(&dir.join("missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A connector whose config serves the management endpoint (its socket lives as long as
/// the connector), and the calls it recorded, made again on a fresh connector, ending in
/// the same slot states; a connector with too few G1 blocks differs, and says where.
#[test]
fn connector_endpoint_and_rerun() {
    use kvtier::{Connector, ConnectorConfig, Role, SlotState, Status};
    let cfg = || Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64,
                          g1_blocks: 1, g2_blocks: 16, g3_blocks: 0, ..Default::default() };
    let dir = std::env::temp_dir().join(format!("kvtier-rust-rerun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log, sock) = (dir.join("run.kvtlog"), dir.join("k.sock"));
    let tokens: Vec<u32> = (0..10).collect();
    let cc = ConnectorConfig { role: Role::Scheduler, num_gpu_blocks: 8, ..Default::default() };
    {
        let m = Manager::new(&cfg()).unwrap();
        let c = Connector::new(&m, &ConnectorConfig { endpoint_path: Some(sock.clone()),
                                                      pause_timeout_ms: 500, ..cc.clone() })
            .unwrap();
        assert!(sock.exists());
        m.record(&log).unwrap();
        assert_eq!(c.get_num_new_matched_tokens("r1", &tokens, 0).unwrap().0, 0);
        c.update_state_after_alloc("r1", &[5, 6, 7], 0).unwrap();
        m.stop_recording().unwrap();
    }
    assert!(!sock.exists(), "the connector's close removes its socket");

    let m = Manager::new(&cfg()).unwrap();
    let fresh = Connector::new(&m, &cc).unwrap();
    let r = fresh.rerun(&log).unwrap();
    assert_eq!((r.calls, r.live_slots), (2, 1));
    assert_eq!(fresh.slot_state("r1").unwrap().0, SlotState::Initialized);
    drop(fresh);
    drop(m);

    let m = Manager::new(&cfg()).unwrap();
    let small = Connector::new(&m, &ConnectorConfig { num_gpu_blocks: 6, ..cc.clone() }).unwrap();
    let err = small.rerun(&log).unwrap_err();
    assert_eq!(err.status, Status::Corrupt);
    assert!(err.message.contains("UPDATE_STATE_AFTER_ALLOC 'r1'"), "{}", err.message);
    drop(small);
    let bad = Connector::new(&m, &ConnectorConfig { pause_timeout_ms: 0, ..cc.clone() });
    assert_eq!(bad.err().unwrap().status, Status::InvalidArgument);
    std::fs::remove_dir_all(&dir).unwrap();
}
