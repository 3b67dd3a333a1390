//! `flatgather._core`: the PyO3 face of `flatgather-core`.
//!
//! It converts arguments and errors and nothing more: plans are built by the
//! pure-Rust core, and the Python package allocates the (pinned) buffers that
//! they are written into. One module per class, as in the core; the
//! conversions they share, and the error boundary, are in `convert`.

use flatgather_core::{MAX_PLAN_BYTES, MAX_TOKENS};
use pyo3::prelude::*;

mod convert;
mod prune;
mod rotation;
mod spec_logprobs;
mod token_ids;

use prune::PyPrunePlan;
use rotation::PyRotationPlan;
use spec_logprobs::PySpecLogprobsPlan;
use token_ids::PyTokenIdsPlan;

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
