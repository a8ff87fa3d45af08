//! A connector or endpoint leaked with mem::forget: its manager (and connector) are leaked
//! rather than destroyed under the library's threads, which keep working; with memory of the
//! engine's in the library, dropping such a manager aborts the process instead.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use kvtier::{Config, Connector, ConnectorConfig, Endpoint, G1Layout, Manager, MemoryKind, Role,
             Status};

/// The tests look at this process's descriptors, which the others open and close: one at a
/// time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> Config {
    Config { page_size: 4, num_layers: 1, num_outer: 2, chunk_bytes: 64, g1_blocks: 8,
             g2_blocks: 16, ..Default::default() }
}

fn connector(m: &Manager) -> Connector<'_> {
    Connector::new(m, &ConnectorConfig { role: Role::Both, num_gpu_blocks: 8, ..Default::default() })
        .unwrap()
}

/// What descriptor `fd` of this process is, None when it is closed.
fn fd_target(fd: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

fn ask(c: &mut BufReader<UnixStream>, request: &str) -> String {
    c.get_mut().write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    c.read_line(&mut line).unwrap();
    line
}

#[test]
fn a_forgotten_connector_leaks_its_manager_and_a_dropped_one_does_not() {
    let _serial = serial();
    // Dropped: the manager is destroyed, its event descriptor closed.
    let m = Manager::new(&config()).unwrap();
    let fd = m.as_raw_fd();
    assert!(fd_target(fd).is_some());
    drop(connector(&m));
    drop(m);
    assert_eq!(fd_target(fd), None, "a manager with no child left is destroyed");

    // Forgotten: its copy threads may still use the manager, which is leaked, not destroyed.
    let m = Manager::new(&config()).unwrap();
    let fd = m.as_raw_fd();
    let target = fd_target(fd);
    let c = connector(&m);
    assert_eq!(c.get_num_new_matched_tokens("r", &[1, 2, 3, 4, 5], 0).unwrap(), (0, false));
    std::mem::forget(c);
    drop(m);
    assert!(target.is_some());
    assert_eq!(fd_target(fd), target, "the leaked manager keeps its descriptor");

    // close says so, and leaks it too.
    let m = Manager::new(&config()).unwrap();
    std::mem::forget(connector(&m));
    let e = m.close().unwrap_err();
    assert_eq!(e.status, Status::State);
    assert!(e.message.contains("leaked"), "{}", e.message);
    // A manager whose connector was dropped closes as before.
    let m = Manager::new(&config()).unwrap();
    drop(connector(&m));
    m.close().unwrap();
}

#[test]
fn a_forgotten_endpoint_keeps_serving_its_leaked_connector_and_manager() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("kvtier-rust-leaks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("e.sock");
    let m = Manager::new(&config()).unwrap();
    let c = connector(&m);
    c.get_num_new_matched_tokens("req-9", &[1, 2, 3, 4, 5], 0).unwrap();
    std::mem::forget(Endpoint::open(&m, Some(&c), &path).unwrap());
    drop(c);
    drop(m);
    // The endpoint's threads still read the connector and the manager: both are alive.
    let mut a = BufReader::new(UnixStream::connect(&path).unwrap());
    let slots = ask(&mut a, r#"{"cmd":"slots"}"#);
    assert!(slots.contains(r#""req_id":"req-9""#) && slots.contains("INITIALIZED"), "{slots}");
    let tiers = ask(&mut a, r#"{"cmd":"tiers"}"#);
    assert!(tiers.contains(r#""ok":true"#) && tiers.contains(r#""capacity":16"#), "{tiers}");
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Set in the child process that runs `engine_memory_makes_a_leaked_manager_abort`'s leak.
const CHILD: &str = "KVTIER_LEAKS_TEST_CHILD";

#[test]
fn engine_memory_makes_a_leaked_manager_abort() {
    let cfg = config();
    let slot = cfg.chunk_bytes as usize;
    let with_layout = |memory: &'static mut [u8]| {
        let base = memory.as_mut_ptr();
        // Safety: the memory is leaked, so it outlives the manager, and holds every slot of
        // both chunks (outer 0 in the first half, outer 1 in the second).
        let layout = unsafe {
            G1Layout::new(MemoryKind::Host, 0, &[base, base.wrapping_add(8 * slot)],
                          &[slot as u64, slot as u64])
        };
        Manager::new(&Config { g1_layout: Some(layout), ..config() }).unwrap()
    };
    let memory = || Box::leak(vec![0u8; 2 * 8 * slot].into_boxed_slice());
    if std::env::var_os(CHILD).is_some() {
        let m = with_layout(memory());
        std::mem::forget(connector(&m));
        drop(m); // aborts: a leaked manager would keep using the engine's memory
        unreachable!("dropping the manager returned");
    }
    // With every child dropped, such a manager is destroyed as usual.
    let m = with_layout(memory());
    drop(connector(&m));
    drop(m);

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "engine_memory_makes_a_leaked_manager_abort", "--nocapture",
               "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(6), "SIGABRT expected: {out:?}");
}
