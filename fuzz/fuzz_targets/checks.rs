//! Checks the fuzz targets make of an outcome, whichever plan produced it.

use flatgather_core::{Field, PlanError, MAX_PLAN_BYTES, MAX_TOKENS};

/// The reference rule for any value of a length list: not negative.
pub fn reference_nonnegative(field: Field, request: usize, value: i64) -> Result<(), PlanError> {
    if value < 0 {
        return Err(PlanError::Negative {
            field,
            request,
            value,
        });
    }
    Ok(())
}

/// The reference rules for a request's token count, added to the running
/// `tokens`: not zero, and the total no more than `MAX_TOKENS`.
pub fn reference_count(
    field: Field,
    request: usize,
    len: i64,
    tokens: &mut i128,
) -> Result<(), PlanError> {
    if len == 0 {
        return Err(PlanError::ZeroExtend { field, request });
    }
    *tokens += i128::from(len);
    if *tokens > i128::from(MAX_TOKENS) {
        return Err(PlanError::TooManyTokens {
            field,
            request,
            extend: len,
            // The total as an i64, saturated where it would pass i64::MAX.
            total: (*tokens).min(i128::from(i64::MAX)) as i64,
        });
    }
    Ok(())
}

/// The reference size bound: a plan of `values` `int64` values must fit in
/// `MAX_PLAN_BYTES`.
pub fn reference_size(values: i128) -> Result<(), PlanError> {
    let bytes = 8 * values;
    if bytes > i128::from(MAX_PLAN_BYTES) {
        return Err(PlanError::PlanTooLarge {
            bytes: bytes as u64,
        });
    }
    Ok(())
}

/// What `check_rows` must answer for a batch of `tokens` given `rows`: at
/// least `tokens` rows, and exactly that many when `exact`.
pub fn rows_reference(tokens: i64, rows: i64, exact: bool) -> Result<(), PlanError> {
    if rows < tokens {
        Err(PlanError::TooFewRows { tokens, rows })
    } else if exact && rows != tokens {
        Err(PlanError::RowMismatch { tokens, rows })
    } else {
        Ok(())
    }
}

/// An error about a batch of `len` requests: a message and a kind, a valid
/// request index named in the message, the field named where there is one.
pub fn check_error(err: &PlanError, len: usize) {
    let msg = err.to_string();
    assert!(!msg.is_empty(), "{err:?}: empty message");
    assert!(!err.kind().is_empty(), "{err:?}: empty kind");
    if let Some(request) = err.request() {
        assert!(request < len, "{err:?}: request {request} out of 0..{len}");
        assert!(
            msg.contains(&format!("request {request}")),
            "{err:?}: message {msg:?} does not name request {request}"
        );
    }
    let field = match err {
        PlanError::Negative { field, .. }
        | PlanError::ZeroExtend { field, .. }
        | PlanError::TooManyTokens { field, .. }
        | PlanError::NotAnInteger { field, .. } => Some(*field),
        _ => None,
    };
    if let Some(field) = field {
        assert!(
            msg.contains(field.name()),
            "{err:?}: message {msg:?} does not name {}",
            field.name()
        );
    }
}

/// A `fill` into `buf`, which is too short for the `needed` values the plan
/// writes: it must return exactly `BufferTooSmall { needed, got }`.
pub fn check_too_short(
    fill: impl FnOnce(&mut [i64]) -> Result<(), PlanError>,
    buf: &mut [i64],
    needed: usize,
) {
    let got = buf.len();
    match fill(buf) {
        Err(err @ PlanError::BufferTooSmall { .. }) => {
            let want = PlanError::BufferTooSmall { needed, got };
            assert_eq!(err, want, "fill into {got} values");
            // About the buffer, not a request: any batch size will do.
            check_error(&err, 0);
        }
        other => panic!("fill into {got} values (needs {needed}) gave {other:?}"),
    }
}
