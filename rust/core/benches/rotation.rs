//! Rotation plan throughput (tokens/s): what the draft worker's prefill pays
//! per batch to build the index of its rotated `input_ids` (and of
//! `mm_input_embeds`), for the same batch mixes as the pruning bench.
//!
//! `cargo bench -p flatgather-core --bench rotation` runs it; criterion keeps
//! the last run as the baseline and reports the change against it.

mod common;

use common::{batch, BATCHES, MIXES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::RotationPlan;
use std::hint::black_box;

fn bench_rotation(c: &mut Criterion) {
    for mix in MIXES {
        for embeds in [false, true] {
            let what = if embeds { "ids+embeds" } else { "ids" };
            let mut group = c.benchmark_group(format!("rotation/{}/{what}", mix.name()));
            for b in BATCHES {
                let (lens, _) = batch(mix, b);
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
