//! Flat gather plans for SGLang's "prefill with input logprobs" pruning.
//!
//! A prefill batch is flattened by request: request `i` owns the rows
//! `[offset_i, offset_i + extend_seq_lens[i])` of `hidden_states`. For input
//! logprobs SGLang keeps, per request, the rows from
//! `extend_logprob_start_lens[i]` to the end of the request. A request whose
//! start equals its extend length (a chunk of a chunked prefill) still keeps
//! its last row, because every request samples one token; that row carries no
//! input logprob.
//!
//! [`Plan::new`] validates the two length lists once and records one span per
//! request; [`Plan::fill`] then writes every index set in a single pass over
//! the kept rows:
//!
//! * `gather`: the flat row index of every kept row, in batch order;
//! * `sample`: for each request, the position of its last kept row;
//! * `input_logprob`: the positions of the kept rows that carry an input logprob;
//! * `token_to_seq`: the request index of every kept row.
//!
//! ```
//! use flatgather_core::Plan;
//!
//! let plan = Plan::new(&[4, 5, 6], &[0, 5, 3]).unwrap();
//! assert_eq!(plan.gather(), vec![0, 1, 2, 3, 8, 12, 13, 14]);
//! assert_eq!(plan.sample(), vec![3, 4, 7]);
//! assert_eq!(plan.input_logprob(), vec![0, 1, 2, 3, 5, 6, 7]);
//! assert_eq!(plan.token_to_seq(), vec![0, 0, 0, 0, 1, 2, 2, 2]);
//! ```
//!
//! This crate has no Python types in it: the PyO3 binding lives in
//! `rust/python` and only converts arguments and errors.

use std::fmt;

/// The largest number of tokens a batch may hold.
///
/// Every index a plan writes is below this bound, so they fit the `int32`
/// range too. It is far above any real batch (SGLang batches are bounded by
/// the KV cache) and keeps a corrupt length from asking for terabytes of
/// index memory.
pub const MAX_TOKENS: i64 = i32::MAX as i64;

/// Which of the two input sequences a value came from, named as SGLang names
/// the fields of `LogitsMetadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ExtendSeqLens,
    ExtendLogprobStartLens,
}

impl Field {
    pub fn name(self) -> &'static str {
        match self {
            Field::ExtendSeqLens => "extend_seq_lens",
            Field::ExtendLogprobStartLens => "extend_logprob_start_lens",
        }
    }
}

/// Why a plan could not be built. Every variant names the request and the
/// values involved, so the message alone locates the bad metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The two sequences have different lengths.
    LengthMismatch { extend: usize, start: usize },
    /// The batch has no request; SGLang samples one token per request.
    EmptyBatch,
    /// A value is not a usable integer (set by front ends that convert
    /// loosely typed input; `found` describes what was there).
    NotAnInteger {
        field: Field,
        request: usize,
        found: String,
    },
    /// A length is negative.
    Negative {
        field: Field,
        request: usize,
        value: i64,
    },
    /// A request has no token: there is nothing to sample.
    ZeroExtend { request: usize },
    /// A logprob start lies past the end of its request.
    StartPastExtend {
        request: usize,
        start: i64,
        extend: i64,
    },
    /// The running token count passes [`MAX_TOKENS`] at this request.
    TooManyTokens {
        request: usize,
        extend: i64,
        total: i64,
    },
    /// The batch's tokens do not match the rows of the hidden states.
    RowMismatch { tokens: i64, rows: i64 },
    /// An output buffer is too short for the plan.
    BufferTooSmall { needed: usize, got: usize },
}

