//! The connector against the real library: seed 003's scenario in one process and split
//! across two, and bad input.
//!
//! Built with `harness = false`: this binary is also the worker process of the two-process
//! test. Run with KVTIER_TEST_CONNECTOR_WORKER=1, it plays the worker half, reading commands
//! as length-prefixed frames on stdin and answering on stdout, which libtest's own output
//! would disturb.
// These tests use the deprecated API on purpose: it must keep working.
#![allow(deprecated)]
use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use kvtier::{Connector, Error, Event, Finished, Manager, Role, ScheduledRequest, SlotState,
             Status, Tier};

#[path = "../examples/connector_seed003.rs"]
mod seed003;
use seed003::{connector_config, manager_config, Worker, G1, GPU_BLOCKS};

const WORKER_ENV: &str = "KVTIER_TEST_CONNECTOR_WORKER";

/// The transcript of seed 003 through the connector, as every language prints it.
const TRANSCRIPT: &str = include_str!("../../../../examples/connector/seed003.txt");

// --- frames: a u32 length (little-endian), then that many bytes ---

fn write_frame(w: &mut impl Write, bytes: &[u8]) {
    w.write_all(&(bytes.len() as u32).to_le_bytes()).unwrap();
    w.write_all(bytes).unwrap();
    w.flush().unwrap();
}

/// None at the end of the stream.
fn read_frame(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).ok()?;
    let mut out = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut out).unwrap();
    Some(out)
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u32(mut self, v: u32) -> Enc {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Enc {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn bytes(self, v: &[u8]) -> Enc {
        let mut e = self.u32(v.len() as u32);
        e.0.extend(v);
        e
    }
    fn strs(self, v: &[String]) -> Enc {
        v.iter().fold(self.u32(v.len() as u32), |e, s| e.bytes(s.as_bytes()))
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = self.u32() as usize;
        self.take(n).to_vec()
    }
    fn strs(&mut self) -> Vec<String> {
        (0..self.u32()).map(|_| String::from_utf8(self.bytes()).unwrap()).collect()
    }
}

// Commands (first byte of a frame) and the answer: 0 and the result, or 1, the status's
// name and the message.
const STEP: u8 = b'S';
const FINISHED: u8 = b'F';
const CLEAR: u8 = b'C';

fn status_named(name: &str) -> Status {
    [Status::Timeout, Status::InvalidArgument, Status::InvalidHandle, Status::State,
     Status::NoSpace, Status::Cancelled, Status::Unsupported, Status::Io, Status::Corrupt,
     Status::NoMemory, Status::Cuda, Status::NotFound, Status::Internal]
        .into_iter()
        .find(|s| format!("{s:?}") == name)
        .unwrap_or(Status::Other(0))
}

/// The worker process: a WORKER connector over its own manager and G1.
fn worker_main() {
    let g1 = G1::new();
    let m = Manager::new(&manager_config()).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Worker)).unwrap();
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64).unwrap();
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    while let Some(frame) = read_frame(&mut input) {
        let mut d = Dec(&frame[1..]);
        let answer = match frame[0] {
            STEP => {
                let meta = d.bytes();
                let writes: Vec<(u32, u64)> = (0..d.u32()).map(|_| (d.u32(), d.u64())).collect();
                let same: Vec<(u32, u32)> = (0..d.u32()).map(|_| (d.u32(), d.u32())).collect();
                seed003::worker_step(&c, &g1, &meta, &writes, &same).map(|n| Enc::default().u32(n as u32))
            }
            FINISHED => c.get_finished().map(|f| {
                Enc::default().strs(&f.finished_sending).strs(&f.finished_recving)
                    .bytes(&f.load_error_block_ids.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<_>>())
                    .bytes(&f.report)
            }),
            CLEAR => c.clear_connector_metadata().map(|_| Enc::default()),
            _ => break,
        };
        let reply = match answer {
            Ok(e) => [vec![0], e.0].concat(),
            Err(e) => [vec![1], Enc::default().bytes(format!("{:?}", e.status).as_bytes())
                .bytes(e.message.as_bytes()).0].concat(),
        };
        write_frame(&mut output, &reply);
    }
}

/// The worker half in a child process: this binary, run again.
struct RemoteWorker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl RemoteWorker {
    fn spawn() -> RemoteWorker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(WORKER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take(), BufReader::new(child.stdout.take().unwrap()));
        RemoteWorker { child, stdin, stdout }
    }

    fn call(&mut self, command: Vec<u8>) -> Result<Vec<u8>, Error> {
        write_frame(self.stdin.as_mut().unwrap(), &command);
        let reply = read_frame(&mut self.stdout).expect("the worker process ended");
        let mut d = Dec(&reply[1..]);
        if reply[0] == 0 {
            return Ok(d.0.to_vec());
        }
        let status = status_named(&String::from_utf8(d.bytes()).unwrap());
        Err(Error { status, message: String::from_utf8(d.bytes()).unwrap() })
    }
}

