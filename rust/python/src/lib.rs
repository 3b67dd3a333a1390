//! `flatgather._core`: the PyO3 face of `flatgather-core`.
//!
//! It converts arguments and errors and nothing more: the plan is built by the
//! pure-Rust core, and the Python package allocates the (pinned) buffers that
//! the plan is written into.

use flatgather_core::{Field, Plan, PlanError as CoreError, MAX_TOKENS};
use numpy::PyReadwriteArray1;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyTuple};

create_exception!(
    flatgather._core,
    PlanError,
    PyValueError,
    "Bad batch metadata: the message names the request and the values. \
     `request` holds the request index (or None) and `kind` a short name of the error."
);

/// Below this many index values the GIL is kept: releasing and taking it
/// back costs more than writing a few thousand integers.
const DETACH_MIN_VALUES: usize = 1 << 15;

fn to_py_err(py: Python<'_>, err: CoreError) -> PyErr {
    let py_err = PlanError::new_err(err.to_string());
    let value = py_err.value(py);
    // Setting attributes on a fresh exception instance cannot fail in practice;
    // if it did, the message still carries every detail.
    let _ = value.setattr("request", err.request());
    let _ = value.setattr("kind", err.kind());
    py_err
}

/// One length, as SGLang passes it: a Python int (or anything with
/// `__index__`, such as a NumPy integer). `bool` is refused although it is
/// an int subclass: a flag where a length belongs is a bug upstream.
fn extract_len(item: &Bound<'_, PyAny>, field: Field, request: usize) -> Result<i64, CoreError> {
    let describe = |what: &str| CoreError::NotAnInteger {
        field,
        request,
        found: what.to_string(),
    };
    if item.is_instance_of::<PyBool>() {
        return Err(describe(&format!(
            "bool {}",
            item.str().map(|s| s.to_string()).unwrap_or_default()
        )));
    }
    item.extract::<i64>().map_err(|_| {
        let type_name = item
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into());
        let shown = item
            .repr()
            .map(|r| {
                let r = r.to_string();
                if r.len() > 60 {
                    format!("{}...", &r[..60])
                } else {
                    r
                }
            })
            .unwrap_or_default();
        if item.is_instance_of::<pyo3::types::PyInt>() {
            describe(&format!("{shown}, which does not fit in int64"))
        } else {
            describe(&format!("{type_name} {shown}"))
        }
    })
}

fn collect_lens<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    len: usize,
    field: Field,
) -> Result<Vec<i64>, CoreError> {
    let mut out = Vec::with_capacity(len);
    for (i, item) in items.enumerate() {
        out.push(extract_len(&item, field, i)?);
    }
    Ok(out)
}

fn extract_lens(obj: &Bound<'_, PyAny>, field: Field) -> PyResult<Result<Vec<i64>, CoreError>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(collect_lens(list.iter(), list.len(), field));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(collect_lens(tuple.iter(), tuple.len(), field));
    }
    let type_name = obj.get_type().name()?.to_string();
    Err(PlanError::new_err(format!(
        "{} must be a list or tuple of ints (as SGLang's LogitsMetadata holds it), got {type_name}",
        field.name()
    )))
}

/// A validated gather plan for one batch (see `flatgather.prune_plan`).
#[pyclass(module = "flatgather._core", name = "Plan", frozen)]
struct PyPlan {
    plan: Plan,
}

#[pymethods]
impl PyPlan {
    /// Validates the batch metadata; raises PlanError naming the request.
    /// `num_rows`, when given, must equal `sum(extend_seq_lens)`.
    #[new]
    #[pyo3(signature = (extend_seq_lens, extend_logprob_start_lens, num_rows=None))]
    fn new(
        py: Python<'_>,
        extend_seq_lens: &Bound<'_, PyAny>,
        extend_logprob_start_lens: &Bound<'_, PyAny>,
        num_rows: Option<i64>,
    ) -> PyResult<Self> {
        let extend =
            extract_lens(extend_seq_lens, Field::ExtendSeqLens)?.map_err(|e| to_py_err(py, e))?;
        let start = extract_lens(extend_logprob_start_lens, Field::ExtendLogprobStartLens)?
            .map_err(|e| to_py_err(py, e))?;
        let plan = Plan::new(&extend, &start).map_err(|e| to_py_err(py, e))?;
        if let Some(rows) = num_rows {
            plan.check_rows(rows).map_err(|e| to_py_err(py, e))?;
        }
        Ok(PyPlan { plan })
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
    fn fill(
        &self,
        py: Python<'_>,
        mut out: PyReadwriteArray1<'_, i64>,
        token_to_seq: bool,
    ) -> PyResult<()> {
        let dst = out
            .as_slice_mut()
            .map_err(|_| PlanError::new_err("the output array must be contiguous"))?;
        let plan = &self.plan;
        let result = if plan.num_pruned() >= DETACH_MIN_VALUES {
            py.detach(|| plan.fill(dst, token_to_seq))
        } else {
            plan.fill(dst, token_to_seq)
        };
        result.map_err(|e| to_py_err(py, e))
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
    /// request's index once more, as SGLang 0.5.10 and 0.5.15 do.
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
            "Plan(batch_size={}, num_tokens={}, num_pruned={}, num_input_logprob={})",
            self.plan.batch_size(),
            self.plan.num_tokens(),
            self.plan.num_pruned(),
            self.plan.num_input_logprob()
        )
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPlan>()?;
    m.add("PlanError", m.py().get_type::<PlanError>())?;
    m.add("MAX_TOKENS", MAX_TOKENS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
