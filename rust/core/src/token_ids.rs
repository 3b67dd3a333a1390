//! The token-id logprobs of a prefill batch: which entries of the logprobs
//! every request reads, and how its values nest in the per-request lists.
//!
//! SGLang's input-logprob code hands each request the logprobs of a list of
//! token ids it asked for, at each of its scored rows: request `i` owns
//! `pruned_lens[i]` consecutive rows of the (chunk of) logprobs, and gets one
//! list per row, holding the logprob of each id in `token_ids[i]`. The
//! release gathers request by request (or row by row); a [`TokenIdsPlan`]
//! lists every `(row, column)` pair of the batch, in the order the values
//! nest, as flat indices into the row-major logprobs (`row * vocab + id`),
//! so that one gather (a `take`) reads them all:
//!
//! ```
//! use flatgather_core::{Entry, TokenIdsPlan, Walk};
//!
//! // Two requests: 2 rows asking for ids [7, 3], 1 row asking for none.
//! let ids: [Option<&[i64]>; 2] = [Some(&[7, 3]), None];
//! let plan = TokenIdsPlan::new(&[2, 1], &ids, 16, Walk::chunk(3, 0)).unwrap();
//! assert_eq!(plan.rows(), vec![0, 0, 1, 1]);
//! assert_eq!(plan.cols(), vec![7, 3, 7, 3]);
//! let mut flat = vec![0; plan.buffer_len(false)];
//! plan.fill(&mut flat, false).unwrap();
//! assert_eq!(flat, vec![7, 3, 23, 19]);
//! assert_eq!(plan.entries()[1], Entry::Rows { request: 1, rows: 0, width: 0, value: 4, extend: false });
//! ```
//!
//! ## The walk
//!
//! A [`Walk`] states how the release walks the requests of one call; every
//! release reads them in order, `pt` advancing by each request's
//! `pruned_lens[i]`:
//!
//! * a request with `pruned_lens[i] <= 0` gets a fresh empty entry
//!   ([`Entry::Empty`]);
//! * with chunked input logprobs, the rows may run out within a request: it
//!   gets the rows that are left (`next_split` then tells the next chunk how
//!   many of its rows were served), and the first request of a chunk may
//!   continue the last entry of the previous one (`split`): its entry extends
//!   that one instead of starting a new one;
//! * releases up to 0.5.15 append nothing for an empty chunk, and nothing for
//!   a request that gets no value list ([`Walk::skip_empty`]);
//! * the unchunked prefill functions of those releases (the whole batch at
//!   once) fail on a request without ids and silently truncate past the last
//!   row: a [`Walk::whole`] plan refuses both, so that the release's own
//!   code decides what they mean.
//!
//! Only `min(len(pruned_lens), len(token_ids))` requests are walked, as
//! Python's `zip` does. Every id must lie in `[-vocab, vocab)` (a negative id
//! counts from the end, as torch indexing does); any other is refused.

use std::ops::Range;

use crate::lengths::check_size;
use crate::PlanError;

/// How the release walks the requests of one call (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    /// Rows of the chunk of logprobs.
    pub rows: i64,
    /// Rows of the first request that an earlier chunk already served.
    pub split: i64,
    /// A request with no value list (no ids, or no row left) gets no entry,
    /// and an empty chunk returns at once (SGLang 0.5.10 to 0.5.15).
    pub skip_empty: bool,
    /// The whole batch in one call: a request without ids, or rows past the
    /// last one, are refused.
    pub whole: bool,
}

impl Walk {
    /// A chunk of `rows` rows whose first request had `split` rows served
    /// before (SGLang 0.5.16 on).
    pub fn chunk(rows: i64, split: i64) -> Walk {
        Walk {
            rows,
            split,
            skip_empty: false,
            whole: false,
        }
    }
}

