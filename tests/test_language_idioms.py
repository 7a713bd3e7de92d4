"""Python as model code writes it, side by side with TorchDynamo (the harness is
`language_harness.check_case`; everyday builtins and the standard library are in
`test_language_breadth.py`): calls and assignment forms, `match`, indexing, torch.Size, dtypes
and devices, tensor methods, distributions, NumPy on constants, comprehensions, module
containers, more object forms (enums, typing.NamedTuple, frozen dataclasses, slots, super()),
and the idioms of transformer and vision models."""

from __future__ import annotations

import dataclasses
import enum
import functools
import heapq
import math
import operator
import typing

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from language_harness import case_registrar, check_case, params, reset_all, t
from test_language_breadth import _Box, _Point, _Scaler

CASES: list = []
case = case_registrar(CASES)

T34 = t(3, 4)


# --- calls: star-args, keywords, defaults ---------------------------------------------------

def _kw_only(x, *, scale=2.0, shift=0.0):
    return x * scale + shift


def _varargs(*xs, **opts):
    out = sum(xs)
    return out * opts.get("k", 1.0)


@case(T34)
def call_keyword_only(x): return _kw_only(x, shift=1.0)
@case(T34)
def call_star_args(x):
    parts = (x, x * 2)
    return _varargs(*parts, k=3.0)
@case(T34)
def call_double_star(x):
    opts = {"scale": 0.5}
    return _kw_only(x, **opts)
@case(T34)
def call_star_and_double_star(x):
    return _varargs(*[x, x], **{"k": 2.0})
@case(T34)
def call_positional_only(x):
    def f(a, b, /, c=1.0):
        return a * b + c
    return f(x, 2.0, c=3.0)
@case(T34)
def call_default_none(x):
    def f(a, bias=None):
        return a if bias is None else a + bias
    return f(x) + f(x, x)
@case(T34)
def call_recursive_function(x):
    def depth(a, n):
        return a if n == 0 else depth(a * 2, n - 1)
    return depth(x, 3)
@case(T34)
def call_torch_with_out_of_order_keywords(x): return torch.sum(keepdim=True, dim=0, input=x)


# --- assignment forms ---------------------------------------------------------------------------

