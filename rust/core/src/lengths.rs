//! What every plan checks of its lengths and sizes, in one place.

use crate::{Field, PlanError, MAX_PLAN_BYTES, MAX_TOKENS};

/// Adds request `request`'s length `len` to the running token count `total`:
/// the length must be positive and the new total within [`MAX_TOKENS`].
pub(crate) fn add_request(
    field: Field,
    request: usize,
    len: i64,
    total: i64,
) -> Result<i64, PlanError> {
    if len < 0 {
        return Err(PlanError::Negative {
            field,
            request,
            value: len,
        });
    }
    if len == 0 {
        return Err(PlanError::ZeroExtend { field, request });
    }
    // Both are in [0, i64::MAX] and total <= MAX_TOKENS, so the sum cannot
    // wrap before it is compared.
    let next = total.saturating_add(len);
    if next > MAX_TOKENS {
        return Err(PlanError::TooManyTokens {
            field,
            request,
            extend: len,
            total: next,
        });
    }
    Ok(next)
}

/// Refuses a plan whose buffers would hold more than [`MAX_PLAN_BYTES`].
pub(crate) fn check_size(values: u64) -> Result<(), PlanError> {
    let bytes = values.saturating_mul(std::mem::size_of::<i64>() as u64);
    if bytes > MAX_PLAN_BYTES {
        return Err(PlanError::PlanTooLarge { bytes });
    }
    Ok(())
}

/// Checks `rows` (of the tensors a plan reads) against the batch's `tokens`:
/// at least `tokens` (padding rows past them are never read), or exactly
/// `tokens` when `exact`.
pub(crate) fn check_rows(tokens: i64, rows: i64, exact: bool) -> Result<(), PlanError> {
    if rows < tokens {
        return Err(PlanError::TooFewRows { tokens, rows });
    }
    if exact && rows != tokens {
        return Err(PlanError::RowMismatch { tokens, rows });
    }
    Ok(())
}