/// What one request adds to the output lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A fresh empty entry (its pruned length is not positive).
    Empty,
    /// `rows` lists of `width` values each, taken from the gathered values
    /// from position `value` on, appended as a fresh entry or, with
    /// `extend`, added to the last entry. `rows == 0` (no row left in the
    /// chunk, or no ids) gives an empty entry.
    Rows {
        request: usize,
        rows: i64,
        width: usize,
        value: usize,
        extend: bool,
    },
}

impl Entry {
    /// The request whose token-id list sits beside each of the entry's rows
    /// in the release's id lists; None when the entry has no row.
    pub fn ids_of(&self) -> Option<usize> {
        match *self {
            Entry::Rows { request, rows, .. } if rows > 0 => Some(request),
            _ => None,
        }
    }

    /// Whether the entry is added to the caller's last entry rather than
    /// appended as a fresh one.
    pub fn extends(&self) -> bool {
        matches!(self, Entry::Rows { extend: true, .. })
    }

    /// Where each of the entry's rows lies among the gathered values, in
    /// order: `width` values from `value` on, one row after the other.
    pub fn row_values(&self) -> impl ExactSizeIterator<Item = Range<usize>> {
        let (value, width, rows) = match *self {
            Entry::Rows {
                value, width, rows, ..
            } => (value, width, rows.max(0) as usize),
            Entry::Empty => (0, 0, 0),
        };
        (0..rows).map(move |row| {
            let start = value + row * width;
            start..start + width
        })
    }
}

/// A validated token-ids plan for one call of the release's function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIdsPlan {
    entries: Vec<Entry>,
    /// Per entry with values: its first row and where its ids lie in `ids`.
    spans: Vec<(i64, Range<usize>)>,
    /// The ids of every entry with values, one after the other.
    ids: Vec<i64>,
    vocab: i64,
    next_split: i64,
    num_values: usize,
}

impl TokenIdsPlan {
    /// Walks `pruned_lens` and `token_ids` as `walk` says; `vocab` is the
    /// logprobs' width. Refuses, naming the request, an id out of range, or
    /// what a [`Walk::whole`] plan leaves to the release.
    pub fn new(
        pruned_lens: &[i64],
        token_ids: &[Option<&[i64]>],
        vocab: i64,
        walk: Walk,
    ) -> Result<TokenIdsPlan, PlanError> {
        let mut plan = TokenIdsPlan {
            entries: Vec::new(),
            spans: Vec::new(),
            ids: Vec::new(),
            next_split: 0,
            num_values: 0,
            vocab,
        };
        // Every flat index `row * vocab + id` must fit: rows and vocab from
        // a real tensor's shape always do.
        if vocab <= 0 || walk.rows < 0 || walk.rows.checked_mul(vocab).is_none() {
            return Err(PlanError::BadShape {
                rows: walk.rows,
                vocab,
            });
        }
        if walk.skip_empty && walk.rows == 0 {
            return Ok(plan);
        }
        let mut pt = 0i64;
        let mut split = walk.split;
        for (request, (&len, &ids)) in pruned_lens.iter().zip(token_ids).enumerate() {
            let mut len = len;
            if request == 0 {
                len = len.saturating_sub(split);
            } else {
                split = 0;
            }
            if len <= 0 {
                plan.entries.push(Entry::Empty);
                continue;
            }
            let left = walk.rows.saturating_sub(pt).max(0);
            let rows = len.min(left);
            if walk.whole && (ids.is_none() || rows < len) {
                return Err(PlanError::LeftToRelease {
                    request,
                    why: if ids.is_none() {
                        "asks for no token ids"
                    } else {
                        "has rows past the logprobs"
                    },
                });
            }
            if rows < len {
                plan.next_split = split.saturating_add(rows);
            }
            let (rows, width) = match ids {
                Some(ids) if rows > 0 => (rows, ids.len()),
                _ => (0, 0),
            };
            if rows == 0 && walk.skip_empty {
                pt = pt.saturating_add(len);
                continue;
            }
            if let Some(ids) = ids.filter(|ids| rows > 0 && !ids.is_empty()) {
                if let Some(&id) = ids.iter().find(|&&id| id < -vocab || id >= vocab) {
                    return Err(PlanError::TokenIdOutOfRange { request, id, vocab });
                }
                let values = (rows as u64).saturating_mul(width as u64);
                check_size(
                    (plan.num_values as u64)
                        .saturating_add(values)
                        .saturating_mul(2),
                )?;
                let start = plan.ids.len();
                plan.ids.extend_from_slice(ids);
                plan.spans.push((pt, start..plan.ids.len()));
            }
            plan.entries.push(Entry::Rows {
                request,
                rows,
                width,
                value: plan.num_values,
                extend: split > 0,
            });
            plan.num_values += rows as usize * width;
            pt = pt.saturating_add(len);
        }
        Ok(plan)
    }