impl PlanError {
    /// The request the error is about, if it is about one.
    pub fn request(&self) -> Option<usize> {
        match *self {
            PlanError::NotAnInteger { request, .. }
            | PlanError::Negative { request, .. }
            | PlanError::ZeroExtend { request }
            | PlanError::StartPastExtend { request, .. }
            | PlanError::TooManyTokens { request, .. } => Some(request),
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
            PlanError::RowMismatch { .. } => "row_mismatch",
            PlanError::BufferTooSmall { .. } => "buffer_too_small",
        }
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
                request,
                found,
            } => write!(
                f,
                "request {request}: {}[{request}] must be an int, got {found}",
                field.name()
            ),
            PlanError::Negative {
                field,
                request,
                value,
            } => write!(
                f,
                "request {request}: {}[{request}] = {value} is negative",
                field.name()
            ),
            PlanError::ZeroExtend { request } => write!(
                f,
                "request {request}: extend_seq_lens[{request}] = 0, but every request needs at least one token to sample"
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
                request,
                extend,
                total,
            } => write!(
                f,
                "request {request}: extend_seq_lens[{request}] = {extend} brings the batch to {total} tokens, over the limit of {MAX_TOKENS}"
            ),
            PlanError::RowMismatch { tokens, rows } => write!(
                f,
                "sum(extend_seq_lens) = {tokens}, but hidden_states has {rows} rows"
            ),
            PlanError::BufferTooSmall { needed, got } => write!(
                f,
                "the output buffer holds {got} int64 values, the plan needs {needed}"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// One request's part of the plan. All fields are non-negative and below
/// [`MAX_TOKENS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    /// Flat row of the request's first kept row.
    first_row: i64,
    /// Rows kept (at least 1).
    kept: i64,
    /// Kept rows that carry an input logprob: `kept`, or 0 for a chunk
    /// whose start equals its extend length.
    logprob: i64,
    /// Position of the first kept row among all kept rows.
    first_pruned: i64,
    /// Position of the first logprob row in `input_logprob`.
    first_logprob: i64,
}

/// Where each index set lies in the flat buffer that [`Plan::fill`] writes:
/// `gather | sample | input_logprob | token_to_seq`, the last part optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub gather: usize,
    pub sample: usize,
    pub input_logprob: usize,
    pub token_to_seq: usize,
}

impl Layout {
    /// Total number of `int64` values.
    pub fn len(&self) -> usize {
        self.gather + self.sample + self.input_logprob + self.token_to_seq
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A validated gather plan for one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    spans: Vec<Span>,
    num_tokens: i64,
    num_pruned: i64,
    num_input_logprob: i64,
}

impl Plan {
    /// Validates `extend_seq_lens` and `extend_logprob_start_lens` (one value
    /// per request, as SGLang's `LogitsMetadata` holds them) and records each
    /// request's span. Costs one pass over the requests.
    pub fn new(
        extend_seq_lens: &[i64],
        extend_logprob_start_lens: &[i64],
    ) -> Result<Plan, PlanError> {
        if extend_seq_lens.len() != extend_logprob_start_lens.len() {
            return Err(PlanError::LengthMismatch {
                extend: extend_seq_lens.len(),
                start: extend_logprob_start_lens.len(),
            });
        }
        if extend_seq_lens.is_empty() {
            return Err(PlanError::EmptyBatch);
        }
        let mut spans = Vec::with_capacity(extend_seq_lens.len());
        let (mut offset, mut pruned, mut logprob) = (0i64, 0i64, 0i64);
        for (request, (&extend, &start)) in extend_seq_lens
            .iter()
            .zip(extend_logprob_start_lens)
            .enumerate()
        {
            if extend < 0 {
                return Err(PlanError::Negative {
                    field: Field::ExtendSeqLens,
                    request,
                    value: extend,
                });
            }
            if start < 0 {
                return Err(PlanError::Negative {
                    field: Field::ExtendLogprobStartLens,
                    request,
                    value: start,
                });
            }
            if extend == 0 {
                return Err(PlanError::ZeroExtend { request });
            }
            if start > extend {
                return Err(PlanError::StartPastExtend {
                    request,
                    start,
                    extend,
                });
            }
            // Both are in [0, i64::MAX] and offset <= MAX_TOKENS, so the sum
            // cannot wrap before it is compared.
            let total = offset.saturating_add(extend);
            if total > MAX_TOKENS {
                return Err(PlanError::TooManyTokens {
                    request,
                    extend,
                    total,
                });
            }
            // A chunk with nothing left to score keeps its last row to sample.
            let (first, lp) = if start == extend {
                (extend - 1, 0)
            } else {
                (start, extend - start)
            };
            let kept = extend - first;
            spans.push(Span {
                first_row: offset + first,
                kept,
                logprob: lp,
                first_pruned: pruned,
                first_logprob: logprob,
            });
            offset = total;
            pruned += kept;
            logprob += lp;
        }
        Ok(Plan {
            spans,
            num_tokens: offset,
            num_pruned: pruned,
            num_input_logprob: logprob,
        })
    }

