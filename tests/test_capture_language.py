"""The translator on small functions, one language feature each, side by side with
TorchDynamo (the harness is `language_harness.check_case`)."""

from __future__ import annotations

import math
import operator
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

from language_harness import case_registrar, check_case, reset_all, t

CASES: list = []
case = case_registrar(CASES)


T34 = t(3, 4)
T4 = t(4)


# --- arithmetic ------------------------------------------------------------------------------

@case(T34, T34)
def add(x, y): return x + y
@case(T34, T34)
def sub(x, y): return x - y
@case(T34, T34)
def mul(x, y): return x * y
@case(T34, T34)
def truediv(x, y): return x / (y.abs() + 1)
@case(T34)
def floordiv_scalar(x): return x // 0.5
@case(T34)
def mod_scalar(x): return x % 0.7
@case(T34)
def pow_scalar(x): return x ** 2
@case(T34, t(4, 5))
def matmul_op(x, y): return x @ y
@case(T34)
def neg(x): return -x
@case(T34)
def pos(x): return +x
@case(T34)
def scalar_left(x): return 2.0 * x + 1
@case(T34)
def scalar_right(x): return x * 3 - 0.5
@case(T34, T34)
def inplace_add(x, y):
    z = x.clone()
    z += y
    return z
@case(T34, T34)
def inplace_mul(x, y):
    z = x * 1
    z *= y
    return z
@case(T34, T34)
def compare_lt(x, y): return x < y
@case(T34, T34)
def compare_ge(x, y): return x >= y
@case(T34)
def compare_scalar(x): return x == 0.0
@case(T34, T34)
def bool_ops(x, y): return (x > 0) & (y > 0) | (x < -1)
@case(T34)
def invert_bool(x): return ~(x > 0)
@case(T34)
def chained_arith(x): return ((x + 1) * 2 - 3) / 4
@case(T34, T34)
def mixed_ops(x, y): return x * y + x / (y * y + 1) - y


# --- torch functions -------------------------------------------------------------------------

def unary(name):
    fn = getattr(torch, name)

    def f(x):
        return fn(x)

    f.__name__ = f"torch_{name}"
    case(T34)(f)


for _name in ["sin", "cos", "tanh", "sigmoid", "exp", "relu", "abs", "neg", "sqrt", "floor", "ceil",
              "round", "sign", "erf", "square", "reciprocal"]:
    unary(_name)


@case(T34)
def torch_log(x): return torch.log(x.abs() + 1)
@case(T34, T34)
def torch_cat(x, y): return torch.cat([x, y], dim=0)
@case(T34, T34)
def torch_cat_tuple(x, y): return torch.cat((x, y), 1)
@case(T34, T34)
def torch_stack(x, y): return torch.stack([x, y])
@case(T34, t(4, 2))
def torch_matmul(x, y): return torch.matmul(x, y)
@case(T34)
def torch_sum_dim(x): return torch.sum(x, dim=1)
@case(T34)
def torch_mean_keepdim(x): return x.mean(dim=-1, keepdim=True)
@case(T34)
def torch_max_dim(x):
    values, indices = torch.max(x, dim=1)
    return values, indices
@case(T34)
def torch_softmax(x): return torch.softmax(x, dim=-1)
@case(T34)
def torch_transpose(x): return torch.transpose(x, 0, 1)
@case(T34)
def torch_reshape(x): return torch.reshape(x, (4, 3))
@case(T34)
def torch_flatten(x): return torch.flatten(x)
@case(T34)
def torch_unsqueeze(x): return torch.unsqueeze(x, 0)
@case(T34, T34)
def torch_where(x, y): return torch.where(x > 0, x, y)
@case(T34)
def torch_clamp(x): return torch.clamp(x, min=-0.5, max=0.5)
@case(T34)
def torch_zeros_like(x): return torch.zeros_like(x) + x
@case(T34)
def torch_ones_like(x): return torch.ones_like(x) * x
@case(T34)
def torch_full_like(x): return torch.full_like(x, 2.5) - x
@case(T34)
def torch_arange(x): return x + torch.arange(4)
@case(T34)
def torch_zeros(x): return x + torch.zeros(3, 4)
@case(T34, T34)
def torch_add_alpha(x, y): return torch.add(x, y, alpha=2)
@case(T34)
def torch_chunk(x):
    a, b = torch.chunk(x, 2, dim=1)
    return a * b
@case(T34)
def torch_split(x):
    parts = torch.split(x, 1, dim=0)
    return parts[0] + parts[2]
