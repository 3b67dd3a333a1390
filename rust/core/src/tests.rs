use super::*;
use crate::invariants::{
    check_decode_token_ids, check_plan, check_rotation_plan, check_token_ids, check_top_k,
    token_ids_model,
};
use proptest::prelude::*;

fn parts(plan: &PrunePlan, with_token_to_seq: bool) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
    let layout = plan.layout(with_token_to_seq);
    let mut buf = vec![0; layout.len()];
    plan.fill(&mut buf, with_token_to_seq).unwrap();
    let (g, rest) = buf.split_at(layout.gather);
    let (s, rest) = rest.split_at(layout.sample);
    let (l, t) = rest.split_at(layout.input_logprob);
    (g.to_vec(), s.to_vec(), l.to_vec(), t.to_vec())
}

#[test]
fn seed_example_from_sglang() {
    // extend [4, 5, 6], start [0, 5, 3] over rows t00..t03, t10..t14, t20..t25.
    let plan = PrunePlan::new(&[4, 5, 6], &[0, 5, 3]).unwrap();
    let (gather, sample, input_logprob, token_to_seq) = parts(&plan, true);
    assert_eq!(gather, [0, 1, 2, 3, 8, 12, 13, 14]); // t00 t01 t02 t03 t14 t23 t24 t25
    assert_eq!(sample, [3, 4, 7]);
    assert_eq!(input_logprob, [0, 1, 2, 3, 5, 6, 7]);
    assert_eq!(token_to_seq, [0, 0, 0, 0, 1, 2, 2, 2]);
    assert_eq!(
        (
            plan.num_tokens(),
            plan.num_pruned(),
            plan.num_input_logprob()
        ),
        (15, 8, 7)
    );
}

#[test]
fn chunk_with_start_equal_extend_keeps_only_its_last_row() {
    let plan = PrunePlan::new(&[3, 1], &[3, 1]).unwrap();
    let (gather, sample, input_logprob, token_to_seq) = parts(&plan, true);
    assert_eq!(gather, [2, 3]);
    assert_eq!(sample, [0, 1]);
    assert!(input_logprob.is_empty());
    assert_eq!(token_to_seq, [0, 1]);
}

#[test]
fn start_zero_keeps_every_row() {
    let plan = PrunePlan::new(&[2, 3], &[0, 0]).unwrap();
    let (gather, sample, input_logprob, _) = parts(&plan, false);
    assert_eq!(gather, [0, 1, 2, 3, 4]);
    assert_eq!(sample, [1, 4]);
    assert_eq!(input_logprob, [0, 1, 2, 3, 4]);
}

#[test]
fn fill_without_token_to_seq_leaves_the_tail_alone() {
    let plan = PrunePlan::new(&[2], &[0]).unwrap();
    let mut buf = vec![-7; 10];
    plan.fill(&mut buf, false).unwrap();
    assert_eq!(buf, [0, 1, 1, 0, 1, -7, -7, -7, -7, -7]);
}

#[test]
fn rejects_bad_metadata_naming_the_request() {
    let cases: [(&[i64], &[i64], PlanError); 6] = [
        (
            &[1, 2],
            &[0],
            PlanError::LengthMismatch {
                extend: 2,
                start: 1,
            },
        ),
        (&[], &[], PlanError::EmptyBatch),
        (
            &[4, -1],
            &[0, 0],
            PlanError::Negative {
                field: Field::ExtendSeqLens,
                request: 1,
                value: -1,
            },
        ),
        (
            &[4, 2],
            &[0, -3],
            PlanError::Negative {
                field: Field::ExtendLogprobStartLens,
                request: 1,
                value: -3,
            },
        ),
        (
            &[4, 0, 1],
            &[0, 0, 0],
            PlanError::ZeroExtend {
                field: Field::ExtendSeqLens,
                request: 1,
            },
        ),
        (
            &[4, 5, 6],
            &[0, 6, 3],
            PlanError::StartPastExtend {
                request: 1,
                start: 6,
                extend: 5,
            },
        ),
    ];
    for (extend, start, want) in cases {
        assert_eq!(PrunePlan::new(extend, start).unwrap_err(), want);
    }
    let err = PrunePlan::new(&[4, 5, 6], &[0, 6, 3]).unwrap_err();
    assert_eq!(err.request(), Some(1));
    assert_eq!(
        err.to_string(),
        "request 1: extend_logprob_start_lens[1] = 6 exceeds extend_seq_lens[1] = 5"
    );
}

