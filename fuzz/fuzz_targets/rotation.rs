//! Fuzz target for `RotationPlan::new` / `RotationPlan::fill` /
//! `RotationPlan::check_rows`.
//!
//! The input bytes are decoded into `extend_lens` (one `i64` list, empty
//! sometimes), biased towards the values that matter: short requests, one-token
//! requests, zeros, negatives, `i64::MIN`/`MAX`, values around `MAX_TOKENS`,
//! around the `MAX_PLAN_BYTES` bound, and totals that overflow `i64`. The
//! bytes left over pick a row count and a cut.
//!
//! Every outcome is checked, and any panic is a bug in the core:
//! * `RotationPlan::new` answers exactly what a small reference model answers:
//!   the same counts for an accepted batch, the same error (every field of it)
//!   for a rejected one;
//! * an error's `request()` is a valid request index and its message names it
//!   and its field;
//! * `check_rows` accepts exactly `num_tokens` rows and otherwise returns
//!   `TooFewRows` / `RowMismatch`;
//! * an accepted plan passes `invariants::check_rotation_plan` (when it is
//!   small enough to fill quickly), `fill` into a too-short buffer returns
//!   `Err` and writes nothing, and `fill` leaves the values past its part alone.
#![no_main]

use flatgather_core::{invariants, Field, PlanError, RotationPlan, MAX_PLAN_BYTES};
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
    ones: true,
    share: 2,
};

/// What `RotationPlan::new` must answer, written straight from the contract:
/// the batch's token count, or the exact error.
///
/// Requests are checked in order; within one: a negative length, a zero
/// length, a running total past `MAX_TOKENS`. After the loop, `ids` and
/// `embeds` together (`2 * tokens` `int64` values) must fit in
/// `MAX_PLAN_BYTES`. An empty batch is an empty rotation.
fn reference(lens: &[i64]) -> Result<i128, PlanError> {
    let mut tokens = 0i128;
    for (request, &len) in lens.iter().enumerate() {
        reference_nonnegative(Field::ExtendLens, request, len)?;
        reference_count(Field::ExtendLens, request, len, &mut tokens)?;
    }
    reference_size(2 * tokens)?;
    Ok(tokens)
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let lens: Vec<i64> = (0..bytes.len()).map(|_| bytes.value(&SKEW)).collect();
    let want = reference(&lens);
    let plan = match RotationPlan::new(&lens) {
        Err(err) => {
            check_error(&err, lens.len());
            assert_eq!(Err(&err), want.as_ref(), "RotationPlan::new({lens:?})");
            return;
        }
        Ok(plan) => plan,
    };
    let tokens = match want {
        Ok(tokens) => tokens,
        Err(want) => panic!("RotationPlan::new({lens:?}) accepted, want {want:?}"),
    };

    // Counts and rows: cheap, so checked on every plan, however large.
    assert_eq!(plan.batch_size(), lens.len(), "batch_size");
    assert_eq!(plan.num_tokens() as i128, tokens, "num_tokens");
    let n = plan.num_tokens();
    assert_eq!(plan.buffer_len(false), n, "buffer_len(false)");
    assert_eq!(plan.buffer_len(true), 2 * n, "buffer_len(true)");
    assert!(
        plan.buffer_len(true) as u64 * 8 <= MAX_PLAN_BYTES,
        "an accepted plan over the bound"
    );
    let tokens = n as i64;
    let picked = bytes.rows(tokens);
    check_rows_edges(
        |rows| plan.check_rows(rows),
        tokens,
        picked,
        true,
        lens.len(),
    );
    for with_embeds in [false, true] {
        if n == 0 {
            assert_eq!(plan.fill(&mut [], with_embeds), Ok(()), "empty fill");
        } else {
            let needed = plan.buffer_len(with_embeds);
            check_too_short(|b| plan.fill(b, with_embeds), &mut [], needed);
        }
    }
    if n >= FILL_LIMIT {
        return;
    }

    // Small enough to fill: the whole contract.
    if let Err(msg) = invariants::check_rotation_plan(&plan, &lens) {
        panic!("check_rotation_plan({lens:?}): {msg}");
    }
    check_fills(
        &mut bytes,
        |with_embeds| plan.buffer_len(with_embeds),
        |buf, with_embeds| plan.fill(buf, with_embeds),
    );
});