@case(T34)
def torch_cumsum(x): return torch.cumsum(x, dim=1)
@case(T34)
def torch_topk(x): return torch.topk(x, 2).values
@case(T34)
def torch_argmax(x): return torch.argmax(x, dim=1)
@case(T34)
def torch_norm(x): return torch.linalg.vector_norm(x, dim=1)
@case(T34)
def torch_einsum(x): return torch.einsum("ij,ij->i", x, x)
@case(T34)
def f_relu(x): return F.relu(x)
@case(T34)
def f_gelu(x): return F.gelu(x)
@case(T34)
def f_silu(x): return F.silu(x)
@case(T34)
def f_softmax(x): return F.softmax(x, dim=1)
@case(T34)
def f_log_softmax(x): return F.log_softmax(x, dim=1)
@case(T34)
def f_layer_norm(x): return F.layer_norm(x, (4,))
@case(T34, t(5, 4), t(5))
def f_linear(x, w, b): return F.linear(x, w, b)
@case(t(1, 2, 8, 8), t(3, 2, 3, 3))
def f_conv2d(x, w): return F.conv2d(x, w, padding=1)
@case(t(1, 2, 8, 8))
def f_max_pool2d(x): return F.max_pool2d(x, 2)
@case(t(1, 2, 8, 8))
def f_avg_pool2d(x): return F.adaptive_avg_pool2d(x, 1)
@case(T34)
def f_dropout_eval(x): return F.dropout(x, p=0.5, training=False)
@case(T34)
def f_pad(x): return F.pad(x, (1, 1))
@case(T34, T34)
def f_mse(x, y): return F.mse_loss(x, y)
@case(T34)
def f_normalize(x): return F.normalize(x, dim=1)


# --- tensor methods and metadata -------------------------------------------------------------

@case(T34)
def method_view(x): return x.view(-1)
@case(T34)
def method_view_shape(x): return x.view(x.shape[1], x.shape[0])
@case(T34)
def method_reshape_size(x): return x.reshape(x.size(0) * x.size(1))
@case(T34)
def method_permute(x): return x.unsqueeze(0).permute(2, 1, 0)
@case(T34)
def method_transpose(x): return x.transpose(0, 1).contiguous()
@case(T34)
def method_sum(x): return x.sum()
@case(T34)
def method_mean(x): return x.mean(1)
@case(T34)
def method_relu_chain(x): return x.relu().exp().sum(0)
@case(T34)
def method_to_dtype(x): return x.to(torch.float64)
@case(T34)
def method_float(x): return (x > 0).float()
@case(T34)
def method_type_as(x): return (x > 0).type_as(x)
@case(T34)
def method_clone(x): return x.clone()
@case(T34)
def method_expand(x): return x[:1].expand(3, 4)
@case(T34)
def method_masked_fill(x): return x.masked_fill(x > 0, 0.0)
@case(T34)
def method_chunk(x): return x.chunk(2, -1)[1]
@case(T34)
def method_inplace(x):
    y = x.clone()
    y.add_(1).mul_(2)
    return y
@case(T34)
def meta_dim(x): return x * x.dim()
@case(T34)
def meta_ndim(x): return x + x.ndim
@case(T34)
def meta_numel(x): return x / x.numel()
@case(T34)
def meta_shape_index(x): return x * x.shape[-1]
@case(T34)
def meta_size_tuple(x):
    rows, cols = x.size()
    return x.new_zeros(rows, cols) + x
@case(T34)
def meta_dtype_check(x): return x * 2 if x.dtype == torch.float32 else x
@case(T34)
def meta_device_check(x): return x + 1 if x.device.type == "cpu" else x
@case(T34)
def meta_is_floating(x): return x * 2 if x.is_floating_point() else x
@case(T34)
def meta_len(x): return x * len(x)
@case(T34)
def index_int(x): return x[0]
@case(T34)
def index_slice(x): return x[1:, ::2]
@case(T34)
def index_none(x): return x[None, :, 1]
@case(T34)
def index_ellipsis(x): return x[..., -1]
@case(T34)
def index_bool_mask(x): return x[x > 0].sum() if False else x[:, 0]
@case(T34)
def setitem(x):
    y = x.clone()
    y[0] = 0.0
    return y
@case(T34)
def setitem_slice(x):
    y = x.clone()
    y[:, 1:3] = y[:, 1:3] * 2
    return y


# --- Python values, control flow, calls ------------------------------------------------------

SCALE = 3.0
OFFSETS = (1.0, 2.0, 3.0)


@case(T34)
def global_constant(x): return x * SCALE
@case(T34)
def global_tuple(x): return x + OFFSETS[1]
@case(T34)
def python_arith(x):
    n = 2 * 3 + 4 // 3 - 7 % 4
    return x * n
@case(T34)
def python_math(x): return x * math.sqrt(16) + math.pi
@case(T34)
def python_operator(x): return operator.mul(x, 2)
@case(T34, 2)
def int_argument(x, n): return x * n
@case(T34, 2.5)
def float_argument(x, s): return x + s
@case(T34, True)
def bool_argument_true(x, flag): return x + 1 if flag else x - 1
@case(T34, False)
def bool_argument_false(x, flag): return x + 1 if flag else x - 1
@case(T34, None)
def none_argument(x, y): return x if y is None else x + y
@case(T34, T34)
def not_none_argument(x, y): return x if y is None else x + y
@case(T34, "relu")
def string_argument(x, kind): return x.relu() if kind == "relu" else x.sigmoid()
@case(T34, "sigmoid")
def string_argument_other(x, kind): return x.relu() if kind == "relu" else x.sigmoid()
@case(T34)
def if_on_shape(x):
    if x.shape[0] > 2:
        return x * 2
    return x
@case(T34)
def if_elif(x):
    n = x.shape[1]
    if n == 1:
        return x
    elif n == 4:
        return x + 4
    else:
        return x - 1
@case(T34)
def and_or_constants(x):
    a = x.shape[0] > 1 and x.shape[1] > 1
    b = x.shape[0] > 10 or x.shape[1] == 4
    return x * (a + b)