#[test]
fn rejects_token_counts_past_the_limit_without_wrapping() {
    let err = PrunePlan::new(&[MAX_TOKENS, 1], &[0, 0]).unwrap_err();
    assert_eq!(
        err,
        PlanError::TooManyTokens {
            field: Field::ExtendSeqLens,
            request: 1,
            extend: 1,
            total: MAX_TOKENS + 1
        }
    );
    let err = PrunePlan::new(&[5, i64::MAX], &[0, 0]).unwrap_err();
    assert_eq!(
        err,
        PlanError::TooManyTokens {
            field: Field::ExtendSeqLens,
            request: 1,
            extend: i64::MAX,
            total: i64::MAX
        }
    );
    assert!(PrunePlan::new(&[MAX_TOKENS], &[MAX_TOKENS]).is_ok());
}

#[test]
fn padding_rows_are_allowed_and_fewer_rows_are_not() {
    let plan = PrunePlan::new(&[4, 5, 6], &[0, 5, 3]).unwrap();
    assert!(plan.check_rows(15, false).is_ok());
    assert!(plan.check_rows(15, true).is_ok());
    // CUDA-graph buckets and DP attention pad hidden_states past the tokens.
    assert!(plan.check_rows(16, false).is_ok());
    assert!(plan.check_rows(i64::MAX, false).is_ok());
    assert_eq!(
        plan.check_rows(16, true),
        Err(PlanError::RowMismatch {
            tokens: 15,
            rows: 16
        })
    );
    for exact in [false, true] {
        assert_eq!(
            plan.check_rows(14, exact),
            Err(PlanError::TooFewRows {
                tokens: 15,
                rows: 14
            })
        );
        assert_eq!(
            plan.check_rows(-1, exact).unwrap_err().kind(),
            "too_few_rows"
        );
    }
}

#[test]
fn short_buffers_are_errors() {
    let plan = PrunePlan::new(&[4, 5, 6], &[0, 5, 3]).unwrap();
    let mut short = vec![0; plan.layout(true).len() - 1];
    assert_eq!(
        plan.fill(&mut short, true),
        Err(PlanError::BufferTooSmall {
            needed: 26,
            got: 25
        })
    );
    let rotation = RotationPlan::new(&[2, 3]).unwrap();
    let mut short = vec![0; 9];
    assert_eq!(
        rotation.fill(&mut short, true),
        Err(PlanError::BufferTooSmall { needed: 10, got: 9 })
    );
}

#[test]
fn plans_over_the_memory_bound_are_refused_before_allocating() {
    // One request of 2^31 - 1 tokens, all kept: 3 * 2^31 int64 values, 48 GiB.
    let err = PrunePlan::new(&[MAX_TOKENS], &[0]).unwrap_err();
    assert_eq!(err.kind(), "plan_too_large");
    assert_eq!(err.request(), None);
    let message = err.to_string();
    assert!(message.contains("48.00 GiB"), "{message}");
    assert!(message.contains("limit of 1.00 GiB"), "{message}");
    // The same tokens with one row kept is a tiny plan.
    assert!(PrunePlan::new(&[MAX_TOKENS], &[MAX_TOKENS - 1]).is_ok());
    // Just under and just over the bound.
    let under = ((MAX_PLAN_BYTES / 8 - 1) / 3) as i64;
    assert!(PrunePlan::new(&[under], &[0]).is_ok());
    assert_eq!(
        PrunePlan::new(&[under + 1], &[0]).unwrap_err().kind(),
        "plan_too_large"
    );
    let rotation_max = (MAX_PLAN_BYTES / 16) as i64;
    assert!(RotationPlan::new(&[rotation_max]).is_ok());
    assert_eq!(
        RotationPlan::new(&[rotation_max, 1]).unwrap_err().kind(),
        "plan_too_large"
    );
}

