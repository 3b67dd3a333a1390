//! Rotation plan throughput (tokens/s): what the draft worker's prefill pays
//! per batch to build the index of its rotated `input_ids` (and of
//! `mm_input_embeds`), for realistic batch mixes.
//!
//! `cargo bench -p flatgather-core --bench rotation` runs it; criterion keeps
//! the last run as the baseline and reports the change against it.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::RotationPlan;
use std::hint::black_box;

/// A small deterministic generator (xorshift64*), so every run benches the same batches.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: i64) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as i64 % n
    }
}

#[derive(Clone, Copy)]
enum Mix {
    /// Chat turns: 16..256 new tokens each.
    Chat,
    /// Long prompts: 1k..8k tokens each.
    LongPrompt,
    /// Serving mix: chat turns, long prompts, a quarter chunked-prefill
    /// chunks, and one request in eight a single token (the shortest
    /// rotation: only the tail).
    Mixed,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Chat => "chat",
            Mix::LongPrompt => "long_prompt",
            Mix::Mixed => "mixed",
        }
    }

    fn request(self, rng: &mut Rng) -> i64 {
        match self {
            Mix::Chat => 16 + rng.below(241),
            Mix::LongPrompt => 1024 + rng.below(7 * 1024 + 1),
            Mix::Mixed => match rng.below(8) {
                0 | 1 => 512 + rng.below(1537),
                2 => 1024 + rng.below(3 * 1024 + 1),
                3 => 1,
                _ => 16 + rng.below(241),
            },
        }
    }
}

const MAX_BATCH_TOKENS: i64 = 256 * 1024;

/// `batch` requests of `mix`, each shrunk in proportion so the batch stays
/// within 256k tokens, as a token budget would.
fn batch(mix: Mix, batch: usize) -> Vec<i64> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ batch as u64);
    let raw: Vec<i64> = (0..batch).map(|_| mix.request(&mut rng)).collect();
    let total: i64 = raw.iter().sum();
    let scale = (MAX_BATCH_TOKENS as f64 / total as f64).min(1.0);
    raw.into_iter()
        .map(|e| ((e as f64 * scale) as i64).max(1))
        .collect()
}

fn bench_rotation(c: &mut Criterion) {
    for mix in [Mix::Chat, Mix::LongPrompt, Mix::Mixed] {
        for embeds in [false, true] {
            let what = if embeds { "ids+embeds" } else { "ids" };
            let mut group = c.benchmark_group(format!("rotation/{}/{what}", mix.name()));
            for b in [1usize, 8, 64, 256, 1024, 4096] {
                let lens = batch(mix, b);
                let tokens: i64 = lens.iter().sum();
                let plan = RotationPlan::new(&lens).unwrap();
                let mut out = vec![0i64; plan.buffer_len(embeds)];
                group.throughput(Throughput::Elements(tokens as u64));
                let id = BenchmarkId::new(format!("B={b}"), format!("{tokens}tok"));
                // What the binding does per call: validate, then write the index.
                group.bench_with_input(id, &lens, |bench, lens| {
                    bench.iter(|| {
                        let plan = RotationPlan::new(black_box(lens)).unwrap();
                        plan.fill(black_box(&mut out), embeds).unwrap();
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench_rotation);
criterion_main!(benches);
