"""Found by `make fuzz` (seed 2215); shrunk. Eager and compiled disagreed:
after "args[0] = torch.randn(2, *ns['S'])[1]": eager raised None, compiled raised InternalCheckFailed('internal error: the guard and its reference evaluation disagree: the guard says it holds, the reference says it fails (L["___arg_t0"]: check failed)')
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (3,)
SEED = 3194
G_INT = 3
G_FLOAT = 1.5
G_FLAG = True
G_LIST = [2, 3]
G_DICT = {'a': 3, 'b': 0}
G_SET = {2, 4}
G_T = torch.full(S, 1.5)


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


G_ADD = make_adder(3)
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w



def f(t0, t1, n0, l0, d0, p0, m0):
    global G_INT, G_FLOAT, G_FLAG, G_T
    try:
        t0 += functools.partial(helper, w=G_INT)(helper(t0, 3))
        G_T.add_(Point.make(0).a)
    except (IndexError, KeyError, TypeError, AttributeError):
        pass
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 0, [0, 1, 2], {'a': 1, 'b': 2}, Point(1, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = ["args[0] = torch.randn(ns['S'][:-1] + (5,))", "args[0] = torch.randn(2, *ns['S'])[1]"]
