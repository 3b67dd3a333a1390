//! Fuzz target for `TokenIdsPlan::new` / `TokenIdsPlan::fill`.
//!
//! The input bytes are decoded into `pruned_lens` (through the shared value
//! decoder: short lengths, zeros, negatives, `i64::MIN`/`MAX`, values around
//! the bounds), one id list per request (absent sometimes, ids mostly inside
//! a small vocabulary, sometimes anywhere), a few more or fewer id lists than
//! lengths (`zip` walks the shorter), the vocabulary, the chunk's rows, the
//! split and the walk's flags.
//!
//! Every outcome is checked, and any panic is a bug in the core:
//! * an error is one of the walk's own (`bad_shape`, `token_id_out_of_range`,
//!   `left_to_release`, `plan_too_large`), names a valid request where it is
//!   about one, and matches a direct check of the inputs (a bad shape is
//!   refused exactly when the shape is bad; an id out of range names a
//!   request that holds one);
//! * an accepted plan whose lengths, rows and split are within `2^12`
//!   answers exactly
//!   what the row-by-row model of the release's loop answers
//!   (`invariants::check_token_ids`: the entries, the split, every flat
//!   index and row), when it is small enough to fill;
//! * `fill` into a buffer one value short returns exactly
//!   `BufferTooSmall { needed, got }` and writes nothing.
#![no_main]

use flatgather_core::{invariants, PlanError, TokenIdsPlan, Walk};
use libfuzzer_sys::fuzz_target;

mod bytes;
// Its errors are checked against the inputs, not a reference model, so the
// models' rules go unused here.
#[allow(dead_code)]
mod checks;

use bytes::{Bytes, Skew};
use checks::{check_error, check_too_short};

/// Plans with fewer values than this are filled and checked in full.
const FILL_LIMIT: usize = 1 << 18;
/// Inputs within this bound are compared with the model, which walks row by
/// row in plain `i64` arithmetic.
const MODEL_BOUND: u64 = 1 << 12;

const SKEW: Skew = Skew {
    ones: true,
    share: 2,
};

fn id(input: &mut Bytes, vocab: i64) -> i64 {
    let b = i64::from(input.u8());
    match input.u8() % 8 {
        0..=4 if vocab > 0 => b % vocab,
        5 if vocab > 0 => -1 - b % vocab,
        6 => vocab.wrapping_add(b % 3 - 1),
        _ => input.u64() as i64,
    }
}

fn shape_is_bad(rows: i64, vocab: i64) -> bool {
    vocab <= 0 || rows < 0 || rows.checked_mul(vocab).is_none()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let n = input.len().min(256);
    let lens: Vec<i64> = (0..n).map(|_| input.value(&SKEW)).collect();
    let vocab = match input.u8() % 4 {
        0 => input.value(&SKEW),
        _ => 1 + i64::from(input.u8() % 40),
    };
    let lists: Vec<Option<Vec<i64>>> = (0..(n + usize::from(input.u8() % 3)).saturating_sub(1))
        .map(|_| {
            if input.u8() % 5 == 0 {
                None
            } else {
                let width = usize::from(input.u8() % 5);
                Some((0..width).map(|_| id(&mut input, vocab)).collect())
            }
        })
        .collect();
    let ids: Vec<Option<&[i64]>> = lists.iter().map(|l| l.as_deref()).collect();
    let total: i64 = lens.iter().fold(0i64, |t, &l| t.saturating_add(l.max(0)));
    let flags = input.u8();
    let walk = Walk {
        rows: input.rows(total),
        split: if flags & 4 != 0 {
            input.value(&SKEW)
        } else {
            i64::from(input.u8() % 4)
        },
        skip_empty: flags & 1 != 0,
        whole: flags & 2 != 0,
    };
    let walked = lens.len().min(ids.len());
    match TokenIdsPlan::new(&lens, &ids, vocab, walk) {
        Err(err) => {
            check_error(&err, walked);
            match err {
                PlanError::BadShape { .. } => assert!(shape_is_bad(walk.rows, vocab)),
                PlanError::TokenIdOutOfRange { request, id, .. } => {
                    assert!(id < -vocab || id >= vocab, "{err:?}: the id is in range");
                    assert!(ids[request].is_some_and(|l| l.contains(&id)));
                }
                PlanError::LeftToRelease { .. } => assert!(walk.whole),
                PlanError::PlanTooLarge { .. } => {}
                other => panic!("{other:?}: not an error of this walk"),
            }
        }
        Ok(plan) => {
            assert!(!shape_is_bad(walk.rows, vocab));
            let bounded = lens.iter().all(|l| l.unsigned_abs() < MODEL_BOUND)
                && walk.rows.unsigned_abs() < MODEL_BOUND
                && walk.split.unsigned_abs() < MODEL_BOUND;
            if plan.num_values() < FILL_LIMIT {
                if bounded {
                    invariants::check_token_ids(&plan, &lens, &ids, walk)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                if plan.num_values() > 0 {
                    let needed = plan.buffer_len(true);
                    let mut short = vec![-1i64; needed - 1];
                    check_too_short(|b| plan.fill(b, true), &mut short, needed);
                    assert!(short.iter().all(|&v| v == -1), "a failed fill wrote");
                }
            }
        }
    }
});