#[test]
fn rotation_seed_example() {
    // rows a0 a1 a2 | b0 | c0 c1, tails at 6, 7, 8.
    let plan = RotationPlan::new(&[3, 1, 2]).unwrap();
    let mut buf = vec![0; plan.buffer_len(true)];
    plan.fill(&mut buf, true).unwrap();
    assert_eq!(buf, [1, 2, 6, 7, 5, 8, 1, 2, 2, 3, 5, 5]);
    assert_eq!((plan.batch_size(), plan.num_tokens()), (3, 6));
    assert!(plan.check_rows(6).is_ok());
    assert_eq!(plan.check_rows(7).unwrap_err().kind(), "row_mismatch");
    assert_eq!(plan.check_rows(5).unwrap_err().kind(), "too_few_rows");
}

#[test]
fn rotation_edges() {
    let empty = RotationPlan::new(&[]).unwrap();
    assert_eq!((empty.num_tokens(), empty.ids()), (0, vec![]));
    // One-token requests read only their tails.
    assert_eq!(RotationPlan::new(&[1, 1, 1]).unwrap().ids(), [3, 4, 5]);
    assert_eq!(
        RotationPlan::new(&[2, 0]).unwrap_err(),
        PlanError::ZeroExtend {
            field: Field::ExtendLens,
            request: 1
        }
    );
    assert_eq!(
        RotationPlan::new(&[-2]).unwrap_err().to_string(),
        "request 0: extend_lens[0] = -2 is negative"
    );
    assert_eq!(
        RotationPlan::new(&[MAX_TOKENS, 1]).unwrap_err().kind(),
        "too_many_tokens"
    );
}

fn ids_of(lists: &[Option<Vec<i64>>]) -> Vec<Option<&[i64]>> {
    lists.iter().map(|l| l.as_deref()).collect()
}

#[test]
fn token_ids_seed_example() {
    // Three requests: 2 rows asking [7, 3], none scored, 3 rows asking [1].
    let lists = [Some(vec![7, 3]), Some(vec![5]), Some(vec![1])];
    let ids = ids_of(&lists);
    let plan = TokenIdsPlan::new(&[2, 0, 3], &ids, 10, Walk::chunk(5, 0)).unwrap();
    assert_eq!(plan.rows(), vec![0, 0, 1, 1, 2, 3, 4]);
    assert_eq!(plan.cols(), vec![7, 3, 7, 3, 1, 1, 1]);
    assert_eq!(plan.entries()[1], Entry::Empty);
    assert_eq!(plan.next_split(), 0);
    check_token_ids(&plan, &[2, 0, 3], &ids, Walk::chunk(5, 0)).unwrap();
}

#[test]
fn token_ids_chunk_boundaries_split_and_continue_a_request() {
    let lists = [Some(vec![4]), Some(vec![2, 6]), None];
    let ids = ids_of(&lists);
    // 3 rows: request 0 has 2, request 1 gets 1 of its 3 (the chunk ends in
    // it, so SGLang's chunk slice stops there).
    let walk = Walk::chunk(3, 0);
    let plan = TokenIdsPlan::new(&[2, 3], &ids[..2], 8, walk).unwrap();
    assert_eq!(plan.next_split(), 1);
    check_token_ids(&plan, &[2, 3], &ids[..2], walk).unwrap();
    // The next chunk starts inside request 1: it extends the last entry.
    let walk = Walk::chunk(4, 1);
    let plan = TokenIdsPlan::new(&[3, 2], &ids[1..], 8, walk).unwrap();
    assert!(matches!(
        plan.entries()[0],
        Entry::Rows {
            rows: 2,
            extend: true,
            ..
        }
    ));
    assert!(matches!(
        plan.entries()[1],
        Entry::Rows {
            rows: 0,
            extend: false,
            ..
        }
    ));
    check_token_ids(&plan, &[3, 2], &ids[1..], walk).unwrap();
}

