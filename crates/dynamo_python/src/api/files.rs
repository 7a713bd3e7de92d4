//! Python face of `dynamo_capture::file_tree`, for `dynamo_rs._inductor_keys`.

use pyo3::prelude::*;

/// The fingerprint of the file trees under `roots` (paths and metadata of every file, no
/// contents), as 32 hex digits. Runs without the GIL: tens of thousands of `stat` calls
/// need no Python, and a thread that started it lets the others run meanwhile.
#[pyfunction]
fn file_tree_fingerprint(py: Python<'_>, roots: Vec<String>) -> String {
    let digest = py.detach(|| dynamo_capture::file_tree::fingerprint(&roots));
    format!("{digest:032x}")
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(file_tree_fingerprint, m)?)?;
    Ok(())
}
