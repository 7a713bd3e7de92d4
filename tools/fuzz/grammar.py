"""Random programs from a grammar of the Python and torch that model code uses.

A program is a module: a fixed prelude (globals, a class with methods, a property, a
classmethod and a staticmethod, an `nn.Module` with a `ModuleList` and a buffer, closures,
a function with defaults), then `f(t0, t1, n0, l0, d0, p0, m0)` whose body is generated, then
`make_args()` and `MUTATIONS`: changes made between calls to what `f` depends on (globals,
the class, the module, closure cells, defaults, arguments, global torch state).

The body is a list of `Stmt`s so the shrinker can drop them one at a time. Variables are
typed while generating; new names are only introduced at the top level of the body, blocks
only reassign or mutate, so every name read is bound whatever branch ran.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Value kinds: T tensor of the program's shape, I int, F float, B bool, L list of ints,
# LT list of tensors, D dict str -> int, S set of ints, P Point, KV a view of a dict,
# FN a callable tensor -> tensor, M the module.
KINDS = ("T", "I", "F", "B", "L", "LT", "D", "S")

SHAPES = ((2, 3), (3,), (3, 3), (1, 3))

PRELUDE = '''\
import collections
import functools
import itertools
import math
import operator

import torch

S = {shape!r}
SEED = {seed}
G_INT = {g_int}
G_FLOAT = {g_float}
G_FLAG = {g_flag}
G_LIST = {g_list!r}
G_DICT = {g_dict!r}
G_SET = {g_set!r}
G_T = torch.full(S, {g_float})
# Read with missing keys: the default each makes is a change to the dict.
G_DD = collections.defaultdict(list)
G_CNT = collections.defaultdict(int)


class Point:
    scale = 2

    def __init__(self, a, t):
        self.a = a
        self.t = t
        self.items = [a]

    def norm(self, z):
        return z * self.scale + self.a

    @property
    def double(self):
        return self.a * 2

    @classmethod
    def make(cls, a):
        return cls(a + cls.scale, None)

    @staticmethod
    def helper(z):
        return z + 1


class Block(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(n, n) for _ in range(2)])
        self.act = torch.nn.ReLU()
        self.k = 1
        self.register_buffer("buf", torch.ones(n))

    def forward(self, z):
        for layer in self.layers:
            z = self.act(layer(z))
        return z * self.k + self.buf


def make_adder(k):
    def add(z):
        return z + k

    return add


def make_counter():
    c = 0

    def bump():
        nonlocal c
        c += 1
        return c

    return bump


G_ADD = make_adder({g_int})
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w

'''

ARGS = '''

def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), {n0}, {l0!r}, {d0!r}, Point({p_a}, torch.randn(S)),
            Block(S[-1])]
'''

# Changes between calls, as statements run against one world: `ns` is its module namespace,
# `args` its argument list. Each is applied to both worlds before they are called again.
WORLD_MUTATIONS = (
    "ns['G_INT'] = {i}",
    "ns['G_FLOAT'] = {f}",
    "ns['G_FLAG'] = not ns['G_FLAG']",
    "ns['G_LIST'].append({i})",
    "ns['G_LIST'].clear()",
    "ns['G_DICT']['{k}'] = {i}",
    "ns['G_DICT'].pop('a', None)",
    "ns['G_SET'].add({i})",
    "ns['G_DD']['{k}'].append({i})",
    "ns['G_DD'].clear()",
    "ns['G_CNT']['{k}'] = {i}",
    "ns['G_CNT'].pop('a', None)",
    "ns['G_T'] = torch.full(ns['S'], {f})",
    "ns['G_T'] = torch.full(ns['S'], {f}, dtype=torch.float64)",
    "ns['Point'].scale = {i}",
    "ns['Point'].norm = lambda self, z: z - self.a",
    "ns['Point'].double = property(lambda self: self.a + {i})",
    "ns['G_ADD'] = ns['make_adder']({i})",
    "ns['G_ADD'].__closure__[0].cell_contents = {i}",
    "ns['helper'].__defaults__ = ({i},)",
    "ns['helper'] = lambda z, w=1: z - w",
    "args[2] = {i}",
    "args[3].append({i})",
    "args[3] = []",
    "args[3][:1] = [{i}]",
    "args[4]['{k}'] = {i}",
    "args[4].pop('a', None)",
    "args[4] = dict(reversed(list(args[4].items())))",
    "args[5].a = {i}",
    "args[5].extra = {i}",
    "args[5].t = None",
    "args[5].items.append({i})",
    "args[5] = ns['Point']({i}, args[0])",
    "args[0] = args[0].double()",
    "args[0] = args[0] + 0",
    "args[1] = args[0]",
    "args[0] = args[0].detach().requires_grad_()",
    "args[0] = torch.randn(ns['S'][:-1] + (5,))",
    "args[0] = torch.randn(2, *ns['S'])[1]",
    "args[6].k = {i}",
    "args[6].eval()",
    "args[6].act = torch.nn.Tanh()",
    "args[6].layers.append(torch.nn.Linear(ns['S'][-1], ns['S'][-1]))",
    "del args[6].layers[0]",
    "args[6].layers[0] = torch.nn.Identity()",
    "args[6].lin.weight.data.mul_(2)",
    "args[6].buf = torch.zeros(ns['S'][-1])",
    "args[6] = ns['Block'](ns['S'][-1])",
    # Instance attributes that hide a class's method (Python looks in the instance dict
    # first; `Module.__call__` calls `self.forward`), and code replaced in place.
    "args[5].norm = lambda z: z * {i}",
    "args[5].norm = ns['Point'].helper",
    "args[6].forward = lambda z: z * {i}",
    "args[6].act.forward = lambda z: z + {i}",
    "args[6].layers[0].forward = args[6].act.forward",
    "ns['helper'].__code__ = (lambda z, w=2: z + w).__code__",
    "ns['Point'].norm.__code__ = (lambda self, z: z + self.a).__code__",
)

# Changes to process-wide torch state: made once before both worlds are called, undone by
# the harness when the program ends.
GLOBAL_MUTATIONS = (
    "torch.set_grad_enabled(not torch.is_grad_enabled())",
    "torch.set_default_dtype(torch.float64)",
    "torch.use_deterministic_algorithms(True)",
)


@dataclass
class Stmt:
    """One statement; a compound one has `blocks`: (header, body) pairs such as
    ("if x:", [...]), ("else:", [...])."""

    text: str = ""
    blocks: list[tuple[str, list["Stmt"]]] = field(default_factory=list)

    def render(self, indent: str) -> list[str]:
        if not self.blocks:
            return [indent + line for line in self.text.splitlines()]
        lines = []
        for header, body in self.blocks:
            lines.append(indent + header)
            inner = [line for stmt in body for line in stmt.render(indent + "    ")]
            lines.extend(inner or [indent + "    pass"])
        return lines


@dataclass
class Program:
    seed: int
    prelude: str
    body: list[Stmt]
    returns: list[str]
    args: str
    mutations: list[str]

    def source(self) -> str:
        lines = [self.prelude, "", "def f(t0, t1, n0, l0, d0, p0, m0):",
                 "    global G_INT, G_FLOAT, G_FLAG, G_T"]
        for stmt in self.body:
            lines.extend(stmt.render("    "))
        lines.append(f"    return ({', '.join(self.returns)},)")
        lines.append(self.args)
        lines.append(f"MUTATIONS = {self.mutations!r}")
        return "\n".join(lines) + "\n"


class Generator:
    """Builds one program from a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.shape = self.rng.choice(SHAPES)
        self.names = 0
        # Name -> kind of every variable bound at the top level of `f` (and the globals).
        self.scope: dict[str, str] = {
            "t0": "T", "t1": "T", "n0": "I", "l0": "L", "d0": "D",
            "G_INT": "I", "G_FLOAT": "F", "G_FLAG": "B", "G_T": "T",
            "G_LIST": "L", "G_DICT": "D", "G_SET": "S",
        }
        self.views: list[str] = []
        self.callables: list[str] = ["G_ADD", "helper", "Point.helper", "p0.norm", "m0",
                                     "m0.lin", "m0.act"]
        self.points: list[str] = ["p0"]
        self.locals: list[str] = []
        # Half the programs leave globals and closure cells alone: writing them makes the
        # whole frame run eagerly today, and the rest of the program would go untested.
        self.pure = self.chance(0.5)

    # --- helpers ------------------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def pick(self, options):
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def var(self, kind: str) -> str | None:
        names = [n for n, k in self.scope.items() if k == kind]
        return self.pick(names) if names else None

    def small(self) -> str:
        return str(self.rng.randint(0, 5))

    # --- expressions --------------------------------------------------------------------------

    def expr(self, kind: str, depth: int = 0) -> str:
        if depth >= 3 or self.chance(0.3):
            leaf = self.leaf(kind)
            if leaf is not None:
                return leaf
        return getattr(self, "expr_" + kind)(depth + 1)

    def leaf(self, kind: str) -> str | None:
        literal = {
            "I": self.small,
            "F": lambda: self.pick(["0.5", "1.5", "-2.0", "G_FLOAT"]),
            "B": lambda: self.pick(["True", "False", "G_FLAG"]),
        }
        name = self.var(kind)
        if name is not None and (kind not in literal or self.chance(0.6)):
            return name
        return literal[kind]() if kind in literal else None

    def expr_T(self, d: int) -> str:
        e = self.expr
        choices = [
            lambda: f"({e('T', d)} {self.pick('+-*')} {e('T', d)})",
            lambda: f"({e('T', d)} * {e('I', d)})",
            lambda: f"({e('T', d)} + {e('F', d)})",
            lambda: f"{e('T', d)}.{self.pick(['sin', 'cos', 'relu', 'abs', 'neg', 'sigmoid', 'tanh', 'clone', 'contiguous'])}()",
            lambda: f"torch.{self.pick(['sin', 'relu', 'abs', 'tanh'])}({e('T', d)})",
            lambda: f"torch.where({e('T', d)} > 0, {e('T', d)}, {e('T', d)})",
            lambda: f"({e('T', d)} - {e('T', d)}.mean())",
            lambda: f"{e('T', d)}.sum(-1, keepdim=True).expand_as({e('T', d)})",
            lambda: f"{e('T', d)}.reshape(-1).view(S)",
            lambda: f"{e('T', d)}.clamp(min={e('F', d)})",
            lambda: f"torch.stack([{e('T', d)}, {e('T', d)}]).sum(0)",
            lambda: f"torch.cat([{e('T', d)}, {e('T', d)}], 0)[:S[0]]",
            lambda: f"{self.pick(self.callables)}({e('T', d)})",
            lambda: f"helper({e('T', d)}, {e('I', d)})",
            lambda: f"(lambda z: z * {e('I', d)})({e('T', d)})",
            lambda: f"functools.partial(helper, w={e('I', d)})({e('T', d)})",
            lambda: f"m0.layers[{self.pick(['0', '-1'])}]({e('T', d)})",
            lambda: f"({e('T', d)} if {e('B', d)} else {e('T', d)})",
            lambda: f"sum({e('LT', d)}, {e('T', d)})",
            lambda: f"functools.reduce(operator.add, {e('LT', d)}, {e('T', d)})",
            lambda: f"{self.pick(self.points)}.t",
            lambda: f"({e('T', d)} * {self.pick(self.points)}.a)",
            lambda: f"{e('T', d)}.to({e('T', d)}.dtype)",
            lambda: f"({e('T', d)} @ {e('T', d)}.T if {e('T', d)}.dim() == 2 and S[0] == S[1] else {e('T', d)})",
        ]
        return self.pick(choices)()

    def expr_I(self, d: int) -> str:
        e = self.expr
        p = self.pick(self.points)
        choices = [
            lambda: f"({e('I', d)} {self.pick(['+', '-', '*'])} {e('I', d)})",
            lambda: f"({e('I', d)} {self.pick(['%', '//'])} {self.rng.randint(2, 5)})",
            lambda: f"len({e(self.pick(['L', 'D', 'S', 'LT']), d)})",
            lambda: f"{e('T', d)}.shape[{self.pick(['0', '-1'])}]",
            lambda: f"{e('T', d)}.{self.pick(['dim', 'numel'])}()",
            lambda: f"{e('T', d)}.size(-1)",
            lambda: f"sum({e('L', d)})",
            lambda: f"max({e('L', d)}, default={e('I', d)})",
            lambda: f"{self.pick(['min', 'max'])}({e('I', d)}, {e('I', d)})",
            lambda: f"abs({e('I', d)})",
            lambda: f"{e('D', d)}.get('{self.pick('abc')}', {e('I', d)})",
            lambda: f"{p}.{self.pick(['a', 'double', 'scale'])}",
            lambda: f"len({p}.items)",
            lambda: "Point.scale",
            lambda: "m0.k",
            lambda: "len(m0.layers)",
            lambda: f"({e('I', d)} if {e('B', d)} else {e('I', d)})",
            lambda: f"({e('L', d)}[0] if {e('L', d)} else {e('I', d)})",
            lambda: f"int({e('F', d)})",
            lambda: f"functools.reduce(operator.add, {e('L', d)}, 0)",
            lambda: f"sum(1 for x in {e('L', d)} if x > {e('I', d)})",
            lambda: f"len([k for k in {e('D', d)} if k != 'a'])",
            lambda: f"getattr({p}, 'extra', {e('I', d)})",
            lambda: f"Point.make({e('I', d)}).a",
        ]
        if self.views:
            choices.append(lambda: f"len({self.pick(self.views)})")
        if not self.pure:
            choices.append(lambda: "G_BUMP()")
            choices.append(lambda: f"len(G_DD['{self.pick('abc')}'])")
            choices.append(lambda: f"G_CNT['{self.pick('abc')}']")
        return self.pick(choices)()

    def expr_F(self, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"float({e('I', d)})",
            lambda: f"({e('F', d)} {self.pick('+-*')} {e('F', d)})",
            lambda: f"math.sqrt(abs({e('F', d)}))",
            lambda: f"({e('F', d)} / {self.pick(['2', '4.0'])})",
        ])()

    def expr_B(self, d: int) -> str:
        e = self.expr
        choices = [
            lambda: f"({e('I', d)} {self.pick(['<', '<=', '==', '!=', '>'])} {e('I', d)})",
            lambda: f"('{self.pick('abc')}' in {e('D', d)})",
            lambda: f"({e('I', d)} in {e(self.pick(['L', 'S']), d)})",
            lambda: f"(not {e('B', d)})",
            lambda: f"({e('B', d)} {self.pick(['and', 'or'])} {e('B', d)})",
            lambda: f"bool({e(self.pick(['L', 'D', 'S']), d)})",
            lambda: f"{e('T', d)}.is_contiguous()",
            lambda: "m0.training",
            lambda: f"hasattr({self.pick(self.points)}, 'extra')",
            lambda: f"({self.pick(self.points)}.t is None)",
            lambda: f"({e('T', d)}.dtype == torch.float32)",
            lambda: f"{e('T', d)}.requires_grad",
            lambda: "torch.is_grad_enabled()",
            lambda: f"isinstance({self.pick(self.points)}.t, torch.Tensor)",
            lambda: f"(len({e('L', d)}) > {e('I', d)})",
        ]
        if self.views:
            choices.append(lambda: f"('{self.pick('abc')}' in {self.pick(self.views)})")
        return self.pick(choices)()

    def expr_L(self, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"[{e('I', d)}, {e('I', d)}]",
            lambda: f"list(range({e('I', d)} % 5))",
            lambda: f"({e('L', d)} + {e('L', d)})[:6]",
            lambda: f"[x * {e('I', d)} for x in {e('L', d)}]",
            lambda: f"[x for x in {e('L', d)} if x % 2]",
            lambda: f"sorted({e('L', d)})",
            lambda: f"list(reversed({e('L', d)}))",
            lambda: f"{e('L', d)}[1:]",
            lambda: f"{e('L', d)}[::-1]",
            lambda: f"list({e('D', d)}.values())",
            lambda: f"sorted({e('S', d)})",
            lambda: f"list(map(abs, {e('L', d)}))",
            lambda: f"list(filter(None, {e('L', d)}))",
            lambda: f"[{e('I', d)}] * 2",
            lambda: f"list(itertools.chain({e('L', d)}, {e('L', d)}))[:6]",
            lambda: f"list(itertools.islice({e('L', d)}, 2))",
            lambda: f"list(itertools.accumulate({e('L', d)}))",
            lambda: f"[a + b for a, b in zip({e('L', d)}, {e('L', d)})]",
            lambda: f"[i * x for i, x in enumerate({e('L', d)})]",
            lambda: f"list({self.pick(self.points)}.items)",
        ])()

    def expr_LT(self, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"[{e('T', d)}, {e('T', d)}]",
            lambda: f"[{e('T', d)} * i for i in range(3)]",
            lambda: f"[layer({e('T', d)}) for layer in m0.layers]",
            lambda: f"list({e('T', d)}.chunk(1))",
            lambda: f"[{e('T', d)}] * 2",
            lambda: f"[{self.pick(['t0', 't1'])}] + {e('LT', d)}",
        ])()

    def expr_D(self, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"{{'a': {e('I', d)}, 'b': {e('I', d)}}}",
            lambda: f"dict({e('D', d)})",
            lambda: f"{{k: v * 2 for k, v in {e('D', d)}.items()}}",
            lambda: f"{{**{e('D', d)}, 'c': {e('I', d)}}}",
            lambda: f"dict(zip(['a', 'b'], {e('L', d)}))",
            lambda: f"dict.fromkeys(['a', 'b'], {e('I', d)})",
            lambda: f"dict(collections.OrderedDict({e('D', d)}))",
            lambda: f"dict(a={e('I', d)})",
        ])()

    def expr_S(self, d: int) -> str:
        e = self.expr
        return self.pick([
            lambda: f"{{{e('I', d)}, {e('I', d)}}}",
            lambda: f"set({e('L', d)})",
            lambda: f"({e('S', d)} {self.pick('|&-^')} {e('S', d)})",
            lambda: f"{{x % 3 for x in {e('L', d)}}}",
            lambda: f"set(frozenset({e('L', d)}))",
        ])()

    # --- statements ---------------------------------------------------------------------------

    def stmt(self, depth: int) -> Stmt:
        top = depth == 0
        roll = self.rng.random()
        if top and roll < 0.28:
            return self.new_variable()
        if roll < 0.45:
            return self.assignment()
        if roll < 0.75:
            return self.mutation()
        if depth < 2 and roll < 0.93:
            return self.compound(depth)
        if top and not self.pure:
            return self.closure()
        return self.mutation()

    def new_variable(self) -> Stmt:
        roll = self.rng.random()
        if roll < 0.08:
            d = self.var("D")
            name = self.fresh("kv")
            self.views.append(name)
            return Stmt(f"{name} = {d}.{self.pick(['keys', 'values', 'items'])}()")
        if roll < 0.14:
            name = self.fresh("p")
            a = self.expr("I")
            value = f"Point.make({a})" if self.chance(0.3) else f"Point({a}, {self.expr('T')})"
            self.points.append(name)
            self.locals.append(name)
            return Stmt(f"{name} = {value}")
        if roll < 0.2:
            name = self.fresh("fn")
            self.callables.append(name)
            self.locals.append(name)
            body = self.pick([f"lambda z: z * {self.expr('I')}",
                              f"functools.partial(helper, w={self.expr('I')})",
                              "functools.partial(torch.add, alpha=2)",
                              f"{self.var('T')}.__class__.sin",
                              "torch.nn.ReLU()",
                              "m0.layers[0]"])
            return Stmt(f"{name} = {body}")
        if roll < 0.24:
            # An alias of an attribute's list: later stores to the attribute must not change
            # what it names, mutations through it must show through the attribute.
            name = self.fresh("la")
            self.scope[name] = "L"
            self.locals.append(name)
            return Stmt(f"{name} = {self.pick(self.points)}.items")
        kind = self.pick(KINDS)
        name = self.fresh(kind.lower())
        text = f"{name} = {self.expr(kind)}"
        self.scope[name] = kind
        self.locals.append(name)
        return Stmt(text)

    def assignment(self) -> Stmt:
        kind = self.pick(("T", "T", "I", "L", "D", "S", "B", "F"))
        # Module-level containers are not declared `global` in `f`: binding them would make
        # them locals of `f`.
        names = [n for n, k in self.scope.items()
                 if k == kind and not (n.startswith("G_") and (self.pure or n in ("G_LIST", "G_DICT", "G_SET")))]
        if not names:
            return self.mutation()
        name = self.pick(names)
        if kind in ("T", "I", "L", "S") and self.chance(0.35):
            op = {"T": "+-*", "I": "+-*", "L": "+", "S": "|&"}[kind]
            value = self.expr(kind)
            if kind == "L":
                value = f"{value}[:2]"
            return Stmt(f"{name} {self.pick(op)}= {value}")
        return Stmt(f"{name} = {self.expr(kind)}")

    def mutation(self) -> Stmt:
        e = self.expr
        lst = self.pick([self.var("L"), "G_LIST", f"{self.pick(self.points)}.items"])
        dct = self.pick([self.var("D"), "G_DICT"])
        st = self.pick([self.var("S"), "G_SET"])
        t = self.var("T")
        p = self.pick(self.points)
        p2 = self.pick(self.points)
        k = self.pick("abc")
        options = [
            f"{lst}.append({e('I')})",
            f"{lst}.extend({e('L')}[:2])",
            f"{lst}.insert(0, {e('I')})",
            f"if {lst}:\n    {lst}.pop()",
            f"{lst}.reverse()",
            f"{lst}.sort()",
            f"if {lst}:\n    {lst}[0] = {e('I')}",
            f"if {lst}:\n    del {lst}[0]",
            f"{dct}['{k}'] = {e('I')}",
            f"{dct}.update({e('D')})",
            f"{dct}.pop('{k}', None)",
            f"{dct}.setdefault('{k}', {e('I')})",
            f"if '{k}' in {dct}:\n    del {dct}['{k}']",
            f"{st}.add({e('I')})",
            f"{st}.discard({e('I')})",
            f"{st}.update({e('L')})",
            f"{t}.add_({e('I')})",
            f"{t}.mul_({e('F')})",
            f"{t}[0] = {e('F')}",
            f"{t}.relu_()",
            f"{t}.clamp_(min=-1.0)",
            f"{t}[0:1].mul_(2)",
            f"{t}.copy_({e('T')})",
            f"{p}.a = {e('I')}",
            f"{p}.extra = {e('I')}",
            f"{p}.t = {e('T')}",
            f"{p}.items = {e('L')}",
            f"{p}.items, {p2}.items = {p2}.items, {p}.items",
            f"{p}.t, {p2}.t = {p2}.t, {p}.t",
            f"if hasattr({p}, 'extra'):\n    del {p}.extra",
            f"m0.k = {e('I')}",
        ]
        if not self.pure:
            options += [f"G_INT = {e('I')}", "G_INT += 1", f"G_T = {e('T')}", "G_BUMP()",
                        f"G_DD['{k}'].append({e('I')})", f"G_CNT['{k}'] += {e('I')}",
                        f"G_DD['{k}']", f"G_DD.setdefault('{k}', []).append({e('I')})"]
        return Stmt(self.pick(options))

    def block(self, depth: int, extra: dict[str, str] | None = None) -> list[Stmt]:
        saved = dict(self.scope)
        self.scope.update(extra or {})
        body = [self.stmt(depth + 1) for _ in range(self.rng.randint(1, 3))]
        self.scope = saved
        return body

    def compound(self, depth: int) -> Stmt:
        roll = self.rng.random()
        if roll < 0.3:
            blocks = [(f"if {self.expr('B')}:", self.block(depth))]
            if self.chance(0.5):
                blocks.append(("else:", self.block(depth)))
            return Stmt(blocks=blocks)
        if roll < 0.45:
            x = self.fresh("x")
            body = self.block(depth, {x: "I"})
            if self.chance(0.3):
                body.append(Stmt(f"if {x} {self.pick(['>', '=='])} {self.small()}:\n"
                                 f"    {self.pick(['break', 'continue'])}"))
            lst = self.var("L")
            if lst is not None and self.chance(0.3):
                # Over the list itself, which the body may change (Python's iterator sees
                # it); bounded, as the body may grow it.
                body.insert(0, Stmt(f"if len({lst}) > 6:\n    break"))
                return Stmt(blocks=[(f"for {x} in {lst}:", body)])
            # Over a copy: the body may grow the list it iterates.
            return Stmt(blocks=[(f"for {x} in {self.expr('L')}[:4]:", body)])
        if roll < 0.55:
            i, x = self.fresh("i"), self.fresh("x")
            return Stmt(blocks=[(f"for {i}, {x} in enumerate({self.expr('L')}[:4]):",
                                 self.block(depth, {i: "I", x: "I"}))])
        if roll < 0.63:
            k, v = self.fresh("k"), self.fresh("v")
            return Stmt(blocks=[(f"for {k}, {v} in {self.expr('D')}.items():",
                                 self.block(depth, {v: "I"}))])
        if roll < 0.72:
            tt = self.fresh("tt")
            t = self.var("T")
            return Stmt(blocks=[(f"for {tt} in {self.expr('LT')}:",
                                 [Stmt(f"{t} = {t} + {tt}")] + self.block(depth, {tt: "T"}))])
        if roll < 0.8:
            w = self.fresh("w")
            loop = Stmt(blocks=[(f"while {w} > 0:", [Stmt(f"{w} -= 1")] + self.block(depth))])
            return Stmt("\n".join([f"{w} = {self.rng.randint(0, 3)}"] + loop.render("")))
        if roll < 0.88:
            return Stmt(blocks=[("with torch.no_grad():", self.block(depth))])
        return Stmt(blocks=[("try:", self.block(depth)),
                            ("except (IndexError, KeyError, TypeError, AttributeError):",
                             [Stmt(f"{self.var('I')} = -1")])])

    def closure(self) -> Stmt:
        """A nested function reading (and maybe rebinding) a local of `f` through a cell."""
        cell = self.fresh("c")
        fn = self.fresh("inner")
        t = self.var("T")
        if self.chance(0.5):
            text = (f"{cell} = {self.expr('I')}\n"
                    f"def {fn}(z):\n"
                    f"    nonlocal {cell}\n"
                    f"    {cell} += 1\n"
                    f"    return z * {cell}\n"
                    f"{t} = {fn}({t})")
        else:
            text = (f"{cell} = {self.expr('I')}\n"
                    f"def {fn}(z, w={self.small()}):\n"
                    f"    return z + {cell} * w\n"
                    f"{cell} = {cell} + 1\n"
                    f"{t} = {fn}({t})")
        self.scope[cell] = "I"
        self.callables.append(fn)
        self.locals.extend([cell, fn])
        return Stmt(text)

    # --- the program --------------------------------------------------------------------------

    def program(self) -> Program:
        rng = self.rng
        prelude = PRELUDE.format(
            shape=self.shape, seed=rng.randint(0, 10_000), g_int=rng.randint(0, 4),
            g_float=self.pick([0.5, 1.5, -1.0]), g_flag=self.chance(0.5),
            g_list=[rng.randint(0, 4) for _ in range(rng.randint(0, 3))],
            g_dict={"a": rng.randint(0, 3), "b": rng.randint(0, 3)},
            g_set={rng.randint(0, 4) for _ in range(2)},
        )
        body = [self.stmt(0) for _ in range(rng.randint(2, 10))]
        returns = ["t0", "t1", "n0", "l0", "d0", "p0"] + self.locals
        args = ARGS.format(n0=rng.randint(0, 4), l0=[rng.randint(0, 4) for _ in range(3)],
                           d0={"a": 1, "b": 2}, p_a=rng.randint(0, 3))
        mutations = []
        for _ in range(rng.randint(1, 4)):
            if self.chance(0.1):
                mutations.append("global: " + self.pick(GLOBAL_MUTATIONS))
            else:
                mutations.append(self.pick(WORLD_MUTATIONS).format(
                    i=rng.randint(-1, 5), f=self.pick(["0.25", "2.0", "-1.5"]),
                    k=self.pick("abc")))
        return Program(self.seed, prelude, body, returns, args, mutations)


def generate(seed: int) -> Program:
    return Generator(seed).program()