@case(T34)
def ternary_chain(x): return x + (1 if x.ndim == 1 else 2 if x.ndim == 2 else 3)
@case(T34)
def for_range(x):
    for i in range(3):
        x = x + i
    return x
@case(T34)
def for_range_step(x):
    for i in range(10, 0, -3):
        x = x * 0.5 + i
    return x
@case(T34)
def for_list(x):
    for k in [1.0, 2.0, 3.0]:
        x = x * k
    return x
@case(T34)
def for_tuple_of_tensors(x):
    total = x
    for part in (x, x * 2, x * 3):
        total = total + part
    return total
@case(T34)
def for_enumerate(x):
    for i, k in enumerate([2.0, 3.0], start=1):
        x = x * k + i
    return x
@case(T34, T34)
def for_zip(x, y):
    out = []
    for a, b in zip([x, y], [y, x]):
        out.append(a - b)
    return out
@case(T34)
def for_break(x):
    for i in range(10):
        if i == 3:
            break
        x = x + i
    return x
@case(T34)
def for_continue(x):
    for i in range(5):
        if i % 2:
            continue
        x = x + i
    return x
@case(T34)
def for_else(x):
    for i in range(2):
        x = x + i
    else:
        x = x * 10
    return x
@case(T34)
def while_counter(x):
    i = 0
    while i < 4:
        x = x + 1
        i += 1
    return x
