//! The output logprobs of a decode step, one entry per row: where each row's
//! values lie in one flat tensor, so that one gather, one device-to-host
//! copy and one `.tolist()` serve the whole batch.
//!
//! A speculative verify step scores `A` positions per request (a plain
//! decode step: one), and SGLang's chain hands the scheduler one entry per
//! row of those `B * A` rows: for top logprobs the first `k` of the row's
//! `max_k` top values, for token-id logprobs the values at the ids the
//! request asked for. The release builds each entry on its own (a view, or a
//! copy of the ids and an index), copies each to the host and calls
//! `.tolist()` on each; a [`SpecLogprobsPlan`] states where every row's
//! values lie in one flat tensor instead:
//!
//! * top logprobs ([`SpecLogprobsPlan::top_k`]): the `[rows, max_k]` top-k
//!   tensor itself, row-major; row `i` owns `[i * max_k, i * max_k + k_i)`;
//! * token ids ([`SpecLogprobsPlan::token_ids`]): the values gathered at the
//!   flat indices [`SpecLogprobsPlan::fill`] writes (`row * vocab + id`, a
//!   negative id counted from the end of its row), row after row; a row
//!   without ids owns none.
//!
//! ```
//! use flatgather_core::SpecLogprobsPlan;
//!
//! // Two requests, two positions each: top-2 and top-1 (max_k 2).
//! let plan = SpecLogprobsPlan::top_k(&[2, 2, 1, 1], 4, 16).unwrap();
//! assert_eq!(plan.spans(), &[(0, 2), (2, 2), (4, 1), (6, 1)]);
//! assert_eq!(plan.split_sizes(), vec![2, 0, 2, 0, 1, 1, 1, 1]);
//!
//! // Ids [7, 3] on the first position, none on the second.
//! let ids: [Option<&[i64]>; 2] = [Some(&[7, 3]), None];
//! let plan = SpecLogprobsPlan::token_ids(&ids, 2, 16).unwrap();
//! let mut flat = vec![0; plan.buffer_len()];
//! plan.fill(&mut flat).unwrap();
//! assert_eq!(flat, vec![7, 3]);
//! assert_eq!(plan.spans(), &[(0, 2), (2, 0)]);
//! assert_eq!(plan.none_rows(), &[1]);
//! ```
//!
//! Both read the rows in order from the first, as the release's loops do;
//! the tensor may have more rows than the lists (they are never read), not
//! fewer. What the release gives its own meaning (a negative top-k number
//! slices from the end; a number past the vocabulary, or an id outside it,
//! fails there) is refused, so that the release's code runs on it.

use std::ops::Range;

use crate::lengths::check_size;
use crate::{Field, PlanError};

/// Where every row's values lie in the flat values of one decode step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecLogprobsPlan {
    /// Per row: the position of its first value and its number of values.
    spans: Vec<(usize, usize)>,
    /// Top logprobs: `max_k`, the row stride of the top-k tensor.
    width: Option<usize>,
    /// Token ids: every row's ids, one row after the other.
    ids: Vec<i64>,
    /// Token ids: the rows that ask for none (`None`, not an empty list).
    none_rows: Vec<usize>,
    vocab: i64,
    num_values: usize,
}

fn refuse_short(rows_listed: usize, rows: i64) -> Result<(), PlanError> {
    if rows_listed == 0 {
        return Err(PlanError::EmptyBatch);
    }
    if (rows_listed as u64) > rows.max(0) as u64 {
        return Err(PlanError::TooFewRows {
            tokens: rows_listed as i64,
            rows,
        });
    }
    Ok(())
}

impl SpecLogprobsPlan {
    /// The top logprobs of `top_logprobs_nums.len()` rows of a logprobs
    /// tensor of `rows` rows and `vocab` columns: row `i` keeps the first
    /// `top_logprobs_nums[i]` of the `max_k = max(top_logprobs_nums)` top
    /// values of its row.
    pub fn top_k(
        top_logprobs_nums: &[i64],
        rows: i64,
        vocab: i64,
    ) -> Result<SpecLogprobsPlan, PlanError> {
        refuse_short(top_logprobs_nums.len(), rows)?;
        let mut max_k = 0i64;
        for (row, &k) in top_logprobs_nums.iter().enumerate() {
            if k < 0 {
                return Err(PlanError::Negative {
                    field: Field::TopLogprobsNums,
                    request: row,
                    value: k,
                });
            }
            if k > vocab {
                return Err(PlanError::LeftToRelease {
                    request: row,
                    why: "asks for more top logprobs than the vocabulary holds",
                });
            }
            max_k = max_k.max(k);
        }
        // The spans address the top-k tensor: bounded like a plan's buffers,
        // so that no position can overflow.
        let rows_listed = top_logprobs_nums.len() as u64;
        check_size(rows_listed.saturating_mul((max_k as u64).max(2)))?;
        let width = max_k as usize;
        let spans = top_logprobs_nums
            .iter()
            .enumerate()
            .map(|(row, &k)| (row * width, k as usize))
            .collect();
        Ok(SpecLogprobsPlan {
            spans,
            width: Some(width),
            ids: Vec::new(),
            none_rows: Vec::new(),
            vocab,
            num_values: top_logprobs_nums.len() * width,
        })
    }

