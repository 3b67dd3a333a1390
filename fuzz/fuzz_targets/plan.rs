//! Fuzz target for `PrunePlan::new` / `PrunePlan::fill` / `PrunePlan::check_rows`.
//!
//! The input bytes are decoded into `extend_seq_lens` and
//! `extend_logprob_start_lens` (two `i64` lists, usually of the same length),
//! biased towards the values that matter: short batches, `start == extend`,
//! `start == 0`, starts just past their extend, negatives, `i64::MIN`/`MAX`,
//! values around `MAX_TOKENS`, around the `MAX_PLAN_BYTES` bound, and totals
//! that overflow `i64`. The bytes left over pick a row count and a cut.
//!
//! Every outcome is checked, and any panic is a bug in the core:
//! * `PrunePlan::new` answers exactly what a small reference model answers:
//!   the same counts for an accepted batch, the same error (every field of it)
//!   for a rejected one;
//! * an error's `request()` is a valid request index and its message names it
//!   (and the field, where there is one);
//! * `check_rows` accepts at least `num_tokens` rows (exactly that many when
//!   `exact`) and otherwise returns `TooFewRows` / `RowMismatch`;
//! * an accepted plan passes `invariants::check_plan` (when it is small enough
//!   to fill quickly), and `fill` into a too-short buffer returns `Err`.
#![no_main]

use flatgather_core::{invariants, Field, PlanError, PrunePlan, MAX_PLAN_BYTES};
use libfuzzer_sys::fuzz_target;

/// Plans with fewer tokens than this are filled and checked in full.
const FILL_LIMIT: usize = 1 << 20;

mod bytes;
mod checks;

use bytes::{Bytes, Skew};
use checks::{
    check_error, check_fills, check_rows_edges, check_too_short, reference_count,
    reference_nonnegative, reference_size,
};

/// How this target's length values are skewed.
const SKEW: Skew = Skew {
    ones: false,
    share: 1,
};

/// A logprob start for a request whose extend is `extend`.
fn logprob_start(bytes: &mut Bytes<'_>, extend: i64) -> i64 {
    let sel = bytes.u8();
    match sel % 12 {
        0..=2 => extend,
        3 | 4 => 0,
        5 => extend.wrapping_sub(1 + i64::from(bytes.u8() % 4)),
        6 => extend.wrapping_add(1 + i64::from(bytes.u8() % 4)),
        7 => i64::from(bytes.u8() % 17),
        _ => bytes.value(&SKEW),
    }
}

/// The two lists, read from `data`.
fn decode(bytes: &mut Bytes<'_>) -> (Vec<i64>, Vec<i64>) {
    let n_extend = bytes.len();
    let n_start = match bytes.u8() {
        0..=229 => n_extend,
        230..=236 => n_extend + 1,
        237..=242 => n_extend.saturating_sub(1),
        _ => bytes.len(),
    };
    let mut extend = Vec::with_capacity(n_extend);
    let mut start = Vec::with_capacity(n_start);
    for i in 0..n_extend.max(n_start) {
        let e = bytes.value(&SKEW);
        if i < n_extend {
            extend.push(e);
        }
        if i < n_start {
            start.push(logprob_start(bytes, e));
        }
    }
    (extend, start)
}

/// An accepted batch's counts, as the contract defines them.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    tokens: i128,
    kept: i128,
    logprob: i128,
}

/// What `PrunePlan::new` must answer, written straight from the contract:
/// the batch's counts, or the exact error.
///
/// Requests are checked in order; within one: a negative extend, a negative
/// start, a zero extend, a running total past `MAX_TOKENS`, a start past its
/// extend. After the loop, the plan's buffers (`gather | sample |
/// input_logprob | token_to_seq`, that is `kept + batch + logprob + kept`
/// `int64` values) must fit in `MAX_PLAN_BYTES`.
fn reference(extend: &[i64], start: &[i64]) -> Result<Counts, PlanError> {
    if extend.len() != start.len() {
        return Err(PlanError::LengthMismatch {
            extend: extend.len(),
            start: start.len(),
        });
    }
    if extend.is_empty() {
        return Err(PlanError::EmptyBatch);
    }
    let (mut tokens, mut kept, mut logprob) = (0i128, 0i128, 0i128);
    for (request, (&e, &s)) in extend.iter().zip(start).enumerate() {
        reference_nonnegative(Field::ExtendSeqLens, request, e)?;
        reference_nonnegative(Field::ExtendLogprobStartLens, request, s)?;
        reference_count(Field::ExtendSeqLens, request, e, &mut tokens)?;
        if s > e {
            return Err(PlanError::StartPastExtend {
                request,
                start: s,
                extend: e,
            });
        }
        // Rows [s, e) are kept and carry a logprob; a chunk with s == e keeps
        // only its last row, which carries none.
        if s == e {
            kept += 1;
        } else {
            kept += i128::from(e - s);
            logprob += i128::from(e - s);
        }
    }
    reference_size(2 * kept + extend.len() as i128 + logprob)?;
    Ok(Counts {
        tokens,
        kept,
        logprob,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let (extend, start) = decode(&mut bytes);
    let want = reference(&extend, &start);
    let plan = match PrunePlan::new(&extend, &start) {
        Err(err) => {
            check_error(&err, extend.len());
            assert_eq!(
                Err(&err),
                want.as_ref(),
                "PrunePlan::new({extend:?}, {start:?})"
            );
            return;
        }
        Ok(plan) => plan,
    };
    let counts = match want {
        Ok(counts) => counts,
        Err(want) => panic!("PrunePlan::new({extend:?}, {start:?}) accepted, want {want:?}"),
    };

    // Counts and rows: cheap, so checked on every plan, however large.
    let got = Counts {
        tokens: plan.num_tokens() as i128,
        kept: plan.num_pruned() as i128,
        logprob: plan.num_input_logprob() as i128,
    };
    assert_eq!(
        got, counts,
        "counts of PrunePlan::new({extend:?}, {start:?})"
    );
    assert_eq!(plan.batch_size(), extend.len(), "batch_size");
    let layout = plan.layout(true);
    assert_eq!(
        (
            layout.gather,
            layout.sample,
            layout.input_logprob,
            layout.token_to_seq
        ),
        (
            plan.num_pruned(),
            plan.batch_size(),
            plan.num_input_logprob(),
            plan.num_pruned()
        ),
        "layout(true)"
    );
    assert_eq!(plan.layout(false).token_to_seq, 0, "layout(false)");
    assert!(
        layout.len() as u64 * 8 <= MAX_PLAN_BYTES,
        "an accepted plan over the bound"
    );
    let tokens = plan.num_tokens() as i64;
    let picked = bytes.rows(tokens);
    for exact in [false, true] {
        let check_rows = |rows| plan.check_rows(rows, exact);
        check_rows_edges(check_rows, tokens, picked, exact, extend.len());
    }
    for with_token_to_seq in [false, true] {
        let needed = plan.layout(with_token_to_seq).len();
        check_too_short(|b| plan.fill(b, with_token_to_seq), &mut [], needed);
    }
    if plan.num_tokens() >= FILL_LIMIT {
        return;
    }

    // Small enough to fill: the whole contract.
    if let Err(msg) = invariants::check_plan(&plan, &extend, &start) {
        panic!("check_plan({extend:?}, {start:?}): {msg}");
    }
    check_fills(
        &mut bytes,
        |with_token_to_seq| plan.layout(with_token_to_seq).len(),
        |buf, with_token_to_seq| plan.fill(buf, with_token_to_seq),
    );
});