@case(T34)
def nested_loops(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x
@case(T34)
def list_comprehension(x): return [x * i for i in range(3)]
@case(T34)
def list_comprehension_if(x): return sum([x * i for i in range(5) if i % 2])
@case(T34)
def dict_comprehension(x): return {f"k{i}": x + i for i in range(2)}
@case(T34)
def nested_comprehension(x): return [[x * i + j for j in range(2)] for i in range(2)]
@case(T34)
def generator_sum(x): return sum(x * i for i in range(3)) if False else x
@case(T34)
def build_tuple_unpack(x):
    a, b, c = x, x * 2, x * 3
    return a + b + c
@case(T34)
def star_unpack(x):
    first, *rest = [x, x + 1, x + 2]
    return first + rest[-1]
@case(T34)
def swap_values(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b
@case(T34)
def list_ops(x):
    items = [x]
    items.append(x * 2)
    items.extend([x * 3, x * 4])
    items.insert(0, x * 0)
    last = items.pop()
    return items[1] + last + len(items)
@case(T34)
def list_slice(x):
    items = [x, x + 1, x + 2, x + 3]
    return items[1:3]
@case(T34)
def list_reverse_index(x):
    items = [x, x * 2]
    items.reverse()
    return items[0] + items.index(items[1]) if False else items[0]
@case(T34)
def tuple_concat(x):
    a = (x,)
    b = a + (x * 2,)
    return b * 1 if False else b
@case(T34)
def dict_ops(x):
    d = {"a": x, "b": x * 2}
    d["c"] = x * 3
    return d["a"] + d.get("c") + d.get("missing", x)
@case(T34)
def dict_items_loop(x):
    d = OrderedDict(a=1.0, b=2.0) if False else {"a": 1.0, "b": 2.0}
    for key, value in d.items():
        x = x + value
    return x
@case(T34)
def dict_keys_values(x):
    d = {"x": x, "y": x * 2}
    return list(d.values())[0] + len(list(d.keys()))
@case(T34)
def dict_pop_update(x):
    d = {"a": x}
    d.update({"b": x + 1})
    a = d.pop("a")
    return a + d["b"]
@case(T34)
def contains_checks(x):
    names = ("relu", "gelu")
    return x.relu() if "relu" in names and "tanh" not in names else x
@case(T34)
def isinstance_checks(x):
    if isinstance(x, torch.Tensor) and not isinstance(3, str):
        return x + 1
    return x
@case(T34)
def len_of_containers(x): return x * len([1, 2, 3]) + len({"a": 1}) + len((x, x))
@case(T34)
def min_max_constants(x): return x * max(1, 2, 3) + min(4, 5)
@case(T34)
def abs_round_constants(x): return x * abs(-2) + round(2.6)
@case(T34)
def int_float_conversions(x): return x * int("3") + float(1)
@case(T34)
def fstring_constant(x):
    name = f"layer_{x.shape[0]}"
    return x + len(name)
@case(T34)
def string_methods(x):
    name = "block.weight"
    return x * 2 if name.startswith("block") and name.endswith("weight") else x
@case(T34)
def slice_object(x):
    s = slice(1, 3)
    return x[:, s]
@case(T34)
def getattr_hasattr(x):
    if hasattr(x, "shape") and getattr(x, "ndim") == 2:
        return x + 1
    return x


def helper_add(a, b):
    return a + b


def helper_default(a, scale=2.0):
    return a * scale


def helper_kwonly(a, *, bias=1.0):
    return a + bias


def helper_varargs(*tensors):
    total = tensors[0]
    for t_ in tensors[1:]:
        total = total + t_
    return total


def helper_kwargs(a, **options):
    return a * options.get("scale", 1.0) + options.get("shift", 0.0)


def helper_mixed(a, b=1.0, *rest, c, d=2.0, **kw):
    return a + b + sum(rest) + c + d + kw.get("e", 0.0)


def helper_posonly(a, b=1.0, /, **kw):
    # `b` is positional-only, so a keyword named b lands in **kw.
    return a * b + kw.get("b", 0.0)


def level1(x): return level2(x) + 1
def level2(x): return level3(x) * 2
def level3(x): return level4(x) - 1
def level4(x): return level5(x) / 2
def level5(x): return level6(x).relu()
def level6(x): return x + 0.5


@case(T34, T34)
def call_function(x, y): return helper_add(x, y)
@case(T34)
def call_default(x): return helper_default(x)
@case(T34)
def call_keyword(x): return helper_default(x, scale=3.0)
@case(T34)
def call_kwonly(x): return helper_kwonly(x, bias=2.0)
@case(T34, T34)
def call_varargs(x, y): return helper_varargs(x, y, x)
@case(T34)
def call_kwargs(x): return helper_kwargs(x, scale=2.0, shift=1.0)
@case(T34)
def call_star_args(x):
    args = (x, x * 2)
    return helper_add(*args)
@case(T34)
def call_star_kwargs(x):
    kwargs = {"scale": 4.0}
    return helper_default(x, **kwargs)
@case(T34)
def call_mixed(x): return helper_mixed(x, 1.0, 2.0, 3.0, c=4.0, e=5.0)
@case(T34)
def call_posonly_and_same_named_keyword(x): return helper_posonly(x, 2.0, b=3.0) + helper_posonly(x)
@case(T34)
def call_nested_kwonly_defaults(x):
    scale = 3.0

    def inner(a, b=scale, *, c=scale + 1, **kw):
        return a * b + c + len(kw)
    return inner(x) + inner(x, 2.0, c=1.0, z=1)
@case(T34)
def inline_depth_6(x): return level1(x)
@case(T34)
def call_lambda(x):
    f = lambda a, k=2: a * k  # noqa: E731
    return f(x) + f(x, k=3)
@case(T34)
def closure_read(x):
    scale = 3.0

    def inner(a):
        return a * scale

    return inner(x)
@case(T34)
def closure_write(x):
    total = x

    def add(a):
        nonlocal total
        total = total + a

    add(x)
    add(x * 2)
    return total
@case(T34)
def closure_over_tensor(x):
    def inner(a):
        return a + x

    return inner(x * 2)
@case(T34)
def nested_closure(x):
    def outer(a):
        def inner(b):
            return a * b

        return inner(a + 1)

    return outer(x)


def make_scaler(k):
    def scale(a):
        return a * k

    return scale


TRIPLE = make_scaler(3.0)


@case(T34)
def global_closure(x): return TRIPLE(x)


def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


@case(T34)
def recursion_on_constant(x): return x * fact(4)


class Point:
    def __init__(self, scale):
        self.scale = scale

    def apply(self, t_):
        return t_ * self.scale

    @property
    def double(self):
        return self.scale * 2

    @staticmethod
    def shift(t_):
        return t_ + 1

    @classmethod
    def make(cls, t_):
        return t_ - 1


POINT = Point(2.0)


@case(T34)
def user_object_method(x): return POINT.apply(x)
@case(T34)
def user_object_attribute(x): return x * POINT.scale
@case(T34)
def user_object_property(x): return x * POINT.double
@case(T34)
def user_static_method(x): return Point.shift(x)
@case(T34)
def user_class_method(x): return Point.make(x)
@case(T34)
def user_static_via_instance(x): return POINT.shift(x)


class Base:
    def transform(self, t_):
        return t_ * 2


class Child(Base):
    def transform(self, t_):
        return super().transform(t_) + 1


CHILD = Child()


@case(T34)
def super_call(x): return CHILD.transform(x)


@case(T34, expect="compiled")
def is_compiling_branch(x):
    if torch.compiler.is_compiling():
        return x + 1
    return x - 1


@case(T34)
def grad_mode_query(x): return x * 2 if torch.is_grad_enabled() else x


# --- nn.Module -------------------------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class WithSequential(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))

    def forward(self, x):
        return self.body(x) + x


class WithModuleList(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return x


class WithModuleDict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 2), "b": torch.nn.Linear(4, 3)})

    def forward(self, x):
        return {name: head(x) for name, head in self.heads.items()} if False else \
            [self.heads[name](x) for name in self.heads]


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.ones(4))
        self.weight = torch.nn.Parameter(torch.full((4,), 2.0))
        self.flag = True

    def forward(self, x):
        y = x * self.weight + self.offset
        return y if self.flag else -y


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.ln = torch.nn.LayerNorm(8)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.ln(F.relu(self.bn(self.conv(x)))))


class Residual(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class CallsHelperMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def _scale(self, x, k=2.0):
        return x * k

    def forward(self, x):
        return self._scale(self.proj(x), k=3.0)


class SubclassedModule(MLP):
    def forward(self, x):
        return super().forward(x) * 2


def module_case(make_module, *make_args, **extra):
    torch.manual_seed(0)
    module = make_module().eval()

    def run(*args):
        return module(*args)

    run.__name__ = f"module_{make_module.__name__}"
    case(*make_args, **extra)(run)


for _cls in [MLP, WithSequential, WithModuleList, WithModuleDict, WithBuffers, CallsHelperMethod,
             SubclassedModule]:
    module_case(_cls, T34)
module_case(Norms, t(1, 2, 8, 8))


def residual_mlp():
    return Residual(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()))


