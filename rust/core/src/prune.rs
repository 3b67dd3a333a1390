//! The pruning plan of `LogitsProcessor._get_pruned_states`'s "prefill with
//! input logprobs" branch (see the crate documentation).

use crate::lengths::{add_request, check_rows, check_size};
use crate::{Field, PlanError};

/// One request's part of the plan. All fields are non-negative and below
/// [`MAX_TOKENS`](crate::MAX_TOKENS).
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

/// Where each index set lies in the flat buffer that [`PrunePlan::fill`] writes:
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
pub struct PrunePlan {
    spans: Vec<Span>,
    num_tokens: i64,
    num_pruned: i64,
    num_input_logprob: i64,
}

impl PrunePlan {
    /// Validates `extend_seq_lens` and `extend_logprob_start_lens` (one value
    /// per request, as SGLang's `LogitsMetadata` holds them) and records each
    /// request's span. Costs one pass over the requests; refuses a plan whose
    /// buffers would pass [`MAX_PLAN_BYTES`](crate::MAX_PLAN_BYTES) before
    /// anything that size is allocated.
    pub fn new(
        extend_seq_lens: &[i64],
        extend_logprob_start_lens: &[i64],
    ) -> Result<PrunePlan, PlanError> {
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
            let total = add_request(Field::ExtendSeqLens, request, extend, offset)?;
            if start > extend {
                return Err(PlanError::StartPastExtend {
                    request,
                    start,
                    extend,
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
        let plan = PrunePlan {
            spans,
            num_tokens: offset,
            num_pruned: pruned,
            num_input_logprob: logprob,
        };
        check_size(plan.layout(true).len() as u64)?;
        Ok(plan)
    }

    /// Checks the `rows` of the tensors the plan gathers from: at least the
    /// batch's tokens (rows past them, such as CUDA-graph or DP padding, are
    /// never read), or exactly that many when `exact`.
    pub fn check_rows(&self, rows: i64, exact: bool) -> Result<(), PlanError> {
        check_rows(self.num_tokens, rows, exact)
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

    /// Writes every index set into `out`, laid out as [`PrunePlan::layout`] says,
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

    /// The body of [`PrunePlan::fill`]: the slices have exactly the layout's
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
