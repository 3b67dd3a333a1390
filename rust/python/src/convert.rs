//! Python arguments in, `flatgather.PlanError` out: everything the classes
//! share to read what SGLang passes and to report what is wrong with it.
//!
//! The error boundary is total. Bad input becomes `flatgather.PlanError`
//! (with `kind` and `request`); an exception raised by the caller's own code
//! while we read an argument (an `__index__` that raises, a
//! `KeyboardInterrupt`) propagates as itself; nothing panics. Describing a bad
//! value costs a bounded amount of work whatever its size: no `repr` of
//! arbitrary objects, a short prefix of long strings.

use flatgather_core::{Field, PlanError as CoreError};
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

pub(crate) fn core_error(err: CoreError) -> PyErr {
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

pub(crate) fn extract_lens(obj: &Bound<'_, PyAny>, field: Field) -> PyResult<Vec<i64>> {
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
pub(crate) fn with_rows<P>(
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
pub(crate) fn with_output<R>(
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

/// A plan built by `build` from the token ids of the first `walked`
/// requests (each None or a list of ints), lent as the core takes them.
pub(crate) fn with_token_ids<P>(
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
