//! `flatgather._core.SpecLogprobsPlan`: the output logprobs of a decode or
//! verify step.

use flatgather_core::{Field, SpecLogprobsPlan};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::{core_error, extract_lens, with_output, with_token_ids};

/// The output logprobs of one decode or verify step, one entry per row:
/// where every row's values lie in one flat tensor.
#[pyclass(module = "flatgather._core", name = "SpecLogprobsPlan", frozen)]
pub(crate) struct PySpecLogprobsPlan {
    plan: SpecLogprobsPlan,
}

#[pymethods]
impl PySpecLogprobsPlan {
    /// The top logprobs of `len(top_logprobs_nums)` rows of a `[rows,
    /// vocab]` logprobs tensor: row `i` keeps the first
    /// `top_logprobs_nums[i]` of the row's `max(top_logprobs_nums)` top values.
    #[staticmethod]
    fn top_k(top_logprobs_nums: &Bound<'_, PyAny>, rows: i64, vocab: i64) -> PyResult<Self> {
        let nums = extract_lens(top_logprobs_nums, Field::TopLogprobsNums)?;
        let plan = SpecLogprobsPlan::top_k(&nums, rows, vocab).map_err(core_error)?;
        Ok(PySpecLogprobsPlan { plan })
    }

    /// The token-id logprobs of `len(token_ids)` rows (each None or a list
    /// of ints) of a `[rows, vocab]` logprobs tensor.
    #[staticmethod]
    fn token_ids(token_ids: &Bound<'_, PyAny>, rows: i64, vocab: i64) -> PyResult<Self> {
        let plan = with_token_ids(token_ids, usize::MAX, |ids| {
            SpecLogprobsPlan::token_ids(ids, rows, vocab)
        })?;
        Ok(PySpecLogprobsPlan { plan })
    }

    /// Rows listed.
    #[getter]
    fn num_rows(&self) -> usize {
        self.plan.num_rows()
    }

    /// Values of the flat tensor.
    #[getter]
    fn num_values(&self) -> usize {
        self.plan.num_values()
    }

    /// `max_k` (the top-k tensor's width) for top logprobs, None for token ids.
    #[getter]
    fn width(&self) -> Option<usize> {
        self.plan.width()
    }

    /// Every row keeps all `max_k` of its top values (never for token ids).
    #[getter]
    fn uniform(&self) -> bool {
        self.plan.uniform()
    }

    /// The sizes that cut the flat values into the rows: for top logprobs
    /// each row's `k` then the `max_k - k` it skips, for token ids each
    /// row's number of ids.
    fn split_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.plan.split_sizes())
    }

    /// The rows that ask for no token id (None).
    fn none_rows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.plan.none_rows())
    }

    /// The `int64` count of the index buffer (token ids; 0 for top logprobs).
    fn buffer_len(&self) -> usize {
        self.plan.buffer_len()
    }

    /// Writes the flat index of every token-id value (`row * vocab + id`)
    /// into `out` in place.
    fn fill(&self, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let plan = &self.plan;
        with_output(out, plan.buffer_len(), |dst| plan.fill(dst))
    }

    /// Every row's values as a fresh list, cut from `values` (the flat
    /// values as one list, `.tolist()` of the flat tensor).
    fn rows_of<'py>(&self, values: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
        let rows = self.plan.rows_of(values.len()).map_err(core_error)?;
        PyList::new(
            values.py(),
            rows.map(|row| values.get_slice(row.start, row.end)),
        )
    }

    fn __repr__(&self) -> String {
        let kind = match self.plan.width() {
            Some(width) => format!("top_k, max_k={width}"),
            None => "token_ids".to_string(),
        };
        format!(
            "SpecLogprobsPlan({kind}, rows={}, num_values={})",
            self.plan.num_rows(),
            self.plan.num_values()
        )
    }
}
