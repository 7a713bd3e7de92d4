"""Backends: the same convention as torch.compile, `backend(gm, example_inputs) -> callable`.

A string is looked up in torch's own backend registry ("eager", "aot_eager", "inductor", ...),
so any backend registered for torch.compile works here too.
"""

from __future__ import annotations

from typing import Callable


def resolve_backend(backend) -> Callable:
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    try:
        return lookup_backend(backend)
    except Exception:  # noqa: BLE001 - torch raises its own InvalidBackend type
        names = sorted(set(list_backends(exclude_tags=())) | {"eager", "inductor"})
        raise ValueError(
            f"unknown backend {backend!r}; available: {', '.join(names)}"
        ) from None
