"""Dynamic shapes: one graph serves many sizes.

Every case runs the same function eagerly, under dynamo_rs and under TorchDynamo (same
`dynamic=` setting, same calls in the same order): results must equal eager's and the number of
compiled frames must equal TorchDynamo's. Then the seed article's examples (static first, then
one symbolic graph; sizes 0 and 1 specialised; shared symbols; a guard on a symbolic branch),
`mark_dynamic` and its errors, guards checked against eager after the first compile, and real
models (GPT-2, Llama, BERT, resnet18) over many sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import dynamo_rs
from dynamo_rs.testing import CompileCounter


pytestmark = pytest.mark.usefixtures("reset_compilers")


def r(*shape):
    return torch.randn(*shape)


def side_by_side(fn, calls, dynamic=None, delta=0):
    """Runs `calls` (argument tuples, or functions making them) eagerly, under dynamo_rs and
    under TorchDynamo; checks results and frame counts (ours = theirs + delta). Returns our
    counter."""
    ours = CompileCounter()
    theirs = torch._dynamo.testing.CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=ours, dynamic=dynamic)
    reference = torch.compile(fn, backend=theirs, dynamic=dynamic)
    for args in calls:
        args = args() if callable(args) else args
        expected = fn(*args)
        torch.testing.assert_close(compiled(*args), expected)
        torch.testing.assert_close(reference(*args), expected)
    assert ours.frame_count == theirs.frame_count + delta, (ours.frame_count, theirs.frame_count)
    return ours


def sizes(*ns, cols=3):
    return [(r(n, cols),) for n in ns]


# --- functions, by family ------------------------------------------------------------------

def scale_by_rows(a):
    return a * a.shape[0]


def seed_fn(a, b):
    return a.shape[0] * a * b


def add_same(a, b):
    return a + b


def view_rows(x):
    return x.view(x.shape[0], -1).relu()


def view_size_call(x):
    return x.view(x.size(0), x.size(1) * x.size(2))


def reshape_neg(x):
    return x.reshape(-1, x.size(-1)) * 2


def view_input_rows(x):
    return (x * x.shape[1]).sum(-1)


def view_input_reshape(x):
    b, h, w, c = x.shape
    return x.reshape(-1, w, c).relu().reshape(b, h, w * c) + h


def flatten_mean(x):
    return x.flatten(1).mean(1)


def permute_contig(x):
    return x.permute(1, 0).contiguous() + 1


def transpose_matmul(x):
    return x @ x.transpose(0, 1)


def slice_half(x):
    return x[: x.shape[0] // 2] * 2


def slice_inner(x):
    n = x.shape[0]
    return x[1 : n - 1]


def slice_last_cols(x):
    return x[:, : x.size(1) - 1]


def narrow_dynamic(x):
    return x.narrow(0, 0, x.shape[0] - 1)


def cat_rows(x, y):
    z = torch.cat([x, y])
    return z * z.shape[0]


def cat_cols(x, y):
    return torch.cat([x, y], dim=1).sum(1)


def stack_pair(x, y):
    return torch.stack([x, y]).sum(0)


def zeros_like_rows(x):
    return x + torch.zeros(x.shape[0], x.shape[1])


def new_zeros_shape(x):
    return x.new_zeros(x.shape) + x


def arange_rows(x):
    return x + torch.arange(x.shape[0]).unsqueeze(1)


def full_rows(x):
    return torch.full((x.size(0), 1), 2.0) * x


def ones_numel(x):
    return x.sum() / x.numel()


def mean_by_size(x):
    return x.sum(0) / x.size(0)


def size_arithmetic(x):
    n, m = x.shape
    return x * (n * m + n // 2 - 1)


def size_float(x):
    return x * (x.shape[0] / 2)


def size_tuple_concat(x):
    shape = (-1,) + tuple(x.shape[1:])
    return x.reshape(shape) + 1


def shape_unpack(x):
    b, t, c = x.shape
    return x.reshape(b * t, c).sum(0)


def branch_on_size(a):
    if a.shape[0] * 2 < 16:
        return a + 1
    return a - 1


def branch_size_equal(a, b):
    if a.shape[0] == b.shape[0]:
        return a + b
    return a.sum() + b.sum()


def range_loop(x):
    out = x
    for _ in range(x.shape[0] // 4):
        out = out + 1
    return out


def min_of_size(x):
    return x[: min(x.shape[0], 4)]


def expand_rows(x, y):
    return x.expand(y.shape[0], x.shape[1]) + y


def split_half(x):
    a, b = x.split(x.shape[1] // 2, dim=1)
    return a * b


def chunk_two(x):
    a, b = x.chunk(2, dim=1)
    return a - b


def repeat_rows(x):
    return x.repeat(2, 1)


def index_select_rows(x):
    return x.index_select(0, torch.arange(x.shape[0] - 1))


def softmax_last(x):
    return torch.softmax(x, dim=-1) * x.shape[-1]


def layer_norm_rows(x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],))


def linear_rows(x, w):
    return torch.nn.functional.linear(x, w).relu()


def unsqueeze_expand_as(x, y):
    return x.unsqueeze(0).expand_as(y) * y


def inplace_scale(x):
    y = x.clone()
    y.mul_(y.shape[0])
    return y


def returns_size(x):
    return x * 2, x.shape[0]


def size_in_list(x):
    sizes = [x.shape[0], x.shape[1]]
    return x.reshape(sizes[0] * sizes[1])


def pad_rows(x):
    return torch.nn.functional.pad(x, (0, 0, 0, 1))


def conv_images(x, w):
    return torch.nn.functional.conv2d(x, w, padding=1).relu()


def pool_images(x):
    return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)


def interpolate_double(x):
    return torch.nn.functional.interpolate(x, scale_factor=2.0)


def paste_resized(mask, h, w):
    """Mask R-CNN's `paste_mask_in_image`: each mask resized to its box's size in ints."""
    h, w = max(h, 1), max(w, 1)
    resized = torch.nn.functional.interpolate(mask[None, None], size=(h, w), mode="bilinear", align_corners=False)
    return resized[0][0] * 2.0


def top_down_merge(top, lateral):
    """A feature pyramid's top-down step: the coarser map resized to the finer one's size."""
    return lateral + torch.nn.functional.interpolate(top, size=lateral.shape[-2:], mode="nearest")


def masked_fill_rows(x):
    mask = torch.arange(x.shape[1]) < (x.shape[1] // 2)
    return x.masked_fill(mask, 0.0)


def triu_square(x):
    n = x.shape[0]
    return torch.triu(torch.ones(n, n)) @ x


def causal_mask(x):
    t = x.shape[1]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    scores = x @ x.transpose(-1, -2)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def gather_positions(x):
    idx = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    return torch.gather(x, 1, idx)


def einsum_rows(x, y):
    return torch.einsum("ij,kj->ik", x, y)


def where_rows(x):
    return torch.where(x > 0, x, x * x.shape[0])


def topk_half(x):
    return x.topk(2, dim=1).values.sum(1)


def sum_dims(x):
    return x.sum(dim=(0, 1))


def batch_matmul(x, y):
    return torch.bmm(x, y.transpose(1, 2))


def mul_two_sizes(x, y):
    return x * y.shape[0] + y.sum() * x.shape[0]


def dim_is_static(x):
    return x * x.dim()


def int_scale(x, n):
    return x * n + n


def int_branch(x, n):
    if n > 5:
        return x + n
    return x - n


def int_slice(x, n):
    return x[:n] * 2


def int_loop(x, n):
    for i in range(n):
        x = x + i
    return x


def int_reshape(x, n):
    return x.reshape(n, -1).sum(0)


def int_optional(x, n=None):
    if n is None:
        return x
    return x * n


def int_isinstance(x, n):
    if isinstance(n, int) and not isinstance(n, bool):
        return x + n
    return x


def square_grid(x):
    # Tokens back to a square grid, as ViT-style models do (`int(N ** 0.5)`).
    n = int(x.shape[1] ** 0.5)
    pos = torch.arange(n)
    distance = (pos[:, None] - pos[None, :]).float()
    return x.reshape(x.shape[0], n, n, -1).sum(-1) + distance


def grid_from_int(x, n):
    # timm's convit: a frame given the token count as an int builds a grid of its root.
    side = int(n ** 0.5)
    ind = torch.arange(side, dtype=torch.float32).view(1, -1) - torch.arange(side, dtype=torch.float32).view(-1, 1)
    return x + ind.repeat(side, side).sum()


def math_sqrt_of_size(x):
    return x * math.sqrt(x.shape[0]) + math.floor(x.shape[0] / 3)


def rotary_heads(x):
    # Rotary embeddings on transposed heads (Llama): elementwise work on non-contiguous
    # layouts with symbolic strides, broadcast against a (1, 1, t, d) table.
    b, t, _ = x.shape
    q = x.view(b, t, 2, 4).transpose(1, 2)
    angle = torch.arange(t, dtype=x.dtype)[None, None, :, None] * torch.ones(4)
    rotated = torch.cat((-q[..., 2:], q[..., :2]), dim=-1)
    return (q * angle.cos() + rotated * angle.sin()).transpose(1, 2).reshape(b, t, 8)


def sliced_elementwise(x):
    half = x[:, : x.shape[1] // 2]
    return half.exp() * 2.0 - half.t().t().sigmoid() + x[:, :1]


def clip_to_size(boxes, size):
    # torchvision's clip_boxes_to_image: an image size handed over as a tuple of ints.
    height, width = size
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack((x, y), dim=boxes.dim()).reshape(boxes.shape)


def resize_to(x, size):
    return torch.nn.functional.interpolate(x, size=size, mode="nearest") * 2


def view_as_shape(x, shape):
    return x.view(shape).sum(-1) + shape[0]


def scale_by_option(x, opts):
    rows, cols = opts["grid"]
    return x * rows + cols


def ints(fn_values, size=8):
    return [(r(size), n) for n in fn_values]


def add_two_inputs(a, b):
    return (a + b).relu() * b


def cat_then_linear(a, b, weight):
    return torch.nn.functional.linear(torch.cat([a, b], dim=-1), weight)


def norm_of_joined(a, b, weight):
    return torch.nn.functional.layer_norm(torch.cat([a, b], dim=-1), (8,), weight)


def views_by_ints_across_a_break(x):
    # timm's Sequencer blocks: the sizes taken before an RNN (a graph break), used after it
    # on tensors that came out of the break with sizes of their own.
    batch, height, width, channels = x.shape
    v = x.permute(0, 2, 1, 3).reshape(-1, height, channels)
    v = v.sin()
    torch._dynamo.graph_break()
    v = v.reshape(batch, width, height, -1).permute(0, 2, 1, 3)
    h = x.reshape(-1, width, channels).cos()
    torch._dynamo.graph_break()
    h = h.reshape(batch, height, width, -1)
    return (v + h) * x


CASES = {
    # Inputs whose sizes change together: each gets symbols of its own (automatic dynamic),
    # and the first operation relating them makes them equal (a guard), as under TorchDynamo.
    "two inputs of equal sizes": (add_two_inputs, [(r(n, n + 1), r(n, n + 1)) for n in (3, 5, 7)]),
    "joined then projected": (cat_then_linear, [(r(n, 3), r(n, 4), r(5, 7)) for n in (2, 4, 6)]),
    "joined widths specialised by a norm": (
        norm_of_joined, [(r(n, w), r(n, 8 - w), torch.ones(8)) for n, w in ((2, 3), (4, 5), (6, 2))]),
    "views by ints taken before a break": (
        views_by_ints_across_a_break, [(r(1, h, w, 4),) for h, w in ((3, 4), (5, 6), (7, 9))]),
    "size times tensor": (scale_by_rows, sizes(4, 8, 16, 100)),
    "seed: a.shape[0] * a * b": (seed_fn, [(r(n, 3), r(n, 3)) for n in (4, 8, 16, 100)]),
    "sizes 0 and 1 specialise": (scale_by_rows, sizes(4, 8, 0, 1, 2, 9)),
    "equal sizes share a symbol": (add_same, [(r(n, 3), r(n, 3)) for n in (4, 5, 6)]),
    "broadcast pair": (add_same, [(r(n, 3), r(1, 3)) for n in (4, 5, 6)]),
    "view with a size": (view_rows, [(r(n, 2, 3),) for n in (3, 5, 7)]),
    "view with size() calls": (view_size_call, [(r(n, 4, 3),) for n in (3, 5, 7)]),
    "reshape -1": (reshape_neg, [(r(n, 3, 4),) for n in (2, 5, 6)]),
    "flatten": (flatten_mean, [(r(n, 3, 4),) for n in (2, 5, 6)]),
    "flatten, changing inner size": (flatten_mean, [(r(2, n, 4),) for n in (3, 5, 6)]),
    "permute + contiguous": (permute_contig, sizes(3, 5, 9)),
    "transpose + matmul": (transpose_matmul, sizes(3, 5, 9)),
    "slice to half": (slice_half, sizes(4, 6, 10, 11)),
    "slice with both bounds": (slice_inner, sizes(4, 6, 10)),
    "slice columns": (slice_last_cols, [(r(3, n),) for n in (4, 6, 10)]),
    "narrow": (narrow_dynamic, sizes(4, 6, 10)),
    "cat along rows": (cat_rows, [(r(n, 3), r(n + 1, 3)) for n in (2, 4, 7)]),
    "cat along columns": (cat_cols, [(r(3, n), r(3, 2)) for n in (2, 4, 7)]),
    "stack": (stack_pair, [(r(n, 3), r(n, 3)) for n in (2, 4, 7)]),
    "zeros from sizes": (zeros_like_rows, sizes(2, 4, 7)),
    "new_zeros of a shape": (new_zeros_shape, sizes(2, 4, 7)),
    "arange of a size": (arange_rows, sizes(2, 4, 7)),
    "full with a size": (full_rows, sizes(2, 4, 7)),
    "numel": (ones_numel, sizes(2, 4, 7)),
    "division by a size": (mean_by_size, sizes(2, 4, 7)),
    "size arithmetic": (size_arithmetic, sizes(2, 4, 7, 9)),
    "true division of a size": (size_float, sizes(2, 4, 7)),
    "shape tuple concatenated": (size_tuple_concat, [(r(n, 3, 2),) for n in (2, 4, 7)]),
    "shape unpacked": (shape_unpack, [(r(2, n, 3),) for n in (2, 4, 7)]),
    "branch on a size (automatic)": (branch_on_size, sizes(4, 5, 7, 8, 9, 20)),
    "branch on equal sizes": (branch_size_equal, [(r(n, 2), r(n, 2)) for n in (3, 4)] + [(r(3, 2), r(4, 2))]),
    "loop over range(size // 4)": (range_loop, sizes(4, 8, 12, 8)),
    "min of a size": (min_of_size, sizes(2, 3, 6, 9)),
    "expand to another input's size": (expand_rows, [(r(1, 3), r(n, 3)) for n in (2, 4, 7)]),
    "split by a size": (split_half, [(r(2, n),) for n in (4, 6, 8)]),
    "chunk": (chunk_two, [(r(2, n),) for n in (4, 6, 8)]),
    "repeat": (repeat_rows, sizes(2, 4, 7)),
    "index_select with arange": (index_select_rows, sizes(3, 4, 7)),
    "softmax times size": (softmax_last, [(r(2, n),) for n in (3, 4, 7)]),
    "layer_norm over a symbolic size": (layer_norm_rows, [(r(2, n),) for n in (3, 4, 7)]),
    "linear, batch changes": (linear_rows, [(r(n, 4), r(5, 4)) for n in (2, 3, 9)]),
    "unsqueeze + expand_as": (unsqueeze_expand_as, [(r(n, 3), r(2, n, 3)) for n in (2, 3, 5)]),
    "in-place multiply by a size": (inplace_scale, sizes(2, 3, 5)),
    "a size returned": (returns_size, sizes(2, 3, 5)),
    "sizes in a list": (size_in_list, sizes(2, 3, 5)),
    "pad": (pad_rows, sizes(2, 3, 5)),
    "conv2d over image sizes": (conv_images, [(r(1, 2, n, n), r(4, 2, 3, 3)) for n in (8, 12, 16)]),
    "adaptive pool": (pool_images, [(r(2, 3, n, n),) for n in (4, 6, 9)]),
    "interpolate": (interpolate_double, [(r(1, 2, n, n),) for n in (4, 6, 9)]),
    "interpolate to int sizes (pasted masks)": (
        paste_resized, [(r(7, 7), h, w) for h, w in ((21, 9), (30, 12), (17, 1), (5, 40), (1, 1), (8, 8))]),
    "interpolate to another input's size": (
        top_down_merge, [(r(1, 4, n, n), r(1, 4, 2 * n, 2 * n + 1)) for n in (3, 5, 8)]),
    "masked_fill with a mask from a size": (masked_fill_rows, [(r(2, n),) for n in (4, 6, 9)]),
    "triu of a size": (triu_square, sizes(3, 4, 6)),
    "causal attention mask": (causal_mask, [(r(2, n, 4),) for n in (3, 5, 8)]),
    "gather with positions": (gather_positions, [(r(2, n),) for n in (3, 5, 8)]),
    "einsum": (einsum_rows, [(r(n, 3), r(n + 1, 3)) for n in (2, 4, 6)]),
    "where": (where_rows, sizes(2, 4, 6)),
    "topk": (topk_half, [(r(n, 5),) for n in (2, 4, 6)]),
    "sum over dims": (sum_dims, [(r(n, n + 1, 2),) for n in (2, 4, 6)]),
    "bmm": (batch_matmul, [(r(n, 3, 4), r(n, 5, 4)) for n in (2, 3, 6)]),
    "two symbols": (mul_two_sizes, [(r(n, 3), r(n + 2, 3)) for n in (2, 3, 6)]),
    "dim() stays static": (dim_is_static, sizes(2, 3, 6)),
    "square grid from int(n ** 0.5)": (square_grid, [(r(2, n * n, 3),) for n in (3, 4, 5, 7)]),
    "a grid from the root of an int": (grid_from_int, ints((9, 16, 25, 49))),
    "math.sqrt and floor of a size": (math_sqrt_of_size, sizes(4, 9, 16)),
    "rotary embedding on transposed heads": (rotary_heads, [(r(2, n, 8),) for n in (3, 5, 9)]),
    "elementwise on slices and transposes": (sliced_elementwise, [(r(3, n),) for n in (4, 6, 10)]),
    "an int that changes": (int_scale, ints((3, 4, 5, 9, 1, 0))),
    "a branch on an int that changes": (int_branch, ints((3, 4, 6, 7, 2))),
    "slicing by an int that changes": (int_slice, ints((2, 3, 4, 5))),
    "range over an int that changes": (int_loop, ints((2, 3, 4))),
    "reshape by an int that changes": (int_reshape, [(r(12), n) for n in (2, 3, 4, 6)]),
    "`is None` on an int that changes": (int_optional, ints((3, 4, 5))),
    "isinstance of an int that changes": (int_isinstance, ints((3, 4, 5))),
    # Tuples of ints among the arguments (image sizes, shapes, kwargs): items that change
    # become symbolic one by one, as TorchDynamo wraps them.
    "an image size tuple that changes": (clip_to_size, [(r(6, 4), (h, w)) for h, w in ((8, 10), (10, 8), (12, 6), (8, 10))]),
    "one item of a size tuple changes": (clip_to_size, [(r(6, 4), (8, w)) for w in (10, 12, 14)]),
    "interpolate to a size tuple": (resize_to, [(r(1, 2, 4, 4), (h, h + 2)) for h in (6, 8, 10)]),
    "view as a shape tuple": (view_as_shape, [(r(n * 3), (n, 3)) for n in (2, 4, 5)]),
    "a size tuple in a dict argument": (scale_by_option, [(r(4), {"grid": (n, n + 1)}) for n in (3, 5, 7)]),
    # Inputs that are views of other tensors (a strided slice, a permute, a narrow at an
    # offset, a view of a view): their sizes go symbolic, their bases keep theirs.
    "strided view as input": (view_input_rows, [lambda n=n: (r(2, 2 * n, 6)[:, ::2],) for n in (3, 4, 7)]),
    "permuted view as input": (view_input_reshape, [lambda n=n: (r(2, 4, n, n).permute(0, 2, 3, 1),) for n in (3, 5, 6)]),
    "narrowed view at an offset": (view_input_rows, [lambda n=n: (r(2, n + 3, 6)[:, 2:],) for n in (3, 4, 7)]),
    "view of a view as input": (view_input_reshape, [lambda n=n: (r(2, 4, 2 * n, n)[:, :, ::2].transpose(1, 3),) for n in (3, 5, 6)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_automatic_dynamic_side_by_side(name) -> None:
    fn, calls = CASES[name]
    side_by_side(fn, calls)


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("sizes 0 and 1 specialise",)])
def test_dynamic_true_side_by_side(name) -> None:
    fn, calls = CASES[name]
    side_by_side(fn, calls, dynamic=True, delta=DYNAMIC_TRUE_DELTAS.get(name, 0))


# Where `dynamic=True` compiles fewer frames than TorchDynamo, and why.
DYNAMIC_TRUE_DELTAS = {
    # TorchDynamo gives the view's base symbols of its own and duck-sizes them with the
    # view's (the base's 6 columns with the view's 6 when the base is square), then
    # recompiles when they differ; the base keeps its sizes here (the graph sees the view).
    "strided view as input": -1,
    "narrowed view at an offset": -1,
}


@pytest.mark.parametrize("name", ["size times tensor", "slice to half", "branch on a size (automatic)"])
def test_dynamic_false_side_by_side(name) -> None:
    fn, calls = CASES[name]
    counter = side_by_side(fn, calls, dynamic=False)
    assert counter.frame_count == len({tuple(a.shape for a in args) for args in calls})


# --- the seed article's examples -------------------------------------------------------------

def test_static_first_then_one_dynamic_graph() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(seed_fn, backend=counter)
    for n, frames in ((4, 1), (8, 2), (16, 2), (100, 2)):
        a, b = r(n, 3), r(n, 3)
        torch.testing.assert_close(f(a, b), seed_fn(a, b))
        assert counter.frame_count == frames, n
    # The dynamic graph has the size as a symbol (an input placeholder's fake is symbolic).
    for n, frames in ((0, 3), (1, 4), (2, 4), (57, 4)):
        a, b = r(n, 3), r(n, 3)
        torch.testing.assert_close(f(a, b), seed_fn(a, b))
        assert counter.frame_count == frames, n


def test_equal_sizes_share_a_symbol_and_guard_it() -> None:
    from dynamo_rs import eval_frame

    counter = CompileCounter()
    f = dynamo_rs.compile(add_same, backend=counter, dynamic=True)
    a, b = r(4, 3), r(4, 3)
    torch.testing.assert_close(f(a, b), a + b)
    (guard, _), = eval_frame.cache_entries(add_same)
    described = "\n".join(guard.describe())
    assert 'L["b"].size()[0] == L["a"].size()[0]' in described, described
    # Another common size passes; unequal sizes (broadcasting 1, or an error) fail the guard.
    torch.testing.assert_close(f(r(9, 3), r(9, 3)).shape, torch.Size([9, 3]))
    assert counter.frame_count == 1
    assert guard.first_failure({"a": r(5, 3), "b": r(6, 3)}) is not None
    with pytest.raises(RuntimeError):
        f(r(5, 3), r(6, 3))


def test_branch_on_a_symbolic_size_is_guarded() -> None:
    from dynamo_rs import eval_frame

    counter = CompileCounter()
    f = dynamo_rs.compile(branch_on_size, backend=counter, dynamic=True)
    for n in (4, 5, 7):
        a = r(n, 2)
        torch.testing.assert_close(f(a), branch_on_size(a))
    assert counter.frame_count == 1
    (guard, _), = eval_frame.cache_entries(branch_on_size)
    described = "\n".join(guard.describe())
    assert '2*L["a"].size()[0] < 16' in described.replace(" ", "").replace("<", " < ").replace("  ", " ") \
        or "2*L" in described, described
    reason = guard.first_failure({"a": r(8, 2)})
    assert reason is not None and "16" in reason, reason
    for n in (8, 9, 20, 6):
        a = r(n, 2)
        torch.testing.assert_close(f(a), branch_on_size(a))
    assert counter.frame_count == 2


def test_recompile_reason_names_the_shape_guard(caplog) -> None:
    import logging

    f = dynamo_rs.compile(branch_on_size, backend=CompileCounter(), dynamic=True)
    f(r(4, 2))
    with caplog.at_level(logging.INFO, logger="dynamo_rs.recompiles"):
        f(r(9, 2))
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "dynamo_rs.recompiles"]
    assert logged and 'L["a"].size()[0]' in logged[0] and "16" in logged[0], logged


# --- marking ---------------------------------------------------------------------------------

def test_mark_dynamic_compiles_dynamic_from_the_first_call() -> None:
    for mark in (dynamo_rs.mark_dynamic, torch._dynamo.mark_dynamic):
        dynamo_rs.reset()
        counter = CompileCounter()
        f = dynamo_rs.compile(scale_by_rows, backend=counter)
        for n in (4, 9, 13):
            a = r(n, 3)
            mark(a, 0)
            torch.testing.assert_close(f(a), scale_by_rows(a))
        assert counter.frame_count == 1


def test_mark_static_keeps_a_dimension_static() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(scale_by_rows, backend=counter, dynamic=True)
    for n in (4, 9):
        a = r(n, 3)
        dynamo_rs.mark_static(a, 0)
        torch.testing.assert_close(f(a), scale_by_rows(a))
    assert counter.frame_count == 2


def test_mark_dynamic_with_a_range() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(scale_by_rows, backend=counter)
    for n in (4, 9, 16):
        a = r(n, 3)
        dynamo_rs.mark_dynamic(a, 0, min=2, max=16)
        torch.testing.assert_close(f(a), scale_by_rows(a))
    assert counter.frame_count == 1
    # Outside the range given: an error naming the dimension, not a silent specialisation.
    a = r(40, 3)
    dynamo_rs.mark_dynamic(a, 0, min=2, max=16)
    with pytest.raises(dynamo_rs.ConstraintViolation, match=r'size\(\)\[0\] is 40.*\[2, 16\]'):
        f(a)


def specialises_on_rows(x):
    if x.shape[0] == 4:
        return x + 1
    return x - 1


def test_mark_dynamic_on_a_specialised_dimension_is_an_error() -> None:
    f = dynamo_rs.compile(specialises_on_rows, backend=CompileCounter())
    a = r(4, 3)
    dynamo_rs.mark_dynamic(a, 0)
    with pytest.raises(dynamo_rs.ConstraintViolation) as info:
        f(a)
    message = str(info.value)
    assert 'L["x"].size()[0]' in message and "test_dynamic_shapes.py" in message, message
    line = specialises_on_rows.__code__.co_firstlineno + 1
    assert f":{line}" in message, message


def test_maybe_mark_dynamic_lets_the_code_specialise() -> None:
    # `maybe_mark_dynamic` is a hint: a dimension the code specialises is specialised (a
    # guard on its value), not an error as for `mark_dynamic`. It raised ConstraintViolation.
    counter = CompileCounter()
    f = dynamo_rs.compile(specialises_on_rows, backend=counter)
    for n in (4, 4, 5, 4):
        a = r(n, 3)
        dynamo_rs.maybe_mark_dynamic(a, 0)
        torch.testing.assert_close(f(a), specialises_on_rows(a))


def test_maybe_mark_dynamic_stays_symbolic_when_not_specialised() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(scale_by_rows, backend=counter)
    for n in (4, 9, 16):
        a = r(n, 3)
        dynamo_rs.maybe_mark_dynamic(a, 0)
        torch.testing.assert_close(f(a), scale_by_rows(a))
    assert counter.frame_count == 1


# --- guards: a change after the first dynamic compile recompiles and matches eager ----------

def test_strides_of_dynamic_inputs_are_guarded() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(permute_contig, backend=counter, dynamic=True)
    a = r(4, 6)
    torch.testing.assert_close(f(a), permute_contig(a))
    b = r(6, 4).t()  # same sizes' kind, other strides
    torch.testing.assert_close(f(b), permute_contig(b))
    c = r(5, 7)[:, :6]  # a non-contiguous view
    torch.testing.assert_close(f(c), permute_contig(c))
    assert counter.frame_count >= 2


def test_rank_change_recompiles() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(scale_by_rows, backend=counter, dynamic=True)
    for a in (r(4, 3), r(5, 3), r(4, 3, 2), r(6, 3, 2)):
        torch.testing.assert_close(f(a), scale_by_rows(a))
    assert counter.frame_count == 2


def test_dtype_change_on_a_dynamic_input_recompiles() -> None:
    counter = CompileCounter()
    f = dynamo_rs.compile(scale_by_rows, backend=counter, dynamic=True)
    for a in (r(4, 3), r(5, 3).double(), r(6, 3)):
        torch.testing.assert_close(f(a), scale_by_rows(a))
    assert counter.frame_count == 2


# --- backends ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_backends_get_symbolic_graphs(backend) -> None:
    f = dynamo_rs.compile(causal_mask, backend=backend, dynamic=True)
    for n in (3, 5, 8):
        x = r(2, n, 4)
        torch.testing.assert_close(f(x), causal_mask(x))
    stats = f._dynamo_rs_converter
    assert stats.graphs == 1


# --- real models --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_language_models_over_sequence_lengths_and_batches(name) -> None:
    from models import build, tensors_of

    model, _ = build(name)
    for shapes in ([(2, s) for s in (7, 13, 32, 64, 100)], [(b, 16) for b in (1, 2, 5)]):
        dynamo_rs.reset()
        counter = CompileCounter()
        compiled = dynamo_rs.compile(model, backend=counter)
        with torch.no_grad():
            for shape in shapes:
                ids = torch.randint(0, 1000, shape)
                for a, b in zip(tensors_of(compiled(ids)), tensors_of(model(ids))):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert counter.frame_count <= 2, (shapes, counter.frame_count)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_language_models_with_dynamic_true_in_one_graph_as_torchdynamo(name) -> None:
    """`dynamic=True` makes the frame's int arguments symbolic, not the ints a model's config
    holds: read through the model (`self.config.num_hidden_layers` sizes transformers'
    `DynamicCache`) they stay constants, as TorchDynamo keeps ints read through modules.
    Symbolic, `len()` of the config's per-layer view broke GPT-2 into 3 graphs."""
    from models import build, tensors_of

    model, _ = build(name)
    ours, theirs = CompileCounter(), torch._dynamo.testing.CompileCounter()
    compiled = dynamo_rs.compile(model, backend=ours, dynamic=True)
    reference = torch.compile(model, backend=theirs, dynamic=True)
    with torch.no_grad():
        for shape in ((2, 7), (2, 13), (3, 9)):
            ids = torch.randint(0, 1000, shape)
            expected = tensors_of(model(ids))
            for out in (compiled(ids), reference(ids)):
                for a, b in zip(tensors_of(out), expected):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert ours.frame_count == theirs.frame_count == 1, (ours.frame_count, theirs.frame_count)