impl Worker for RemoteWorker {
    fn step(&mut self, meta: &[u8], writes: &[(u32, u64)], same: &[(u32, u32)]) -> Result<usize, Error> {
        let e = Enc(vec![STEP]).bytes(meta);
        let e = writes.iter().fold(e.u32(writes.len() as u32), |e, (b, h)| e.u32(*b).u64(*h));
        let e = same.iter().fold(e.u32(same.len() as u32), |e, (a, b)| e.u32(*a).u32(*b));
        Ok(Dec(&self.call(e.0)?).u32() as usize)
    }
    fn get_finished(&mut self) -> Result<Finished, Error> {
        let reply = self.call(vec![FINISHED])?;
        let mut d = Dec(&reply);
        let (finished_sending, finished_recving) = (d.strs(), d.strs());
        let load_error_block_ids =
            d.bytes().chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        Ok(Finished { finished_sending, finished_recving, load_error_block_ids, report: d.bytes() })
    }
    fn clear(&mut self) -> Result<(), Error> {
        self.call(vec![CLEAR]).map(drop)
    }
    fn shares_manager(&self) -> bool {
        false
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        drop(self.stdin.take()); // end of input: the worker exits
        let status = self.child.wait().unwrap();
        if !std::thread::panicking() {
            assert!(status.success(), "the worker process failed: {status}");
        }
    }
}

/// What both forms of the scenario leave behind in the scheduler: the transitions of its
/// `requests` (A, B, and V in two processes), and B's three blocks registered in G2
/// (BLOCK_STORED events).
fn check_scheduler(m: &Manager, c: &Connector, requests: u64) {
    let s = c.stats().unwrap();
    let t = |from: SlotState, to: SlotState| s.transitions[from as usize][to as usize];
    assert_eq!(s.transitions[0][SlotState::Initialized as usize], requests);
    assert_eq!(t(SlotState::OnboardStaged, SlotState::Onboarding), requests - 1);
    assert_eq!(t(SlotState::Prefilling, SlotState::Finishing), requests - 1);
    assert_eq!(t(SlotState::Decoding, SlotState::Finishing), 1);
    assert_eq!(t(SlotState::Finishing, SlotState::Finished), requests);
    assert_eq!(t(SlotState::Prefilling, SlotState::Decoding), 1);
    assert_eq!((s.stored_blocks, s.store_failures, s.load_errors, s.preemptions), (3, 0, 0, 0));
    let stored: Vec<Event> = c.take_events(64).into_iter()
        .filter(|e| matches!(e, Event::BlockStored { tier, .. } if *tier == Tier::G2 as u32))
        .collect();
    assert_eq!(stored.len(), 3, "{stored:?}");
    m.check().unwrap();
}

fn seed003_in_one_process() {
    let g1 = G1::new();
    let m = Manager::new(&manager_config()).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Both)).unwrap();
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64).unwrap();
    let lines = seed003::run(&m, &c, &mut seed003::LocalWorker { c: &c, g1: &g1 }).unwrap();
    assert_eq!(lines.join("\n") + "\n", TRANSCRIPT);
    assert_eq!(c.stats().unwrap().loaded_blocks, 2);
    check_scheduler(&m, &c, 2);
    // B's tokens: its three blocks under the connector's salt, none under a tenant's; none
    // after a reset.
    let b: Vec<u32> = (1000..1032).chain(2000..2020).collect();
    let tenant = kvtier::hash_salt(b"tenant-1");
    assert_eq!(c.get_num_new_matched_tokens_salted("T", tenant, &b, 0).unwrap(), (0, false));
    assert_eq!(c.get_num_new_matched_tokens("U", &b, 0).unwrap(), (48, false));
    c.request_finished("U").unwrap();
    c.reset_cache().unwrap();
    assert_eq!(c.get_num_new_matched_tokens("V", &b, 0).unwrap(), (0, false));
    m.check().unwrap();
}

fn seed003_in_two_processes() {
    // The scheduler's manager holds no KV bytes: chunk_bytes 0.
    let m = Manager::new(&kvtier::Config { chunk_bytes: 0, ..manager_config() }).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Scheduler)).unwrap();
    let mut w = RemoteWorker::spawn();
    // Metadata that does not decode is refused by the worker, which then goes on.
    let refused = w.step(b"\x93not metadata", &[], &[]).unwrap_err();
    assert_eq!(refused.status, Status::Corrupt, "{refused:?}");
    // A scheduler has no worker half.
    assert_eq!(c.bind_connector_metadata(b"").unwrap_err().status, Status::State);
    let lines = seed003::run(&m, &c, &mut w).unwrap();
    assert_eq!(lines.join("\n") + "\n", TRANSCRIPT);
    // The check of G2's bytes loaded B's three blocks once more, as request V.
    assert_eq!(c.stats().unwrap().loaded_blocks, 5);
    check_scheduler(&m, &c, 3);
}

