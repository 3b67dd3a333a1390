//! The one error type of every plan, and the names of the inputs it speaks of.

use std::fmt;

use crate::{MAX_PLAN_BYTES, MAX_TOKENS};

/// Which input a value came from, named as SGLang names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `LogitsMetadata.extend_seq_lens_cpu`.
    ExtendSeqLens,
    /// `LogitsMetadata.extend_logprob_start_lens_cpu`.
    ExtendLogprobStartLens,
    /// The rows of `hidden_states` (or of `input_ids` for a rotation).
    NumRows,
    /// `ScheduleBatch.extend_lens` (`extend_seq_lens` before 0.5.13): the
    /// lengths a draft-prefill rotation walks.
    ExtendLens,
    /// `LogitsMetadata.extend_logprob_pruned_lens_cpu`: the scored rows of
    /// each request.
    PrunedLens,
    /// `LogitsMetadata.token_ids_logprobs`: the token ids each request asks
    /// the logprobs of.
    TokenIds,
    /// The top-logprob numbers, one per row of a decode step
    /// (`top_logprobs_nums`, repeated per accepted position in a verify).
    TopLogprobsNums,
}

impl Field {
    pub fn name(self) -> &'static str {
        match self {
            Field::ExtendSeqLens => "extend_seq_lens",
            Field::ExtendLogprobStartLens => "extend_logprob_start_lens",
            Field::NumRows => "num_rows",
            Field::ExtendLens => "extend_lens",
            Field::PrunedLens => "extend_logprob_pruned_lens",
            Field::TokenIds => "token_ids_logprobs",
            Field::TopLogprobsNums => "top_logprobs_nums",
        }
    }
}

/// Why a plan could not be built. Every variant names the values involved
/// and, where the error is about one request, that request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The two sequences have different lengths.
    LengthMismatch { extend: usize, start: usize },
    /// The batch has no request; SGLang samples one token per request.
    EmptyBatch,
    /// A value is not a usable integer (set by front ends that convert
    /// loosely typed input; `found` describes what was there, briefly).
    NotAnInteger {
        field: Field,
        request: Option<usize>,
        found: String,
    },
    /// A length is negative.
    Negative {
        field: Field,
        request: usize,
        value: i64,
    },
    /// A request has no token: there is nothing to sample.
    ZeroExtend { field: Field, request: usize },
    /// A logprob start lies past the end of its request.
    StartPastExtend {
        request: usize,
        start: i64,
        extend: i64,
    },
    /// The running token count passes [`MAX_TOKENS`] at this request.
    TooManyTokens {
        field: Field,
        request: usize,
        extend: i64,
        total: i64,
    },
    /// The tensors hold fewer rows than the batch has tokens: some request
    /// would read past the end.
    TooFewRows { tokens: i64, rows: i64 },
    /// Exactly `tokens` rows were required and `rows` were given.
    RowMismatch { tokens: i64, rows: i64 },
    /// The plan's index buffers would take more than [`MAX_PLAN_BYTES`].
    PlanTooLarge { bytes: u64 },
    /// An output buffer is too short for the plan.
    BufferTooSmall { needed: usize, got: usize },
    /// The values handed in to be cut into the plan's rows are not as many
    /// as the plan has, so some row would lie past them or some value be
    /// left over. `gathered` only picks the wording (a token-ids plan
    /// gathers its values).
    ValueCount {
        got: usize,
        expected: usize,
        gathered: bool,
    },
    /// The logprobs' shape `[rows, vocab]` is not one a tensor has, or its
    /// flat indices would not fit in `int64`.
    BadShape { rows: i64, vocab: i64 },
    /// A requested token id lies outside `[-vocab, vocab)`.
    TokenIdOutOfRange { request: usize, id: i64, vocab: i64 },
    /// Input the release's own code gives its own meaning (an exception, a
    /// silent truncation): the plan leaves it to that code.
    LeftToRelease { request: usize, why: &'static str },
}

impl PlanError {
    /// The request the error is about, if it is about one.
    pub fn request(&self) -> Option<usize> {
        match *self {
            PlanError::NotAnInteger { request, .. } => request,
            PlanError::Negative { request, .. }
            | PlanError::ZeroExtend { request, .. }
            | PlanError::StartPastExtend { request, .. }
            | PlanError::TooManyTokens { request, .. }
            | PlanError::TokenIdOutOfRange { request, .. }
            | PlanError::LeftToRelease { request, .. } => Some(request),
            _ => None,
        }
    }

