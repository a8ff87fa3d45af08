//! The safe crate against the real library: real bytes, real threads.
// These tests use the deprecated API on purpose: it must keep working.
#![allow(deprecated)]
use kvtier::{Block, Config, Event, Manager, Status, Tier};
use std::time::Duration;

fn manager() -> Manager {
    Manager::new(&Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64,
                           g1_blocks: 64, g2_blocks: 64, g3_blocks: 0, min_batch_size: 1,
                           flush_interval_us: 1000, ..Default::default() })
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
fn hashing_agrees_with_the_incremental_form() {
    let tokens: Vec<u32> = (1000..1037).collect();
    let salt = kvtier::hash_salt(b"salt");
    let h = kvtier::hash_sequence(&tokens, 4, salt).unwrap();
    assert_eq!(h.len(), 9);
    let mut s = kvtier::Seq::new(4, salt).unwrap();
    s.append(&tokens[..5]).unwrap();
    s.append(&tokens[5..]).unwrap();
    assert_eq!(s.hashes().unwrap(), h);
    assert_eq!(kvtier::hash_sequence(&tokens, 3, salt).unwrap_err().status, Status::InvalidArgument);
}

#[test]
fn dedup_and_prefix_match() {
    let m = manager();
    let a = stored(&m, &[1, 2, 3], 1);
    let again = m.alloc(1, Tier::G1).unwrap();
    let dup = m.register_hashes(&again, &[2], 1).unwrap();
    assert_eq!(dup[0], a[1]);
    let got = m.match_prefix(&[1, 2, 3, 4], Tier::G1).unwrap();
    assert_eq!(got, a);
    m.release(&got).unwrap();
    m.release(&dup).unwrap();
    m.release(&a).unwrap();
    m.check().unwrap();
}

#[test]
fn offload_completes_through_polling() {
    let m = manager();
    let a = stored(&m, &[10, 11], 0x5a);
    m.events().for_each(drop);
    let x = m.offload(&a, Tier::G2, None, 77).unwrap();
    let mut done = None;
    for _ in 0..10_000 {
        if let Some(e) = m.events().find(|e| matches!(e, Event::XferDone { .. })) {
            done = Some(e);
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(done, Some(Event::XferDone { status: Ok(()), tier: 2, user_data: 77, count: 2 }));
    assert_eq!(x.wait(None).unwrap(), 2);
    drop(x);
    let g2 = m.match_prefix(&[10, 11], Tier::G2).unwrap();
    assert_eq!(g2.len(), 2);
    assert!(unsafe { m.data(g2[1]).unwrap() }.iter().all(|b| *b == 0x5a));
    m.release(&g2).unwrap();
    m.release(&a).unwrap();
    assert!(m.event_fd() >= 0);
}

#[test]
fn cancel_is_the_cancelled_status() {
    let m = manager();
    let a = stored(&m, &[30], 0);
    let f = m.fence().unwrap();
    let x = m.offload(&a, Tier::G2, Some(&f), 0).unwrap();
    assert_eq!(x.wait(Some(Duration::from_millis(1))).unwrap_err().status, Status::Timeout);
    x.cancel().unwrap();
    let e = x.wait(None).unwrap_err();
    assert_eq!(e.status, Status::Cancelled);
    assert!(!e.message.is_empty());
    drop(x);
    drop(f);
    m.release(&a).unwrap();
    assert!(m.match_prefix(&[30], Tier::G2).unwrap().is_empty());
}

#[test]
fn bad_input_gives_typed_errors() {
    let m = manager();
    let e = m.release(&[Block(12345)]).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle);
    assert!(e.message.contains("handle"), "{}", e.message);
    assert_eq!(m.alloc(1000, Tier::G1).unwrap_err().status, Status::NoSpace);
    assert_eq!(m.register_hashes(&[Block(1)], &[], 0).unwrap_err().status, Status::InvalidArgument);
    let fresh = m.alloc(1, Tier::G1).unwrap();
    assert_eq!(m.retain(fresh[0]).unwrap_err().status, Status::State);
    let bad = Manager::new(&Config { page_size: 3, ..Default::default() });
    assert_eq!(bad.err().unwrap().status, Status::InvalidArgument);
    // A handle of another manager is foreign.
    let other = manager();
    let theirs = other.alloc(1, Tier::G1).unwrap();
    assert_eq!(m.release(&theirs).unwrap_err().status, Status::InvalidHandle);
}

#[test]
fn drop_after_an_error_and_in_any_order_leaves_the_manager_whole() {
    let m = manager();
    let a = stored(&m, &[40], 0);
    {
        let f = m.fence().unwrap();
        let x = m.offload(&a, Tier::G2, Some(&f), 0).unwrap();
        let r: Result<(), kvtier::Error> = (|| {
            m.release(&[Block(1)])?; // fails: x and f are dropped on the way out
            Ok(())
        })();
        assert!(r.is_err());
        drop(f); // before its transfer: the transfer ends cancelled
        assert_eq!(x.wait(None).unwrap_err().status, Status::Cancelled);
    }
    m.release(&a).unwrap();
    m.check().unwrap();
}

#[test]
fn threads_share_one_manager() {
    let m = Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks: 1024,
                                   g2_blocks: 1024, ..Default::default() }).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let m = &m;
            s.spawn(move || {
                for i in 0..50u64 {
                    let base = t * 100_000 + i * 4;
                    let h = [base + 1, base + 2, base + 3];
                    let b = stored(m, &h, t as u8);
                    m.offload(&b, Tier::G2, None, t).unwrap().wait(None).unwrap();
                    let got = m.match_prefix(&h, Tier::G1).unwrap();
                    assert_eq!(got, b);
                    m.release(&got).unwrap();
                    m.release(&b).unwrap();
                }
            });
        }
    });
    m.check().unwrap();
}

