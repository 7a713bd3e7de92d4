"""dynamo-rs: TorchDynamo's graph capture, with a Rust core.

At this stage the package exposes the bytecode layer (`dynamo_rs.bytecode`); capture
(`compile`, `reset`, `explain`) follows the roadmap in the README.
"""

from dynamo_rs import bytecode

__all__ = ["bytecode"]
__version__ = "0.1.0"
