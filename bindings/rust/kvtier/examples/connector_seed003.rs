//! Seed 003 through the connector: request A computes two blocks that are stored to G2;
//! request B shares A's prefix, loads it from G2 into its own G1 blocks and computes the
//! rest. Prints the transcript of the C example examples/connector_seed003, line for line.
//! tests/connector.rs runs this file's scenario (`run`) in one process and in two.
use std::time::{Duration, Instant};

use kvtier::{
    Config, Connector, ConnectorConfig, Error, Finished, G1Layout, Manager, MemoryKind,
    OffloadMode, Role, ScheduledRequest, Status, Tier,
};

pub const PAGE: u32 = 16;
pub const LAYERS: u32 = 2;
pub const OUTER: u32 = 2;
pub const CHUNK: usize = 256;
pub const BLOCK: usize = CHUNK * (LAYERS * OUTER) as usize;
pub const GPU_BLOCKS: usize = 100;

/// Both processes' manager: the same page size and G2 capacity; its own G1 is unused.
pub fn manager_config() -> Config {
    Config { page_size: PAGE, num_layers: LAYERS, num_outer: OUTER, chunk_bytes: CHUNK as u64,
             g1_blocks: 1, g2_blocks: 50, g3_blocks: 0, ..Default::default() }
}

pub fn connector_config(role: Role) -> ConnectorConfig {
    ConnectorConfig { role, offload: OffloadMode::Eager, store_tier: Tier::G2,
                      num_gpu_blocks: GPU_BLOCKS as u64, load_async: false,
                      ..Default::default() }
}

/// Byte k of the KV of the full block whose sequence hash is h.
pub fn kv_byte(h: u64, k: usize) -> u8 {
    ((h >> (8 * (k % 8))) as u8) ^ (k / 8) as u8
}

/// The engine's G1: GPU_BLOCKS blocks of BLOCK bytes in host memory; block b is bytes
/// [b * BLOCK, (b + 1) * BLOCK). Declare it before the manager, so that it outlives it.
pub struct G1 {
    p: *mut u8,
}

// Shared like GPU memory: the library's copy thread reads and writes it too, and the engine
// touches a block only while no copy uses it.
unsafe impl Send for G1 {}
unsafe impl Sync for G1 {}

impl G1 {
    pub fn new() -> G1 {
        G1 { p: Box::into_raw(vec![0u8; GPU_BLOCKS * BLOCK].into_boxed_slice()).cast() }
    }

    pub fn layout(&self) -> G1Layout {
        let bases: Vec<*mut u8> = (0..(LAYERS * OUTER) as usize)
            .map(|i| unsafe { self.p.add(i * CHUNK) })
            .collect();
        // Safety: the buffer holds every block and lives until G1 is dropped, after the
        // manager; the engine touches a block only while no copy uses it.
        unsafe { G1Layout::new(MemoryKind::Host, 0, &bases, &[BLOCK as u64; 4]) }
    }

    fn block(&self, b: u32) -> *mut u8 {
        assert!((b as usize) < GPU_BLOCKS);
        unsafe { self.p.add(b as usize * BLOCK) }
    }

    /// The engine's forward: block b gets the KV of hash h.
    pub fn write_kv(&self, b: u32, h: u64) {
        for k in 0..BLOCK {
            unsafe { *self.block(b).add(k) = kv_byte(h, k) };
        }
    }

    /// Whether blocks a and b hold the same bytes.
    pub fn same(&self, a: u32, b: u32) -> bool {
        unsafe {
            std::slice::from_raw_parts(self.block(a), BLOCK)
                == std::slice::from_raw_parts(self.block(b), BLOCK)
        }
    }
}

impl Drop for G1 {
    fn drop(&mut self) {
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.p, GPU_BLOCKS * BLOCK)) });
    }
}

