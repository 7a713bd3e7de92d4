"""Runs one generated program eagerly and compiled, and compares everything observable.

The program's source is executed twice, into two independent worlds (module namespaces with
their own globals, classes, closures and arguments from `make_args()`). The eager world's
`f` is called as is, the other's through `dynamo_rs.compile`. After each call the results
*and* the worlds' state are compared: arguments (lists, dicts, objects, the module, tensors
changed in place), globals, closure cells - together, so that an object returned by one
side that is an argument must be the same argument on the other (aliasing is observable).

Then each of the program's MUTATIONS is applied to both worlds (the same seed for anything
random) and both are called again: the compiled side must recompile or reuse its code as the
change requires and still agree with eager (guard soundness).
"""

from __future__ import annotations

import math
import types
import warnings
from dataclasses import dataclass, field

import torch

import dynamo_rs

FILENAME = "<fuzz-program>"


class Mismatch(Exception):
    """Eager and compiled disagree; the message says where."""


@dataclass
class Outcome:
    mismatch: str | None = None
    graphs: int = 0
    calls: int = 0
    fallbacks: list[str] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)


class World:
    def __init__(self, source: str) -> None:
        self.ns: dict = {"__name__": "fuzz_program"}
        exec(compile(source, FILENAME, "exec"), self.ns)  # noqa: S102 - generated test code
        torch.manual_seed(0)
        self.args = self.ns["make_args"]()

    def state(self) -> dict:
        ns = self.ns
        return {
            "args": self.args,
            "globals": {name: ns[name] for name in sorted(ns) if name.startswith("G_")},
            "bump": ns["G_BUMP"].__closure__[0].cell_contents,
        }


class Counter:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


# --- comparison -------------------------------------------------------------------------------


