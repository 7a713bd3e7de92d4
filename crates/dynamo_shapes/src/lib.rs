//! Sizes and strides of operation results, computed from the sizes and strides of the
//! operands — the arithmetic torch's meta kernels do, for the handful of operations that make
//! up most of real models (elementwise ops, views, linear layers, convolutions, norms).
//!
//! Why it exists: propagating tensor metadata through torch's `FakeTensorMode` costs
//! 0.2–6 ms per operation the first time a process meets an operation and shape (Python
//! dispatch, decompositions into many smaller ops, cache bookkeeping). For these operations
//! the answer is a few lines of integer arithmetic. The extension uses these rules where they
//! apply and FakeTensorMode everywhere else; the test suite checks every rule against
//! FakeTensorMode on the same inputs.
//!
//! Conventions: sizes and strides are in elements, outermost dimension first, as torch
//! reports them. A function that cannot answer (bad shapes, a layout it does not model)
//! returns `None` or an error, and the caller falls back to FakeTensorMode.
//!
//! Module map:
//! - [`layout`]: contiguous strides, contiguity and density tests, broadcasting.
//! - [`elementwise`]: the layout of an elementwise result (TensorIterator's rule).
//! - [`view`]: `view`/`reshape` strides, `-1` inference, permutations.
//! - [`index`]: basic indexing (`t[0, 1:3, None, ...]`) and `split`.
//! - [`conv`]: convolution output sizes.

pub mod conv;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod view;

pub use elementwise::elementwise_strides;
pub use layout::{broadcast_shapes, contiguous_strides, ShapeError};
