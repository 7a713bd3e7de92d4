"""dynamo-rs: TorchDynamo's graph capture, with a Rust core.

`dynamo_rs.compile(model, backend=...)` is used like `torch.compile`; `dynamo_rs.bytecode` and
`dynamo_rs.eval_frame` expose the layers below it.
"""

from dynamo_rs import bytecode, config
from dynamo_rs._native import BackendCompilerFailed, CompileError, InternalCheckFailed, Unsupported
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
    """Forgets every compiled version of every function, as `torch._dynamo.reset()` does."""
    from dynamo_rs import _native

    _native.reset_all()


__all__ = [
    "BackendCompilerFailed",
    "CompileError",
    "InternalCheckFailed",
    "OptimizedModule",
    "Unsupported",
    "bytecode",
    "compile",
    "config",
    "disable",
    "explain",
    "reset",
]
__version__ = "0.1.0"
