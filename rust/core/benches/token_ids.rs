//! Token-ids plan throughput (values/s): what one call of the token-id
//! input-logprob function pays to list every `(row, id)` pair of a chunk,
//! for the same batch mixes as the pruning bench (each request's scored rows
//! from its logprob start to its end, three token ids each).
//!
//! `cargo bench -p flatgather-core --bench token_ids` runs it; criterion
//! keeps the last run as the baseline and reports the change against it.

mod common;

use common::{batch, BATCHES, MIXES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::{TokenIdsPlan, Walk};
use std::hint::black_box;

const IDS: [i64; 3] = [11, 500, 1023];

fn bench_token_ids(c: &mut Criterion) {
    for mix in MIXES {
        let mut group = c.benchmark_group(format!("token_ids/{}", mix.name()));
        for b in BATCHES {
            let (extend, start) = batch(mix, b);
            let lens: Vec<i64> = extend.iter().zip(&start).map(|(e, s)| e - s).collect();
            let rows: i64 = lens.iter().sum();
            let ids: Vec<Option<&[i64]>> = vec![Some(&IDS[..]); b];
            let walk = Walk::chunk(rows, 0);
            let plan = TokenIdsPlan::new(&lens, &ids, 1024, walk).unwrap();
            let mut out = vec![0i64; plan.buffer_len(false)];
            group.throughput(Throughput::Elements(plan.num_values() as u64));
            let id = BenchmarkId::new(format!("B={b}"), format!("{}values", plan.num_values()));
            // What the binding does per call (past reading the Python lists):
            // walk the requests, then write the flat index of every value.
            group.bench_with_input(id, &lens, |bench, lens| {
                bench.iter(|| {
                    let plan = TokenIdsPlan::new(black_box(lens), &ids, 1024, walk).unwrap();
                    plan.fill(black_box(&mut out), false).unwrap();
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_token_ids);
criterion_main!(benches);
