// Thread-local torch state that the per-call path of a compiled function reads: whether the
// JIT tracer is active (`torch._C._is_tracing()`, which `nn.Module.__call__` consults) and the
// lengths of the torch-function and torch-dispatch mode stacks (which every guard checks).
// The Python bindings of these answer through pybind11 or a Python call each time; here they
// are one C++ call. Each function returns what the binding of the same name returns, by
// calling the same libtorch function.
//
// Called with the GIL held. No C++ exception leaves this file: a function that throws
// answers with its "unusual" value (tracing, a mode active), which sends the caller down its
// slow, general path.

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <cstdint>

extern "C" {

// `torch._C._is_tracing()`: 1 when the JIT tracer is recording on this thread.
int dynamo_rs_is_tracing() noexcept {
  try {
    return torch::jit::tracer::isTracing() ? 1 : 0;
  } catch (...) {
    return 1;
  }
}

// `torch._C._len_torch_function_stack()`.
int64_t dynamo_rs_torch_function_stack_len() noexcept {
  try {
    return at::impl::PythonTorchFunctionTLS::stack_len();
  } catch (...) {
    return 1;
  }
}

// `torch._C._len_torch_dispatch_stack()`.
int64_t dynamo_rs_torch_dispatch_stack_len() noexcept {
  try {
    return c10::impl::TorchDispatchModeTLS::stack_len();
  } catch (...) {
    return 1;
  }
}

}  // extern "C"
