"""Context managers and exceptions in traced code, by family, side by side with TorchDynamo
(the harness is `language_harness.check_case`): user context managers, `contextlib`, grad-mode
blocks; exceptions raised and caught inside the traced code, bare `raise`, exceptions whose
handling a graph break must not lose. Split from `test_language_breadth.py` by topic."""

from __future__ import annotations

import contextlib

import pytest
import torch

from language_harness import case_registrar, check_case, params, reset_all, t

CASES: list = []
case = case_registrar(CASES)

T34 = t(3, 4)


class _Shifted:
    def __init__(self, shift):
        self.shift = shift


# --- context managers -------------------------------------------------------------------------

@contextlib.contextmanager
def _scaled(box, k):
    box.append(k)
    try:
        yield k * 2
    finally:
        box.pop()


class _Tracker:
    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        return False


@case(T34)
def user_context_manager_class(x):
    tr = _Tracker()
    with tr as t_:
        y = x * (t_.depth + 1)
    return y + tr.depth
@case(T34)
def contextmanager_decorator(x):
    box = []
    with _scaled(box, 3) as k:
        y = x * k * len(box)
    return y + len(box)
@case(T34)
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + 1
@case(T34)
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
    return y
@case(T34)
def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        return x.sin()
@case(T34)
def nullcontext_block(x):
    with contextlib.nullcontext():
        return x + 1
@torch.profiler.record_function("labelled")
def _labelled_by_a_profiler_range(x):
    return x.relu() * 2
@case(T34)
def record_function_as_a_decorator(x):
    return _labelled_by_a_profiler_range(x) + 1
@case(T34)
def suppress_constant_error(x):
    with contextlib.suppress(KeyError):
        {}["missing"]
    return x * 2


# --- exceptions inside traced code ----------------------------------------------------------
# A bare `raise` in an except block raises the exception being handled again.
def _reraise_inner():
    try:
        raise ValueError("inner")
    except:  # noqa: E722
        raise
def _reraise_after_a_check(d):
    try:
        return d["missing"]
    except KeyError:
        if len(d) > 0:
            raise
        return 0
def _reraise_after_a_nested_handler():
    try:
        raise ValueError("outer")
    except ValueError:
        try:
            raise TypeError("nested")
        except TypeError:
            pass
        raise
def _reraise_the_callers_exception():
    raise
@case(T34)
def bare_raise_in_an_inlined_handler(x):
    try:
        _reraise_inner()
    except ValueError as e:
        return x.sin(), str(e)
    return x.cos()
@case(T34)
def bare_raise_after_a_check(x):
    try:
        return _reraise_after_a_check({"a": 1}) + x
    except KeyError as e:
        return x - 1, e.args
@case(T34)
def bare_raise_after_a_nested_handler_is_the_outer_exception(x):
    try:
        _reraise_after_a_nested_handler()
    except ValueError as e:
        return x + 1, str(e)
    except TypeError:
        return x + 2
# The exception a callee's bare `raise` raises is the caller's, being handled in the compiled
# frame: the frame runs eagerly (a split there lost it: "No active exception to reraise").
@case(T34, graphs=0, ops=0)
def bare_raise_in_a_callee_of_the_frames_handler(x):
    try:
        raise ValueError("x")
    except ValueError:
        try:
            _reraise_the_callers_exception()
        except ValueError as e:
            return x + 1, str(e)
    return x

@case(T34)
def try_except_constant(x):
    try:
        k = {"a": 1}["b"]
    except KeyError:
        k = 2
    return x * k
@case(T34)
def try_finally_runs(x):
    out = []
    try:
        out.append(1)
    finally:
        out.append(2)
    return x * len(out)
@case(T34)
def raise_caught_in_the_frame(x):
    try:
        raise ValueError("done")
    except ValueError as e:
        return x + len(str(e))
@case(T34)
def raise_from_caught_by_outer_handler(x):
    y = x * 2
    try:
        try:
            raise KeyError("k") from ValueError("v")
        except ValueError:
            return y - 1
    except KeyError as e:
        return y + isinstance(e.__cause__, ValueError)
# A class statement breaks the graph at its `__build_class__` call (a new class on every
# call), as under TorchDynamo: the code around it is captured.
@case(T34, recompiles=True)
def class_statement_with_a_method(x):
    y = x + 1

    class Scaler:
        scale = 2

        def twice(self, t):
            return t * self.scale
    return Scaler().twice(y) - 1
@case(T34, recompiles=True)
def raise_and_catch_custom(x):
    class Stop(Exception):
        pass
    try:
        raise Stop("done")
    except Stop:
        return x + 1
@case(T34, recompiles=True)
def class_statement_reading_a_local(x):
    k = x.shape[0]

    class Holder:
        size = k

        def __init__(self, t):
            self.t = t * 2
    return Holder(x).t + Holder.size
@case(T34, recompiles=True)
def class_statement_with_super(x):
    class Base:
        def f(self, t):
            return t + 1

    class Child(Base):
        def f(self, t):
            return super().f(t) * 2
    return Child().f(x)
