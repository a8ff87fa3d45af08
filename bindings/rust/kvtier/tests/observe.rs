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
