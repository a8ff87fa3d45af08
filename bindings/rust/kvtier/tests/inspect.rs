//! The connector's inspection, breakpoints, pauses and hooks from Rust: a scheduler thread
//! paused inside a real call while another reads where it is, and the hooks around calls.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier::{Block, CandidateState, Config, Connector, ConnectorConfig, ConnectorHooks, Manager,
             Role, ScheduledRequest, SlotState, Status, Tier, Trigger};

const PAGE: u32 = 4;

fn manager() -> Manager {
    Manager::new(&Config { page_size: PAGE, chunk_bytes: 64, g1_blocks: 1, g2_blocks: 16,
                           ..Default::default() })
    .unwrap()
}

fn scheduler(m: &Manager) -> Connector<'_> {
    Connector::new(m, &ConnectorConfig { role: Role::Scheduler, num_gpu_blocks: 8, ..Default::default() })
        .unwrap()
}

#[test]
fn slots_and_batches_show_a_planned_store() {
    let m = manager();
    let c = scheduler(&m);
    let mut sub = m.subscribe(256).unwrap();
    let tokens: Vec<u32> = (0..10).collect();
    assert_eq!(c.get_num_new_matched_tokens("r1", &tokens, 0).unwrap().0, 0);
    c.update_state_after_alloc("r1", &[0, 1, 2], 0).unwrap();
    assert!(c.batches().unwrap().is_empty());
    // The connector saw the blocks in update_state_after_alloc: none is new to this step.
    c.build_connector_meta(&[ScheduledRequest { req_id: "r1", num_scheduled_tokens: 10, ..Default::default() }])
        .unwrap();
    let slots = c.slots().unwrap();
    assert_eq!(slots.len(), 1);
    let s = &slots[0];
    assert_eq!((s.req_id.as_str(), s.state, s.tokens, s.computed, s.blocks, s.batches),
               ("r1", SlotState::Prefilling, 10, 10, 3, 1));
    let batches = c.batches().unwrap();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!((b.req_id.as_str(), b.src, b.dst, b.blocks), ("r1", Tier::G1, Tier::G2, 2));
    assert!(b.step > 0, "sent in a step's metadata: {b:?}");
    let promoted: Vec<_> = sub.drain(256).into_iter().filter(|e| e.kind == "CANDIDATE").collect();
    assert_eq!(CandidateState::from_raw(promoted[0].state), Some(CandidateState::Promoted));
    assert_eq!((promoted[0].src_tier(), promoted[0].dst_tier(), promoted[0].batch), (Some(Tier::G1), Some(Tier::G2), b.batch));
    assert_eq!(CandidateState::Promoted.to_string(), "PROMOTED");
    assert_eq!(CandidateState::from_raw(99), None);
}