class Comparer:
    """Structural equality of two object graphs that also requires the same aliasing: an
    object met twice on one side must pair with one object on the other."""

    def __init__(self) -> None:
        self.left: dict[int, object] = {}
        self.right: dict[int, object] = {}
        self.keep: list = []

    def pair(self, a, b, path: str) -> bool:
        """Records that `a` and `b` correspond; False if both were already compared."""
        seen_a, seen_b = self.left.get(id(a)), self.right.get(id(b))
        if seen_a is None and seen_b is None:
            self.left[id(a)] = b
            self.right[id(b)] = a
            self.keep.append((a, b))
            return True
        if seen_a is not b or seen_b is not a:
            raise Mismatch(f"{path}: aliasing differs (one side shares an object the other "
                           f"does not)")
        return False

    def compare(self, a, b, path: str = "") -> None:
        ta, tb = type(a), type(b)
        if ta.__name__ != tb.__name__:
            raise Mismatch(f"{path}: type {ta.__name__} vs {tb.__name__}: {a!r:.80} vs {b!r:.80}")
        if isinstance(a, torch.Tensor):
            self.tensor(a, b, path)
        elif a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device)):
            if a != b:
                raise Mismatch(f"{path}: {a!r} vs {b!r}")
        elif isinstance(a, float):
            if not (a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5)):
                raise Mismatch(f"{path}: {a!r} vs {b!r}")
        elif isinstance(a, tuple):
            self.sequence(a, b, path)
        elif isinstance(a, list):
            if self.pair(a, b, path):
                self.sequence(a, b, path)
        elif isinstance(a, dict):
            if self.pair(a, b, path):
                if list(a) != list(b):
                    raise Mismatch(f"{path}: keys {list(a)} vs {list(b)}")
                for key in a:
                    self.compare(a[key], b[key], f"{path}[{key!r}]")
        elif isinstance(a, (set, frozenset)):
            if (isinstance(a, set) and not self.pair(a, b, path)) or a == b:
                return
            raise Mismatch(f"{path}: {a!r} vs {b!r}")
        elif ta.__name__ in ("dict_keys", "dict_values", "dict_items"):
            self.sequence(list(a), list(b), path + f".{ta.__name__}")
        elif isinstance(a, torch.nn.Module):
            if self.pair(a, b, path):
                self.module(a, b, path)
        elif isinstance(a, types.FunctionType):
            # Paired like lists: a function can reach itself through its closure.
            if self.pair(a, b, path):
                self.function(a, b, path)
        elif isinstance(a, types.MethodType):
            self.compare(a.__func__, b.__func__, path + ".__func__")
            self.compare(a.__self__, b.__self__, path + ".__self__")
        elif isinstance(a, type):
            if a.__qualname__ != b.__qualname__:
                raise Mismatch(f"{path}: class {a.__qualname__} vs {b.__qualname__}")
        elif ta.__name__ == "partial":
            self.compare((a.func, a.args, a.keywords), (b.func, b.args, b.keywords), path)
        elif hasattr(a, "__dict__"):
            if self.pair(a, b, path):
                self.compare(dict(vars(a)), dict(vars(b)), path + ".__dict__")
        elif a != b:
            raise Mismatch(f"{path}: {a!r:.80} vs {b!r:.80}")

    def sequence(self, a, b, path: str) -> None:
        if len(a) != len(b):
            raise Mismatch(f"{path}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            self.compare(x, y, f"{path}[{i}]")

    def tensor(self, a: torch.Tensor, b: torch.Tensor, path: str) -> None:
        if (a.dtype, a.shape, a.requires_grad) != (b.dtype, b.shape, b.requires_grad):
            raise Mismatch(f"{path}: tensor {a.dtype} {tuple(a.shape)} grad={a.requires_grad} "
                           f"vs {b.dtype} {tuple(b.shape)} grad={b.requires_grad}")
        try:
            torch.testing.assert_close(a.detach(), b.detach(), equal_nan=True, rtol=1e-4,
                                       atol=1e-5)
        except AssertionError as err:
            raise Mismatch(f"{path}: tensor values differ: {str(err).splitlines()[0]}") from None

    def module(self, a: torch.nn.Module, b: torch.nn.Module, path: str) -> None:
        if a.training != b.training or list(a._modules) != list(b._modules):
            raise Mismatch(f"{path}: module structure or mode differs")
        self.compare(dict(a.state_dict()), dict(b.state_dict()), path + ".state_dict()")
        plain = {k: v for k, v in vars(a).items() if not k.startswith("_") and k != "training"}
        other = {k: v for k, v in vars(b).items() if not k.startswith("_") and k != "training"}
        self.compare(plain, other, path + ".__dict__")
        for name in a._modules:
            self.compare(a._modules[name], b._modules[name], f"{path}.{name}")

    def function(self, a, b, path: str) -> None:
        if a.__code__.co_name != b.__code__.co_name:
            raise Mismatch(f"{path}: function {a.__code__.co_name} vs {b.__code__.co_name}")
        self.compare(a.__defaults__, b.__defaults__, path + ".__defaults__")
        cells_a = [c.cell_contents for c in a.__closure__ or () if _filled(c)]
        cells_b = [c.cell_contents for c in b.__closure__ or () if _filled(c)]
        self.compare(cells_a, cells_b, path + ".__closure__")


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def storage_links(result, args) -> set[tuple[int, int]]:
    """Pairs (i, j): result tensor i shares storage with argument tensor j."""
    def tensors(value):
        return [v for v in (value if isinstance(value, (list, tuple)) else [value])
                if isinstance(v, torch.Tensor)]

    out, ins = tensors(result), tensors(args)
    return {(i, j) for i, x in enumerate(out) for j, y in enumerate(ins)
            if x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()}


# --- running ----------------------------------------------------------------------------------


def call(fn, args):
    try:
        return fn(*args), None
    except TimeoutError:
        # The worker's alarm (a program that runs too long, like one squaring an int on
        # every call), not the program's own error: the whole program is reported as slow.
        raise
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        return None, err


def apply_mutation(mutation: str, worlds: list[World]) -> None:
    if mutation.startswith("global: "):
        exec(mutation[len("global: "):], {"torch": torch})  # noqa: S102
        return
    for world in worlds:
        torch.manual_seed(1)
        exec(mutation, {"torch": torch, "ns": world.ns, "args": world.args})  # noqa: S102


def restore_global_state() -> None:
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(False)


def run_source(source: str, mutations: list[str] | None = None) -> Outcome:
    """Runs one program; `mutations` defaults to the program's own MUTATIONS."""
    outcome = Outcome()
    eager, comp = World(source), World(source)
    if mutations is None:
        mutations = eager.ns["MUTATIONS"]
    counter = Counter()
    compiled = dynamo_rs.compile(comp.ns["f"], backend=counter)
    converter = compiled._dynamo_rs_converter
    rounds: list[str | None] = [None, None, *mutations]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for mutation in rounds:
                if mutation is not None:
                    try:
                        apply_mutation(mutation, [eager, comp])
                    except TimeoutError:
                        raise
                    except Exception:  # noqa: BLE001 - a change that does not apply
                        break  # (an index gone after an earlier change): nothing to compare
                expected, eager_error = call(eager.ns["f"], eager.args)
                actual, compiled_error = call(compiled, comp.args)
                outcome.calls += 1
                where = f"after {mutation!r}" if mutation else f"call {outcome.calls}"
                if eager_error is not None or compiled_error is not None:
                    if type(eager_error) is not type(compiled_error):
                        outcome.mismatch = (f"{where}: eager raised {eager_error!r}, "
                                            f"compiled raised {compiled_error!r}")
                    break
                try:
                    Comparer().compare((expected, eager.state()), (actual, comp.state()),
                                       "(result, state)")
                    if storage_links(expected, eager.args) != storage_links(actual, comp.args):
                        raise Mismatch("returned tensors share storage with different "
                                       "arguments")
                except Mismatch as err:
                    outcome.mismatch = f"{where}: {err}"
                    break
        for warning in caught:
            text = str(warning.message)
            if "failed, running it uncompiled" in text:
                outcome.internal_errors.append(text.split("uncompiled: ", 1)[-1])
    finally:
        restore_global_state()
        outcome.graphs = counter.graphs
        outcome.fallbacks = [reason for _, reason in converter.failures]
        dynamo_rs.reset()
    return outcome