#[test]
fn token_ids_older_walks_skip_empty_entries_and_empty_chunks() {
    let lists = [None, Some(vec![1]), Some(vec![])];
    let ids = ids_of(&lists);
    let walk = Walk {
        skip_empty: true,
        ..Walk::chunk(4, 0)
    };
    let plan = TokenIdsPlan::new(&[1, 2, 1], &ids, 4, walk).unwrap();
    // No entry for the request without ids; one row of no value for [].
    assert_eq!(plan.entries().len(), 2);
    check_token_ids(&plan, &[1, 2, 1], &ids, walk).unwrap();
    let empty = Walk {
        skip_empty: true,
        ..Walk::chunk(0, 0)
    };
    assert!(TokenIdsPlan::new(&[1, 2], &ids, 4, empty)
        .unwrap()
        .entries()
        .is_empty());
}

#[test]
fn token_ids_refusals_name_the_request() {
    let lists = [Some(vec![1]), Some(vec![9])];
    let ids = ids_of(&lists);
    let err = TokenIdsPlan::new(&[1, 1], &ids, 9, Walk::chunk(2, 0)).unwrap_err();
    assert_eq!(
        (err.kind(), err.request()),
        ("token_id_out_of_range", Some(1))
    );
    assert!(TokenIdsPlan::new(&[1, 1], &[Some(&[-9][..]), None], 9, Walk::chunk(2, 0)).is_ok());
    let whole = Walk {
        whole: true,
        ..Walk::chunk(2, 0)
    };
    let err = TokenIdsPlan::new(&[1, 1], &[Some(&[1][..]), None], 9, whole).unwrap_err();
    assert_eq!((err.kind(), err.request()), ("left_to_release", Some(1)));
    let err =
        TokenIdsPlan::new(&[1, 2], &ids_of(&[Some(vec![1]), Some(vec![1])]), 9, whole).unwrap_err();
    assert_eq!((err.kind(), err.request()), ("left_to_release", Some(1)));
    // Shapes no tensor has, or whose flat indices overflow int64.
    for (rows, vocab) in [(2, 0), (2, -1), (-1, 9), (i64::MAX, 2), (2, i64::MIN)] {
        let err = TokenIdsPlan::new(&[1, 1], &ids, vocab, Walk::chunk(rows, 0)).unwrap_err();
        assert_eq!((err.kind(), err.request()), ("bad_shape", None));
    }
    // A request with nothing to score needs no ids, even in a whole walk.
    assert!(TokenIdsPlan::new(&[0, 2], &[None, Some(&[1][..])], 9, whole).is_ok());
}

#[test]
fn token_ids_nest_cuts_the_values_into_each_entry_s_rows() {
    // Request 0 continues the previous chunk's entry (2 rows of [7, 3]);
    // request 1 has nothing to score, request 2 asks for no ids, request 3
    // for an empty list (a row of no value), request 4 runs past the chunk.
    let lists = [
        Some(vec![7, 3]),
        Some(vec![1]),
        None,
        Some(vec![]),
        Some(vec![5]),
    ];
    let ids = ids_of(&lists);
    let walk = Walk::chunk(6, 1);
    let plan = TokenIdsPlan::new(&[3, 0, 1, 1, 4], &ids, 8, walk).unwrap();
    check_token_ids(&plan, &[3, 0, 1, 1, 4], &ids, walk).unwrap();
    assert_eq!(plan.num_values(), 6);
    let entries = plan.nest(6).unwrap();
    let cut: Vec<_> = entries
        .iter()
        .map(|e| {
            let rows: Vec<_> = e.row_values().map(|r| (r.start, r.end)).collect();
            (e.ids_of(), e.extends(), rows)
        })
        .collect();
    assert_eq!(
        cut,
        vec![
            (Some(0), true, vec![(0, 2), (2, 4)]),
            (None, false, vec![]),
            (None, false, vec![]),
            (Some(3), false, vec![(4, 4)]),
            (Some(4), false, vec![(4, 5), (5, 6)]),
        ]
    );
    assert_eq!(plan.next_split(), 2);
}

