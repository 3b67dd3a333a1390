//! Plan building throughput (tokens/s) for realistic batch mixes.
//!
//! `cargo bench -p flatgather-core` runs it; criterion keeps the last run as
//! the baseline and reports the change against it. `--save-baseline NAME` /
//! `--baseline NAME` pin a named one.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::PrunePlan;
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
    /// Chat turns: 16..256 new tokens, logprobs over all of them.
    Chat,
    /// Long prompts: 1k..8k tokens, logprobs from a random start.
    LongPrompt,
    /// Serving mix: chat turns, long prompts, and a quarter chunked-prefill
    /// chunks with start == extend (no input logprob, one row kept).
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

    fn request(self, rng: &mut Rng) -> (i64, i64) {
        match self {
            Mix::Chat => (16 + rng.below(241), 0),
            Mix::LongPrompt => {
                let e = 1024 + rng.below(7 * 1024 + 1);
                (e, rng.below(e))
            }
            Mix::Mixed => match rng.below(4) {
                0 => {
                    let e = 512 + rng.below(1537);
                    (e, e)
                }
                1 => {
                    let e = 1024 + rng.below(3 * 1024 + 1);
                    (e, rng.below(e))
                }
                _ => (16 + rng.below(241), 0),
            },
        }
    }
}

const MAX_BATCH_TOKENS: i64 = 256 * 1024;

/// `batch` requests of `mix`, each shrunk in proportion so the batch stays
/// within 256k tokens, as a token budget would.
fn batch(mix: Mix, batch: usize) -> (Vec<i64>, Vec<i64>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ batch as u64);
    let raw: Vec<(i64, i64)> = (0..batch).map(|_| mix.request(&mut rng)).collect();
    let total: i64 = raw.iter().map(|r| r.0).sum();
    let scale = (MAX_BATCH_TOKENS as f64 / total as f64).min(1.0);
    raw.into_iter()
        .map(|(e, s)| {
            let e2 = ((e as f64 * scale) as i64).max(1);
            // Keep the request's kind: start == extend stays so, else scale.
            let s2 = if s == e {
                e2
            } else {
                ((s as f64 * scale) as i64).min(e2 - 1)
            };
            (e2, s2)
        })
        .unzip()
}

fn bench_plan(c: &mut Criterion) {
    for mix in [Mix::Chat, Mix::LongPrompt, Mix::Mixed] {
        let mut group = c.benchmark_group(format!("plan/{}", mix.name()));
        for b in [1usize, 8, 64, 256, 1024, 4096] {
            let (extend, start) = batch(mix, b);
            let tokens: i64 = extend.iter().sum();
            let plan = PrunePlan::new(&extend, &start).unwrap();
            let mut out = vec![0i64; plan.layout(true).len()];
            group.throughput(Throughput::Elements(tokens as u64));
            let id = BenchmarkId::new(format!("B={b}"), format!("{tokens}tok"));
            // What the binding does per call: validate, then write every index set.
            group.bench_with_input(id, &(extend, start), |bench, (extend, start)| {
                bench.iter(|| {
                    let plan = PrunePlan::new(black_box(extend), black_box(start)).unwrap();
                    plan.fill(black_box(&mut out), true).unwrap();
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