def _make_class_and_use(x):
    class Local:
        factor = 3
    return x * Local.factor
@case(T34, recompiles=True)
def class_statement_in_a_called_function(x):
    y = x.sin()
    return _make_class_and_use(y) + 1
@case(T34, recompiles=True)
def dataclass_defined_in_the_function(x):
    import dataclasses

    @dataclasses.dataclass
    class Pair:
        a: torch.Tensor
        b: int = 2
    p = Pair(x + 1)
    return p.a * p.b
@case(T34, recompiles=True)
def class_statement_in_a_loop(x):
    for i in range(2):
        class Step:
            k = i
        x = x + Step.k
    return x
@case(T34)
def raise_from_inside_an_except_block(x):
    try:
        try:
            raise KeyError("a")
        except KeyError as e:
            raise ValueError("b") from e
    except ValueError as e:
        return x + isinstance(e.__cause__, KeyError) + e.__suppress_context__
@case(T34)
def implicit_context_of_a_raise_in_an_except_block(x):
    try:
        try:
            raise KeyError("a")
        except KeyError:
            raise ValueError("b")
    except ValueError as e:
        return x * 2 + isinstance(e.__context__, KeyError) + (e.__cause__ is None)
@case(T34)
def raise_in_a_nested_except_block(x):
    y = x + 1
    try:
        try:
            y = y * 2
            raise IndexError
        except IndexError:
            try:
                raise KeyError("k")
            except KeyError as inner:
                raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        y = y + len(str(e)) + isinstance(e.__context__, KeyError)
    return y
@case(T34)
def exc_info_in_an_except_block(x):
    import sys
    try:
        raise KeyError("a")
    except KeyError:
        kind, value, _ = sys.exc_info()
    return x + (kind is KeyError) + isinstance(value, LookupError)
def _handled_kind():
    import sys
    return sys.exc_info()[0]
@case(T34)
def exc_info_read_by_a_helper_called_from_a_handler(x):
    try:
        try:
            raise ValueError("v")
        except ValueError:
            inner = _handled_kind()
            raise IndexError("i")
    except IndexError:
        outer = _handled_kind()
    return x * 2 + (inner is ValueError) + (outer is IndexError)
@case(T34)
def exc_info_outside_a_handler(x):
    import sys
    return x + (sys.exc_info()[0] is None)
@case(T34)
def exception_in_inlined_function(x):
    def check(n):
        if n > 2:
            raise ValueError("too big")
        return n
    try:
        check(3)
    except ValueError as e:
        return x * len(str(e))
@case(T34)
def try_else_branch(x):
    try:
        n = int("3")
    except ValueError:
        n = 0
    else:
        n += 1
    return x * n
@case(T34)
def getattr_missing_caught(x):
    try:
        return x * _Shifted(1.0).nope
    except AttributeError:
        return x - 1



# A raise inside a grad-mode or autocast block inside `try`: the block's cleanup puts the mode
# back and the exception goes on to the handler (the frame ran eagerly before).
@case(T34)
def raise_inside_no_grad_caught_outside(x):
    try:
        with torch.no_grad():
            y = x * 2
            raise ValueError("bad")
    except ValueError:
        y = x + 1
    return y, torch.is_grad_enabled()
@case(T34)
def conditional_raise_inside_no_grad(x):
    try:
        with torch.no_grad():
            if x.shape[0] > 1:
                raise KeyError("k")
            y = x
    except KeyError as e:
        y = x - len(str(e))
    return y * 2
def _checked(x):
    if x.dim() == 2:
        raise IndexError("two dims")
    return x
@case(T34)
def raise_in_a_helper_called_inside_no_grad(x):
    try:
        with torch.no_grad():
            y = _checked(x) * 3
    except IndexError:
        y = x.sum(0)
    return y
@case(T34)
def raise_through_nested_grad_modes(x):
    try:
        with torch.no_grad():
            with torch.enable_grad():
                z = x * 2
                raise RuntimeError("deep")
    except RuntimeError:
        z = x - 2
    return z, torch.is_grad_enabled()
@case(lambda: t(3, 4)().requires_grad_())
def grad_mode_restored_after_the_handler(x):
    try:
        with torch.no_grad():
            raise ValueError
    except ValueError:
        pass
    y = x * 2
    return y.requires_grad, y.detach()
@case(T34, ops=lambda theirs: theirs - 2)  # TorchDynamo records the disabled block too
def raise_inside_a_disabled_autocast_block(x):
    try:
        with torch.autocast("cpu", enabled=False):
            raise RuntimeError("r")
    except RuntimeError:
        return x + 3


@pytest.fixture(autouse=True)
def fresh_caches():
    reset_all()
    yield


def test_enough_cases() -> None:
    assert len(CASES) >= 20, len(CASES)


@pytest.mark.parametrize(("name", "fn", "make", "spec"), params(CASES))
def test_case(name, fn, make, spec) -> None:
    check_case(fn, make, spec)
