//! The cost of one kvt_tier_match_prefix of one block from Rust (docs/BENCHMARKS.md): prints
//! the median over 5 rounds of ns per call.
use kvtier::{Config, Manager, Tier};
use std::time::Instant;

fn main() -> Result<(), kvtier::Error> {
    let m = Manager::new(&Config { page_size: 4, chunk_bytes: 64, g1_blocks: 64, g2_blocks: 0,
                                   ..Default::default() })?;
    let b = m.alloc(1, Tier::G1)?;
    let b = m.register_hashes(&b, &[99], 0)?;
    m.release(&b)?;
    let h = [99u64];
    let n = 1_000_000;
    let mut rounds = Vec::new();
    let mut out = Vec::with_capacity(1);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            m.match_prefix_into(&h, Tier::G1, &mut out)?; // an FFI call: nothing to elide
        }
        rounds.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("rust {:.1} ns/call", rounds[2]);
    Ok(())
}
