//! Output-logprob plan throughput (rows/s): what one decode or verify step
//! pays, past reading the Python lists, to lay out every row's top-k and
//! token-id logprobs in one flat tensor. A speculative verify step of B
//! requests scores A = 4 positions each (B * A rows); every request asks
//! for top-5 (half of them for none, in the mixed series) and 4 token ids.
//!
//! `cargo bench -p flatgather-core --bench spec_logprobs` runs it; criterion
//! keeps the last run as the baseline and reports the change against it.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flatgather_core::SpecLogprobsPlan;
use std::hint::black_box;

const A: usize = 4;
const BATCHES: [usize; 4] = [1, 16, 256, 1024];
const VOCAB: i64 = 128_256;
const IDS: [i64; 4] = [11, 500, 1023, -1];

fn bench_spec_logprobs(c: &mut Criterion) {
    let mut group = c.benchmark_group("spec_logprobs");
    for b in BATCHES {
        let rows = b * A;
        group.throughput(Throughput::Elements(rows as u64));
        let uniform = vec![5i64; rows];
        // Every other request without top logprobs: the rows keep 5 or 0.
        let mixed: Vec<i64> = (0..rows)
            .map(|r| if (r / A) % 2 == 0 { 5 } else { 0 })
            .collect();
        for (name, nums) in [("top_k/uniform", &uniform), ("top_k/mixed", &mixed)] {
            group.bench_with_input(
                BenchmarkId::new(name, format!("B={b}")),
                nums,
                |bench, nums| {
                    bench.iter(|| {
                        let plan =
                            SpecLogprobsPlan::top_k(black_box(nums), rows as i64, VOCAB).unwrap();
                        black_box(plan.split_sizes())
                    })
                },
            );
        }
        let ids: Vec<Option<&[i64]>> = vec![Some(&IDS[..]); rows];
        let mut out = vec![0i64; rows * IDS.len()];
        group.bench_with_input(
            BenchmarkId::new("token_ids", format!("B={b}")),
            &ids,
            |bench, ids| {
                bench.iter(|| {
                    let plan =
                        SpecLogprobsPlan::token_ids(black_box(ids), rows as i64, VOCAB).unwrap();
                    plan.fill(black_box(&mut out)).unwrap();
                    black_box(plan.split_sizes())
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_spec_logprobs);
criterion_main!(benches);