    /// The token-id logprobs of `token_ids.len()` rows of a logprobs tensor
    /// of `rows` rows and `vocab` columns: row `i` gets the values at
    /// `token_ids[i]` (none for `None`).
    pub fn token_ids(
        token_ids: &[Option<&[i64]>],
        rows: i64,
        vocab: i64,
    ) -> Result<SpecLogprobsPlan, PlanError> {
        refuse_short(token_ids.len(), rows)?;
        let mut plan = SpecLogprobsPlan {
            spans: Vec::with_capacity(token_ids.len()),
            width: None,
            ids: Vec::new(),
            none_rows: Vec::new(),
            vocab,
            num_values: 0,
        };
        for (row, ids) in token_ids.iter().enumerate() {
            let Some(ids) = ids else {
                plan.none_rows.push(row);
                plan.spans.push((plan.num_values, 0));
                continue;
            };
            if let Some(&id) = ids.iter().find(|&&id| id < -vocab || id >= vocab) {
                return Err(PlanError::TokenIdOutOfRange {
                    request: row,
                    id,
                    vocab,
                });
            }
            check_size((plan.num_values + ids.len()) as u64 + 2 * token_ids.len() as u64)?;
            plan.spans.push((plan.num_values, ids.len()));
            plan.ids.extend_from_slice(ids);
            plan.num_values += ids.len();
        }
        Ok(plan)
    }

    /// Rows listed: entries the release hands on.
    pub fn num_rows(&self) -> usize {
        self.spans.len()
    }

    /// Values of the flat tensor: `rows * max_k` for top logprobs, every
    /// requested id for token ids.
    pub fn num_values(&self) -> usize {
        self.num_values
    }

    /// `max_k` for top logprobs, None for token ids.
    pub fn width(&self) -> Option<usize> {
        self.width
    }

    /// Every row keeps all of its `max_k` top values: the rows of the top-k
    /// tensor are the entries as they are. False for token ids.
    pub fn uniform(&self) -> bool {
        matches!(self.width, Some(w) if self.spans.iter().all(|&(_, len)| len == w))
    }

    /// Per row, where its values start in the flat values and how many.
    pub fn spans(&self) -> &[(usize, usize)] {
        &self.spans
    }

    /// Where each row's values lie among `num_values` flat values, in
    /// order; refuses any count but the plan's, so that no range lies past
    /// the values.
    pub fn rows_of(
        &self,
        num_values: usize,
    ) -> Result<impl ExactSizeIterator<Item = Range<usize>> + '_, PlanError> {
        if num_values != self.num_values {
            return Err(PlanError::ValueCount {
                got: num_values,
                expected: self.num_values,
                gathered: false,
            });
        }
        Ok(self.spans.iter().map(|&(start, len)| start..start + len))
    }

    /// The rows that ask for no token id (`None`).
    pub fn none_rows(&self) -> &[usize] {
        &self.none_rows
    }

    /// The sizes that cut the flat values into every row's values, in order:
    /// for top logprobs each row's `k` followed by the `max_k - k` values it
    /// skips (so the rows are every other piece); for token ids each row's
    /// number of ids.
    pub fn split_sizes(&self) -> Vec<i64> {
        match self.width {
            Some(width) => self
                .spans
                .iter()
                .flat_map(|&(_, len)| [len as i64, (width - len) as i64])
                .collect(),
            None => self.spans.iter().map(|&(_, len)| len as i64).collect(),
        }
    }

    /// Index values [`fill`](Self::fill) writes: one per token id, none for
    /// top logprobs (the top-k tensor is the flat tensor).
    pub fn buffer_len(&self) -> usize {
        match self.width {
            Some(_) => 0,
            None => self.num_values,
        }
    }

    /// Writes into `out` the flat index of every token-id value into the
    /// row-major logprobs (`row * vocab + id`, a negative id counted from the
    /// end of its row), in order. Values past them are left alone.
    pub fn fill(&self, out: &mut [i64]) -> Result<(), PlanError> {
        let needed = self.buffer_len();
        if out.len() < needed {
            return Err(PlanError::BufferTooSmall {
                needed,
                got: out.len(),
            });
        }
        if needed == 0 {
            return Ok(());
        }
        let vocab = self.vocab;
        for (row, &(start, len)) in self.spans.iter().enumerate() {
            let base = row as i64 * vocab;
            for (slot, &id) in out[start..start + len]
                .iter_mut()
                .zip(&self.ids[start..start + len])
            {
                *slot = base + if id < 0 { id + vocab } else { id };
            }
        }
        Ok(())
    }
}
