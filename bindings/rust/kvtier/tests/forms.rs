//! What 0.5.0's conforming forms of six calls (docs/CONVENTIONS.md) change as the safe crate
//! reaches them: KVT_ITEROVER ends the event-log reader, the evictable blocks and the token
//! hashes report their total while filling only the room given, the connector's events drain
//! through kvt_connector_drain_events, and a pause wait that runs out is KVT_TIMEOUT.
use std::time::{Duration, Instant};

use kvtier::{Block, Config, Connector, ConnectorConfig, EventLogReader, Manager, ManagerEvent,
             Role, SlotState, Status, Tier, Trigger};

fn manager(g1_blocks: u64) -> Manager {
    Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks, g2_blocks: 16,
                           ..Default::default() })
    .unwrap()
}

fn store(m: &Manager, tier: Tier, hashes: &[u64]) -> Vec<Block> {
    let b = m.alloc(hashes.len(), tier).unwrap();
    m.register_hashes(&b, hashes, 0).unwrap()
}

#[test]
fn iterover_is_a_status_of_its_own() {
    assert_eq!(Status::IterOver.code(), 3);
    assert_eq!(Status::IterOver.name(), "KVT_ITEROVER");
    assert_ne!(Status::IterOver, Status::NotFound);
    assert_eq!(Status::Timeout.code(), 2);
}

#[test]
fn the_log_reader_ends_cleanly_past_the_last_record() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-forms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log, empty) = (dir.join("ring.kvtlog"), dir.join("empty.kvtlog"));

    let quiet = manager(4);
    quiet.set_recorder_ring(16).unwrap();
    quiet.dump_recorder(&empty).unwrap();
    let mut r = EventLogReader::open(&empty).unwrap();
    assert!(r.next().is_none(), "a log without records ends at once");
    assert!(r.next().is_none());

    let m = manager(4);
    m.set_recorder_ring(64).unwrap();
    m.release(&store(&m, Tier::G1, &[7, 8, 9])).unwrap();
    m.dump_recorder(&log).unwrap();
    let mut r = EventLogReader::open(&log).unwrap();
    let mut n = 0;
    for e in r.by_ref() {
        let e = e.expect("no record past the last one is an error");
        assert_eq!((e.kind.as_str(), e.dst_tier()), ("BLOCK_STORED", Some(Tier::G1)));
        n += 1;
    }
    assert_eq!(n, 3);
    // Past the end it stays ended, without an error.
    assert!(r.next().is_none());
    assert!(r.next().is_none());
    let whole = kvtier::read_event_log(&log).unwrap();
    assert_eq!((whole.events.len(), whole.torn), (3, None));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn evictable_counts_every_block_and_lists_up_to_max() {
    let m = manager(8);
    assert_eq!(m.evictable_count(Tier::G1).unwrap(), 0);
    assert!(m.evictable(Tier::G1, 8).unwrap().is_empty());
    let b = store(&m, Tier::G1, &[1, 2, 3, 4, 5]);
    assert_eq!(m.evictable_count(Tier::G1).unwrap(), 0, "held blocks are not evictable");
    m.release(&b).unwrap();
    assert_eq!(m.evictable_count(Tier::G1).unwrap(), 5);
    let all = m.evictable(Tier::G1, 64).unwrap();
    assert_eq!(all.len(), 5);
    // A smaller max lists the first of them; the count still says how many there are.
    assert_eq!(m.evictable(Tier::G1, 2).unwrap(), all[..2]);
    assert!(m.evictable(Tier::G1, 0).unwrap().is_empty());
    m.pin(&all[..1]).unwrap();
    assert_eq!(m.evictable_count(Tier::G1).unwrap(), 4);
    assert_eq!(m.evictable(Tier::G1, 64).unwrap(), all[1..]);
    m.unpin(&all[..1]).unwrap();
    // G4 holds no handles: refused, as by every call that takes a tier for handles.
    assert_eq!(m.evictable_count(Tier::G4).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(m.evictable(Tier::G4, 4).unwrap_err().status, Status::InvalidArgument);
}

#[test]
fn hashing_into_a_small_buffer_reports_every_block() {
    let tokens: Vec<u32> = (1..=38).collect(); // 9 full blocks of 4 and 2 tokens over
    let salt = kvtier::try_hash_salt(b"forms").unwrap();
    let all = kvtier::hash_sequence(&tokens, 4, salt).unwrap();
    assert_eq!(all.len(), 9);

    assert_eq!(kvtier::hash_sequence_into(&tokens, 4, salt, &mut []).unwrap(), 9);
    let mut small = [0u64; 3];
    assert_eq!(kvtier::hash_sequence_into(&tokens, 4, salt, &mut small).unwrap(), 9);
    assert_eq!(small, all[..3]);
    let mut big = [u64::MAX; 12];
    assert_eq!(kvtier::hash_sequence_into(&tokens, 4, salt, &mut big).unwrap(), 9);
    assert_eq!(big[..9], all[..]);
    assert_eq!(big[9..], [u64::MAX; 3], "nothing past the full blocks is written");
    assert_eq!(kvtier::hash_sequence_into(&tokens[..3], 4, salt, &mut small).unwrap(), 0);
    assert_eq!(kvtier::hash_sequence_into(&tokens, 3, salt, &mut small).unwrap_err().status,
               Status::InvalidArgument);
    assert_eq!(kvtier::hash_sequence(&tokens, 0, salt).unwrap_err().status, Status::InvalidArgument);

    let mut s = kvtier::Seq::new(4, salt).unwrap();
    assert!(s.hashes().unwrap().is_empty());
    s.append(&tokens[..7]).unwrap();
    assert_eq!(s.hashes().unwrap(), all[..1]);
    s.append(&tokens[7..]).unwrap();
    assert_eq!(s.hashes().unwrap(), all);
}

fn scheduler(m: &Manager) -> Connector<'_> {
    Connector::new(m, &ConnectorConfig { role: Role::Scheduler, num_gpu_blocks: 8, ..Default::default() })
        .unwrap()
}

