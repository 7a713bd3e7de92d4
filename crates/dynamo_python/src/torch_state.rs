//! Thread-local torch state read on every call of a compiled function, answered by
//! `cpp/torch_state.cpp` with the libtorch functions torch's own Python bindings call
//! (`torch._C._is_tracing`, `_len_torch_function_stack`, `_len_torch_dispatch_stack`),
//! without a Python call each time.

extern "C" {
    fn dynamo_rs_is_tracing() -> std::ffi::c_int;
    fn dynamo_rs_torch_function_stack_len() -> i64;
    fn dynamo_rs_torch_dispatch_stack_len() -> i64;
}

/// `torch._C._is_tracing()`: the JIT tracer is recording on this thread.
pub fn is_tracing() -> bool {
    // SAFETY: reads this thread's tracing state; catches every C++ exception.
    unsafe { dynamo_rs_is_tracing() != 0 }
}

/// `torch._C._len_torch_function_stack()`.
pub fn torch_function_stack_len() -> i64 {
    // SAFETY: reads this thread's mode stack; catches every C++ exception.
    unsafe { dynamo_rs_torch_function_stack_len() }
}

/// `torch._C._len_torch_dispatch_stack()`.
pub fn torch_dispatch_stack_len() -> i64 {
    // SAFETY: reads this thread's mode stack; catches every C++ exception.
    unsafe { dynamo_rs_torch_dispatch_stack_len() }
}
