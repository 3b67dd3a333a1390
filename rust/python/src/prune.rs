//! `flatgather._core.PrunePlan`: the pruning plan of
//! `LogitsProcessor._get_pruned_states`.

use flatgather_core::{Field, PrunePlan};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::{extract_lens, with_output, with_rows};

/// A validated pruning plan for one batch (see `flatgather.prune_plan`).
#[pyclass(module = "flatgather._core", name = "PrunePlan", frozen)]
pub(crate) struct PyPrunePlan {
    plan: PrunePlan,
}

#[pymethods]
impl PyPrunePlan {
    /// Validates the batch metadata; raises PlanError naming the request.
    /// `num_rows`, when given, is the rows of `hidden_states`: at least
    /// `sum(extend_seq_lens)`, or exactly that with `exact_rows=True`.
    #[new]
    #[pyo3(signature = (extend_seq_lens, extend_logprob_start_lens, num_rows=None, exact_rows=false))]
    fn new(
        extend_seq_lens: &Bound<'_, PyAny>,
        extend_logprob_start_lens: &Bound<'_, PyAny>,
        num_rows: Option<&Bound<'_, PyAny>>,
        exact_rows: bool,
    ) -> PyResult<Self> {
        let extend = extract_lens(extend_seq_lens, Field::ExtendSeqLens)?;
        let start = extract_lens(extend_logprob_start_lens, Field::ExtendLogprobStartLens)?;
        let plan = with_rows(
            num_rows,
            || PrunePlan::new(&extend, &start),
            |plan, rows| plan.check_rows(rows, exact_rows),
        )?;
        Ok(PyPrunePlan { plan })
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.plan.batch_size()
    }

    #[getter]
    fn num_tokens(&self) -> usize {
        self.plan.num_tokens()
    }

    #[getter]
    fn num_pruned(&self) -> usize {
        self.plan.num_pruned()
    }

    #[getter]
    fn num_input_logprob(&self) -> usize {
        self.plan.num_input_logprob()
    }

    /// The `int64` count of the flat buffer: `gather | sample | input_logprob`
    /// and, with `token_to_seq=True`, `| token_to_seq`.
    #[pyo3(signature = (token_to_seq=true))]
    fn buffer_len(&self, token_to_seq: bool) -> usize {
        self.plan.layout(token_to_seq).len()
    }

    /// Writes the plan into `out`, a writable, contiguous 1-D int64 NumPy
    /// array (typically a view of a pinned torch tensor), in place.
    #[pyo3(signature = (out, token_to_seq=true))]
    fn fill(&self, out: &Bound<'_, PyAny>, token_to_seq: bool) -> PyResult<()> {
        let plan = &self.plan;
        with_output(out, plan.layout(token_to_seq).len(), |dst| {
            plan.fill(dst, token_to_seq)
        })
    }

    /// `sample` as a Python list (SGLang's `sample_indices_cpu`).
    fn sample_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.plan.sample())
    }

    /// `input_logprob` as a Python list (SGLang's `input_logprob_indices_cpu`).
    fn input_logprob_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.plan.input_logprob())
    }

    /// `token_to_seq` as a Python list. `trailing=True` appends the last
    /// request's index once more, as SGLang releases before 0.5.16 do.
    #[pyo3(signature = (trailing=false))]
    fn token_to_seq_list<'py>(
        &self,
        py: Python<'py>,
        trailing: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut values = self.plan.token_to_seq();
        if trailing {
            values.push(self.plan.batch_size() as i64 - 1);
        }
        PyList::new(py, values)
    }

    fn __repr__(&self) -> String {
        format!(
            "PrunePlan(batch_size={}, num_tokens={}, num_pruned={}, num_input_logprob={})",
            self.plan.batch_size(),
            self.plan.num_tokens(),
            self.plan.num_pruned(),
            self.plan.num_input_logprob()
        )
    }
}
