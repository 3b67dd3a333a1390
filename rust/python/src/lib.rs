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
    Entry, Field, PlanError as CoreError, PrunePlan, RotationPlan, SpecLogprobsPlan, TokenIdsPlan,
    Walk, MAX_PLAN_BYTES, MAX_TOKENS,
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
    if !integer_dtype(&dtype, torch)? {
        let name = dtype.str()?.to_string();
        return Err(not_an_integer(
            field,
            request,
            format!("a 0-d tensor of dtype {name}"),
        ));
    }
    int_to_i64(&item.call_method0(intern!(py, "item"))?, field, request)
}

/// Whether a torch dtype holds integers (`bool` does not).
fn integer_dtype(dtype: &Bound<'_, PyAny>, torch: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = dtype.py();
    Ok(!(dtype.eq(torch.getattr(intern!(py, "bool"))?)?
        || dtype
            .getattr(intern!(py, "is_floating_point"))?
            .is_truthy()?
        || dtype.getattr(intern!(py, "is_complex"))?.is_truthy()?))
}

/// The lengths of a 1-D integer torch tensor or NumPy array, as a list
/// (its `.tolist()`); None when `obj` is neither. Any other shape or dtype
/// is refused by name.
fn array_lens<'py>(obj: &Bound<'py, PyAny>, field: Field) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = obj.py();
    let modules = py
        .import(intern!(py, "sys"))?
        .getattr(intern!(py, "modules"))?;
    let dtype = || obj.getattr(intern!(py, "dtype"));
    let mut found = None;
    if let Ok(torch) = modules.get_item(intern!(py, "torch")) {
        if obj.is_instance(&torch.getattr(intern!(py, "Tensor"))?)? {
            found = Some(("a tensor", integer_dtype(&dtype()?, &torch)?));
        }
    }
    if let Ok(np) = modules.get_item(intern!(py, "numpy")) {
        if obj.is_instance(&np.getattr(intern!(py, "ndarray"))?)? {
            let kind: String = dtype()?.getattr(intern!(py, "kind"))?.extract()?;
            found = Some(("an array", kind == "i" || kind == "u"));
        }
    }
    let Some((what, integer)) = found else {
        return Ok(None);
    };
    let ndim: i64 = obj.getattr(intern!(py, "ndim"))?.extract()?;
    if ndim != 1 {
        let shape = py
            .import(intern!(py, "builtins"))?
            .getattr(intern!(py, "tuple"))?
            .call1((obj.getattr(intern!(py, "shape"))?,))?;
        return Err(plan_error(
            format!(
                "{} must be 1-D, got {what} of shape {}",
                field.name(),
                shape.str()?
            ),
            "bad_container",
            None,
        ));
    }
    if !integer {
        return Err(plan_error(
            format!(
                "{} must hold integers, got {what} of dtype {}",
                field.name(),
                dtype()?.str()?
            ),
            "bad_container",
            None,
        ));
    }
    Ok(Some(
        obj.call_method0(intern!(py, "tolist"))?
            .cast_into::<PyList>()?,
    ))
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
    if let Some(list) = array_lens(obj, field)? {
        return collect_lens(list.iter(), list.len(), field);
    }
    Err(plan_error(
        format!(
            "{} must be a list or tuple of ints (as SGLang holds it) or a 1-D integer tensor or array, got {}",
            field.name(),
            describe(obj)
        ),
        "bad_container",
        None,
    ))
}

/// A plan built by `build` and, when `num_rows` is given (not None),
/// checked by `check` against it. `num_rows` is read before `build` runs,
/// so a row count that is no int is refused before the core judges the
/// lengths.
fn with_rows<P>(
    num_rows: Option<&Bound<'_, PyAny>>,
    build: impl FnOnce() -> Result<P, CoreError>,
    check: impl FnOnce(&P, i64) -> Result<(), CoreError>,
) -> PyResult<P> {
    let rows = match num_rows {
        Some(rows) if !rows.is_none() => Some(extract_len(rows, Field::NumRows, None)?),
        _ => None,
    };
    let plan = build().map_err(core_error)?;
    if let Some(rows) = rows {
        check(&plan, rows).map_err(core_error)?;
    }
    Ok(plan)
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

/// `out[-1]`, raising IndexError on an empty list as Python does.
fn last_item<'py>(out: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
    match out.len() {
        0 => Err(pyo3::exceptions::PyIndexError::new_err(
            "list index out of range",
        )),
        n => out.get_item(n - 1),
    }
}

/// A plan built by `build` from the token ids of the first `walked`
/// requests (each None or a list of ints), lent as the core takes them.
fn with_token_ids<P>(
    obj: &Bound<'_, PyAny>,
    walked: usize,
    build: impl FnOnce(&[Option<&[i64]>]) -> Result<P, CoreError>,
) -> PyResult<P> {
    let list = obj.cast::<PyList>().map_err(|_| {
        plan_error(
            format!(
                "token_ids_logprobs must be a list (as SGLang holds it), got {}",
                describe(obj)
            ),
            "bad_container",
            None,
        )
    })?;
    let mut lists = Vec::with_capacity(walked.min(list.len()));
    for (request, item) in list.iter().take(walked).enumerate() {
        if item.is_none() {
            lists.push(None);
            continue;
        }
        let ids = item.cast::<PyList>().map_err(|_| {
            plan_error(
                format!(
                    "request {request}: token_ids_logprobs[{request}] must be None or a list, got {}",
                    describe(&item)
                ),
                "bad_container",
                Some(request),
            )
        })?;
        lists.push(Some(collect_lens(ids.iter(), ids.len(), Field::TokenIds)?));
    }
    let ids: Vec<Option<&[i64]>> = lists.iter().map(|l| l.as_deref()).collect();
    build(&ids).map_err(core_error)
}

/// The token-id logprobs of one call of SGLang's input-logprob function:
/// every `(row, id)` pair in the order the values nest, and the nesting.
#[pyclass(module = "flatgather._core", name = "TokenIdsPlan", frozen)]
struct PyTokenIdsPlan {
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

/// The output logprobs of one decode or verify step, one entry per row:
/// where every row's values lie in one flat tensor.
#[pyclass(module = "flatgather._core", name = "SpecLogprobsPlan", frozen)]
struct PySpecLogprobsPlan {
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPrunePlan>()?;
    m.add_class::<PyRotationPlan>()?;
    m.add_class::<PyTokenIdsPlan>()?;
    m.add_class::<PySpecLogprobsPlan>()?;
    m.add("MAX_TOKENS", MAX_TOKENS)?;
    m.add("MAX_PLAN_BYTES", MAX_PLAN_BYTES)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