#[test]
fn the_connector_drains_the_managers_events() {
    let m = manager(4);
    let c = scheduler(&m);
    m.release(&store(&m, Tier::G2, &[41, 42])).unwrap();
    let first = c.poll_events(1);
    assert_eq!(first, [ManagerEvent::BlockStored { tier: Tier::G2, hash: 41, parent: 0 }]);
    let rest = c.poll_events(16);
    assert_eq!(rest, [ManagerEvent::BlockStored { tier: Tier::G2, hash: 42, parent: 41 }]);
    assert!(c.poll_events(16).is_empty());
    assert!(c.poll_events(0).is_empty());
}

#[test]
fn a_pause_wait_runs_out_or_waits_forever() {
    let m = manager(4);
    let c = scheduler(&m);
    assert_eq!(c.wait_paused(Duration::ZERO).unwrap(), None);
    let t = Instant::now();
    assert_eq!(c.wait_paused(Duration::from_millis(30)).unwrap(), None);
    assert!(t.elapsed() >= Duration::from_millis(30), "{:?}", t.elapsed());

    let id = c.breakpoint_add(Some(SlotState::Initialized), Some("r1")).unwrap();
    std::thread::scope(|s| {
        let call = s.spawn(|| c.get_num_new_matched_tokens("r1", &[1, 2, 3, 4, 5], 0));
        let p = c.wait_paused(Duration::MAX).unwrap().expect("a wait without end sees the pause");
        assert_eq!((p.trigger, p.breakpoint, p.req_id.as_str()),
                   (Trigger::GetNumNewMatchedTokens, id, "r1"));
        // Paused now: a wait that only looks sees it too.
        assert_eq!(c.wait_paused(Duration::ZERO).unwrap().map(|p| p.breakpoint), Some(id));
        c.resume().unwrap();
        assert_eq!(call.join().unwrap().unwrap(), (0, false));
    });
    c.breakpoint_remove(id).unwrap();
}
