//! One transfer shared by threads, and timeouts that report themselves.
use kvtier::{Block, Config, Manager, Status, Tier};
use std::time::Duration;

fn manager() -> Manager {
    Manager::new(&Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64,
                           g1_blocks: 64, g2_blocks: 64, g3_blocks: 0, min_batch_size: 1,
                           flush_interval_us: 1000, ..Default::default() })
    .unwrap()
}

fn stored(m: &Manager, hashes: &[u64]) -> Vec<Block> {
    let b = m.alloc(hashes.len(), Tier::G1).unwrap();
    m.register_hashes(&b, hashes, 0).unwrap()
}

#[test]
fn cancel_from_one_thread_ends_the_waits_of_others() {
    let m = manager();
    let a = stored(&m, &[70, 71]);
    let f = m.fence().unwrap();
    let x = m.offload(&a, Tier::G2, Some(&f), 0).unwrap();
    std::thread::scope(|s| {
        let x = &x;
        let (started, waiting) = std::sync::mpsc::channel();
        let forever_started = started.clone();
        let forever = s.spawn(move || {
            forever_started.send(()).unwrap();
            x.wait(None)
        });
        let polling = s.spawn(move || {
            let mut told = false;
            loop {
                match x.wait(Some(Duration::from_millis(1))) {
                    Err(e) if e.status == Status::Timeout => {
                        // Seen waiting on the live transfer: it waits again right away.
                        if !told {
                            started.send(()).unwrap();
                            told = true;
                        }
                        continue;
                    }
                    r => return r,
                }
            }
        });
        // Cancel once both are about to wait, or waiting: nothing observable tells when
        // `forever` is inside the library's wait rather than just before it. Both outcomes
        // of that race are the same one, though: a wait that starts after the cancel finds
        // the transfer ended cancelled and returns Status::Cancelled too, as the asserts
        // below expect either way.
        waiting.recv().unwrap();
        waiting.recv().unwrap();
        x.cancel().unwrap();
        assert_eq!(forever.join().unwrap().unwrap_err().status, Status::Cancelled);
        assert_eq!(polling.join().unwrap().unwrap_err().status, Status::Cancelled);
    });
    drop(x);
    drop(f);
    assert!(m.match_prefix(&[70], Tier::G2).unwrap().is_empty());
    m.release(&a).unwrap();
    m.check().unwrap();
}

#[test]
fn threads_wait_on_one_running_transfer() {
    let m = manager();
    for i in 0..40u64 {
        let a = stored(&m, &[1000 + 2 * i, 1001 + 2 * i]);
        let x = m.offload(&a, Tier::G2, None, i).unwrap();
        std::thread::scope(|s| {
            let x = &x;
            let waits: Vec<_> = (0..3).map(|_| s.spawn(move || x.wait(None))).collect();
            if i % 2 == 0 {
                x.cancel().unwrap(); // too late or not: either way every wait sees one end
            }
            let ends: Vec<_> = waits.into_iter().map(|w| w.join().unwrap()).collect();
            assert!(ends.iter().all(|e| *e == ends[0]), "{ends:?}");
            assert!(matches!(&ends[0], Ok(2)) || ends[0].as_ref().unwrap_err().status == Status::Cancelled);
        });
        drop(x);
        m.release(&a).unwrap();
    }
    m.check().unwrap();
}

#[test]
fn a_timeout_reports_itself_not_an_older_failure() {
    let m = manager();
    let a = stored(&m, &[90]);
    let f = m.fence().unwrap();
    let x = m.offload(&a, Tier::G2, Some(&f), 0).unwrap();
    let older = m.alloc(100_000, Tier::G1).unwrap_err(); // on this thread, as the wait is
    assert_eq!(older.status, Status::NoSpace);
    let e = x.wait(Some(Duration::from_millis(1))).unwrap_err();
    assert_eq!(e.status, Status::Timeout);
    assert!(!e.message.contains(&older.message) && e.message.contains("1ms"), "{}", e.message);
    drop(x);
    drop(f);
    m.release(&a).unwrap();
}