#[test]
fn token_ids_nest_refuses_values_of_another_plan() {
    let plan = TokenIdsPlan::new(&[2], &[Some(&[1, 2][..])], 8, Walk::chunk(2, 0)).unwrap();
    for got in [0, 3, 5, usize::MAX] {
        let err = plan.nest(got).unwrap_err();
        assert_eq!((err.kind(), err.request()), ("bad_buffer", None));
        assert_eq!(
            err.to_string(),
            format!("values holds {got} items, the plan gathers 4")
        );
    }
    // No entry at all (an empty chunk of an older walk) takes no value.
    let empty = Walk {
        skip_empty: true,
        ..Walk::chunk(0, 0)
    };
    let plan = TokenIdsPlan::new(&[2], &[Some(&[1][..])], 8, empty).unwrap();
    assert!(plan.nest(0).unwrap().is_empty());
    assert_eq!(plan.nest(1).unwrap_err().kind(), "bad_buffer");
}

fn token_id_lists() -> impl Strategy<Value = Vec<(i64, Option<Vec<i64>>)>> {
    let request = (
        prop_oneof![Just(0i64), Just(-1), 1i64..6, 1i64..40],
        prop::option::weighted(0.8, prop::collection::vec(-12i64..12, 0..5)),
    );
    // Chunks of one or two requests are where a split shows in the result.
    prop_oneof![
        prop::collection::vec(request.clone(), 0..3),
        prop::collection::vec(request, 0..40),
    ]
}

/// A walk over `lens`: the chunk's rows end anywhere in the batch (or past
/// it), as chunked input logprobs cut it.
fn walk_over(lens: &[i64], (cut, split, skip_empty, whole): (u8, i64, bool, bool)) -> Walk {
    let total: i64 = lens.iter().map(|&l| l.max(0)).sum();
    let rows = match cut {
        0 => 0,
        101.. => total + i64::from(cut - 101),
        _ => total * i64::from(cut) / 100,
    };
    Walk {
        rows,
        split: if whole { 0 } else { split },
        skip_empty,
        whole,
    }
}

fn rotation_lens() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(prop_oneof![Just(1i64), 1i64..8, 1i64..600], 0..300)
}

fn batch() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    prop::collection::vec(
        (1i64..600).prop_flat_map(|e| {
            // Weight the edges: start 0, start == extend, anything between.
            (Just(e), prop_oneof![Just(0), Just(e), 0..=e])
        }),
        1..300,
    )
    .prop_map(|pairs| pairs.into_iter().unzip())
}

#[test]
fn spec_top_k_seed_example() {
    // B = 2 requests verifying A = 2 positions each: top-2, then top-1 and
    // top-0 mixed in (a request without top logprobs).
    let nums = [2, 2, 1, 1, 0, 0];
    let plan = SpecLogprobsPlan::top_k(&nums, 8, 10).unwrap();
    assert_eq!(plan.width(), Some(2));
    assert_eq!(plan.num_values(), 12);
    assert!(!plan.uniform());
    assert_eq!(plan.split_sizes(), vec![2, 0, 2, 0, 1, 1, 1, 1, 0, 2, 0, 2]);
    check_top_k(&plan, &nums).unwrap();
    let plan = SpecLogprobsPlan::top_k(&[5; 4], 4, 10).unwrap();
    assert!(plan.uniform());
    check_top_k(&plan, &[5; 4]).unwrap();
}

#[test]
fn spec_token_ids_seed_example() {
    // Ragged ids, an empty list and None; a negative id counts from the end.
    let lists = [Some(vec![7, 3]), Some(vec![]), None, Some(vec![-1])];
    let ids = ids_of(&lists);
    let plan = SpecLogprobsPlan::token_ids(&ids, 4, 10).unwrap();
    let mut flat = vec![0; plan.buffer_len()];
    plan.fill(&mut flat).unwrap();
    assert_eq!(flat, vec![7, 3, 39]);
    assert_eq!(plan.split_sizes(), vec![2, 0, 0, 1]);
    assert_eq!(plan.none_rows(), &[2]);
    check_decode_token_ids(&plan, &ids, 10).unwrap();
}