module_case(residual_mlp, T34)


# --- return values ---------------------------------------------------------------------------

@case(T34)
def return_tuple(x): return x + 1, x - 1
@case(T34)
def return_list(x): return [x * 2, x * 3]
@case(T34)
def return_dict(x): return {"double": x * 2, "half": x / 2}
@case(T34)
def return_nested(x): return {"pair": (x + 1, [x + 2]), "n": 3}
@case(T34, ("u", "v", "u"))
def dict_fromkeys(x, names):
    # Duplicate keys keep their first place; the default value is shared by every key.
    scores = dict.fromkeys(names, 0)
    shared = dict.fromkeys(("p", "q"), [])
    shared["p"].append(x.sum())
    scores["v"] = x * 2
    return scores, len(shared["q"]), list(dict.fromkeys("abca")), dict.fromkeys(range(3))
# dict and OrderedDict made in the trace from nothing, pairs, dicts and keywords: their
# class survives copies, type() and isinstance(), comparisons and the rebuilt result.
@case(T34)
def ordered_dict_built_by_stores(x):
    out = OrderedDict()
    for name in ("b", "a"):
        out[name] = x * len(name) + len(out)
    return out, type(out) is OrderedDict, isinstance(out, dict), list(out)
@case(T34)
def ordered_dict_from_pairs_and_keywords(x):
    od = OrderedDict([("z", x), ("y", x - 1)], q=x.sin())
    od["z"] = x + 2  # an existing key keeps its place
    first = next(iter(od.values()))
    return od, od.copy(), first, OrderedDict(a=1, b=2) == OrderedDict(b=2, a=1)
@case(T34)
def dict_from_pairs_with_tensors(x):
    d = dict([("a", x), ("b", x * 2)], c=x.cos())
    merged = dict(d, a=x - 1)
    return d, merged, dict(zip(("u", "v"), x.unbind(0))), type(merged) is dict
@case(T34)
def ordered_dict_through_a_helper(x):
    def collect(values):
        found = OrderedDict()
        for i, v in enumerate(values):
            found[f"out{i}"] = v.relu()
        return found
    got = collect([x, -x])
    return dict(got), [k for k in got], sum(got.values())
# iter() and next() on what the trace holds: one iterator shared by next() and a loop.
@case(T34)
def iter_and_next(x):
    d = {"a": x, "b": x * 2}
    first = next(iter(d.values()))
    it = iter([x.sin(), x.cos(), x.tan()])
    head = next(it)
    rest = [v + 1 for v in it]
    return first, head, rest, next(it, None), next(iter(()), x)
# reversed() of lists (with tensors), argument lists, constant tuples and ranges.
@case(T34, [1, 2, 3])
def reversed_sequences(x, values):
    scaled = [v * x for v in reversed([x, x + 1])]
    return scaled, list(reversed(values)), tuple(reversed((1, 2))), [i for i in reversed(range(3))]
# functools.reduce with torch functions, operators, lambdas and user functions.
def _weighted(acc, v):
    return acc * 0.5 + v
@case(T34)
def functools_reduce(x):
    import functools
    parts = [x, x.sin(), x.cos()]
    return (functools.reduce(operator.add, parts), functools.reduce(torch.maximum, parts),
            functools.reduce(lambda a, b: a * b, parts, x + 1), functools.reduce(_weighted, parts),
            functools.reduce(operator.mul, [1, 2, 3]))
# Functions made in the trace used as values, as transformers' masking_utils composes mask
# functions: closures checked with callable() in a generator, combined, called later.
def _and_fns(*fns):
    if not all(callable(f) for f in fns):
        raise RuntimeError("not callable")
    def both(v):
        out = v > -10
        for f in fns:
            out = out & f(v)
        return out
    return both
@case(T34)
def closures_checked_with_callable(x):
    limit = 0.5
    def below(v): return v < limit
    def above(v): return v > -limit
    combined = _and_fns(below, above, lambda v: v != 0)
    flags = [callable(combined), callable(x), callable([below]), callable(x.sin), callable(len)]
    return torch.where(combined(x), x, x * 0), flags
