//! The library's diagnostics to a closure. One test: the handler is process-wide.
use kvtier::{Config, LogLevel, Manager};
use std::sync::{Arc, Mutex};

fn stale_g3_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kvtier-g3-999999-00000000deadbeef.bin");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    path
}

fn with_g3(dir: &std::path::Path) {
    Manager::new(&Config { g1_blocks: 4, g3_blocks: 4, g3_path: Some(dir.into()), ..Default::default() })
        .unwrap();
}

#[test]
fn the_handler_gets_the_librarys_messages_at_its_level() {
    let dir = std::env::temp_dir().join(format!("kvtier-rust-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    kvtier::set_log_handler(LogLevel::Info, move |level, message| {
        sink.lock().unwrap().push((level, message.to_string()))
    });
    let path = stale_g3_file(&dir);
    with_g3(&dir);
    assert!(!path.exists());
    {
        let got = got.lock().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(got.iter().any(|(l, m)| *l == LogLevel::Info && m.contains(name)), "{got:?}");
    }
    got.lock().unwrap().clear();
    let sink = got.clone();
    kvtier::set_log_handler(LogLevel::Warn, move |level, message| {
        sink.lock().unwrap().push((level, message.to_string()))
    });
    stale_g3_file(&dir);
    with_g3(&dir); // INFO is above WARN: not sent
    kvtier::clear_log_handler();
    stale_g3_file(&dir);
    with_g3(&dir);
    assert!(got.lock().unwrap().is_empty());
    std::fs::remove_dir(&dir).unwrap();
}