#[test]
fn reset_cancels_empties_and_keeps_held_bytes() {
    let m = manager();
    let a = stored(&m, &[50, 51], 9);
    m.offload(&a, Tier::G2, None, 0).unwrap().wait(None).unwrap();
    let b = stored(&m, &[52], 3); // not in G2: it waits for the fence
    let f = m.fence().unwrap();
    let parked = m.offload(&b, Tier::G2, Some(&f), 5).unwrap();
    m.events().for_each(drop);
    m.reset(None).unwrap();
    assert_eq!(parked.wait(None).unwrap_err().status, Status::Cancelled);
    let ev: Vec<Event> = m.events().collect();
    let cleared: Vec<u32> = ev
        .iter()
        .filter_map(|e| match e { Event::TierCleared { tier } => Some(*tier), _ => None })
        .collect();
    assert_eq!(cleared, vec![1, 2]);
    let mut removed: Vec<u64> = ev
        .iter()
        .filter_map(|e| match e { Event::BlockRemoved { tier: 2, hash } => Some(*hash), _ => None })
        .collect();
    removed.sort();
    assert_eq!(removed, vec![50, 51]);
    assert_eq!(ev.iter().filter(|e| matches!(e, Event::XferDone { .. })).count(), 1);
    assert!(m.match_prefix(&[50], Tier::G1).unwrap().is_empty());
    assert!(m.match_prefix(&[50], Tier::G2).unwrap().is_empty());
    assert!(unsafe { m.data(a[0]).unwrap() }.iter().all(|x| *x == 9));
    m.reset(Some(Tier::G2)).unwrap();
    assert_eq!(m.events().collect::<Vec<_>>(), vec![Event::TierCleared { tier: 2 }]);
    let e = m.reset(Some(Tier::G3)).unwrap_err(); // absent
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("absent"), "{}", e.message);
    drop(parked);
    drop(f);
    m.release(&a).unwrap();
    m.release(&b).unwrap();
    m.check().unwrap();
}