    /// What each walked request adds, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entries, once `num_values` gathered values are to be cut into
    /// them (see [`Entry::row_values`]); refuses any count but the plan's,
    /// so that no range lies past the values.
    pub fn nest(&self, num_values: usize) -> Result<&[Entry], PlanError> {
        if num_values != self.num_values {
            return Err(PlanError::ValueCount {
                got: num_values,
                expected: self.num_values,
                gathered: true,
            });
        }
        Ok(&self.entries)
    }

    /// What the release's function returns: the rows of the last request
    /// served so far, when its rows ran past the chunk; else 0.
    pub fn next_split(&self) -> i64 {
        self.next_split
    }

    /// Values gathered: the length of each part of the buffer.
    pub fn num_values(&self) -> usize {
        self.num_values
    }

    /// The logprobs' width the ids were checked against.
    pub fn vocab(&self) -> i64 {
        self.vocab
    }

    /// Calls `visit(row, id)` for every value, in order.
    fn each(&self, mut visit: impl FnMut(i64, i64)) {
        // One span per entry with values, in order.
        let mut spans = self.spans.iter();
        for entry in &self.entries {
            let Entry::Rows { rows, width, .. } = *entry else {
                continue;
            };
            if rows == 0 || width == 0 {
                continue;
            }
            let (first, ids) = spans.next().expect("one span per entry with values");
            for row in *first..*first + rows {
                for &id in &self.ids[ids.clone()] {
                    visit(row, id);
                }
            }
        }
    }

    /// Buffer length: the flat index of every value and, `with_rows`,
    /// its row after them.
    pub fn buffer_len(&self, with_rows: bool) -> usize {
        self.num_values * if with_rows { 2 } else { 1 }
    }

    /// Writes into `out` the flat index of every value into the row-major
    /// logprobs (`row * vocab + id`, a negative id counted from the end of
    /// its row) and, `with_rows`, the row of every value after them. Values
    /// past them are left alone.
    pub fn fill(&self, out: &mut [i64], with_rows: bool) -> Result<(), PlanError> {
        let n = self.num_values;
        let needed = self.buffer_len(with_rows);
        if out.len() < needed {
            return Err(PlanError::BufferTooSmall {
                needed,
                got: out.len(),
            });
        }
        let (flat, rest) = out.split_at_mut(n);
        let vocab = self.vocab;
        let mut at = 0;
        if with_rows {
            let rows = &mut rest[..n];
            self.each(|row, id| {
                flat[at] = row * vocab + if id < 0 { id + vocab } else { id };
                rows[at] = row;
                at += 1;
            });
        } else {
            self.each(|row, id| {
                flat[at] = row * vocab + if id < 0 { id + vocab } else { id };
                at += 1;
            });
        }
        Ok(())
    }

    /// The row of every value, in order.
    pub fn rows(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.num_values);
        self.each(|row, _| out.push(row));
        out
    }

    /// The column (token id, as asked) of every value, in order.
    pub fn cols(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.num_values);
        self.each(|_, id| out.push(id));
        out
    }
}