    /// A short, stable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PlanError::LengthMismatch { .. } => "length_mismatch",
            PlanError::EmptyBatch => "empty_batch",
            PlanError::NotAnInteger { .. } => "not_an_integer",
            PlanError::Negative { .. } => "negative",
            PlanError::ZeroExtend { .. } => "zero_extend",
            PlanError::StartPastExtend { .. } => "start_past_extend",
            PlanError::TooManyTokens { .. } => "too_many_tokens",
            PlanError::TooFewRows { .. } => "too_few_rows",
            PlanError::RowMismatch { .. } => "row_mismatch",
            PlanError::PlanTooLarge { .. } => "plan_too_large",
            PlanError::BufferTooSmall { .. } => "buffer_too_small",
            // The name the binding gave it before the check moved here.
            PlanError::ValueCount { .. } => "bad_buffer",
            PlanError::BadShape { .. } => "bad_shape",
            PlanError::TokenIdOutOfRange { .. } => "token_id_out_of_range",
            PlanError::LeftToRelease { .. } => "left_to_release",
        }
    }
}

/// `1234567` as `1.18 MiB`-style text for messages about sizes.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::LengthMismatch { extend, start } => write!(
                f,
                "extend_seq_lens has {extend} requests but extend_logprob_start_lens has {start}"
            ),
            PlanError::EmptyBatch => write!(
                f,
                "the batch has no request: extend_seq_lens is empty (each request samples one token)"
            ),
            PlanError::NotAnInteger {
                field,
                request: Some(request),
                found,
            } => write!(
                f,
                "request {request}: {}[{request}] must be an int, got {found}",
                field.name()
            ),
            PlanError::NotAnInteger {
                field,
                request: None,
                found,
            } => write!(f, "{} must be an int, got {found}", field.name()),
            PlanError::Negative {
                field,
                request,
                value,
            } => write!(
                f,
                "request {request}: {}[{request}] = {value} is negative",
                field.name()
            ),
            PlanError::ZeroExtend { field, request } => write!(
                f,
                "request {request}: {}[{request}] = 0, but every request needs at least one token",
                field.name()
            ),
            PlanError::StartPastExtend {
                request,
                start,
                extend,
            } => write!(
                f,
                "request {request}: extend_logprob_start_lens[{request}] = {start} exceeds extend_seq_lens[{request}] = {extend}"
            ),
            PlanError::TooManyTokens {
                field,
                request,
                extend,
                total,
            } => write!(
                f,
                "request {request}: {}[{request}] = {extend} brings the batch to {total} tokens, over the limit of {MAX_TOKENS}",
                field.name()
            ),
            PlanError::TooFewRows { tokens, rows } => write!(
                f,
                "the batch has {tokens} tokens, but the tensor has only {rows} rows"
            ),
            PlanError::RowMismatch { tokens, rows } => write!(
                f,
                "the batch has {tokens} tokens, but the tensor has {rows} rows (exactly {tokens} were required)"
            ),
            PlanError::PlanTooLarge { bytes } => write!(
                f,
                "the plan's index buffers would take {} ({bytes} bytes), over the limit of {} per plan",
                human_bytes(*bytes),
                human_bytes(MAX_PLAN_BYTES)
            ),
            PlanError::BufferTooSmall { needed, got } => write!(
                f,
                "the output buffer holds {got} int64 values, the plan needs {needed}"
            ),
            PlanError::ValueCount {
                got,
                expected,
                gathered,
            } => write!(
                f,
                "values holds {got} items, the plan {} {expected}",
                if *gathered { "gathers" } else { "has" }
            ),
            PlanError::BadShape { rows, vocab } => write!(
                f,
                "logprobs of shape [{rows}, {vocab}]: rows must be at least 0, the vocabulary \
                 positive, and rows * vocab within int64"
            ),
            PlanError::TokenIdOutOfRange { request, id, vocab } => write!(
                f,
                "request {request}: token id {id} is outside the vocabulary of {vocab}"
            ),
            PlanError::LeftToRelease { request, why } => write!(
                f,
                "request {request} {why}: left to the release's own code"
            ),
        }
    }
}

impl std::error::Error for PlanError {}
