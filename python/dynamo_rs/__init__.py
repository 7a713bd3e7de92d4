"""dynamo-rs: TorchDynamo's graph capture, with a Rust core.

`dynamo_rs.compile(model, backend=...)` is used like `torch.compile`; `dynamo_rs.bytecode` and
`dynamo_rs.eval_frame` expose the layers below it.
"""

from dynamo_rs import bytecode, cache, config
from dynamo_rs._native import (
    BackendCompilerFailed,
    CompileError,
    ConstraintViolation,
    InternalCheckFailed,
    Unsupported,
)
from dynamo_rs.eval_frame import disable


def __getattr__(name: str):
    # `compile` and `OptimizedModule` need torch; importing dynamo_rs alone does not.
    if name in ("compile", "OptimizedModule"):
        from dynamo_rs import compiler

        return getattr(compiler, name)
    if name == "explain":
        from dynamo_rs._explain import explain

        return explain
    raise AttributeError(f"module 'dynamo_rs' has no attribute {name!r}")


def reset() -> None:
    """Forgets every compiled version of every function, as `torch._dynamo.reset()` does,
    and the sizes automatic dynamic shapes remembered."""
    import sys

    from dynamo_rs import _native

    _native.reset_all()
    shapes = sys.modules.get("dynamo_rs._shapes")
    if shapes is not None:
        shapes.FRAME_SIZES.clear()


def mark_dynamic(t, index, *, min=None, max=None) -> None:  # noqa: A002 - torch's names
    """Makes dimension(s) `index` of tensor `t` symbolic from the first compile that sees it
    (optionally within [min, max]); the same mark as `torch._dynamo.mark_dynamic`, which is
    honoured too. A compile where the code specialises such a dimension, or where its size is
    outside the range, raises `ConstraintViolation`."""
    from torch._dynamo.decorators import mark_dynamic as torch_mark_dynamic

    torch_mark_dynamic(t, index, min=min, max=max)


def maybe_mark_dynamic(t, index) -> None:
    """Like `mark_dynamic`, but the code may specialise the dimension (no error)."""
    from torch._dynamo.decorators import maybe_mark_dynamic as torch_maybe_mark_dynamic

    torch_maybe_mark_dynamic(t, index)


def mark_static(t, index=None) -> None:
    """Keeps dimension(s) `index` of `t` (all if None) static, even with `dynamic=True`."""
    from torch._dynamo.decorators import mark_static as torch_mark_static

    torch_mark_static(t, index)


__all__ = [
    "BackendCompilerFailed",
    "CompileError",
    "ConstraintViolation",
    "InternalCheckFailed",
    "OptimizedModule",
    "Unsupported",
    "bytecode",
    "cache",
    "compile",
    "config",
    "disable",
    "explain",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "reset",
]
__version__ = "0.1.0"