/// The worker half of one engine step: load, compare the blocks of `same` (pairs of G1
/// blocks) once loaded, forward (write `writes`: G1 block and hash), save. Returns how many
/// pairs held the same bytes.
pub fn worker_step(c: &Connector, g1: &G1, meta: &[u8], writes: &[(u32, u64)],
                   same: &[(u32, u32)]) -> Result<usize, Error> {
    c.bind_connector_metadata(meta)?;
    c.start_load_kv()?;
    for l in 0..LAYERS {
        c.wait_for_layer_load(l)?;
    }
    let matching = same.iter().filter(|(a, b)| g1.same(*a, *b)).count();
    for (b, h) in writes {
        g1.write_kv(*b, *h);
    }
    for l in 0..LAYERS {
        c.save_kv_layer(l)?;
    }
    c.wait_for_save()?;
    Ok(matching)
}

/// The worker half, in this process or another.
pub trait Worker {
    /// One step (see worker_step).
    fn step(&mut self, meta: &[u8], writes: &[(u32, u64)], same: &[(u32, u32)]) -> Result<usize, Error>;
    fn get_finished(&mut self) -> Result<Finished, Error>;
    fn clear(&mut self) -> Result<(), Error>;
    /// Whether its G2 is the scheduler's manager's (one process), so that G2's bytes can be
    /// read there.
    fn shares_manager(&self) -> bool;
}

/// The worker half of a ROLE_BOTH connector.
pub struct LocalWorker<'a> {
    pub c: &'a Connector<'a>,
    pub g1: &'a G1,
}

impl Worker for LocalWorker<'_> {
    fn step(&mut self, meta: &[u8], writes: &[(u32, u64)], same: &[(u32, u32)]) -> Result<usize, Error> {
        worker_step(self.c, self.g1, meta, writes, same)
    }
    fn get_finished(&mut self) -> Result<Finished, Error> {
        self.c.get_finished()
    }
    fn clear(&mut self) -> Result<(), Error> {
        self.c.clear_connector_metadata()
    }
    fn shares_manager(&self) -> bool {
        true
    }
}

