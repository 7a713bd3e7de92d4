"""Found by `make fuzz` (seed 1000567); shrunk. Eager and compiled disagreed:
after 'args[0] = args[0].detach().requires_grad_()': eager raised None, compiled raised InternalCheckFailed('internal error: the guard built for f (<fuzz-program>:86) fails on the frame it was built from: shape guard Eq(FloatTrueDiv(G["G_FLOAT"]**2, 2.0), 0.0703125) does not hold')
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (2, 3)
SEED = 6099
G_INT = 0
G_FLOAT = 1.5
G_FLAG = False
G_LIST = [1, 3]
G_DICT = {'a': 1, 'b': 1}
G_SET = {1, 4}
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


G_ADD = make_adder(0)
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w



def f(t0, t1, n0, l0, d0, p0, m0):
    global G_INT, G_FLOAT, G_FLAG, G_T
    t1.copy_(t1)
    G_FLOAT = math.sqrt(abs(((G_FLOAT * G_FLOAT) / 2)))
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 2, [0, 4, 2], {'a': 1, 'b': 2}, Point(2, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = ['global: torch.use_deterministic_algorithms(True)', "args[4].pop('a', None)", 'args[0] = args[0].detach().requires_grad_()']