fn bad_input_is_refused_and_harms_nothing() {
    let g1 = G1::new();
    let m = Manager::new(&manager_config()).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Both)).unwrap();
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64).unwrap();
    let status = |r: Result<(), Error>| r.unwrap_err().status;
    let tokens: Vec<u32> = (1000..1040).collect();

    assert_eq!(status(c.update_state_after_alloc("nobody", &[1], 0)), Status::NotFound);
    assert_eq!(status(c.request_finished("nobody").map(drop)), Status::NotFound);
    assert_eq!(status(c.request_preempted("nobody")), Status::NotFound);
    assert_eq!(status(c.slot_state("nobody").map(drop)), Status::NotFound);
    assert_eq!(status(c.get_num_new_matched_tokens("a\0b", &tokens, 0).map(drop)),
               Status::InvalidArgument);

    assert_eq!(c.get_num_new_matched_tokens("A", &tokens, 0).unwrap(), (0, false));
    c.update_state_after_alloc("A", &[1, 2, 3], 0).unwrap();
    let req = ScheduledRequest { req_id: "A", num_computed_tokens: 0, num_scheduled_tokens: 40,
                                 ..Default::default() };
    let meta = c.build_connector_meta(&[req]).unwrap();
    assert_eq!(status(c.bind_connector_metadata(b"not msgpack")), Status::Corrupt);
    assert_eq!(status(c.bind_connector_metadata(&meta[..meta.len() - 1])), Status::Corrupt);
    assert_eq!(status(c.bind_connector_metadata(&[])), Status::Corrupt);
    assert_eq!(status(c.update_connector_output(&meta)), Status::Corrupt, "metadata is no report");
    assert_eq!(status(c.update_connector_output(b"\xc1")), Status::Corrupt);

    // The request goes on unharmed: its stores run and register.
    let hashes = kvtier::hash_sequence(&tokens, seed003::PAGE, kvtier::hash_salt(b"")).unwrap();
    seed003::worker_step(&c, &g1, &meta, &[(1, hashes[0]), (2, hashes[1])], &[]).unwrap();
    assert_eq!(status(c.bind_connector_metadata(&meta)), Status::State, "one is bound");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while c.stats().unwrap().stored_blocks < 2 {
        assert!(std::time::Instant::now() < deadline, "the stores did not end");
        c.update_connector_output(&c.get_finished().unwrap().report).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    c.clear_connector_metadata().unwrap();
    assert!(!c.request_finished("A").unwrap());
    assert_eq!(status(c.request_finished("A").map(drop)), Status::NotFound, "finished is gone");
    assert_eq!(c.slot_state("A").unwrap().0, SlotState::Finished);
    m.check().unwrap();
}

/// B is preempted after a first chunk of its prefill, comes back, loads A's prefix again into
/// other G1 blocks (one of them added by the step, as new_block_ids) and finishes.
fn preempted_b_loads_again_into_other_blocks() {
    use SlotState::*;
    let g1 = G1::new();
    let m = Manager::new(&manager_config()).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Both)).unwrap();
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64).unwrap();
    let w = &mut seed003::LocalWorker { c: &c, g1: &g1 };
    let a: Vec<u32> = (1000..1040).collect();
    let b: Vec<u32> = a[..32].iter().copied().chain(2000..2020).collect();
    let salt = kvtier::hash_salt(b"");
    let (ha, hb) = (kvtier::hash_sequence(&a, seed003::PAGE, salt).unwrap(),
                    kvtier::hash_sequence(&b, seed003::PAGE, salt).unwrap());
    let req = |computed, scheduled, new_block_ids| ScheduledRequest {
        req_id: "B", num_computed_tokens: computed, num_scheduled_tokens: scheduled, new_block_ids,
        ..Default::default()
    };

    c.get_num_new_matched_tokens("A", &a, 0).unwrap();
    c.update_state_after_alloc("A", &[1, 2, 3], 0).unwrap();
    let first = ScheduledRequest { req_id: "A", num_scheduled_tokens: 40, ..Default::default() };
    seed003::engine_step(&c, w, &[first], &[(1, ha[0]), (2, ha[1])], &[], 2, 0).unwrap();
    c.request_finished("A").unwrap();

    assert_eq!(c.get_num_new_matched_tokens("B", &b, 0).unwrap(), (32, false));
    c.update_state_after_alloc("B", &[4, 5, 6, 7], 32).unwrap();
    let (same, _) = seed003::engine_step(&c, w, &[req(32, 8, &[])], &[], &[(4, 1), (5, 2)], 2, 2).unwrap();
    assert_eq!(same, 2);
    c.request_preempted("B").unwrap();
    assert_eq!(c.slot_state("B").unwrap().0, Preempted);
    c.handle_preemptions(&["B", "nobody", "A"]).unwrap();
    for blk in 4..8 {
        g1.write_kv(blk, 0); // the engine reuses B's blocks
    }

    assert_eq!(c.get_num_new_matched_tokens("B", &b, 0).unwrap(), (32, false));
    assert_eq!(c.slot_state("B").unwrap().0, OnboardStaged);
    c.update_state_after_alloc("B", &[10, 11, 12], 32).unwrap();
    let (same, _) = seed003::engine_step(&c, w, &[req(32, 20, &[13])], &[(12, hb[2])],
                                         &[(10, 1), (11, 2)], 3, 4).unwrap();
    assert_eq!(same, 2, "B's second load did not bring A's bytes");
    assert!(!c.request_finished("B").unwrap());
    assert_eq!(c.slot_state("B").unwrap().1,
               [Initialized, OnboardStaged, Onboarding, Prefilling, Preempted, OnboardStaged,
                Onboarding, Prefilling, Finishing, Finished]);
    let s = c.stats().unwrap();
    assert_eq!((s.preemptions, s.transitions[Preempted as usize][OnboardStaged as usize]), (1, 1));
    let g2 = m.match_prefix(&hb, Tier::G2).unwrap();
    m.release(&g2).unwrap();
    assert_eq!(g2.len(), 3);
    m.check().unwrap();
}