class _Configured(torch.nn.Module):
    """A module whose config object's ints shape the computation."""

    def __init__(self, repeats: int):
        super().__init__()
        self.config = type("Config", (), {})()
        self.config.repeats = repeats

    def forward(self, x):
        for _ in range(self.config.repeats):
            x = x.sin()
        return x * self.config.repeats


def test_ints_of_a_modules_config_stay_constants_under_dynamic_true() -> None:
    """An int read through a module's attributes is a constant guarded by value under
    `dynamic=True` (a loop over it unrolls): changing it recompiles, as under TorchDynamo."""
    module = _Configured(3)
    calls = [(r(4, 3),), (r(6, 3),)]
    side_by_side(module, calls, dynamic=True)
    module.config.repeats = 2
    counter = side_by_side(module, calls + [(r(5, 3),)], dynamic=True)
    assert counter.frame_count == 1


def test_resnet18_over_image_sizes() -> None:
    from models import build

    model, _ = build("resnet18")
    counter = CompileCounter()
    compiled = dynamo_rs.compile(model, backend=counter)
    with torch.no_grad():
        for n in (64, 96, 128, 160):
            x = r(2, 3, n, n)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert counter.frame_count <= 2


def test_gpt2_dynamic_under_inductor() -> None:
    from models import build, tensors_of

    model, _ = build("gpt2")
    compiled = dynamo_rs.compile(model, backend="inductor")
    with torch.no_grad():
        for s in (7, 13, 32):
            ids = torch.randint(0, 1000, (2, s))
            for a, b in zip(tensors_of(compiled(ids)), tensors_of(model(ids))):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    assert compiled._dynamo_rs_converter.graphs == 2


