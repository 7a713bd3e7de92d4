"""Edited code still runs right.

Every jump of a function (and of every code object nested in it) is lengthened by 300 NOPs,
which forces EXTENDED_ARG on all of them, moves every exception handler and stretches the
line table. The edited functions must return the same values, raise the same exceptions
from the same source lines, and yield the same items as the originals.

Two kinds of subjects:
- hand-written functions for each construct (try/except/finally, with, loops, closures,
  generators with send/throw, comprehensions, async), each with inputs that succeed and fail;
- real library code: whole stdlib and torch modules have their functions' `__code__`
  swapped for the edited code while a workload runs, and the workload's result is compared
  with an unedited run. A profiler counts which edited functions actually ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import sys
import traceback
import types
from typing import Any, Callable

import pytest

from dynamo_rs import bytecode

PAD = 300  # more than 255 code units: every padded jump needs an EXTENDED_ARG


def pad_jumps(code: types.CodeType) -> types.CodeType:
    consts = tuple(pad_jumps(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    old = bytecode.decode(code)
    new: list[bytecode.Instruction] = []
    new_index: list[int] = []
    for i, ins in enumerate(old):
        backward = ins.is_jump and ins.target <= i
        if backward:  # NOPs inside the loop body, before the jump back
            new.extend(bytecode.Instruction("NOP", positions=ins.positions) for _ in range(PAD))
        new_index.append(len(new))
        new.append(ins)
        if ins.is_jump and not backward:  # NOPs between the jump and its target
            new.extend(bytecode.Instruction("NOP", positions=ins.positions) for _ in range(PAD))
    for ins in old:
        if ins.target is not None:
            ins.target = new_index[ins.target]
        if ins.exc_handler is not None:
            target, depth, lasti = ins.exc_handler
            ins.exc_handler = (new_index[target], depth, lasti)
    return bytecode.assemble(new, like=code.replace(co_consts=consts))


def jumps_all_extended(code: types.CodeType) -> bool:
    return all(
        ins.arg >= PAD for ins in bytecode.decode(code) if ins.is_jump
    ) and all(jumps_all_extended(c) for c in code.co_consts if isinstance(c, types.CodeType))


def edited(fn: Callable) -> Callable:
    clone = types.FunctionType(pad_jumps(fn.__code__), fn.__globals__, fn.__name__,
                               fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__qualname__ = fn.__qualname__
    return clone


def outcome(call: Callable[[], Any]) -> tuple:
    """What a call did: its value (iterators drained) or its exception and raising line."""
    try:
        value = call()
        if inspect.isgenerator(value) or isinstance(value, (map, filter, zip)):
            value = list(value)
        return ("value", value)
    except Exception as err:  # noqa: BLE001 - comparing exceptions is the point
        last = traceback.extract_tb(err.__traceback__)[-1]
        return ("raise", type(err), str(err), last.name, last.lineno)


# ---------------------------------------------------------------------------------------------
# Hand-written subjects: one construct each, with inputs that take every path.


def try_except_finally(x):
    log = []
    try:
        log.append("try")
        if x < 0:
            raise ValueError("negative")
        y = 10 // x
    except ZeroDivisionError as e:
        log.append(f"zero:{e}")
        y = None
    except ValueError:
        log.append("value")
        raise
    else:
        log.append("else")
    finally:
        log.append("finally")
    return y, log


def nested_try_in_loop(items):
    out = []
    for item in items:
        try:
            try:
                out.append(int(item))
            except ValueError:
                if item == "stop":
                    break
                continue
            finally:
                out.append("f")
        except TypeError:
            out.append("type")
    else:
        out.append("exhausted")
    return out


def return_in_finally(x):
    try:
        if x:
            return "try"
    finally:
        if x == 2:
            return "finally"  # noqa: B012 - overriding the return is the construct under test
    return "after"


class Resource:
    def __init__(self, log, swallow=False):
        self.log, self.swallow = log, swallow

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", exc[0].__name__ if exc[0] else None))
        return self.swallow


def with_blocks(mode):
    log = []
    with Resource(log) as r, Resource(log, swallow=True):
        log.append(r is not None)
        if mode == "raise-swallowed":
            raise KeyError("k")
    with Resource(log):
        if mode == "raise":
            raise RuntimeError("boom")
        if mode == "return":
            return log
    return log


def while_loops(n):
    i, total = 0, 0
    while i < n:
        i += 1
        if i % 3 == 0:
            continue
        if i > 50:
            break
        total += i
    else:
        total = -total
    return total


def closures(n):
    counter = 0

    def bump(k=1):
        nonlocal counter
        counter += k
        return counter

    adders = [lambda x, i=i: x + i for i in range(n)]
    for add in adders:
        bump(add(0))
    return counter, [a(1) for a in adders]


def comprehensions(n):
    squares = [i * i for i in range(n) if i % 2]
    table = {i: [j for j in range(i)] for i in range(n)}
    unique = {i % 3 for i in range(n)}
    lazy = sum(x for x in squares if x > 4)
    return squares, table, unique, lazy


def generator(n):
    for i in range(n):
        got = yield i
        if got == "skip":
            continue
        if got == "boom":
            raise ValueError("asked to")
    return "done"


def delegating(n):
    result = yield from generator(n)
    yield result


def drive_generator(n):
    gen = delegating(n)
    out = [next(gen)]
    try:
        out.append(gen.send("skip"))
        out.append(gen.send(None))
        out.append(gen.throw(KeyError, KeyError("thrown")))
    except KeyError as e:
        out.append(f"caught {e}")
    gen.close()
    return out


def drive_generator_to_end(n):
    return list(delegating(n))


def match_statement(value):
    match value:
        case {"kind": "point", "x": x, "y": y}:
            return ("point", x, y)
        case [first, *rest] if len(rest) > 1:
            return ("seq", first, len(rest))
        case int(n) | float(n) if n > 0:
            return ("positive", n)
        case str() as s:
            return ("str", s.upper())
        case _:
            return ("other",)


def star_args(*args, sep="-", **kwargs):
    parts = [str(a) for a in args]
    parts += [f"{k}={v}" for k, v in sorted(kwargs.items())]
    return sep.join(parts)


def boolean_chains(a, b, c):
    x = a and b or c
    y = a if b else c
    z = (a or b) and (b or c) and not c
    w = a < b < c
    return x, y, z, w, a is None, b is not None


def fstrings_and_slices(s, n):
    return f"{s!r:>{n}}|{s[::-1]}|{s[1:n]}|{n:#x}|{s!a}"


async def async_work(n):
    total = 0
    for i in range(n):
        await asyncio.sleep(0)
        total += i
    async with contextlib.AsyncExitStack():
        pass
    return total


def run_async(n):
    return asyncio.run(async_work(n))


class Base:
    def describe(self, x):
        return ("base", x)


class Derived(Base):
    def describe(self, x):
        try:
            return ("derived",) + super().describe(x * 2)
        finally:
            self.seen = x


def method_with_super(x):
    return Derived().describe(x)


HAND_WRITTEN: list[tuple[Callable, list[tuple]]] = [
    (try_except_finally, [(2,), (0,), (-1,), ("a",)]),
    (nested_try_in_loop, [(["1", "x", None, "2", "stop", "3"],), (["4"],), ([],)]),
    (return_in_finally, [(0,), (1,), (2,)]),
    (with_blocks, [("ok",), ("raise",), ("return",), ("raise-swallowed",)]),
    (while_loops, [(0,), (10,), (100,)]),
    (closures, [(0,), (5,)]),
    (comprehensions, [(0,), (9,)]),
    (drive_generator, [(5,), (2,)]),
    (drive_generator_to_end, [(0,), (4,)]),
    (match_statement, [({"kind": "point", "x": 1, "y": 2},), ([1, 2, 3],), (3.5,), ("s",), (None,)]),
    (star_args, [((1, 2), {"sep": "+", "b": 2, "a": 1}), ((), {})]),
    (boolean_chains, [(1, 2, 3), (0, None, 5), (None, 0, 0)]),
    (fstrings_and_slices, [("héllo", 3), ("", 0)]),
    (method_with_super, [(1,), ("a",)]),
    (run_async, [(0,), (7,)]),
]

CALLEES = ("generator", "delegating", "async_work")


@contextlib.contextmanager
def edited_callees():
    """Swaps the module-level callees of the subjects for edited copies, then restores them."""
    saved = {name: globals()[name] for name in CALLEES}
    saved_method = Derived.__dict__["describe"]
    try:
        for name in CALLEES:
            globals()[name] = edited(saved[name])
        Derived.describe = edited(saved_method)
        yield
    finally:
        globals().update(saved)
        Derived.describe = saved_method


def call_with(fn, args):
    if len(args) == 2 and isinstance(args[0], tuple) and isinstance(args[1], dict):
        return lambda: fn(*args[0], **args[1])
    return lambda: fn(*args)


@pytest.mark.parametrize("fn,inputs", HAND_WRITTEN, ids=[f.__name__ for f, _ in HAND_WRITTEN])
def test_hand_written_constructs(fn, inputs) -> None:
    clone = edited(fn)
    assert jumps_all_extended(clone.__code__)
    for args in inputs:
        expected = outcome(call_with(fn, args))
        with edited_callees():
            got = outcome(call_with(clone, args))
        assert got == expected, (fn.__name__, args)


# ---------------------------------------------------------------------------------------------
# Real library code: patch every function of the named modules while a workload runs.


def functions_of(module: types.ModuleType):
    """(owner, attribute name, function) for the plain functions defined in `module`,
    including methods, static/class methods and properties of its classes."""
    seen: set[int] = set()

    def visit_function(owner, name, fn):
        if isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__ and id(fn) not in seen:
            seen.add(id(fn))
            yield owner, name, fn

    for name, value in list(vars(module).items()):
        yield from visit_function(module, name, value)
        if isinstance(value, type) and value.__module__ == module.__name__:
            for attr, member in list(vars(value).items()):
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    for accessor in (member.fget, member.fset, member.fdel):
                        yield from visit_function(value, attr, accessor)
                    continue
                yield from visit_function(value, attr, member)


@contextlib.contextmanager
def edited_modules(names: list[str]):
    originals: list[tuple[types.FunctionType, types.CodeType]] = []
    padded: set[types.CodeType] = set()
    try:
        for name in names:
            for _, _, fn in functions_of(importlib.import_module(name)):
                new = pad_jumps(fn.__code__)
                assert jumps_all_extended(new), fn.__qualname__
                originals.append((fn, fn.__code__))
                fn.__code__ = new
                padded.add(new)
        yield padded
    finally:
        for fn, code in originals:
            fn.__code__ = code


def ran_functions(padded: set[types.CodeType], workload: Callable[[], Any]) -> tuple[Any, set]:
    ran: set[types.CodeType] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in padded:
            ran.add(frame.f_code)

    sys.setprofile(profile)
    try:
        result = outcome(workload)
    finally:
        sys.setprofile(None)
    return result, ran


def wl_json():
    import json

    data = {"b": [1, 2.5, None, True, {"x": "é\n"}], "a": {"nested": [[], {}, ""]}}
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True)
    return text, json.loads(text), json.dumps([1, {"k": float("inf")}], allow_nan=True)


def wl_text():
    import difflib
    import string
    import textwrap

    a = "the quick brown fox jumps over the lazy dog\n" * 3
    b = a.replace("lazy", "sleepy").replace("quick", "slow")
    return (
        textwrap.wrap(a, 17), textwrap.fill(a, 30), textwrap.dedent("   x\n   y\n"),
        textwrap.shorten(a, 40), textwrap.indent("a\nb\n", "> "),
        list(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="")),
        list(difflib.ndiff(a.splitlines(), b.splitlines())),
        difflib.SequenceMatcher(None, a, b).ratio(),
        difflib.get_close_matches("appel", ["ape", "apple", "peach", "puppy"]),
        string.Template("$who likes ${what}").substitute(who="tim", what="kung pao"),
        string.capwords("hello   world"), string.Formatter().format("{0:>5}|{x!r}", 3, x="y"),
    )


def wl_numbers():
    import fractions
    import statistics

    f = fractions.Fraction(3, 7) + fractions.Fraction("1.25") * 2
    data = [2.5, 3.25, 5.5, 11.0, 1.0, 3.25]
    return (
        f, f.limit_denominator(10), fractions.Fraction.from_float(0.1), round(f, 2),
        statistics.mean(data), statistics.median(data), statistics.stdev(data),
        statistics.variance(data), statistics.quantiles(data, n=4), statistics.mode(data),
        statistics.fmean(data), statistics.harmonic_mean(data),
        statistics.correlation([1, 2, 3, 4], [2, 4, 5, 9]),
    )


def wl_parsing():
    import ast
    import io
    import shlex
    import tokenize
    import urllib.parse

    src = "def f(a, *b, c=1, **d):\n    return [x for x in b if x > a] or {c: d}\n"
    tree = ast.parse(src)
    return (
        ast.dump(tree, indent=1), ast.unparse(tree), ast.literal_eval("[1, (2, 3), {'a': -4.5}]"),
        [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)],
        shlex.split("a 'b c' \"d\\\"e\" f\\ g"), shlex.join(["a b", "c"]),
        urllib.parse.urlparse("https://u:p@host:8080/p/a;x?q=1&r=2#frag"),
        urllib.parse.urljoin("http://a/b/c/d;p?q", "../../g"),
        urllib.parse.parse_qs("a=1&a=2&b=%20x"), urllib.parse.quote("a b/é"),
        urllib.parse.urlencode({"k": ["v1", "v2"], "z": "&"}, doseq=True),
    )


def wl_regex():
    import re

    re.purge()
    patterns = [r"(?P<word>\w+)\s+(?P=word)", r"^(a|b)*?c{2,5}[^xyz]$", r"(?i)héllo(?=\d)",
                r"(?:\d{1,3}\.){3}\d{1,3}", r"[\u0400-\u04ff]+|\bfoo\b"]
    compiled = [re.compile(p) for p in patterns]
    text = "hello hello abcc 192.168.0.1 foo Привет HÉLLO1"
    return [(p.pattern, [m.span() for m in p.finditer(text)]) for p in compiled], \
        re.sub(r"(\w)(\w*)", lambda m: m[2] + m[1], "swap these words")


def wl_misc_stdlib():
    import calendar
    import colorsys
    import configparser
    import ipaddress
    import posixpath
    import pprint

    cfg = configparser.ConfigParser()
    cfg.read_string("[a]\nx = 1\ny = %(x)s2\n[b]\nz = yes\n")
    net = ipaddress.ip_network("192.168.0.0/28")
    return (
        calendar.TextCalendar().formatmonth(2024, 2), calendar.monthrange(2023, 2),
        colorsys.rgb_to_hls(0.2, 0.4, 0.6), colorsys.hsv_to_rgb(0.3, 0.5, 0.7),
        cfg.get("a", "y"), cfg.getboolean("b", "z"), list(net.hosts())[:3],
        list(ipaddress.collapse_addresses([ipaddress.ip_network("10.0.0.0/25"),
                                           ipaddress.ip_network("10.0.0.128/25")])),
        ipaddress.ip_address("::ffff:1.2.3.4").ipv4_mapped,
        posixpath.normpath("/a/./b/../c//d"), posixpath.relpath("/a/b/c", "/a/d"),
        posixpath.splitext("x.tar.gz"), posixpath.commonpath(["/a/b/c", "/a/b/d"]),
        pprint.pformat({"k": list(range(30)), "n": {"deep": [("t", 1)] * 5}}, width=40),
    )


def wl_argparse():
    import argparse

    parser = argparse.ArgumentParser(prog="tool", description="does things")
    parser.add_argument("path")
    parser.add_argument("--tags", nargs="*", default=[])
    parser.add_argument("-v", "--verbose", action="count", default=0)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fast", action="store_true")
    group.add_argument("--level", type=int, choices=range(5))
    sub = parser.add_subparsers(dest="cmd")
    run = sub.add_parser("run")
    run.add_argument("--n", type=float, default=1.5)
    ns = parser.parse_args(["a", "--tags", "x", "y", "-vv", "--level", "3", "run", "--n", "2"])
    return vars(ns), parser.format_help(), parser.format_usage()


def wl_torch_fx():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x, scale: float = 2.0):
            y = self.norm(self.lin(x)).relu() * scale
            return torch.cat([y, x], dim=-1).sum(dim=0)

    torch.manual_seed(0)
    model = Block()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        eager, traced = model(x), gm(x)
    return (gm.code, [n.op for n in gm.graph.nodes], torch.equal(eager, traced),
            [k for k, _ in model.named_parameters()], sorted(model.state_dict()), repr(model))


WORKLOADS = [
    (wl_json, ["json.encoder", "json.decoder", "json"]),
    (wl_text, ["textwrap", "difflib", "string"]),
    (wl_numbers, ["fractions", "statistics", "numbers"]),
    (wl_parsing, ["ast", "tokenize", "shlex", "urllib.parse"]),
    (wl_regex, ["re", "re._parser", "re._compiler", "re._casefix"]),
    (wl_misc_stdlib, ["calendar", "colorsys", "configparser", "ipaddress", "posixpath", "pprint"]),
    (wl_argparse, ["argparse", "gettext"]),
    (wl_torch_fx, ["torch.fx._symbolic_trace", "torch.fx.graph", "torch.fx.node", "torch.fx.proxy",
                   "torch.fx.graph_module", "torch.nn.modules.module", "torch.fx._compatibility"]),
]


def test_library_code_with_padded_jumps_behaves_the_same() -> None:
    total_ran: set[types.CodeType] = set()
    edited_count = 0
    for workload, modules in WORKLOADS:
        expected = outcome(workload)
        assert expected[0] == "value", (workload.__name__, expected)
        with edited_modules(modules) as padded:
            edited_count += len(padded)
            got, ran = ran_functions(padded, workload)
        assert got == expected, workload.__name__
        assert ran, f"{workload.__name__} ran none of the edited functions"
        total_ran |= ran
    print(f"\nedited {edited_count} library functions; {len(total_ran)} of them ran and agreed")
    assert len(total_ran) >= 200
