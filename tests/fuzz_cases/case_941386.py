"""Found by `make fuzz` (seed 941386); shrunk. Eager and compiled disagreed:
after 'args[5].a = -1': eager raised None, compiled raised TypeError("f.__resume_at_312_0() missing 1 required positional argument: '___cell_x1'")
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (3,)
SEED = 8421
G_INT = 4
G_FLOAT = 1.5
G_FLAG = True
G_LIST = []
G_DICT = {'a': 0, 'b': 0}
G_SET = {2, 3}
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


G_ADD = make_adder(4)
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w



def f(t0, t1, n0, l0, d0, p0, m0):
    global G_INT, G_FLOAT, G_FLAG, G_T
    if m0.training:
        if helper(t1, n0).reshape(-1).view(S).is_contiguous():
            if l0:
                del l0[0]
        for x1 in l0[:4]:
            t0 = functools.partial(helper, w=2)(((lambda z: z * x1)(G_T) if False else t0))
    fn4 = G_T.__class__.sin
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 0, [4, 0, 0], {'a': 1, 'b': 2}, Point(2, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = ['args[5].a = -1']
