//! The management endpoint on a Unix socket: a real client's requests and replies, the
//! stats counting it and the client turned away, the config's socket modes, and close.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;

use kvtier::{Config, Connector, ConnectorConfig, Endpoint, EndpointConfig, Manager, Role, Status};

fn manager() -> Manager {
    Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks: 8, g2_blocks: 16, ..Default::default() })
        .unwrap()
}

fn ask(c: &mut BufReader<UnixStream>, request: &str) -> String {
    c.get_mut().write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    c.read_line(&mut line).unwrap();
    line
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_client_is_served_counted_and_one_too_many_turned_away() {
    let dir = temp_dir("endpoint");
    let path = dir.join("e.sock");
    let m = manager();
    let cfg = EndpointConfig { max_clients: 1, client_buffer_bytes: 8192, ..Default::default() };
    let e = Endpoint::open_with(&m, None, &path, &cfg).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let s = e.stats().unwrap();
    assert_eq!((s.clients, s.refused, s.dropped), (0, 0, 0));
    assert_eq!(Endpoint::open(&m, None, &path).err().unwrap().status, Status::State); // served

    let mut a = BufReader::new(UnixStream::connect(&path).unwrap());
    let tiers = ask(&mut a, r#"{"cmd":"tiers"}"#);
    assert!(tiers.contains(r#""ok":true"#) && tiers.contains(r#""capacity":16"#), "{tiers}");
    // The endpoint counts its clients after serving them: a second reply follows the count.
    let metrics = ask(&mut a, r#"{"cmd":"metrics"}"#);
    assert!(metrics.contains("kvtier_"), "{metrics}");
    let s = e.stats().unwrap();
    assert_eq!(s.clients, 1);
    assert!(s.peak_buffered_bytes >= metrics.len() as u64 - 1, "{s:?}");

    let mut b = BufReader::new(UnixStream::connect(&path).unwrap());
    let mut refused = String::new();
    b.read_line(&mut refused).unwrap();
    assert!(refused.contains("too many clients (1)"), "{refused}");
    assert_eq!(e.stats().unwrap().refused, 1);

    drop(a);
    // Wait for the endpoint to notice the client left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while e.stats().unwrap().clients != 0 {
        assert!(std::time::Instant::now() < deadline, "the client is still counted");
        std::thread::yield_now();
    }
    drop(e);
    assert!(!path.exists(), "close removes the socket");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_connectors_endpoint_shows_its_slots_and_the_allowed_users_set_the_mode() {
    let dir = temp_dir("endpoint-conn");
    let m = manager();
    let c = Connector::new(&m, &ConnectorConfig { role: Role::Scheduler, num_gpu_blocks: 8, ..Default::default() })
        .unwrap();
    c.get_num_new_matched_tokens("req-7", &[1, 2, 3, 4, 5], 0).unwrap();
    let path = dir.join("c.sock");
    let e = Endpoint::open(&m, Some(&c), &path).unwrap();
    let mut a = BufReader::new(UnixStream::connect(&path).unwrap());
    let slots = ask(&mut a, r#"{"cmd":"slots"}"#);
    assert!(slots.contains(r#""req_id":"req-7""#) && slots.contains("INITIALIZED"), "{slots}");
    drop(a);
    drop(e);

    let me = std::fs::metadata(&dir).unwrap();
    let (uid, gid) = (me.uid(), me.gid());
    let gid_path = dir.join("g.sock");
    let e = Endpoint::open_with(&m, None, &gid_path, &EndpointConfig { allow_gid: Some(gid), ..Default::default() })
        .unwrap();
    let md = std::fs::metadata(&gid_path).unwrap();
    assert_eq!((md.permissions().mode() & 0o777, md.gid()), (0o660, gid));
    drop(e);
    let uid_path = dir.join("u.sock");
    let e = Endpoint::open_with(&m, None, &uid_path, &EndpointConfig { allow_uid: Some(uid), ..Default::default() })
        .unwrap();
    assert_eq!(std::fs::metadata(&uid_path).unwrap().permissions().mode() & 0o777, 0o666);
    drop(e);
    let bad = EndpointConfig { max_clients: 0, ..Default::default() };
    assert_eq!(Endpoint::open_with(&m, None, &dir.join("x.sock"), &bad).err().unwrap().status,
               Status::InvalidArgument);
    let d = EndpointConfig::default();
    assert_eq!((d.max_clients, d.allow_uid, d.allow_gid, d.client_buffer_bytes), (64, None, None, 256 << 10));
    drop(c);
    std::fs::remove_dir_all(&dir).unwrap();
}
