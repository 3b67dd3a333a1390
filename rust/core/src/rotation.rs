//! The rotation plan of the V2 draft worker's prefill
//! (`EagleDraftWorker._draft_extend_for_prefill`).
//!
//! The draft model of EAGLE reads, at every prefill position, the token that
//! *follows* it: request `i`'s ids shift left by one and its last position
//! takes the request's tail token (the token the target just sampled, or for
//! a chunk of a chunked prefill the next prompt token). With the batch's ids
//! flattened by request and the `B` tail tokens appended after them, that is
//! one gather:
//!
//! * `ids[r]`: row `j` of request `i` (flat row `r = offset_i + j`) reads row
//!   `r + 1`, and its last row reads row `N + i` (the tail, `N` being the
//!   batch's tokens);
//! * `embeds[r]`, for multimodal embeddings rotated alongside: row `r + 1`
//!   likewise, and the last row of each request reads itself. SGLang leaves
//!   that row unwritten (the draft model fills it from the tail token), so
//!   any in-range row will do; reading itself keeps the index within `N`.
//!
//! ```
//! use flatgather_core::RotationPlan;
//!
//! let plan = RotationPlan::new(&[3, 1, 2]).unwrap();
//! // rows: a0 a1 a2 | b0 | c0 c1, tails at 6, 7, 8
//! assert_eq!(plan.ids(), vec![1, 2, 6, 7, 5, 8]);
//! assert_eq!(plan.embeds(), vec![1, 2, 2, 3, 5, 5]);
//! ```

use crate::lengths::{add_request, check_rows, check_size};
use crate::{Field, PlanError};

/// A validated rotation plan for one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationPlan {
    /// Each request's length (all positive).
    lens: Vec<i64>,
    num_tokens: i64,
}

impl RotationPlan {
    /// Validates the batch's extend lengths (SGLang's `extend_lens`). An
    /// empty batch is a valid, empty rotation.
    pub fn new(extend_lens: &[i64]) -> Result<RotationPlan, PlanError> {
        let mut total = 0i64;
        for (request, &len) in extend_lens.iter().enumerate() {
            total = add_request(Field::ExtendLens, request, len, total)?;
        }
        // ids and embeds together: the most a caller asks to fill.
        check_size(2 * total as u64)?;
        Ok(RotationPlan {
            lens: extend_lens.to_vec(),
            num_tokens: total,
        })
    }

    pub fn batch_size(&self) -> usize {
        self.lens.len()
    }

    /// `sum(extend_lens)`: the rows rotated.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens as usize
    }

    /// Checks the rows of the tensor to rotate: exactly the batch's tokens
    /// (SGLang asserts the same after its loop).
    pub fn check_rows(&self, rows: i64) -> Result<(), PlanError> {
        check_rows(self.num_tokens, rows, true)
    }

    /// The `int64` count of the buffer [`RotationPlan::fill`] writes:
    /// `ids`, then `embeds` when asked for.
    pub fn buffer_len(&self, with_embeds: bool) -> usize {
        self.num_tokens() * if with_embeds { 2 } else { 1 }
    }

    /// Writes `ids` and, with `with_embeds`, `embeds` after it into `out`, in
    /// one pass over the rows. Values past them are left alone.
    pub fn fill(&self, out: &mut [i64], with_embeds: bool) -> Result<(), PlanError> {
        let needed = self.buffer_len(with_embeds);
        if out.len() < needed {
            return Err(PlanError::BufferTooSmall {
                needed,
                got: out.len(),
            });
        }
        let (ids, rest) = out.split_at_mut(self.num_tokens());
        let embeds = if with_embeds {
            Some(&mut rest[..self.num_tokens()])
        } else {
            None
        };
        self.fill_parts(ids, embeds);
        Ok(())
    }

    fn fill_parts(&self, ids: &mut [i64], mut embeds: Option<&mut [i64]>) {
        let tail = self.num_tokens;
        let mut offset = 0usize;
        for (request, &len) in self.lens.iter().enumerate() {
            let len = len as usize;
            let last = offset + len - 1;
            for (r, dst) in (offset..last).zip(&mut ids[offset..last]) {
                *dst = r as i64 + 1;
            }
            ids[last] = tail + request as i64;
            if let Some(embeds) = embeds.as_deref_mut() {
                for (r, dst) in (offset..last).zip(&mut embeds[offset..last]) {
                    *dst = r as i64 + 1;
                }
                embeds[last] = last as i64;
            }
            offset += len;
        }
    }

    /// `ids` alone.
    pub fn ids(&self) -> Vec<i64> {
        let mut out = vec![0; self.num_tokens()];
        self.fill_parts(&mut out, None);
        out
    }

    /// `embeds` alone.
    pub fn embeds(&self) -> Vec<i64> {
        let mut ids = vec![0; self.num_tokens()];
        let mut out = vec![0; self.num_tokens()];
        self.fill_parts(&mut ids, Some(&mut out));
        out
    }
}
