//! Checks both fuzz targets make of an outcome, whichever plan produced it.

use flatgather_core::PlanError;

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
