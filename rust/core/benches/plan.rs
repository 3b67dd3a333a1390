//! Pruning plan throughput (tokens/s) for realistic batch mixes.
//!
//! `cargo bench -p flatgather-core --bench plan` runs it; criterion keeps the
//! last run as the baseline and reports the change against it.
//! `--save-baseline NAME` / `--baseline NAME` pin a named one.

mod common;

use common::{batch, BATCHES, MIXES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::PrunePlan;
use std::hint::black_box;

fn bench_plan(c: &mut Criterion) {
    for mix in MIXES {
        let mut group = c.benchmark_group(format!("plan/{}", mix.name()));
        for b in BATCHES {
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
