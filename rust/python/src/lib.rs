//! `flatgather._core`: the PyO3 face of `flatgather-core`.
//!
//! It converts arguments and errors and nothing more: plans are built by the
//! pure-Rust core, and the Python package allocates the (pinned) buffers that
//! they are written into.
//!
//! The error boundary is total. Bad input becomes `flatgather.PlanError`
//! (with `kind` and `request`); an exception raised by the caller's own code
//! while we read an argument (an `__index__` that raises, a
//! `KeyboardInterrupt`) propagates as itself; nothing panics. Describing a bad
//! value costs a bounded amount of work whatever its size: no `repr` of
//! arbitrary objects, a short prefix of long strings.

use flatgather_core::{
    Field, PlanError as CoreError, PrunePlan, RotationPlan, MAX_PLAN_BYTES, MAX_TOKENS,
};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::{ffi, intern};

pyo3::import_exception!(flatgather._errors, PlanError);

/// Below this many index values the GIL is kept: releasing and taking it
/// back costs more than writing a few thousand integers.
const DETACH_MIN_VALUES: usize = 1 << 15;

/// Characters of a string shown in a message.
const SHOWN_CHARS: isize = 32;

fn plan_error(message: String, kind: &str, request: Option<usize>) -> PyErr {
    PlanError::new_err((message, kind.to_string(), request))
}

fn core_error(err: CoreError) -> PyErr {
    plan_error(err.to_string(), err.kind(), err.request())
}

fn not_an_integer(field: Field, request: Option<usize>, found: String) -> PyErr {
    core_error(CoreError::NotAnInteger {
        field,
        request,
        found,
    })
}

/// `module.qualname` of a type, read off the type object (no instance code runs).
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.get_type();
    let qualname = ty
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    match ty.module() {
        Ok(module) if module != "builtins" => format!("{module}.{qualname}"),
        _ => qualname,
    }
}

/// A short description of a value that is not a usable length, in bounded
/// work: a prefix of a string, the size of a byte string, the value of a
/// float, and otherwise only the type's name.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let py = obj.py();
    if obj.is_none() {
        return "None".into();
    }
    if let Ok(s) = obj.cast::<PyString>() {
        // SAFETY: `s` is a live str; both calls only read it and return a new
        // reference (or -1 / NULL with an exception set, handled below).
        let len = unsafe { ffi::PyUnicode_GetLength(s.as_ptr()) };
        if len < 0 {
            let _ = PyErr::take(py);
            return type_name(obj);
        }
        let end = len.min(SHOWN_CHARS);
        let head = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyUnicode_Substring(s.as_ptr(), 0, end))
        };
        let shown = head
            .and_then(|h| h.repr().map(|r| r.to_string()))
            .unwrap_or_else(|_| "?".into());
        return if len > SHOWN_CHARS {
            format!("{} {shown}... ({len} characters)", type_name(obj))
        } else {
            format!("{} {shown}", type_name(obj))
        };
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        if let Ok(r) = obj.repr() {
            return format!("float {r}");
        }
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return format!("{} of length {}", type_name(obj), b.as_bytes().len());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return format!("{} of length {}", type_name(obj), b.len());
    }
    type_name(obj)
}

/// A Python int as `i64`, or PlanError naming its size.
fn int_to_i64(int: &Bound<'_, PyAny>, field: Field, request: Option<usize>) -> PyResult<i64> {
    match int.extract::<i64>() {
        Ok(value) => Ok(value),
        Err(_) => {
            let py = int.py();
            let bits = py
                .get_type::<PyInt>()
                .getattr(intern!(py, "bit_length"))
                .and_then(|f| f.call1((int,)))
                .and_then(|b| b.extract::<u64>())
                .map(|b| format!("an int of {b} bits"))
                .unwrap_or_else(|_| "an int".into());
            Err(not_an_integer(
                field,
                request,
                format!("{bits}, which does not fit in int64"),
            ))
        }
    }
}

/// `operator.index(obj)`. An exception raised by the object's own
/// `__index__` propagates unchanged.
fn index<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `obj` is a live object; PyNumber_Index returns a new reference
    // or NULL with an exception set, which from_owned_ptr_or_err turns into Err.
    unsafe { Bound::from_owned_ptr_or_err(obj.py(), ffi::PyNumber_Index(obj.as_ptr())) }
}

/// A 0-d integer torch tensor as its value; any other tensor is refused.
fn tensor_len(
    item: &Bound<'_, PyAny>,
    torch: &Bound<'_, PyAny>,
    field: Field,
    request: Option<usize>,
) -> PyResult<i64> {
    let py = item.py();
    let dim: i64 = item.call_method0(intern!(py, "dim"))?.extract()?;
    if dim != 0 {
        let shape = item.getattr(intern!(py, "shape"))?.str()?.to_string();
        return Err(not_an_integer(
            field,
            request,
            format!("a tensor of shape {shape}"),
        ));
    }
    let dtype = item.getattr(intern!(py, "dtype"))?;
    let is_bool = dtype.eq(torch.getattr(intern!(py, "bool"))?)?;
    let not_int = dtype
        .getattr(intern!(py, "is_floating_point"))?
        .is_truthy()?
        || dtype.getattr(intern!(py, "is_complex"))?.is_truthy()?;
    if is_bool || not_int {
        let name = dtype.str()?.to_string();
        return Err(not_an_integer(
            field,
            request,
            format!("a 0-d tensor of dtype {name}"),
        ));
    }
    int_to_i64(&item.call_method0(intern!(py, "item"))?, field, request)
}

