"""dynamo-rs: TorchDynamo's graph capture, with a Rust core.

At this stage the package exposes the bytecode layer (`dynamo_rs.bytecode`); capture
(`compile`, `reset`, `explain`) follows the roadmap in the README.
"""

from dynamo_rs import bytecode, config
from dynamo_rs.eval_frame import disable


def reset() -> None:
    """Forgets every compiled version of every function, as `torch._dynamo.reset()` does."""
    from dynamo_rs import _native

    _native.reset_all()


__all__ = ["bytecode", "config", "disable", "reset"]
__version__ = "0.1.0"