@case(T34)
def walrus_in_condition(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x
@case(T34)
def walrus_in_comprehension(x):
    return torch.stack([y for i in range(3) if (y := x * i) is not None])
@case(T34)
def chained_assignment(x):
    a = b = x * 2
    return a + b
@case(T34)
def augmented_on_attribute(x):
    box = _Box()
    box.items["k"] = x
    box.items["k"] += 1
    return box.items["k"]
@case(T34)
def swap_by_tuple(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b
@case(T34)
def nested_unpacking(x):
    (a, b), c = (x, x + 1), x + 2
    return a * b * c
@case(T34)
def global_constant_read(x): return x * _CONSTANT_SCALE
@case(T34)
def deleted_local(x):
    y = x * 2
    z = y + 1
    del y
    return z


_CONSTANT_SCALE = 4.0


# --- match statements ---------------------------------------------------------------------------

@case(T34)
def match_literal(x):
    mode = "mean"
    match mode:
        case "sum":
            return x.sum()
        case "mean":
            return x.mean()
        case _:
            return x
@case(T34)
def match_tuple_shape(x):
    match x.shape:
        case (a, b):
            return x * a * b
        case _:
            return x
@case(T34)
def match_mapping(x):
    cfg = {"act": "relu", "p": 0.1}
    match cfg:
        case {"act": "relu"}:
            return F.relu(x)
        case _:
            return x
@case(T34)
def match_class_pattern(x):
    p = _Point(x, 2.0)
    match p:
        case _Point(x=v, y=k):
            return v * k
    return x


# --- indexing ----------------------------------------------------------------------------------

@case(t(4, 5, 6))
def index_ellipsis(x): return x[..., 1]
@case(t(4, 5, 6))
def index_none(x): return x[:, None, 2]
@case(t(4, 5))
def index_negative_step_free(x): return x[-2:, :-1]
@case(t(4, 5))
def index_with_list(x): return x[[0, 2]]
@case(t(4, 5))
def index_with_bool_mask(x): return torch.where(x > 0, x, torch.zeros_like(x))
@case(t(4, 5))
def index_with_tensor(x): return x[torch.tensor([1, 3])]
@case(t(4, 5))
def index_assign_slice(x):
    y = x.clone()
    y[:, 0] = 0.0
    return y
@case(t(4, 5))
def index_assign_with_tensor(x):
    y = x.clone()
    y[1:3] = x[:2] * 2
    return y
@case(t(4, 5))
def index_by_shape_arithmetic(x): return x[: x.shape[0] // 2, x.shape[1] - 2:]
@case(t(2, 3, 4))
def unbind_and_stack(x): return torch.stack(x.unbind(1), dim=0)


# --- torch.Size, dtypes, devices -----------------------------------------------------------------

@case(t(2, 3, 4))
def size_slicing_and_concat(x): return x.reshape(x.shape[:1] + (-1,))
@case(t(2, 3, 4))
def size_numel_and_index(x): return x.view(-1) * x.shape.numel() + x.shape.index(3)
@case(t(2, 3, 4))
def size_unpack_star(x):
    b, *rest = x.shape
    return x.reshape(b, math_prod(rest))
@case(t(2, 3, 4))
def size_compare_tuple(x): return x * 2 if x.shape == (2, 3, 4) else x
@case(T34)
def dtype_attributes(x):
    return x.to(torch.float64) * 2 if x.dtype.is_floating_point and x.dtype.itemsize == 4 else x
@case(T34)
def dtype_promotion_query(x):
    dt = torch.promote_types(x.dtype, torch.float64)
    return x.to(dt)
@case(T34)
def finfo_constants(x): return x.clamp(min=torch.finfo(x.dtype).min, max=torch.finfo(x.dtype).max) + torch.finfo(torch.float32).eps
@case(T34)
def iinfo_constants(x): return x * (torch.iinfo(torch.int8).max / 127)
@case(T34)
def new_tensors_like_input(x):
    return x.new_zeros(2, 4) + x.new_ones(4) + x.new_full((4,), 2.0) + x.new_tensor([1.0, 2.0, 3.0, 4.0])
@case(T34)
def device_comparison(x): return x + 1 if x.device == torch.device("cpu") else x
@case(T34)
def tensor_type_conversions(x): return x.long().float() + x.double().float() + x.half().float()


def math_prod(items):
    out = 1
    for i in items:
        out *= i
    return out


# --- tensor methods and in-place ops -------------------------------------------------------------

@case(T34)
def inplace_chain(x):
    y = x.clone()
    y.mul_(2).add_(1).clamp_(min=0)
    return y
@case(T34)
def inplace_on_view(x):
    y = x.clone()
    v = y[0]
    v.fill_(3.0)
    return y
@case(T34)
def masked_fill_and_scatter(x):
    y = x.masked_fill(x < 0, 0.0)
    return y.scatter(1, torch.zeros(3, 1, dtype=torch.long), 1.0)
@case(T34)
def gather_and_index_select(x):
    idx = torch.tensor([[0, 1], [1, 2], [2, 3]])
    return x.gather(1, idx) + x.index_select(1, torch.tensor([0, 3]))
@case(T34)
def chunk_and_cat(x): return torch.cat(x.chunk(2, dim=1)[::-1], dim=1)
@case(T34)
def split_sizes(x):
    a, b = x.split([1, 3], dim=1)
    return a * b
@case(T34)
def expand_and_repeat(x): return x[:, :1].expand(3, 4) + x.repeat(1, 1)
@case(T34)
def permute_contiguous_view(x): return x.t().contiguous().view(-1)
@case(T34)
def type_as_and_to_other(x): return x.type_as(torch.zeros(1, dtype=torch.float64)).to(x)
@case(T34)
def tensor_apply_functions(x): return x.sigmoid().tanh().exp().log1p().sqrt()
@case(T34)
def tensor_reductions(x): return x.amax(1) + x.amin(1) + x.std(1) + x.var(1) + x.prod(1) + x.logsumexp(1)
@case(T34)
def tensor_max_with_indices(x):
    values, indices = x.max(dim=1)
    return values * indices
@case(T34)
def sort_and_argsort(x):
    s, i = x.sort(dim=1, descending=True)
    return s + i + x.argsort(dim=0)
@case(T34)
def cumulative_ops(x): return x.cumsum(1) + x.cumprod(1) + torch.cummax(x, 1).values
@case(T34)
def tril_triu_diag(x): return x.tril() - x.triu(1) + torch.diag(x[:, :3]).sum()
@case(T34)
def outer_and_einsum(x): return torch.outer(x[0], x[1]) + torch.einsum("i,j->ij", x[0], x[1])
@case(T34)
def where_with_scalar(x): return torch.where(x > 0, x, 0.0)
@case(T34)
def clone_detach_requires_grad_flag(x):
    y = x.detach().clone()
    return y * 2 if not y.requires_grad else y


# --- torch.distributions made in forward -----------------------------------------------------------

@case(T34)
def normal_log_prob(x):
    d = torch.distributions.Normal(torch.zeros(4), torch.ones(4))
    return d.log_prob(x)
@case(T34)
def categorical_entropy(x):
    d = torch.distributions.Categorical(logits=x)
    return d.entropy()
@case(T34)
def bernoulli_probs(x):
    d = torch.distributions.Bernoulli(logits=x)
    return d.probs + d.mean


# --- numpy on constants ------------------------------------------------------------------------

# TorchDynamo traces NumPy into torch operations and breaks at int() of the result (2 graphs);
# NumPy on constants is folded here: one graph, x * 2.0 + 6.
@case(T34, graphs=1, ops=2)
def numpy_constants(x):
    import numpy as np
    return x * float(np.sqrt(4.0)) + int(np.prod((2, 3)))
@case(T34)
def numpy_pi_and_dtype(x):
    import numpy as np
    return x * np.pi


# --- comprehensions ----------------------------------------------------------------------------

@case(T34)
def list_comprehension_with_condition(x): return torch.stack([x * i for i in range(5) if i % 2])
@case(T34)
def dict_comprehension_with_tensors(x):
    d = {f"k{i}": x * i for i in range(3)}
    return d["k2"] - d["k1"]
@case(T34)
def nested_comprehension_flatten(x):
    rows = [[x, x + 1], [x + 2]]
    return torch.stack([v for row in rows for v in row])
@case(T34)
def comprehension_over_zip_enumerate(x):
    return sum(i * a for i, (a, b) in enumerate(zip([x, x], [1, 2])))
@case(T34)
def comprehension_closing_over_local(x):
    k = 3.0
    return torch.stack([x * k + j for j in range(2)])
@case(T34)
def generator_into_tuple(x): return torch.cat(tuple(x * i for i in range(2)))
@case(T34)
def any_all_generator_constants(x):
    sizes = [3, 4]
    return x * 2 if all(s > 0 for s in sizes) and not any(s > 10 for s in sizes) else x


# Closures compiled as frames of their own (decorated functions, factories): comprehensions
# and nested functions read the closure's free variables.
def _closure_with_comprehensions(k):
    def closure_comprehensions_over_a_free_variable(x):
        parts = [x * k for _ in range(3)]
        table = {i: x + k for i in range(2)}
        return sum(parts) + table[1] + sum(x * k for _ in range(2))

    return closure_comprehensions_over_a_free_variable


def _closure_with_nested_function(k):
    def closure_nested_function_reads_a_free_variable(x):
        def scale(t):
            return t * k

        return scale(x) + max(k, 1.0)

    return closure_nested_function_reads_a_free_variable


def _keyword_filter(fn):
    allowed = ("scale",)

    @functools.wraps(fn)
    def wrapper(x, **kwargs):
        kwargs = {name: v for name, v in kwargs.items() if name in allowed}
        return fn(x, **kwargs) + len([a for a in allowed if a])

    return wrapper


@_keyword_filter
def decorator_filters_keywords_with_a_comprehension(x, scale=2.0):
    return x * scale


case(T34)(_closure_with_comprehensions(3.0))
case(T34)(_closure_with_nested_function(2.0))
case(T34)(decorator_filters_keywords_with_a_comprehension)


@case(T34)
def builtin_abs_and_pow_of_tensors(x): return abs(x) + pow(x, 2) + pow(2.0, x) + abs(-x).sum()


# --- lists changed inside their own for loop (Python's list iterator reads by position) ----

@case(T34)
def loop_over_a_growing_worklist(x):
    todo = [x]
    for item in todo:
        if len(todo) < 4:
            todo.append(item * 2 + 1)
    return sum(todo)
@case(T34)
def loop_replaces_an_item_ahead(x):
    xs = [x, x + 1, x + 2]
    acc = x * 0
    for v in xs:
        acc = acc + v
        xs[-1] = acc * 0.5
    return acc, xs[-1]
@case(T34)
def loop_pops_from_the_end(x):
    xs = [x, x * 2, x * 3, x * 4]
    seen = []
    for v in xs:
        seen.append(v.sum())
        xs.pop()
    return torch.stack(seen), len(xs)
@case(T34)
def loop_inserts_in_front(x):
    xs = [x, x * 3]
    total = x * 0
    for v in xs:
        total = total + v
        if len(xs) < 5:
            xs.insert(0, v * 0.5)
    return total, len(xs)
@case(T34)
def exhausted_iterator_ignores_later_appends(x):
    xs = [x, x + 1]
    it = iter(xs)
    first = [v * 2 for v in it]
    xs.append(x * 5)
    return sum(first), list(it), len(xs)


# --- modules: iteration, lookups, flags --------------------------------------------------------------

class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return x


_STACK = _Stack()


@case(T34)
def modulelist_zip_enumerate(x):
    for i, layer in enumerate(_STACK.layers):
        x = layer(x) * (i + 1)
    return x
@case(T34, ops=lambda theirs: theirs - 2)  # TorchDynamo logs each ModuleList slice made
def modulelist_slice_and_reverse(x):
    for layer in _STACK.layers[1:][::-1]:
        x = layer(x)
    return x
@case(T34)
def moduledict_items_and_keys(x):
    outs = [head(x) for name, head in _STACK.heads.items() if name in _STACK.heads.keys()]
    return torch.cat(outs, dim=1)
@case(T34)
def module_buffer_use(x): return x * _STACK.scale
@case(T34)
def module_named_buffers(x): return x * len(dict(_STACK.named_buffers()))
@case(T34)
def module_getattr_by_name(x): return getattr(_STACK.heads, "a")(x)
@case(T34)
def module_len_and_index(x): return _STACK.layers[len(_STACK.layers) - 1](x)
@case(T34)
def module_weight_shape(x): return x @ _STACK.layers[0].weight.T + _STACK.layers[0].weight.shape[0]
@case(T34)
def module_isinstance_checks(x):
    n = sum(1 for m in _STACK.modules() if isinstance(m, (nn.Linear, nn.ModuleDict)))
    return x * n


# --- more object forms: enums, typing.NamedTuple, frozen dataclasses, slots, super() ------------

class _Mode(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


class _Spec(typing.NamedTuple):
    dim: int
    keepdim: bool = False


@dataclasses.dataclass(frozen=True)
class _Frozen:
    k: float = 2.0


class _Slotted:
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


class _Base:
    def scale(self, x):
        return x * 2


class _Derived(_Base):
    def scale(self, x):
        return super().scale(x) + 1


class _WithSetter:
    def __init__(self):
        self._k = 1.0

    @property
    def k(self):
        return self._k

    @k.setter
    def k(self, value):
        self._k = value * 2


@case(T34)
def enum_member_compare(x):
    mode = _Mode.MEAN
    return x.mean() if mode is _Mode.MEAN else x.sum()
@case(T34)
def enum_value_and_name(x): return x * len(_Mode.SUM.value + _Mode.MEAN.name)
@case(T34)
def typing_namedtuple_defaults(x):
    spec = _Spec(1)
    return x.sum(dim=spec.dim, keepdim=spec.keepdim)
@case(T34)
def frozen_dataclass(x): return x * _Frozen().k
@case(T34)
def frozen_dataclass_assignment_raises(x):
    f = _Frozen(3.0)
    try:
        f.k = 5.0
    except dataclasses.FrozenInstanceError:
        return x * f.k
    return x
@case(T34)
def frozen_dataclass_through_getter(x): return x + operator.attrgetter("k")(_Frozen())
@case(T34)
def slotted_object(x): return x * _Slotted(3.0).k
@case(T34)
def super_in_plain_class(x): return _Derived().scale(x)
@case(T34)
def property_setter(x):
    w = _WithSetter()
    w.k = 3.0
    return x * w.k
@case(T34)
def itemgetter_and_attrgetter(x):
    pair = (x, x * 2)
    return operator.itemgetter(1)(pair) + operator.attrgetter("k")(_Frozen())
@case(T34)
def methodcaller_on_tensor(x): return operator.methodcaller("sum", 1)(x)
@case(T34)
def class_attribute_through_instance(x): return x * _Scaler(0.0).factor
@case(T34)
def instance_dict_vars(x):
    s = _Scaler(2.0)
    return x * vars(s)["shift"]
@case(T34)
def type_name_of_instance(x): return x * len(type(_Scaler(0.0)).__name__)
@case(T34)
def isinstance_tuple_of_types(x):
    return x + 1 if isinstance(3, (int, float)) and isinstance(x, torch.Tensor) else x
@case(T34)
def issubclass_check(x): return x * 2 if issubclass(_Derived, _Base) else x
@case(T34)
def id_equality_of_constants(x):
    a = b = _CONSTANT_SCALE
    return x * 2 if a is b else x


# --- idioms of transformer and vision model code -------------------------------------------------

class _Cfg:
    hidden = 4
    heads = 2
    use_bias = True
    act = "gelu"


_CFG = _Cfg()


def _attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ v



@case(t(2, 5, 4))
def causal_mask_from_triu(x):
    n = x.shape[1]
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    return _attention(x, x, x, mask)
@case(t(2, 5, 4))
def sdpa_with_causal_flag(x):
    q = x.unsqueeze(1)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True).squeeze(1)
@case(t(2, 5, 4))
def qkv_chunk_unpack(x):
    q, k, v = torch.cat([x, x * 2, x * 3], dim=-1).chunk(3, dim=-1)
    return _attention(q, k, v)
@case(t(2, 5, 4))
def heads_split_and_merge(x):
    b, n, d = x.shape
    h = _CFG.heads
    y = x.view(b, n, h, d // h).transpose(1, 2)
    return y.transpose(1, 2).reshape(b, n, -1)
@case(t(2, 5, 4))
def rotary_halves(x):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((-x2, x1), dim=-1) * 0.5 + x
@case(t(2, 5, 4))
def position_ids_expand(x):
    b, n, _ = x.shape
    pos = torch.arange(n).unsqueeze(0).expand(b, -1)
    return x + pos.unsqueeze(-1).to(x.dtype)
@case(t(2, 5, 4))
def finfo_min_mask(x):
    mask = x[..., 0] > 0
    return x.masked_fill(~mask.unsqueeze(-1), torch.finfo(x.dtype).min).amax(-1)
@case(t(2, 5, 4))
def getattr_config_default(x):
    eps = getattr(_CFG, "layer_norm_eps", 1e-5)
    return F.layer_norm(x, (getattr(_CFG, "hidden"),), eps=eps)
@case(t(2, 5, 4))
def activation_by_config_name(x):
    acts = {"gelu": F.gelu, "relu": F.relu}
    return acts[_CFG.act](x)
@case(t(2, 5, 4))
def kwargs_pop_and_forward(x):
    def inner(a, **kwargs):
        scale = kwargs.pop("scale", 1.0)
        return a * scale + len(kwargs)
    return inner(x, scale=2.0, extra=None)
@case(t(2, 5, 4))
def isinstance_list_or_tuple(x):
    sizes = (2, 3)
    return x * 2 if isinstance(sizes, (list, tuple)) else x
@case(t(2, 5, 4))
def jit_queries(x):
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    return x + 1
@case(t(2, 5, 4))
def pad_with_computed_amounts(x):
    pad = (4 - x.shape[-1] % 4) % 4 + 1
    return F.pad(x, (0, pad))
@case(t(2, 6, 4))
def unflatten_and_flatten(x): return x.unflatten(1, (2, 3)).flatten(1, 2)
@case(t(2, 5, 4))
def softmax_with_dtype(x): return x.softmax(-1, dtype=torch.float32)
@case(t(2, 5, 4))
def to_dtype_of_other(x):
    other = torch.zeros(1, dtype=torch.float64)
    return x.to(dtype=other.dtype).type(torch.float32)
@case(t(2, 5, 4))
def baddbmm_scores(x): return torch.baddbmm(torch.zeros(2, 5, 5), x, x.transpose(1, 2), alpha=0.5)
@case(t(2, 5, 4))
def split_by_sizes_list(x):
    a, b = torch.split(x, [1, 3], dim=-1)
    return a.expand_as(b) * b
@case(t(2, 5, 4))
def einsum_heads(x):
    q = x.view(2, 5, 2, 2)
    return torch.einsum("bqhd,bkhd->bhqk", q, q)
@case(t(2, 5, 4))
def mask_to_additive_bias(x):
    mask = torch.ones(2, 5)
    mask[:, -2:] = 0
    bias = (1.0 - mask[:, None, None, :]) * torch.finfo(x.dtype).min
    return bias.expand(2, 1, 5, 5).sum()
# Our graph keeps the two grad-mode switches around the decorated call (enable, then back to
# no_grad); TorchDynamo's has none here.
@case(t(2, 5, 4), ops=lambda theirs: theirs + 2)
def inner_enable_grad_decorator_under_no_grad(x):
    @torch.enable_grad()
    def grad_mode(a):
        return a * 2 if torch.is_grad_enabled() else a
    with torch.no_grad():
        return grad_mode(x) + torch.is_grad_enabled()
@case(t(2, 5, 4))
def inner_no_grad_decorator(x):
    @torch.no_grad()
    def stats(a):
        return a.mean()
    return x - stats(x)
@case(t(2, 5, 4))
def math_ceil_of_shape(x): return x[:, : math.ceil(x.shape[1] / 2)]
@case(t(2, 5, 4))
def full_and_arange_from_shape(x):
    return x + torch.full((x.shape[-1],), 0.5) + torch.arange(x.shape[-1], dtype=x.dtype)
@case(t(2, 5, 4))
def where_with_tensor_scalar(x): return torch.where(x > 0, x, torch.tensor(0.0))
@case(t(2, 5, 4))
def masked_fill_inplace_on_clone(x):
    y = x.clone()
    y.masked_fill_(y < 0, 0.0)
    return y
@case(t(2, 5, 4), ops=lambda theirs: theirs - 2)  # TorchDynamo logs each nn.Identity made
def layers_zip_norms(x):
    layers = [nn.Identity(), nn.Identity()]
    norms = [lambda a: a * 2, lambda a: a + 1]
    for layer, norm in zip(layers, norms):
        x = norm(layer(x))
    return x
@case(t(2, 5, 4))
def getattr_of_numbered_layers(x):
    for i in range(2):
        x = getattr(_STACK.layers, str(i))(x)
    return x
@case(t(2, 5, 4))
def bias_is_not_none(x):
    layer = _STACK.layers[0]
    out = x @ layer.weight.t()
    if hasattr(layer, "bias") and layer.bias is not None:
        out = out + layer.bias
    return out
@case(t(2, 5, 4))
def linear_functional_with_module_params(x):
    layer = _STACK.layers[1]
    return F.linear(x, layer.weight, layer.bias if _CFG.use_bias else None)
@case(t(2, 5, 4))
def interpolate_scale(x): return F.interpolate(x.unsqueeze(1), scale_factor=2, mode="nearest").squeeze(1)
@case(t(2, 3, 8, 8))
def adaptive_pool_and_flatten(x): return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
@case(t(2, 3, 8, 8))
def conv_functional_same_padding(x):
    w = torch.ones(4, 3, 3, 3) / 27
    return F.conv2d(x, w, padding="same")
@case(t(2, 3, 8, 8))
def channels_last_roundtrip(x):
    return x.contiguous(memory_format=torch.channels_last).relu().contiguous()
@case(t(2, 3, 8, 8))
def patchify(x):
    b, c, h, w = x.shape
    p = 4
    return x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)
@case(t(2, 5, 4))
def cumsum_positions_from_mask(x):
    mask = (x[..., 0] > -10).long()
    pos = mask.cumsum(-1) * mask - 1
    return x + pos.unsqueeze(-1)
@case(t(2, 5, 4))
def gather_last_token(x):
    idx = torch.full((2,), 4, dtype=torch.long)
    return x[torch.arange(2), idx]
@case(t(2, 5, 4))
def cross_entropy_loss(x):
    target = torch.zeros(10, dtype=torch.long)
    return F.cross_entropy(x.reshape(10, 4), target, ignore_index=-100)
@case(t(2, 5, 4))
def label_smoothing_loss(x):
    return F.cross_entropy(x.reshape(10, 4), torch.ones(10, dtype=torch.long), label_smoothing=0.1)
@case(t(2, 5, 4))
def one_hot_and_sum(x): return F.one_hot(torch.tensor([0, 3, 1]), num_classes=4).float() @ x[0].t()
@case(t(2, 5, 4))
def normalize_and_cosine(x): return F.cosine_similarity(F.normalize(x, dim=-1), x, dim=-1)


@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


# --- TorchDynamo's own decorators -------------------------------------------------------------

@torch.compiler.allow_in_graph
def _allowed(x, k):
    # One node in the graph, run on fake tensors while tracing, as under TorchDynamo.
    return x.cos() * k + 1


def _plain_helper(x):
    return x.sin()


@case(T34)
def allow_in_graph_function(x):
    return _allowed(x, 2.0) + _plain_helper(x)


@case(T34)
def allow_in_graph_function_twice(x):
    y = _allowed(x, 3.0)
    return _allowed(y, 0.5).sum(0)


@torch.compiler.assume_constant_result
def _constant_scale():
    return 4


@case(T34)
def assume_constant_result_function(x):
    return x * _constant_scale()


# --- heapq (its C functions traced as the module's Python versions), zip over iterators
# that outlive it, object() sentinels -----------------------------------------------------

@case(T34)
def heapq_heapify_and_pop(x):
    h = [5, 1, 4, 2]
    heapq.heapify(h)
    first = heapq.heappop(h)
    second = heapq.heappop(h)
    return x * first + second + h[0]


@case(T34)
def heapq_push_then_pop_in_order(x):
    h = []
    for p in (3, 1, 2):
        heapq.heappush(h, (p, p * 10))
    rows = [heapq.heappop(h)[1] for _ in range(len(h))]
    return x[:, :1] * torch.tensor(rows, dtype=x.dtype)


@case(T34)
def heapq_priority_queue_of_tensors(x):
    # Ties broken by a counter, so tensors are never compared.
    h = []
    for i, row in enumerate(x):
        heapq.heappush(h, (-(i % 2), i, row))
    _, _, a = heapq.heappop(h)
    _, _, b = heapq.heappushpop(h, (5, 9, x[0] * 3))
    return a + b


@case(T34)
def heapq_replace_and_nsmallest(x):
    h = [1, 3, 5]
    heapq.heapreplace(h, 4)
    return x * heapq.nsmallest(2, [7, 2, 9, 4])[1] + heapq.nlargest(1, h)[0]


@case(T34)
def heapq_nlargest_with_key(x):
    sizes = {"a": x.shape[0], "b": x.shape[1], "c": 1}
    top = heapq.nlargest(2, sizes.items(), key=lambda kv: kv[1])
    return x.sum(0)[: top[1][1]] * top[0][1]


@case(T34)
def heapq_merge_sorted_lists(x):
    order = list(heapq.merge([1, 4], [2, 3]))
    return x[:, order[1]] + order[-1]


@case(T34)
def zip_with_range_then_rest_of_iterator(x):
    it = iter([x, x + 1, x * 2, x - 3])
    head = [a * i for i, a in zip(range(2), it)]
    return sum(head) + sum(it)


@case(T34)
def zip_iterator_before_the_shortest_loses_an_item(x):
    it = iter([x, x + 1, x * 2, x - 3])
    pairs = list(zip(it, range(2)))
    return pairs[1][0] + next(it)


@case(T34)
def zip_of_two_iterators_then_both(x):
    a = iter([x, x.cos()])
    b = iter([x.sin(), x * 2, x * 3, x * 4])
    total = sum(u * v for u, v in zip(a, b))
    return total + sum(b) + len(list(a))


@case(T34)
def tuples_holding_tensors_compared_by_known_items(x):
    a, b = (1, 0, x), (1, 1, x * 2)
    same = (a == a) + ([1, x] != [1, x, 2]) + ((2, x) > (1, x.cos())) + ((0, [1, x]) < (0, [2, x]))
    return x * (a < b) + same + (b >= a) * 2


_FALLBACK = object()


@case(T34)
def sentinel_made_in_forward(x):
    missing = object()
    d = {"scale": 2.0}
    scale = d.get("scale", missing)
    shift = d.get("shift", missing)
    if shift is missing:
        shift = 1.0
    return x * scale + shift


@case(T34)
def module_level_sentinel_and_a_new_one(x):
    mine = object()
    return x + (1 if mine is not _FALLBACK else 2) + (mine is mine) + (object() is object())


def test_enough_cases() -> None:
    assert len(CASES) >= 130, len(CASES)


@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)
