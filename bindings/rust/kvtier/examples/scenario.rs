//! Seed 003's two requests through the tiers: the scenario of examples/scenario/scenario.c,
//! line for line the same output.
use kvtier::{Config, Manager, ManagerEvent, Tier};

const PAGE: u32 = 4;

fn kv_byte(h: u64, i: usize) -> u8 {
    ((h >> (8 * (i % 8))) ^ i as u64) as u8
}

fn tokenize(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn main() -> Result<(), kvtier::Error> {
    let m = Manager::new(&Config {
        page_size: PAGE, num_layers: 1, num_outer: 2, chunk_bytes: 64, g1_blocks: 8,
        g2_blocks: 16, g3_blocks: 0, ..Default::default()
    })?;
    let salt = kvtier::try_hash_salt(b"kvtier-scenario")?;

    let a_tokens = tokenize("Hello, world!");
    let a_hash = kvtier::hash_sequence(&a_tokens, PAGE, salt)?;
    let a = m.alloc(a_hash.len(), Tier::G1)?;
    for (b, h) in a.iter().zip(&a_hash) {
        // Safety: the block is ours (one reference) and nobody else writes it.
        let d = unsafe { m.data(*b)? };
        for (i, x) in d.iter_mut().enumerate() {
            *x = kv_byte(*h, i);
        }
    }
    let a = m.register_hashes(&a, &a_hash, 0)?;
    let moved = m.offload(&a, Tier::G2, None, 1)?.wait(None)?;
    m.release(&a)?;
    println!("request A: {} tokens, {} full blocks, computed {}, offloaded {} to G2",
             a_tokens.len(), a_hash.len(), a_hash.len(), moved);
    println!("request A: first block hash 0x{:016x}", a_hash[0]);

    m.pending_events().for_each(drop);
    m.release(&m.alloc(8, Tier::G1)?)?; // evicts A's blocks from G1
    let removed = m.pending_events()
        .filter(|e| matches!(e, ManagerEvent::BlockRemoved { tier: Tier::G1, .. }))
        .count();
    println!("G1 evicted: {removed} blocks removed");

    let b_tokens = tokenize("Hello, world! How are you?");
    let b_hash = kvtier::hash_sequence(&b_tokens, PAGE, salt)?;
    let mut g1 = m.match_prefix(&b_hash, Tier::G1)?;
    let g1_hit = g1.len();
    let g2 = m.match_prefix(&b_hash[g1_hit..], Tier::G2)?;
    let dst = m.alloc(g2.len(), Tier::G1)?;
    let x = m.onboard(&g2, &dst, None, 2)?;
    let moved = x.wait(None)?;
    g1.extend(x.blocks()?);
    drop(x);
    let mut same = true;
    for (b, h) in g1.iter().zip(&a_hash) {
        let d = unsafe { m.data(*b)? };
        same &= d.iter().enumerate().all(|(i, x)| *x == kv_byte(*h, i));
    }
    m.release(&g2)?;
    m.release(&g1)?;
    println!("request B: {} tokens, {} full blocks, G1 hit {}, G2 hit {}, onboarded {}",
             b_tokens.len(), b_hash.len(), g1_hit, g2.len(), moved);
    println!("request B: onboarded bytes equal request A's: {}", if same { "yes" } else { "no" });
    m.check()?;
    if !same {
        std::process::exit(1);
    }
    Ok(())
}