#[test]
fn spec_refusals_name_the_row() {
    let err = SpecLogprobsPlan::top_k(&[1, -2], 2, 10).unwrap_err();
    assert_eq!((err.kind(), err.request()), ("negative", Some(1)));
    let err = SpecLogprobsPlan::top_k(&[1, 11], 2, 10).unwrap_err();
    assert_eq!((err.kind(), err.request()), ("left_to_release", Some(1)));
    assert_eq!(
        SpecLogprobsPlan::top_k(&[1, 1, 1], 2, 10)
            .unwrap_err()
            .kind(),
        "too_few_rows"
    );
    assert_eq!(
        SpecLogprobsPlan::top_k(&[], 2, 10).unwrap_err().kind(),
        "empty_batch"
    );
    let lists = [Some(vec![1]), Some(vec![10])];
    let err = SpecLogprobsPlan::token_ids(&ids_of(&lists), 2, 10).unwrap_err();
    assert_eq!(
        (err.kind(), err.request()),
        ("token_id_out_of_range", Some(1))
    );
    let lists = [None, None, None];
    let err = SpecLogprobsPlan::token_ids(&ids_of(&lists), 2, 10).unwrap_err();
    assert_eq!(err.kind(), "too_few_rows");
    // Extra rows (a padded tensor) are never read.
    let plan = SpecLogprobsPlan::token_ids(&ids_of(&lists[..1]), 2, 10).unwrap();
    assert_eq!((plan.num_rows(), plan.num_values()), (1, 0));
    let mut short = vec![0; 0];
    let plan = SpecLogprobsPlan::token_ids(&ids_of(&[Some(vec![1, 2])]), 1, 10).unwrap();
    assert_eq!(
        plan.fill(&mut short).unwrap_err().kind(),
        "buffer_too_small"
    );
}

#[test]
fn spec_rows_of_cuts_ragged_rows_and_refuses_other_values() {
    let plan = SpecLogprobsPlan::top_k(&[2, 0, 1, 2], 5, 10).unwrap();
    let rows: Vec<_> = plan.rows_of(8).unwrap().collect();
    assert_eq!(rows, vec![0..2, 2..2, 4..5, 6..8]);
    let lists = [Some(vec![7, 3]), Some(vec![]), None, Some(vec![-1])];
    let plan = SpecLogprobsPlan::token_ids(&ids_of(&lists), 4, 10).unwrap();
    let rows: Vec<_> = plan.rows_of(3).unwrap().collect();
    assert_eq!(rows, vec![0..2, 2..2, 2..2, 2..3]);
    // Rows without any id: no value to cut, every row empty.
    let plan = SpecLogprobsPlan::token_ids(&ids_of(&[None, Some(vec![])]), 2, 10).unwrap();
    assert_eq!(
        plan.rows_of(0).unwrap().collect::<Vec<_>>(),
        vec![0..0, 0..0]
    );
    for got in [0, 2, 4, usize::MAX] {
        let plan = SpecLogprobsPlan::token_ids(&ids_of(&lists), 4, 10).unwrap();
        let err = plan.rows_of(got).err().unwrap();
        assert_eq!((err.kind(), err.request()), ("bad_buffer", None));
        assert_eq!(
            err.to_string(),
            format!("values holds {got} items, the plan has 3")
        );
    }
}

fn spec_ids() -> impl Strategy<Value = Vec<Option<Vec<i64>>>> {
    prop::collection::vec(
        prop::option::weighted(0.8, prop::collection::vec(-12i64..12, 0..5)),
        1..40,
    )
}