# functools.partial: made in the trace (of torch functions, user functions, modules, another
# partial; keywords overridden at the call), and existing ones read from globals and modules.
import functools
def _affine(x, k, bias=0.0): return x * k + bias
_GELU_TANH = functools.partial(F.gelu, approximate="tanh")
_SCALE_BY = functools.partial(_affine, bias=1.0)
class _WithPartial(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = functools.partial(F.leaky_relu, negative_slope=0.2)
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.act(self.lin(x))
_WITH_PARTIAL = _WithPartial()
@case(T34)
def partial_made_in_the_trace(x):
    double = functools.partial(_affine, k=2.0)
    shifted = functools.partial(double, bias=x.cos())
    plus_x = functools.partial(torch.add, x)
    lin = functools.partial(_WITH_PARTIAL.lin)
    return (double(x), shifted(x), shifted(x, k=3.0), plus_x(1.0), plus_x(x, alpha=2),
            lin(x), callable(shifted))
@case(T34)
def partial_objects_that_exist(x):
    return _GELU_TANH(x), _SCALE_BY(x, 3.0), _SCALE_BY(x, k=0.5, bias=x), _WITH_PARTIAL(x)
# lru_cache: with constant arguments the cached function's (constant) answer; with tensors the
# wrapped function is traced.
@functools.lru_cache(maxsize=None)
def _offsets(n, step=1):
    return tuple(range(0, n * step, step))
@functools.lru_cache(maxsize=8)
def _cached_tensor_fn(t):
    return t.sin() * 2
@case(T34)
def lru_cached_helpers(x):
    return x * sum(_offsets(4)) + len(_offsets(3, step=2)), _cached_tensor_fn(x)
# Exceptions raised and caught inside the traced code: a Mapping's get() over a registry
# (transformers' AttentionInterface), raise in a helper caught by the caller, IndexError /
# KeyError / AttributeError from lookups whose answer the guards fix, `except ... as e`.
import collections.abc
class _Registry(collections.abc.Mapping):
    _shared = {"sin": torch.sin}
    def __init__(self):
        self._local = {"cos": torch.cos}
    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._shared[key]
    def __iter__(self):
        return iter({**self._shared, **self._local})
    def __len__(self):
        return len(self._shared) + len(self._local)
_REGISTRY = _Registry()
def _checked_scale(n):
    if n > 3:
        raise ValueError(f"scale {n} too big")
    return n
def _first_or(items, default):
    try:
        return items[0]
    except IndexError:
        return default
@case(T34)
def mapping_get_falls_back(x):
    return _REGISTRY.get("sin", torch.tanh)(x) + _REGISTRY.get("eager", torch.tanh)(x) + _REGISTRY["cos"](x)
@case(T34)
def exception_raised_in_callee_caught_here(x):
    try:
        k = _checked_scale(5)
    except ValueError as err:
        k = len(err.args)
    try:
        k = k + _checked_scale(2)
    except ValueError:
        k = -1
    return x * k
@case(T34)
def lookups_that_raise_are_caught(x):
    y = x + _first_or([], 2) + _first_or((3,), 0)
    try:
        y = y + {"a": 1}["b"]
    except KeyError:
        y = y - 1
    try:
        y = y + getattr(_REGISTRY, "missing")
    except AttributeError:
        y = y * 2
    return y
# del on items of lists and dicts made in the trace, and of arguments' (replayed).
@case(T34, lambda: [1, 2, 3, 4, 5, 6], lambda: {"a": 1, "b": 2})
def del_items(x, values, table):
    local = [x, x + 1, x + 2, x + 3]
    del local[1]
    del local[-1]
    names = {"p": x, "q": x * 2}
    del names["p"]
    del values[::2]
    del table["a"]
    try:
        del table["zzz"]
    except KeyError:
        x = x + 1
    return local, names, values, table, x
# Generator functions that change nothing run ahead of their consumer: user generators
# (yield, yield from, nested, with local state), Module.children()/modules()/named_children().
def _powers(x, n):
    seen = set()
    acc = x
    for i in range(n):
        seen.add(i)
        acc = acc * x
        yield acc
def _chained(x):
    yield x
    yield from _powers(x, 2)
    yield from (x + k for k in range(2))
_SEQ = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Tanh()))
@case(T34)
def generator_functions_consumed(x):
    total = sum(_powers(x, 3))
    items = list(_chained(x))
    first = next(iter(_powers(x, 1)))
    for i, y in enumerate(_chained(x.cos())):
        total = total + y * i
    return total, items, first
@case(T34)
def module_generator_methods(x):
    for child in _SEQ.children():
        x = child(x)
    names = [name for name, _ in _SEQ.named_children()]
    return x * len(list(_SEQ.modules())), names
# Named tuples: made in the trace (defaults, keywords, a subclass with methods), torch's
# named results; handed back with their own class.
from collections import namedtuple
_Pair = namedtuple("_Pair", "first second", defaults=[1.0])
class _Span(_Pair):
    def width(self):
        return self.second - self.first
@case(T34)
def named_tuples(x):
    p = _Pair(x, second=x * 2)
    q = _Pair(x.sin())
    span = _Span(x, x + 3)
    top = torch.topk(x, 2)
    a, b = p
    return (p, q, span, top, torch.max(x, 1), a + b + q.second, isinstance(p, _Pair),
            type(top) is type(torch.topk(torch.ones(3), 1)), top.values + top.indices)
# zip(strict=True) (nn.LSTM uses it) and dict.update with keywords and pairs.
@case(T34, lambda: {"a": 1})
def zip_strict_and_dict_update(x, table):
    pairs = [a * b for a, b in zip([x, x + 1], [2, 3], strict=True)]
    try:
        list(zip([1, 2], [3], strict=True))
    except ValueError:
        pairs.append(x)
    table.update(b=2, c=x.sum())
    table.update([("d", 4)], e=5)
    local = {}
    local.update(table, f=x)
    return pairs, table, local
# torch.nn modules without parameters made in forward and called at once: five operations
# (TorchDynamo's graph has five more, a `torch._C._log_api_usage_once` per module made).
@case(T34, ops=5)
def stateless_modules_made_in_forward(x):
    y = torch.nn.Softmax(dim=-1)(x)
    z = torch.nn.Dropout(p=0.0)(torch.nn.GELU(approximate="tanh")(x))
    act = torch.nn.LeakyReLU(0.3)
    return y, z, act(x), torch.nn.Flatten(0)(x)
