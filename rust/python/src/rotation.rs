//! `flatgather._core.RotationPlan`: the draft worker's input rotation.

use flatgather_core::{Field, RotationPlan};
use pyo3::prelude::*;

use crate::convert::{extract_lens, with_output, with_rows};

/// A validated rotation plan for one batch (see `flatgather.rotation_plan`).
#[pyclass(module = "flatgather._core", name = "RotationPlan", frozen)]
pub(crate) struct PyRotationPlan {
    plan: RotationPlan,
}

#[pymethods]
impl PyRotationPlan {
    /// Validates the extend lengths; `num_rows`, when given, is the rows of
    /// `input_ids` and must equal `sum(extend_lens)`.
    #[new]
    #[pyo3(signature = (extend_lens, num_rows=None))]
    fn new(extend_lens: &Bound<'_, PyAny>, num_rows: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let lens = extract_lens(extend_lens, Field::ExtendLens)?;
        let plan = with_rows(
            num_rows,
            || RotationPlan::new(&lens),
            RotationPlan::check_rows,
        )?;
        Ok(PyRotationPlan { plan })
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.plan.batch_size()
    }

    #[getter]
    fn num_tokens(&self) -> usize {
        self.plan.num_tokens()
    }

    /// The `int64` count of the buffer: `ids`, and `| embeds` with `embeds=True`.
    #[pyo3(signature = (embeds=false))]
    fn buffer_len(&self, embeds: bool) -> usize {
        self.plan.buffer_len(embeds)
    }

    /// Writes `ids` (and `embeds` after it) into `out` in place.
    #[pyo3(signature = (out, embeds=false))]
    fn fill(&self, out: &Bound<'_, PyAny>, embeds: bool) -> PyResult<()> {
        let plan = &self.plan;
        with_output(out, plan.buffer_len(embeds), |dst| plan.fill(dst, embeds))
    }

    fn __repr__(&self) -> String {
        format!(
            "RotationPlan(batch_size={}, num_tokens={})",
            self.plan.batch_size(),
            self.plan.num_tokens()
        )
    }
}