/// One length, as SGLang passes it: a Python int, a NumPy integer, a 0-d
/// integer tensor, or any object with `__index__`. `bool` (Python's, NumPy's
/// or a tensor's) is refused although Python treats it as an int: a flag
/// where a length belongs is a bug upstream.
fn extract_len(item: &Bound<'_, PyAny>, field: Field, request: Option<usize>) -> PyResult<i64> {
    let py = item.py();
    if item.is_instance_of::<PyBool>() {
        let shown = if item.is_truthy()? { "True" } else { "False" };
        return Err(not_an_integer(field, request, format!("bool {shown}")));
    }
    if item.is_instance_of::<PyInt>() {
        return int_to_i64(item, field, request);
    }
    let ty = item.get_type();
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    if module == "numpy" {
        // The type lives in numpy, so numpy is imported: this is a lookup.
        let np = py.import(intern!(py, "numpy"))?;
        if !item.is_instance(&np.getattr(intern!(py, "bool_"))?)?
            && item.is_instance(&np.getattr(intern!(py, "integer"))?)?
        {
            return int_to_i64(&index(item)?, field, request);
        }
        return Err(not_an_integer(field, request, describe(item)));
    }
    let modules = py
        .import(intern!(py, "sys"))?
        .getattr(intern!(py, "modules"))?;
    if let Ok(torch) = modules.get_item(intern!(py, "torch")) {
        if item.is_instance(&torch.getattr(intern!(py, "Tensor"))?)? {
            return tensor_len(item, &torch, field, request);
        }
    }
    if ty.hasattr(intern!(py, "__index__"))? {
        // Python's own conversion: a bool returned by __index__ becomes an
        // int (with Python's DeprecationWarning), as operator.index does.
        return int_to_i64(&index(item)?, field, request);
    }
    Err(not_an_integer(field, request, describe(item)))
}

fn collect_lens<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    len: usize,
    field: Field,
) -> PyResult<Vec<i64>> {
    let mut out = Vec::with_capacity(len);
    for (i, item) in items.enumerate() {
        out.push(extract_len(&item, field, Some(i))?);
    }
    Ok(out)
}

fn extract_lens(obj: &Bound<'_, PyAny>, field: Field) -> PyResult<Vec<i64>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return collect_lens(list.iter(), list.len(), field);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return collect_lens(tuple.iter(), tuple.len(), field);
    }
    Err(plan_error(
        format!(
            "{} must be a list or tuple of ints (as SGLang holds it), got {}",
            field.name(),
            describe(obj)
        ),
        "bad_container",
        None,
    ))
}

fn extract_rows(num_rows: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    match num_rows {
        Some(rows) if !rows.is_none() => Ok(Some(extract_len(rows, Field::NumRows, None)?)),
        _ => Ok(None),
    }
}

/// The writable, contiguous `int64` slice of a 1-D NumPy array, or PlanError.
fn with_output<R>(
    out: &Bound<'_, PyAny>,
    needed: usize,
    write: impl FnOnce(&mut [i64]) -> Result<R, CoreError> + Send,
) -> PyResult<R>
where
    R: Send,
{
    let bad = |why: &str| plan_error(format!("the output buffer {why}"), "bad_buffer", None);
    let array = out.cast::<PyArray1<i64>>().map_err(|_| {
        bad(&format!(
            "must be a 1-D int64 NumPy array, got {}",
            describe(out)
        ))
    })?;
    let mut view = array.try_readwrite().map_err(|_| bad("is not writable"))?;
    let dst = view.as_slice_mut().map_err(|_| bad("must be contiguous"))?;
    let result = if needed >= DETACH_MIN_VALUES {
        out.py().detach(|| write(dst))
    } else {
        write(dst)
    };
    result.map_err(core_error)
}

/// A validated pruning plan for one batch (see `flatgather.prune_plan`).
#[pyclass(module = "flatgather._core", name = "PrunePlan", frozen)]
struct PyPrunePlan {
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
        let rows = extract_rows(num_rows)?;
        let plan = PrunePlan::new(&extend, &start).map_err(core_error)?;
        if let Some(rows) = rows {
            plan.check_rows(rows, exact_rows).map_err(core_error)?;
        }
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

/// A validated rotation plan for one batch (see `flatgather.rotation_plan`).
#[pyclass(module = "flatgather._core", name = "RotationPlan", frozen)]
struct PyRotationPlan {
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
        let rows = extract_rows(num_rows)?;
        let plan = RotationPlan::new(&lens).map_err(core_error)?;
        if let Some(rows) = rows {
            plan.check_rows(rows).map_err(core_error)?;
        }
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPrunePlan>()?;
    m.add_class::<PyRotationPlan>()?;
    m.add("MAX_TOKENS", MAX_TOKENS)?;
    m.add("MAX_PLAN_BYTES", MAX_PLAN_BYTES)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