/// The worker half's calls on a thread of their own, as an engine whose model runner is not
/// its scheduler would make them.
struct ThreadWorker {
    calls: std::sync::mpsc::Sender<Box<dyn FnOnce(&mut dyn Worker) + Send>>,
}

impl ThreadWorker {
    fn run<T: Send + 'static>(&mut self, f: impl FnOnce(&mut dyn Worker) -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.calls.send(Box::new(move |w: &mut dyn Worker| tx.send(f(w)).unwrap())).unwrap();
        rx.recv().unwrap()
    }
}

impl Worker for ThreadWorker {
    fn step(&mut self, meta: &[u8], writes: &[(u32, u64)], same: &[(u32, u32)]) -> Result<usize, Error> {
        let (meta, writes, same) = (meta.to_vec(), writes.to_vec(), same.to_vec());
        self.run(move |w| w.step(&meta, &writes, &same))
    }
    fn get_finished(&mut self) -> Result<Finished, Error> {
        self.run(|w| w.get_finished())
    }
    fn clear(&mut self) -> Result<(), Error> {
        self.run(|w| w.clear())
    }
    fn shares_manager(&self) -> bool {
        true
    }
}

/// The scheduler half on this thread, the worker half on another, and a third reading the
/// counters and B's state all along: the transcript is seed 003's.
fn halves_on_three_threads() {
    let g1 = G1::new();
    let m = Manager::new(&manager_config()).unwrap();
    let c = Connector::new(&m, &connector_config(Role::Both)).unwrap();
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = std::sync::Barrier::new(2);
    let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce(&mut dyn Worker) + Send>>();
    let lines = std::thread::scope(|s| {
        s.spawn(|| {
            let mut w = seed003::LocalWorker { c: &c, g1: &g1 };
            for call in rx {
                call(&mut w);
            }
        });
        let reader = s.spawn(|| {
            started.wait();
            loop {
                c.stats().unwrap();
                if let Err(e) = c.slot_state("B") {
                    assert_eq!(e.status, Status::NotFound, "{e:?}");
                }
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
            }
        });
        started.wait();
        let lines = seed003::run(&m, &c, &mut ThreadWorker { calls: tx });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap();
        lines.unwrap()
    });
    assert_eq!(lines.join("\n") + "\n", TRANSCRIPT);
}

fn main() {
    if std::env::var_os(WORKER_ENV).is_some() {
        return worker_main();
    }
    let tests: [(&str, fn()); 5] = [
        ("seed003_in_one_process", seed003_in_one_process),
        ("seed003_in_two_processes", seed003_in_two_processes),
        ("preempted_b_loads_again_into_other_blocks", preempted_b_loads_again_into_other_blocks),
        ("halves_on_three_threads", halves_on_three_threads),
        ("bad_input_is_refused_and_harms_nothing", bad_input_is_refused_and_harms_nothing),
    ];
    // libtest's interface, in short: name filters, and its summary line.
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let ok = std::panic::catch_unwind(test).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if ok { passed += 1 } else { failed += 1 }
    }
    println!("test result: {}. {passed} passed; {failed} failed",
             if failed == 0 { "ok" } else { "FAILED" });
    std::process::exit(i32::from(failed > 0));
}