proptest! {
    #[test]
    fn every_accepted_batch_meets_the_contract((extend, start) in batch()) {
        let plan = PrunePlan::new(&extend, &start).unwrap();
        prop_assert_eq!(plan.num_tokens() as i64, extend.iter().sum::<i64>());
        check_plan(&plan, &extend, &start).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arbitrary_lengths_are_accepted_or_rejected_never_panic(
        extend in prop::collection::vec(any::<i64>(), 0..8),
        start in prop::collection::vec(any::<i64>(), 0..8),
    ) {
        if let Ok(plan) = PrunePlan::new(&extend, &start) {
            prop_assume!(plan.num_tokens() < 1 << 20);
            check_plan(&plan, &extend, &start).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn every_token_ids_walk_matches_the_row_by_row_model(
        requests in token_id_lists(),
        walk in (0u8..105, prop_oneof![Just(0i64), 0i64..8], any::<bool>(), any::<bool>()),
        extra_ids in 0usize..3,
    ) {
        let lens: Vec<i64> = requests.iter().map(|r| r.0).collect();
        let walk = walk_over(&lens, walk);
        let lists: Vec<Option<Vec<i64>>> = requests.iter().map(|r| r.1.clone()).collect();
        let mut ids = ids_of(&lists);
        // zip() stops at the shorter of the two.
        ids.extend(std::iter::repeat_n(None, extra_ids));
        match TokenIdsPlan::new(&lens, &ids, 12, walk) {
            Ok(plan) => check_token_ids(&plan, &lens, &ids, walk).map_err(TestCaseError::fail)?,
            Err(err) => {
                let request = err.request().expect("every refusal names a request");
                prop_assert!(request < lens.len());
                prop_assert!(
                    err.kind() == "left_to_release" && token_ids_model(&lens, &ids, walk).is_none()
                );
            }
        }
    }

    #[test]
    fn every_accepted_rotation_meets_the_contract(lens in rotation_lens()) {
        let plan = RotationPlan::new(&lens).unwrap();
        prop_assert_eq!(plan.num_tokens() as i64, lens.iter().sum::<i64>());
        check_rotation_plan(&plan, &lens).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn arbitrary_rotation_lengths_never_panic(lens in prop::collection::vec(any::<i64>(), 0..8)) {
        match RotationPlan::new(&lens) {
            Ok(plan) => {
                prop_assume!(plan.num_tokens() < 1 << 20);
                check_rotation_plan(&plan, &lens).map_err(TestCaseError::fail)?;
            }
            Err(err) => {
                prop_assert!(lens.iter().any(|&l| l <= 0)
                    || lens.iter().map(|&l| l as i128).sum::<i128>() > MAX_TOKENS as i128
                    || err.kind() == "plan_too_large");
                prop_assert!(err.request().is_none_or(|r| r < lens.len()));
            }
        }
    }

    #[test]
    fn every_spec_top_k_plan_matches_the_row_by_row_model(
        nums in prop::collection::vec(prop_oneof![Just(0i64), 1i64..4, Just(20)], 1..64),
        spare in 0i64..3,
    ) {
        let rows = nums.len() as i64 + spare;
        let plan = SpecLogprobsPlan::top_k(&nums, rows, 32).unwrap();
        check_top_k(&plan, &nums).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn every_spec_token_ids_plan_matches_the_row_by_row_model(
        lists in spec_ids(),
        spare in 0i64..3,
        vocab in 1i64..14,
    ) {
        let ids = ids_of(&lists);
        let rows = lists.len() as i64 + spare;
        match SpecLogprobsPlan::token_ids(&ids, rows, vocab) {
            Ok(plan) => check_decode_token_ids(&plan, &ids, vocab).map_err(TestCaseError::fail)?,
            Err(err) => {
                prop_assert_eq!(err.kind(), "token_id_out_of_range");
                let row = err.request().unwrap();
                prop_assert!(ids[row].unwrap().iter().any(|&id| id < -vocab || id >= vocab));
            }
        }
    }

    #[test]
    fn arbitrary_spec_inputs_never_panic(
        nums in prop::collection::vec(any::<i64>(), 0..6),
        rows in any::<i64>(),
        vocab in any::<i64>(),
    ) {
        if let Ok(plan) = SpecLogprobsPlan::top_k(&nums, rows, vocab) {
            prop_assume!(plan.num_values() < 1 << 20);
            check_top_k(&plan, &nums).map_err(TestCaseError::fail)?;
        }
    }
}
