// Tensor metadata checks for dynamo-rs guards, in C++ because a tensor's metadata (dispatch
// keys, dtype, device, sizes, strides, requires_grad) is only reachable through libtorch's
// C++ classes. Compiled by build.rs against the installed torch's headers.
//
// The checks are those of torch's own `TensorGuards` (torch/csrc/dynamo/guards.cpp), which
// dynamo-rs used before: the same fields, compared the same way, with the thread's local
// dispatch-key modifiers applied to the keys and the Python keys masked (no torch-dispatch
// mode can be active when a dynamo-rs guard passes: it checks the mode stack). What differs
// is the cost: no pybind11 argument parsing, no SymInt comparisons for concrete sizes, no
// hash set per call (dynamo-rs checks that the tensors are distinct itself), ~5x less per
// tensor.
//
// Everything here is called with the GIL held. No C++ exception leaves this file: a check
// that throws (a tensor subclass whose sizes come from Python and fail) does not hold.

#include <torch/csrc/autograd/python_variable.h>

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace {

// A size or stride the check leaves open (a dynamic dimension).
constexpr int64_t kOpen = std::numeric_limits<int64_t>::min();

c10::DispatchKeySet python_keys() {
  return c10::DispatchKeySet({c10::DispatchKey::Python,
                              c10::DispatchKey::PythonTLSSnapshot,
                              c10::DispatchKey::PythonDispatcher});
}

// The keys a tensor dispatches on in this thread's state, as torch's guards compare them.
uint64_t effective_keys(const c10::impl::LocalDispatchKeySet& local,
                        c10::DispatchKeySet keys) {
  return (((keys | local.included_) - local.excluded_) - python_keys()).raw_repr();
}

struct Expected {
  PyTypeObject* type;
  uint64_t keys;
  c10::ScalarType dtype;
  c10::DeviceIndex device_index;
  bool requires_grad;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

bool dims_match(c10::SymIntArrayRef now, const std::vector<int64_t>& expected) {
  if (now.size() != expected.size()) {
    return false;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == kOpen) {
      continue;
    }
    // A symbolic size (a tensor traced with symbolic shapes) never equals a number.
    auto value = now[i].maybe_as_int();
    if (!value.has_value() || *value != expected[i]) {
      return false;
    }
  }
  return true;
}

bool matches(const c10::impl::LocalDispatchKeySet& local, const Expected& e, PyObject* object) {
  if (Py_TYPE(object) != e.type) {
    return false;
  }
  // The type is the one recorded from a torch.Tensor (or subclass) instance, so `object` is a
  // THPVariable.
  const at::Tensor& tensor = THPVariable_Unpack(object);
  if (!tensor.defined()) {
    return false;
  }
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  return effective_keys(local, impl->key_set()) == e.keys &&
      c10::typeMetaToScalarType(impl->dtype()) == e.dtype && impl->device().index() == e.device_index &&
      impl->requires_grad() == e.requires_grad && dims_match(impl->sym_sizes(), e.sizes) &&
      dims_match(impl->sym_strides(), e.strides);
}

}  // namespace

extern "C" {

// The expectation that a tensor looks like `tensor` does now (a torch.Tensor or subclass
// instance: the caller checked), with the sizes and strides given (`kOpen` where a dimension
// is dynamic; `ndim` of each). Null if its metadata cannot be read.
void* dynamo_rs_tensor_expect(PyObject* tensor, const int64_t* sizes, const int64_t* strides,
                              size_t ndim) {
  try {
    const at::Tensor& t = THPVariable_Unpack(tensor);
    if (!t.defined()) {
      return nullptr;
    }
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto local = c10::impl::tls_local_dispatch_key_set();
    return new Expected{Py_TYPE(tensor),
                        effective_keys(local, impl->key_set()),
                        c10::typeMetaToScalarType(impl->dtype()),
                        impl->device().index(),
                        impl->requires_grad(),
                        std::vector<int64_t>(sizes, sizes + ndim),
                        std::vector<int64_t>(strides, strides + ndim)};
  } catch (...) {
    return nullptr;
  }
}

void dynamo_rs_tensor_expect_free(void* expected) {
  delete static_cast<Expected*>(expected);
}

// The index of the first of `tensors` that does not match its expectation (`expected[i]`),
// or `n` when all match.
size_t dynamo_rs_tensor_check(void* const* expected, PyObject* const* tensors, size_t n) {
  auto local = c10::impl::tls_local_dispatch_key_set();
  for (size_t i = 0; i < n; ++i) {
    try {
      if (!matches(local, *static_cast<const Expected*>(expected[i]), tensors[i])) {
        return i;
      }
    } catch (...) {
      return i;
    }
  }
  return n;
}

}  // extern "C"