# map, filter and itertools over items the trace holds (computed when made; the functions
# change nothing).
import itertools
@case(T34)
def map_filter_itertools(x):
    parts = [x, x.sin(), x.cos()]
    mapped = list(map(torch.relu, parts))
    paired = list(map(lambda a, b: a * b, parts, [1, 2, 3]))
    kept = list(filter(lambda v: v > 1, [0, 1, 2, 3]))
    nonzero = list(filter(None, [0, 1, 0, 2]))
    chained = sum(itertools.chain(parts, [x * 2]))
    flat = list(itertools.chain.from_iterable([[1, 2], (3,)]))
    head = list(itertools.islice(iter(parts), 2))
    rest = list(itertools.islice(parts, 1, None, 2))
    pairs = [a + b for a, b in itertools.product(parts[:2], repeat=2)]
    combos = [a * b for a, b in itertools.combinations(parts, 2)]
    perms = len(list(itertools.permutations(range(3), 2)))
    running = list(itertools.accumulate(parts))
    products = list(itertools.accumulate([1, 2, 3], operator.mul, initial=2))
    longest = list(itertools.zip_longest([x, x], [1], fillvalue=0))
    return (mapped, paired, kept, nonzero, chained, flat, head, rest, pairs, combos, perms,
            running, products, longest)
# list.sort and sorted() of lists holding tensors, by constant keys.
@case(T34, lambda: [3, 1, 2])
def sort_by_constant_keys(x, order):
    named = [("b", x), ("a", x.sin()), ("c", x.cos())]
    named.sort(key=lambda pair: pair[0])
    by_len = sorted([x, x[:1], x[:2]], key=len, reverse=True)
    order.sort(reverse=True)
    local = [5, 4, 6]
    local.sort()
    return [t for _, t in named], by_len, order, local
# Iterating over a tensor walks its first dimension (x[0], x[1], ...).
@case(T34)
def iterate_over_a_tensor(x):
    acc = x[0] * 0
    for row in x:
        acc = acc + row.relu()
    a, b, c = x
    return acc, [r.sum() for r in x.T], b - c + a
# Sets made in the trace (elements are constants): literals, comprehensions, unpacking,
# set(), methods and operators, in-place changes, iteration; returned as new sets.
@case(T34, [1, 4, 5])
def set_literals_and_methods(x, values):
    s = {1, 2}
    s.add(3)
    s.discard(1)
    s.update(values[:1])
    s |= {7}
    evens = {v % 2 for v in values}
    merged = {*values, 9} - evens
    n = sum(1 for v in sorted(merged) if v in s)
    return x * len(s) + n, s, sorted(merged), s.issubset(merged | s), evens.pop() in (0, 1)
@case(T34)
def set_iteration_and_membership(x):
    names = set(("a", "b", "a"))
    total = x
    for name in sorted(names):
        total = total + len(name)
    return total, "a" in names, frozenset(names), len(names & {"b", "c"})
class _Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, x, bias=0):
        return x * self.k + bias


_SCALER = _Scaler(3)


# Objects of Python classes with a Python __call__, existing and made in the trace.
@case(T34)
def callable_objects(x):
    return _SCALER(x, bias=1) + _Scaler(2)(x.sin())
# Repetition of sequences holding tensors: the same tensors repeated.
@case(T34)
def repeat_sequences_of_tensors(x):
    pair = (x.sin(), x.cos())
    stacked = torch.stack(pair * 2, dim=-1)
    copies = [x] * 2
    return stacked, 3 * [x.relu()], copies, copies[0] is copies[1], [1, 2] * 0
@case(T34)
def return_with_constants(x): return x.relu(), 7, "name", None
@case(T34)
def return_same_twice(x):
    y = x.sin()
    return y, y
@case(T34, T34)
def return_input(x, y): return x.cos(), y
@case(T34)
def return_shape(x): return x.exp(), x.shape


# --- graph breaks: the frame is split, as by TorchDynamo ----------------------------------------

@case(T34)
def data_dependent_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@case(T34)
def item_call(x): return x * x.sum().item()


@case(T34)
def mutates_global(x):
    global _LAST
    _LAST = x.shape
    return x + 1


_LAST = None


@case(3, 4, graphs=0, ops=0)
def no_tensors(a, b): return a * b + 1


class Registry(dict):
    """A dict subclass that overrides `get` in Python (as transformers' registries do)."""

    def get(self, key):
        return super().get(str(key)) or {"fallback": 1.0}


REGISTRY = Registry()
REGISTRY["a"] = {"scale": 2.0}
PLAIN_TABLE = {"scale": 3.0, "shift": 1.0}


@case(T34)
def dict_subclass_override(x): return x * len(REGISTRY.get("zzz")) + REGISTRY.get("a")["scale"]
@case(T34)
def global_dict_lookup(x): return x * PLAIN_TABLE.get("scale") + PLAIN_TABLE["shift"] + ("bias" in PLAIN_TABLE)


class Accumulator:
    def __init__(self, scale):
        self.scale = scale
        self.parts = []

    def add(self, t_):
        self.parts.append(t_ * self.scale)
        return self

    @property
    def total(self):
        return sum(self.parts)


class Settings:
    pass


SETTINGS = Settings()
SETTINGS.last = None