/// One engine step from the scheduler's side: build the metadata, run the worker's step,
/// then pass the worker's reports on until the stats show `stores` and `loads` (5 s at
/// most). Returns the worker's matching pairs and the requests finished receiving.
pub fn engine_step(sched: &Connector, w: &mut dyn Worker, reqs: &[ScheduledRequest],
                   writes: &[(u32, u64)], same: &[(u32, u32)], stores: u64, loads: u64)
                   -> Result<(usize, Vec<String>), Error> {
    let meta = sched.build_connector_meta(reqs)?;
    let matching = w.step(&meta, writes, same)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut recving = Vec::new();
    loop {
        let f = w.get_finished()?;
        recving.extend(f.finished_recving);
        sched.update_connector_output(&f.report)?;
        let s = sched.stats()?;
        if s.stored_blocks >= stores && s.loaded_blocks >= loads {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error { status: Status::Timeout, message: format!(
                "after 5 s: stored {} loaded {}, waiting for {stores} and {loads}",
                s.stored_blocks, s.loaded_blocks) });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    w.clear()?;
    Ok((matching, recving))
}

fn states(sched: &Connector, id: &str) -> Result<String, Error> {
    let (_, history) = sched.slot_state(id)?;
    Ok(history.iter().map(|s| s.name()).collect::<Vec<_>>().join(" "))
}

/// The scenario, from the scheduler's side (`sched` over manager `m`); returns the
/// transcript's lines.
pub fn run(m: &Manager, sched: &Connector, w: &mut dyn Worker) -> Result<Vec<String>, Error> {
    let salt = kvtier::try_hash_salt(b"")?;
    let a: Vec<u32> = (1000..1040).collect();
    let b: Vec<u32> = a[..32].iter().copied().chain(2000..2020).collect();
    let ha = kvtier::hash_sequence(&a, PAGE, salt)?;
    let hb = kvtier::hash_sequence(&b, PAGE, salt)?;
    let mut out = Vec::new();

    let (n, load_async) = sched.get_num_new_matched_tokens("A", &a, 0)?;
    out.push(format!("A: matched {n} async {}", load_async as u32));
    sched.update_state_after_alloc("A", &[1, 2, 3], 0)?;
    let req = ScheduledRequest { req_id: "A", num_computed_tokens: 0, num_scheduled_tokens: 40,
                                 ..Default::default() };
    engine_step(sched, w, &[req], &[(1, ha[0]), (2, ha[1])], &[], 2, 0)?;
    let s = sched.stats()?;
    out.push(format!("A: stored {} loaded {}", s.stored_blocks, s.loaded_blocks));
    out.push(format!("A: delay_free {}", sched.request_finished("A")? as u32));
    out.push(format!("A: states {}", states(sched, "A")?));

    let (n, load_async) = sched.get_num_new_matched_tokens("B", &b, 0)?;
    out.push(format!("B: matched {n} async {}", load_async as u32));
    sched.update_state_after_alloc("B", &[4, 5, 6, 7], n)?;
    let req = ScheduledRequest { req_id: "B", num_computed_tokens: 32, num_scheduled_tokens: 20,
                                 ..Default::default() };
    let (matching, recving) = engine_step(sched, w, &[req], &[(6, hb[2])], &[(4, 1), (5, 2)], 3, 2)?;
    out.push(format!("B: loaded blocks matching A's {matching}"));
    // none: a synchronous load, which the engine waited for in its step
    let recving = if recving.is_empty() { "none".to_string() } else { recving.join(" ") };
    out.push(format!("B: finished_recving {}", recving));
    let s = sched.stats()?;
    out.push(format!("B: stored {} loaded {}", s.stored_blocks, s.loaded_blocks));
    let req = ScheduledRequest { req_id: "B", num_computed_tokens: 52, num_scheduled_tokens: 1,
                                 new_token_ids: &[3000], ..Default::default() };
    engine_step(sched, w, &[req], &[], &[], 3, 2)?;
    out.push(format!("B: delay_free {}", sched.request_finished("B")? as u32));
    out.push(format!("B: states {}", states(sched, "B")?));

    let g2 = m.match_prefix(&hb, Tier::G2)?;
    let matching = if w.shares_manager() {
        let mut n = 0;
        for (blk, h) in g2.iter().zip(&hb) {
            // Safety: match_prefix pinned the block, and nothing writes it.
            let d = unsafe { m.data(*blk)? };
            n += d.iter().enumerate().all(|(k, x)| *x == kv_byte(*h, k)) as usize;
        }
        n
    } else {
        // G2's bytes are in the worker's process: load B's blocks into fresh G1 blocks as
        // request V, and compare them there with B's (blocks 4, 5, 6).
        let v: Vec<u32> = b[..48].iter().copied().chain([4000]).collect();
        let (n, _) = sched.get_num_new_matched_tokens("V", &v, 0)?;
        sched.update_state_after_alloc("V", &[8, 9, 10, 11], n)?;
        let req = ScheduledRequest { req_id: "V", num_computed_tokens: n, num_scheduled_tokens: 1,
                                     ..Default::default() };
        let (matching, _) = engine_step(sched, w, &[req], &[], &[(8, 4), (9, 5), (10, 6)], 3, 2 + n / 16)?;
        sched.request_finished("V")?;
        matching
    };
    m.release(&g2)?;
    out.push(format!("G2: registered {} matching {matching}", g2.len()));
    Ok(out)
}

#[allow(dead_code)] // tests/connector.rs includes this file for `run`
fn main() -> Result<(), Error> {
    let g1 = G1::new();
    let m = Manager::new(&manager_config())?;
    let c = Connector::new(&m, &connector_config(Role::Both))?;
    c.register_kv_caches(&g1.layout(), GPU_BLOCKS as u64)?;
    for line in run(&m, &c, &mut LocalWorker { c: &c, g1: &g1 })? {
        println!("{line}");
    }
    Ok(())
}
