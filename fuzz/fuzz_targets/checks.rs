//! Checks the fuzz targets make of an outcome, whichever plan produced it.

use flatgather_core::{Field, PlanError, MAX_PLAN_BYTES, MAX_TOKENS};

use crate::bytes::Bytes;

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

/// `check_rows` of a plan of `tokens` tokens in a batch of `batch` requests,
/// compared with `rows_reference` at the edges (`tokens`, one more, one
/// fewer, 0, -1, `i64::MIN`, `i64::MAX`) and at `picked`.
pub fn check_rows_edges(
    check_rows: impl Fn(i64) -> Result<(), PlanError>,
    tokens: i64,
    picked: i64,
    exact: bool,
    batch: usize,
) {
    for rows in [
        tokens,
        tokens + 1,
        tokens - 1,
        0,
        -1,
        i64::MIN,
        i64::MAX,
        picked,
    ] {
        let got = check_rows(rows);
        if let Err(err) = &got {
            check_error(err, batch);
        }
        assert_eq!(
            got,
            rows_reference(tokens, rows, exact),
            "check_rows({rows}, exact={exact}) with {tokens} tokens"
        );
    }
}

/// The buffer contract of a plan small enough to fill, whose buffer holds
/// `len(false)` values, or `len(true)` with its optional last part
/// (`token_to_seq`, `embeds`). A fill one value short, or cut where the input
/// picks, returns exactly `BufferTooSmall` and writes nothing; the fills
/// without and with the last part write the same first values, and neither
/// writes past its part (the buffers hold a `-1` sentinel, which no index
/// equals).
pub fn check_fills(
    bytes: &mut Bytes<'_>,
    len: impl Fn(bool) -> usize,
    fill: impl Fn(&mut [i64], bool) -> Result<(), PlanError>,
) {
    let (short, full) = (len(false), len(true));
    let mut buf = vec![-1i64; full + 2];
    for with_last in [false, true] {
        let needed = len(with_last);
        if needed == 0 {
            continue;
        }
        let fill = |b: &mut [i64]| fill(b, with_last);
        check_too_short(fill, &mut buf[..needed - 1], needed);
        let cut = usize::from(bytes.u16()) % needed;
        check_too_short(fill, &mut buf[..cut], needed);
    }
    assert!(
        buf.iter().all(|&v| v == -1),
        "a failed fill wrote to the buffer"
    );
    fill(&mut buf, false).expect("fill without the last part");
    assert!(
        buf[short..].iter().all(|&v| v == -1),
        "fill without the last part wrote past its part"
    );
    let mut with = vec![-1i64; full + 2];
    fill(&mut with, true).expect("fill with the last part");
    assert!(
        with[full..].iter().all(|&v| v == -1),
        "fill with the last part wrote past it"
    );
    assert_eq!(
        buf[..short],
        with[..short],
        "the first parts differ with the last part"
    );
}