# --- capture_scalar_outputs: .item() as an unbacked symbol in the graph ----------------------


def _dynamo_setting(name: str):
    """A fixture turning `torch._dynamo.config.<name>` on for one test (both front ends read
    it)."""
    @pytest.fixture
    def setting():
        import torch._dynamo.config as dynamo_config

        with dynamo_config.patch(name, True):
            yield
    return setting


scalar_outputs = _dynamo_setting("capture_scalar_outputs")


def item_scales(x, y):
    s = x.sum().item()
    return y * s + 1


def item_of_an_int_tensor(x, idx):
    k = idx.max().item()
    return x * k - k


def items_into_a_factory(x):
    a, b = x[0].item(), x[1].item()
    return torch.full((3,), a + b * 2) + x


def item_branched_on(x, y):
    n = y.max().item()
    z = x * n
    if n > 0:
        return z + 1
    return z - 1


def item_then_tolist(x):
    s = x.mean().item()
    values = (x * s).tolist()
    return torch.tensor(values) + s


SCALAR_CASES = [
    (item_scales, lambda: (torch.randn(4), torch.randn(4))),
    (item_of_an_int_tensor, lambda: (torch.randn(4), torch.tensor([1, 5, 2]))),
    (items_into_a_factory, lambda: (torch.randn(3),)),
    (item_branched_on, lambda: (torch.randn(4), torch.randn(4))),
    (item_branched_on, lambda: (torch.randn(4), -torch.rand(4))),
    (item_then_tolist, lambda: (torch.randn(4),)),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn, make", SCALAR_CASES, ids=[f"{c[0].__name__}{i}" for i, c in enumerate(SCALAR_CASES)])
def test_item_captured_as_unbacked_symbol(fn, make, backend, scalar_outputs) -> None:
    args = make()
    expected = fn(*args)
    theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
    torch.compile(fn, backend=theirs)(*args)
    ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = dynamo_rs.compile(fn, backend=ours)
    torch.testing.assert_close(compiled(*args), expected)
    graphs, ops = ours.frame_count, ours.op_count
    again = make()
    torch.testing.assert_close(compiled(*again), fn(*again))
    assert graphs == theirs.frame_count
    # TorchDynamo hands an unbacked float out of a graph wrapped in a scalar_tensor node
    # (one op more per such output); ours hands it out as it is.
    assert 0 <= theirs.op_count - ops <= theirs.frame_count


# --- capture_dynamic_output_shape_ops: data-dependent sizes as unbacked symbols -------------


dynamic_output_shapes = _dynamo_setting("capture_dynamic_output_shape_ops")


def nonzero_positions(x):
    idx = x.nonzero()
    return idx.float().sum(0) * 2, idx.shape[0] + x.sum()


def torch_nonzero_as_tuple(x):
    (rows,) = torch.nonzero(x > 0, as_tuple=True)
    return x[rows] * 3


def boolean_mask(x, y):
    picked = x[y > 0]
    return picked.sum() + picked.mean(), picked * 2


def masked_select_then_more(x):
    kept = torch.masked_select(x, x > 0.5)
    return kept.exp() + 1, x.relu()


def unique_values(x):
    values = torch.unique((x * 3).round())
    return values * 2


def nonzero_then_index(x, table):
    rows = (x > 0).nonzero().squeeze(1)
    return table[rows].sum(0) + table.mean(0)


OUTPUT_SHAPE_CASES = [
    (nonzero_positions, lambda n: (torch.randn(n, 3),)),
    (torch_nonzero_as_tuple, lambda n: (torch.randn(n),)),
    (boolean_mask, lambda n: (torch.randn(n, 4), torch.randn(n, 4))),
    (masked_select_then_more, lambda n: (torch.rand(n, 5),)),
    (unique_values, lambda n: (torch.randn(n),)),
    (nonzero_then_index, lambda n: (torch.randn(n), torch.randn(n, 3))),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn, make", OUTPUT_SHAPE_CASES, ids=[c[0].__name__ for c in OUTPUT_SHAPE_CASES])
def test_data_dependent_sizes_captured_as_unbacked_symbols(fn, make, backend, dynamic_output_shapes) -> None:
    """With `capture_dynamic_output_shape_ops` (as TorchDynamo reads it), `nonzero`,
    boolean-mask indexing, `masked_select` and `unique` stay in the graph with unbacked
    sizes: results equal eager on several sizes and contents, frames as TorchDynamo's."""
    theirs = torch._dynamo.testing.CompileCounterWithBackend(backend)
    ours = torch._dynamo.testing.CompileCounterWithBackend(backend)
    reference = torch.compile(fn, backend=theirs)
    compiled = dynamo_rs.compile(fn, backend=ours)
    for n in (6, 9, 9, 13):
        args = make(n)
        expected = fn(*args)
        torch.testing.assert_close(compiled(*args), expected)
        torch.testing.assert_close(reference(*args), expected)
    assert ours.frame_count == theirs.frame_count


def test_data_dependent_sizes_stay_graph_breaks_by_default() -> None:
    theirs = torch._dynamo.testing.CompileCounter()
    ours = CompileCounter()
    x = torch.randn(6, 3)
    torch.compile(nonzero_positions, backend=theirs)(x)
    torch.testing.assert_close(dynamo_rs.compile(nonzero_positions, backend=ours)(x), nonzero_positions(x))
    assert ours.frame_count == theirs.frame_count


def test_item_stays_a_graph_break_by_default() -> None:
    theirs = torch._dynamo.testing.CompileCounter()
    ours = CompileCounter()
    x, y = torch.randn(4), torch.randn(4)
    torch.compile(item_scales, backend=theirs)(x, y)
    torch.testing.assert_close(dynamo_rs.compile(item_scales, backend=ours)(x, y), item_scales(x, y))
    assert (ours.frame_count, ours.op_count) == (theirs.frame_count, theirs.op_count) == (2, 3)


def _evaluate(expr, reads):
    """A reference evaluation of `_shapes`' guard expressions (nested tuples)."""
    tag = expr[0]
    if tag == "v":
        return reads[expr[1]]
    if tag in ("i", "f", "b"):
        return expr[1]
    args = [_evaluate(e, reads) for e in expr[1:]]
    ops = {"pow": lambda a, b: a ** b, "float": float, "trunc": math.trunc, "floor": math.floor,
           "eq": lambda a, b: a == b, "ge": lambda a, b: a >= b, "truediv": lambda a, b: a / b}
    return ops[tag](*args)


def test_shape_guards_over_roots_of_sizes_translate() -> None:
    """Guards torch records for `int(n ** 0.5)` of a symbolic int (timm's convit builds its
    relative positions from the root of the token count): float powers, truncation and
    conversions are part of the native guard language, not a reason to run eagerly."""
    import sympy
    from torch.utils._sympy.functions import FloatPow, Identity, ToFloat, TruncToFloat, TruncToInt

    from dynamo_rs import _shapes

    s = sympy.Symbol("s0", integer=True, positive=True)
    root = TruncToInt(FloatPow(ToFloat(s), 0.5))
    for guard, holds_at in ((sympy.Eq(root, 14), {196: True, 195: False, 225: False}),
                            (root >= 0, {196: True, 2: True}),
                            (sympy.Eq(TruncToFloat(FloatPow(ToFloat(Identity(s)), 0.5)), 3.0),
                             {9: True, 16: False})):
        plan = _shapes._translate(guard, {s: 0})
        for value, expected in holds_at.items():
            assert bool(_evaluate(plan, [value])) is expected, (guard, value)


def _specialised_then_converted(t, n):
    seen = {n}  # a set element: n's value is needed, the symbol is specialised
    return float(n), n / 2, int(n * 1.5), n == 4, len(seen), t + 1


def _converted(t, n):
    return float(n), float(n) * 2, t + 1


@pytest.mark.parametrize("fn", [_specialised_then_converted, _converted])
def test_int_argument_converted_keeps_python_types(fn) -> None:
    """Numbers computed from an int argument that changed (made symbolic) keep eager's Python
    types: `float(n)` is a float even when the ShapeEnv knows its value (fuzzer seed 272798:
    it came back as the int 4)."""
    compiled = dynamo_rs.compile(fn, backend=CompileCounter())
    for n in (3, 4, 5, 4):
        expected, actual = fn(torch.ones(2), n), compiled(torch.ones(2), n)
        assert [type(v) for v in actual] == [type(v) for v in expected], (n, actual, expected)
        assert actual[:-1] == expected[:-1]
        torch.testing.assert_close(actual[-1], expected[-1])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_symbolic_size_stored_into_an_existing_object(backend) -> None:
    """`obj.n = x.shape[0] * 2` with a symbolic size: the value is a graph output stored after
    the graph (it broke the graph: 'storing a symbolic size into .n of an existing
    object'), and what the object holds is a plain int equal to eager's."""

    class Holder:
        k = 4

    def fn(x, holder):
        holder.n = x.shape[0] * 2
        holder.m = x.shape[0] + holder.k
        return x + 1

    counter = CompileCounter()
    compiled = dynamo_rs.compile(fn, backend=counter if backend == "eager" else backend, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n)
        ours, theirs = Holder(), Holder()
        torch.testing.assert_close(compiled(x, ours), fn(x, theirs))
        assert type(ours.n) is int and (ours.n, ours.m) == (theirs.n, theirs.m)
    if backend == "eager":
        assert counter.frame_count == 1


def _no_fallback_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "could not compile" in r.getMessage()]


def test_int_argument_related_to_sizes_under_aot_autograd(caplog) -> None:
    """AOTAutograd gives each int example input a symbol of its own (`sym_<position>`) and
    guards on it: the shape guard reads it from that input (it was an internal error, 'the
    symbol s49 is not an input size', and the frame ran eagerly from then on)."""

    def fn(x, k, n):
        y = torch.cat([k, x], 1)
        return y.reshape(2, n + 1, 4), n + 1

    compiled = dynamo_rs.compile(fn, backend="aot_eager")
    for n in (4, 5, 6, 7):
        k, x = torch.randn(2, n, 4), torch.randn(2, 1, 4)
        expected, got = fn(x, k, n), compiled(x, k, n)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
    assert not _no_fallback_warnings(caplog)
    # The relation the graph relies on is checked: a call breaking it raises as eager does.
    k, x = torch.randn(2, 3, 4), torch.randn(2, 1, 4)
    with pytest.raises(RuntimeError):
        fn(x, k, 5)
    with pytest.raises(RuntimeError):
        compiled(x, k, 5)


def test_equal_int_arguments_that_later_differ_under_aot_autograd(caplog) -> None:
    """Two ints equal when traced share one AOTAutograd symbol: the entry must not be used
    once they differ."""

    def fn(x, a, b):
        return x[:a].sum(0) * 2 + x[:b].sum(0), a * b

    compiled = dynamo_rs.compile(fn, backend="aot_eager")
    x = torch.randn(9, 3)
    for a, b in ((3, 3), (4, 4), (5, 5), (5, 2), (2, 7), (6, 6)):
        expected, got = fn(x, a, b), compiled(x, a, b)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
    assert not _no_fallback_warnings(caplog)


class _KVLayer:
    """A cache layer as transformers' sliding-window ones: an int counter and a tensor."""

    def __init__(self):
        self.seen = 0
        self.keys = torch.zeros(2, 0, 4)

    def update(self, k):
        self.seen += k.shape[1]
        self.keys = torch.cat([self.keys, k], 1)
        if self.seen > 6:
            return self.keys[:, -6:]
        return self.keys


def _decode_step(cache, k):
    total = 0
    for layer in cache:
        total = total + layer.update(k).sum(1)
    return total


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_int_attribute_of_an_argument_becomes_dynamic(backend, caplog) -> None:
    """An int attribute of a plain object handed to the frame (a cache's length counter)
    changes on every call: after it changed once it is symbolic, as the frame's own int
    arguments are (it was one recompile per decoding step, then eager at the cache limit)."""
    counter = CompileCounter()
    compiled = dynamo_rs.compile(_decode_step, backend=counter if backend == "eager" else backend)
    ours, theirs = [_KVLayer(), _KVLayer()], [_KVLayer(), _KVLayer()]
    for step in range(10):
        k = torch.randn(2, 3 if step == 0 else 1, 4)
        torch.testing.assert_close(compiled(ours, k), _decode_step(theirs, k))
        assert [layer.seen for layer in ours] == [layer.seen for layer in theirs]
        assert all(type(layer.seen) is int for layer in ours)
    if backend == "eager":
        assert counter.frame_count <= 4, counter.frame_count
    assert not _no_fallback_warnings(caplog)


def test_int_attribute_of_a_module_stays_specialised() -> None:
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2

        def forward(self, x):
            return x[: self.k] * self.k

    model = Scale()
    compiled = dynamo_rs.compile(model, backend=CompileCounter())
    x = torch.randn(6, 2)
    for k in (2, 3, 4):
        model.k = k
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("name", ["two inputs of equal sizes", "joined then projected",
                                  "joined widths specialised by a norm", "views by ints taken before a break"])
def test_sizes_related_by_operations_are_answered_by_the_rules(name, monkeypatch) -> None:
    """The recompile with symbolic sizes relates sizes of different symbols (added tensors,
    joined ones, a norm's width, views to the ints of a resume function): the shape rules
    record the equalities torch records and answer, with no operation left to
    FakeTensorMode's symbolic reasoning (10–50 ms each; timm's Sequencer spent most of its
    capture there). Under `no_grad`, as inference runs (with grad mode on, views are made by
    FakeTensorMode, which links them to their base for autograd)."""
    from torch.utils._pytree import tree_leaves

    from dynamo_rs import _capture

    left_to_torch = []
    original = _capture._call

    def spy(target, args, kwargs):
        if any(getattr(getattr(a, "fake_mode", None), "dynamo_rs_symbolic", False) for a in tree_leaves(args)):
            left_to_torch.append(getattr(target, "__name__", str(target)))
        return original(target, args, kwargs)

    monkeypatch.setattr(_capture, "_call", spy)
    fn, calls = CASES[name]
    with torch.no_grad():
        counter = side_by_side(fn, calls)
    assert counter.frame_count > 1
    assert left_to_torch == [], left_to_torch
