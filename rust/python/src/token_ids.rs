//! `flatgather._core.TokenIdsPlan`: the token-id input logprobs of one call
//! of SGLang's input-logprob function.

use flatgather_core::{Entry, Field, TokenIdsPlan, Walk};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::{core_error, extract_lens, with_output, with_token_ids};

/// `out[-1]`, raising IndexError on an empty list as Python does.
fn last_item<'py>(out: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
    match out.len() {
        0 => Err(pyo3::exceptions::PyIndexError::new_err(
            "list index out of range",
        )),
        n => out.get_item(n - 1),
    }
}

/// The token-id logprobs of one call of SGLang's input-logprob function:
/// every `(row, id)` pair in the order the values nest, and the nesting.
#[pyclass(module = "flatgather._core", name = "TokenIdsPlan", frozen)]
pub(crate) struct PyTokenIdsPlan {
    plan: TokenIdsPlan,
}

#[pymethods]
impl PyTokenIdsPlan {
    /// Walks `pruned_lens` and `token_ids` (a list of None or lists of
    /// ints) over a chunk of `rows` rows of a `vocab`-wide logprobs tensor,
    /// whose first request had `split` rows served by earlier chunks.
    /// `skip_empty`: no entry for a request without values, and none at all
    /// for an empty chunk (SGLang 0.5.10 to 0.5.15). `whole`: the whole
    /// batch at once; a request without ids or past the rows is refused.
    #[new]
    #[pyo3(signature = (pruned_lens, token_ids, vocab, rows, split=0, skip_empty=false, whole=false))]
    fn new(
        pruned_lens: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        vocab: i64,
        rows: i64,
        split: i64,
        skip_empty: bool,
        whole: bool,
    ) -> PyResult<Self> {
        let lens = extract_lens(pruned_lens, Field::PrunedLens)?;
        let walk = Walk {
            rows,
            split,
            skip_empty,
            whole,
        };
        let plan = with_token_ids(token_ids, lens.len(), |ids| {
            TokenIdsPlan::new(&lens, ids, vocab, walk)
        })?;
        Ok(PyTokenIdsPlan { plan })
    }

    /// Values to gather.
    #[getter]
    fn num_values(&self) -> usize {
        self.plan.num_values()
    }

    /// What the release's function returns (the split for the next chunk).
    #[getter]
    fn next_split(&self) -> i64 {
        self.plan.next_split()
    }

    /// Whether the first entry extends the caller's last one.
    #[getter]
    fn extends(&self) -> bool {
        self.plan.entries().first().is_some_and(Entry::extends)
    }

    /// The `int64` count of the buffer: the flat indices and, with
    /// `rows=True`, the row of each after them.
    #[pyo3(signature = (rows=false))]
    fn buffer_len(&self, rows: bool) -> usize {
        self.plan.buffer_len(rows)
    }

    /// Writes the flat indices (`row * vocab + id`) into `out` in place, and
    /// with `rows=True` the rows after them.
    #[pyo3(signature = (out, rows=false))]
    fn fill(&self, out: &Bound<'_, PyAny>, rows: bool) -> PyResult<()> {
        let plan = &self.plan;
        with_output(out, plan.buffer_len(rows), |dst| plan.fill(dst, rows))
    }

    /// The entries, in order: None for a fresh empty entry, else
    /// `(request, rows, width, value, extend)`.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self.plan.entries().iter().map(|entry| match *entry {
            Entry::Empty => py.None().into_bound(py),
            Entry::Rows {
                request,
                rows,
                width,
                value,
                extend,
            } => (request, rows, width, value, extend)
                .into_pyobject(py)
                .expect("a tuple of ints and a bool")
                .into_any(),
        });
        PyList::new(py, items)
    }

    /// Appends to `val_out` and `idx_out` what the release appends, from
    /// `values` (the gathered values, as one flat list): per request one list
    /// of `width` values per row, and the request's own `token_ids` list
    /// once per row; an entry that continues the previous one extends the
    /// last item of each instead.
    fn nest(
        &self,
        values: &Bound<'_, PyList>,
        token_ids: &Bound<'_, PyList>,
        val_out: &Bound<'_, PyList>,
        idx_out: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let py = values.py();
        for entry in self.plan.nest(values.len()).map_err(core_error)? {
            let val = PyList::empty(py);
            let idx = PyList::empty(py);
            if let Some(request) = entry.ids_of() {
                // The same list object on every row, as the release does.
                let ids = token_ids.get_item(request)?;
                for row in entry.row_values() {
                    val.append(values.get_slice(row.start, row.end))?;
                    idx.append(&ids)?;
                }
            }
            if entry.extends() {
                last_item(val_out)?.call_method1(intern!(py, "extend"), (val,))?;
                last_item(idx_out)?.call_method1(intern!(py, "extend"), (idx,))?;
            } else {
                val_out.append(val)?;
                idx_out.append(idx)?;
            }
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "TokenIdsPlan(entries={}, num_values={}, next_split={})",
            self.plan.entries().len(),
            self.plan.num_values(),
            self.plan.next_split()
        )
    }
}
