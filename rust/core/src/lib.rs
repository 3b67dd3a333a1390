//! Flat gather plans for the prefill step of SGLang's speculative-decoding
//! path: the pruning of `LogitsProcessor._get_pruned_states` ("prefill with
//! input logprobs"), the draft worker's input rotation ([`RotationPlan`]),
//! the token-id input logprobs ([`TokenIdsPlan`]) and the output logprobs of
//! a decode or verify step ([`SpecLogprobsPlan`]).
//!
//! ## Pruning
//!
//! A prefill batch is flattened by request: request `i` owns the rows
//! `[offset_i, offset_i + extend_seq_lens[i])` of `hidden_states`. For input
//! logprobs SGLang keeps, per request, the rows from
//! `extend_logprob_start_lens[i]` to the end of the request. A request whose
//! start equals its extend length (a chunk of a chunked prefill) still keeps
//! its last row, because every request samples one token; that row carries no
//! input logprob.
//!
//! [`PrunePlan::new`] validates the two length lists once and records one span per
//! request; [`PrunePlan::fill`] then writes every index set in a single pass over
//! the kept rows:
//!
//! * `gather`: the flat row index of every kept row, in batch order;
//! * `sample`: for each request, the position of its last kept row;
//! * `input_logprob`: the positions of the kept rows that carry an input logprob;
//! * `token_to_seq`: the request index of every kept row.
//!
//! ```
//! use flatgather_core::PrunePlan;
//!
//! let plan = PrunePlan::new(&[4, 5, 6], &[0, 5, 3]).unwrap();
//! assert_eq!(plan.gather(), vec![0, 1, 2, 3, 8, 12, 13, 14]);
//! assert_eq!(plan.sample(), vec![3, 4, 7]);
//! assert_eq!(plan.input_logprob(), vec![0, 1, 2, 3, 5, 6, 7]);
//! assert_eq!(plan.token_to_seq(), vec![0, 0, 0, 0, 1, 2, 2, 2]);
//! ```
//!
//! Rows of `hidden_states` past the batch's tokens (CUDA-graph buckets, DP
//! attention padding) are allowed and never read: see
//! [`PrunePlan::check_rows`].
//!
//! ## Bounds
//!
//! Every plan is refused, with a [`PlanError`], before it allocates: bad
//! lengths, more than [`MAX_TOKENS`] tokens, or buffers over
//! [`MAX_PLAN_BYTES`].
//!
//! This crate has no Python types in it: the PyO3 binding lives in
//! `rust/python` and only converts arguments and errors.

/// The largest number of tokens a batch may hold.
///
/// Every index a plan writes is below `2 * MAX_TOKENS`, so within `int64`
/// with room to spare. It is far above any real batch (SGLang batches are
/// bounded by the KV cache) and keeps a corrupt length from overflowing.
pub const MAX_TOKENS: i64 = i32::MAX as i64;

/// The most memory one plan's index buffers may take: 1 GiB, that is 134M
/// `int64` values, or a pruning plan of about 44M kept rows. A real batch
/// needs a few MiB at most (1M tokens: 24 MiB); a corrupt length that asks
/// for more is refused before anything is allocated.
pub const MAX_PLAN_BYTES: u64 = 1 << 30;

mod error;
pub mod invariants;
mod lengths;
mod prune;
mod rotation;
mod spec_logprobs;
mod token_ids;

pub use error::{Field, PlanError};
pub use prune::{Layout, PrunePlan};
pub use rotation::RotationPlan;
pub use spec_logprobs::SpecLogprobsPlan;
pub use token_ids::{Entry, TokenIdsPlan, Walk};

#[cfg(test)]
mod tests;