@case(T34)
def same_tensor_twice(x): return helper_add(x, x)
@case(T34)
def user_object_built_in_trace(x): return Accumulator(2.0).add(x).add(x + 1).total
@case(T34)
def user_object_returned(x):
    acc = Accumulator(3.0).add(x)
    return acc.total, acc.scale
@case(T34)
def side_effect_on_global_object(x):
    SETTINGS.last = "seen"
    return x * 2
@case(T34)
def generator_expression_all(x): return x * 2 if all(n > 0 for n in x.shape) else x
@case(T34)
def generator_expression_sum(x): return sum(x * k for k in (1.0, 2.0))
@case(T34)
def bound_string_method(x):
    mode = "eager"
    check = mode.startswith
    return x + 1 if check("ea") else x


@case(t(3, 4, requires_grad=True) if False else T34)
def no_grad_block(x):
    y = x * 2
    with torch.no_grad():
        z = y + 1
    return y, z


@case(T34)
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = a + 1
    return a, b


@torch.no_grad()
def decorated_no_grad(x):
    return x.sin()


@case(T34)
def no_grad_decorator(x): return decorated_no_grad(x) + 1


# --- torch._assert: a condition known while tracing leaves no node --------------------------

@case(T34)
def assert_on_rank(x):
    torch._assert(x.ndim == 2, "expected 2D")
    return x + 1
@case(T34)
def assert_on_size_expression(x):
    torch._assert(x.shape[0] * 2 > 1 and x.shape[-1] == 4, f"bad shape {x.shape}")
    return x.relu()
@case(T34)
def assert_on_tensor(x):
    torch._assert(x.abs().sum() >= 0, "negative")
    return x * 2
@case(T34, 3)
def assert_on_int_argument(x, n):
    torch._assert(n > 2, "n too small")
    return x + n


# --- the truth value of objects made in the trace: __bool__, else __len__ ---------------------

class _Layers:
    def __init__(self, n):
        self.layers = [None] * n

    def __len__(self):
        return len(self.layers)


class _Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


@case(T34)
def truth_of_object_with_len(x):
    empty, full = _Layers(0), _Layers(2)
    a = x + 1 if full and not empty else x - 1
    return a * 2 if empty or full else a
@case(T34)
def truth_of_object_with_bool(x):
    return x.sin() if _Flag(x.shape[0] == 3) else x.cos()
@case(T34)
def truth_of_object_in_while(x):
    stack = _Layers(3)
    while stack:
        stack.layers.pop()
        x = x + 1
    return x


# --- type annotations used as values ----------------------------------------------------------

@case(T34)
def jit_annotate_list_of_tensors(x):
    from typing import List
    out = torch.jit.annotate(List[torch.Tensor], [])
    out.append(x.sin())
    out.append(x.cos())
    return torch.stack(out)
@case(T34)
def generic_alias_compared(x):
    from typing import Dict, Optional
    kind = Optional[Dict[str, int]]
    return x * 2 if kind == Optional[Dict[str, int]] and list[int] != list[str] else x


# --- torch.autocast(enabled=False) while autocast is off: a block that changes nothing --------
# TorchDynamo's graphs hold an _enter_autocast/_exit_autocast pair for it; ours hold nothing.
WITHOUT_AUTOCAST_NODES = dict(ops=lambda theirs: theirs - 2)


@case(T34, **WITHOUT_AUTOCAST_NODES)
def autocast_disabled_block(x):
    with torch.autocast(device_type=x.device.type, enabled=False):
        y = x @ x.t()
    return y.relu()
@case(T34, **WITHOUT_AUTOCAST_NODES)
def amp_autocast_disabled_positional(x):
    with torch.amp.autocast("cpu", torch.bfloat16, False):
        y = x.sin() * 2
    return y + 1


# --- torch.autocast turning autocast on inside the frame: _enter/_exit_autocast nodes ----------
# As TorchDynamo: the block's operations run with autocast's dtypes, the graph holds the pair.
W8 = lambda: torch.randn(4, 4, generator=torch.Generator().manual_seed(8))  # noqa: E731


@case(T34, W8)
def autocast_bfloat16_matmul(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    return y.float().relu(), y.dtype
@case(T34, W8)
def autocast_default_dtype_keywords(x, w):
    with torch.autocast(device_type="cpu"):
        y = F.linear(x, w)
    return y, (y * 2).dtype
@case(T34, W8)
def amp_autocast_positional_then_float_ops(x, w):
    with torch.amp.autocast("cpu", torch.bfloat16, True):
        y = torch.mm(x, w)
    return (y.float() @ w).sum(0)
@case(T34, W8)
def autocast_with_enabled_false_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
    return a.float() + b, a.dtype, b.dtype
@case(T34, W8)
def autocast_in_an_inlined_helper(x, w):
    def project(v):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            return F.linear(v, w).relu()
    return project(x).float() + project(x * 2).float()
@case(T34, W8)
def autocast_block_returning_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return (x @ w).softmax(-1)
@case(T34, W8)
def autocast_same_context_entered_twice(x, w):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    with ctx:
        a = x @ w
    b = x @ w
    with ctx:
        c = b @ w
    return a.float() + b + c.float()


@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


def test_enough_cases() -> None:
    assert len(CASES) >= 200, len(CASES)


@pytest.mark.parametrize(("name", "fn", "make", "spec"), CASES, ids=[c[0] for c in CASES])
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)