#[test]
fn a_breakpoint_pauses_a_call_until_resumed() {
    let m = manager();
    let c = scheduler(&m);
    assert_eq!(c.breakpoint_add(None, None).unwrap_err().status, Status::InvalidArgument);
    let id = c.breakpoint_add(Some(SlotState::Initialized), Some("r2")).unwrap();
    assert_eq!(c.wait_paused(Duration::ZERO).unwrap(), None);
    assert_eq!(c.resume().unwrap_err().status, Status::State);
    std::thread::scope(|s| {
        let call = s.spawn(|| c.get_num_new_matched_tokens("r2", &[1, 2, 3, 4, 5], 0));
        let p = c.wait_paused(Duration::from_secs(30)).unwrap().expect("the call pauses");
        assert_eq!((p.trigger, p.prev, p.state, p.breakpoint, p.pauses, p.req_id.as_str()),
                   (Trigger::GetNumNewMatchedTokens, None, Some(SlotState::Initialized), id, 1, "r2"));
        let paused_at = c.slots().unwrap();
        assert_eq!((paused_at[0].req_id.as_str(), paused_at[0].state), ("r2", SlotState::Initialized));
        c.resume().unwrap();
        assert_eq!(call.join().unwrap().unwrap(), (0, false));
    });
    c.breakpoint_remove(id).unwrap();
    assert_eq!(c.breakpoint_remove(id).unwrap_err().status, Status::NotFound);

    // pause(): the next call pauses, as breakpoint 0; a pause nobody resumes ends itself.
    assert_eq!(c.set_pause_timeout(Duration::ZERO).unwrap_err().status, Status::InvalidArgument);
    c.set_pause_timeout(Duration::from_millis(20)).unwrap();
    c.pause().unwrap();
    c.request_preempted("r2").unwrap(); // returns once its pause timed out
    c.set_pause_timeout(Duration::from_secs(3600)).unwrap();
    c.pause().unwrap();
    std::thread::scope(|s| {
        let call = s.spawn(|| c.request_finished("r2"));
        let p = c.wait_paused(Duration::from_secs(30)).unwrap().expect("the call pauses");
        assert_eq!((p.breakpoint, p.req_id.as_str()), (0, "r2"));
        c.resume().unwrap();
        assert!(!call.join().unwrap().unwrap());
    });
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl ConnectorHooks for Recorder {
    fn will_call(&self, trigger: Trigger, req_id: Option<&str>) {
        self.0.lock().unwrap().push(format!("will {trigger} {req_id:?}"));
    }
    fn finished_call(&self, trigger: Trigger, req_id: Option<&str>, result: Result<(), Status>) {
        self.0.lock().unwrap().push(format!("done {trigger} {req_id:?} {result:?}"));
    }
    fn transition(&self, req_id: &str, from: Option<SlotState>, to: SlotState, trigger: Trigger) {
        self.0.lock().unwrap().push(format!("{req_id} {from:?} -> {to} by {}", trigger.name()));
    }
}

struct Panics;

impl ConnectorHooks for Panics {
    fn will_call(&self, _: Trigger, _: Option<&str>) {
        panic!("a hook's panic stays out of C");
    }
}

#[test]
fn hooks_see_every_call_and_transition() {
    let m = manager();
    let c = scheduler(&m);
    let rec = Arc::new(Recorder::default());
    c.set_hooks(rec.clone()).unwrap();
    c.get_num_new_matched_tokens("h1", &[1, 2, 3], 0).unwrap();
    assert_eq!(c.update_state_after_alloc("h1", &[99], 0).unwrap_err().status, Status::InvalidArgument);
    c.clear_hooks().unwrap();
    c.request_finished("h1").unwrap();
    assert_eq!(*rec.0.lock().unwrap(), [
        "will GET_NUM_NEW_MATCHED_TOKENS Some(\"h1\")",
        "h1 None -> KVT_SLOT_INITIALIZED by GET_NUM_NEW_MATCHED_TOKENS",
        "done GET_NUM_NEW_MATCHED_TOKENS Some(\"h1\") Ok(())",
        "will UPDATE_STATE_AFTER_ALLOC Some(\"h1\")",
        "done UPDATE_STATE_AFTER_ALLOC Some(\"h1\") Err(InvalidArgument)",
    ]);
    c.set_hooks(Panics).unwrap();
    c.get_num_new_matched_tokens("h2", &[1], 0).unwrap();
    drop(c);

    let w = Connector::new(&m, &ConnectorConfig { role: Role::Worker, ..Default::default() }).unwrap();
    assert_eq!(w.set_hooks(Panics).unwrap_err().status, Status::State); // no scheduler half
    assert_eq!(Trigger::from_raw(Trigger::ResetCache as u32), Some(Trigger::ResetCache));
}

#[test]
fn the_max_form_caps_the_hit() {
    let m = manager();
    let c = scheduler(&m);
    let salt = kvtier::try_hash_salt(b"").unwrap();
    let tokens: Vec<u32> = (100..117).collect(); // four full blocks and one token
    let hashes = kvtier::hash_sequence(&tokens, PAGE, salt).unwrap();
    let blocks: Vec<Block> = m.alloc(4, Tier::G2).unwrap();
    let blocks = m.register_hashes(&blocks, &hashes, 0).unwrap();
    m.release(&blocks).unwrap();
    assert_eq!(c.get_num_new_matched_tokens_max("a", salt, &tokens, 0, 9).unwrap(), (8, false));
    assert_eq!(c.get_num_new_matched_tokens_max("b", salt, &tokens, 0, u64::MAX).unwrap(), (16, false));
    assert_eq!(c.get_num_new_matched_tokens_max("c", salt ^ 1, &tokens, 0, u64::MAX).unwrap().0, 0);
}

#[test]
fn a_paused_build_connector_meta_does_not_hold_off_get_finished() {
    let m = manager();
    let c = Connector::new(&m, &ConnectorConfig { role: Role::Both, num_gpu_blocks: 8, ..Default::default() })
        .unwrap();
    // Far longer than get_finished takes: the pause still holds when it returns, unless it
    // waited the pause out (the one lock both halves' buffers once shared).
    c.set_pause_timeout(Duration::from_secs(60)).unwrap();
    c.pause().unwrap();
    std::thread::scope(|s| {
        let call = s.spawn(|| c.build_connector_meta(&[]));
        let p = c.wait_paused(Duration::from_secs(30)).unwrap().expect("the call pauses");
        assert_eq!(p.trigger, Trigger::BuildConnectorMeta);
        // The worker half, while the scheduler's call is paused inside the library.
        let f = c.get_finished().unwrap();
        assert!(f.finished_sending.is_empty() && f.finished_recving.is_empty(), "{f:?}");
        c.resume().unwrap(); // Status::State had the pause ended by itself meanwhile
        call.join().unwrap().unwrap();
    });
}