    /// Checks that the batch's tokens are exactly the `rows` of the hidden
    /// states the plan will gather from.
    pub fn check_rows(&self, rows: i64) -> Result<(), PlanError> {
        if rows != self.num_tokens {
            return Err(PlanError::RowMismatch {
                tokens: self.num_tokens,
                rows,
            });
        }
        Ok(())
    }

    pub fn batch_size(&self) -> usize {
        self.spans.len()
    }

    /// `sum(extend_seq_lens)`: rows the plan gathers from.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens as usize
    }

    /// Rows the plan keeps (the length of `gather` and `token_to_seq`).
    pub fn num_pruned(&self) -> usize {
        self.num_pruned as usize
    }

    /// Kept rows that carry an input logprob (the length of `input_logprob`).
    pub fn num_input_logprob(&self) -> usize {
        self.num_input_logprob as usize
    }

    /// The buffer layout, with or without the `token_to_seq` part.
    pub fn layout(&self, with_token_to_seq: bool) -> Layout {
        Layout {
            gather: self.num_pruned(),
            sample: self.batch_size(),
            input_logprob: self.num_input_logprob(),
            token_to_seq: if with_token_to_seq {
                self.num_pruned()
            } else {
                0
            },
        }
    }

    /// Writes every index set into `out`, laid out as [`Plan::layout`] says,
    /// in one pass over the kept rows. Values past the layout are left alone.
    pub fn fill(&self, out: &mut [i64], with_token_to_seq: bool) -> Result<(), PlanError> {
        let layout = self.layout(with_token_to_seq);
        if out.len() < layout.len() {
            return Err(PlanError::BufferTooSmall {
                needed: layout.len(),
                got: out.len(),
            });
        }
        let (gather, rest) = out.split_at_mut(layout.gather);
        let (sample, rest) = rest.split_at_mut(layout.sample);
        let (input_logprob, rest) = rest.split_at_mut(layout.input_logprob);
        let token_to_seq = &mut rest[..layout.token_to_seq];
        self.fill_parts(gather, sample, input_logprob, token_to_seq);
        Ok(())
    }

    /// The body of [`Plan::fill`]: the slices have exactly the layout's
    /// lengths (`token_to_seq` may be empty to skip it).
    fn fill_parts(
        &self,
        gather: &mut [i64],
        sample: &mut [i64],
        input_logprob: &mut [i64],
        token_to_seq: &mut [i64],
    ) {
        let with_token_to_seq = !token_to_seq.is_empty();
        for ((request, span), sample) in self.spans.iter().enumerate().zip(sample.iter_mut()) {
            let kept = span.first_pruned as usize..(span.first_pruned + span.kept) as usize;
            for (row, dst) in (span.first_row..).zip(&mut gather[kept.clone()]) {
                *dst = row;
            }
            *sample = span.first_pruned + span.kept - 1;
            let lp = span.first_logprob as usize..(span.first_logprob + span.logprob) as usize;
            for (pos, dst) in (span.first_pruned..).zip(&mut input_logprob[lp]) {
                *dst = pos;
            }
            if with_token_to_seq {
                token_to_seq[kept].fill(request as i64);
            }
        }
    }

    /// `sample` alone, e.g. for SGLang's `sample_indices_cpu` list.
    pub fn sample(&self) -> Vec<i64> {
        self.spans
            .iter()
            .map(|s| s.first_pruned + s.kept - 1)
            .collect()
    }

    /// `input_logprob` alone, e.g. for SGLang's `input_logprob_indices_cpu`.
    pub fn input_logprob(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.num_input_logprob());
        for span in &self.spans {
            out.extend(span.first_pruned..span.first_pruned + span.logprob);
        }
        out
    }

    /// `token_to_seq` alone: the request index of every kept row.
    pub fn token_to_seq(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.num_pruned());
        for (request, span) in self.spans.iter().enumerate() {
            out.extend(std::iter::repeat_n(request as i64, span.kept as usize));
        }
        out
    }

    /// `gather` alone.
    pub fn gather(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.num_pruned());
        for span in &self.spans {
            out.extend(span.first_row..span.first_row + span.kept);
        }
        out
    }
}

pub mod invariants;

#[cfg(test)]
mod tests;
