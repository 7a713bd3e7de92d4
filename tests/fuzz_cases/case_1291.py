"""Found by `make fuzz` (seed 1291); shrunk. Eager and compiled disagreed:
call 1: (result, state)[1]['globals']['G_T']: tensor values differ: Tensor-likes are not close!
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (1, 3)
SEED = 2472
G_INT = 3
G_FLOAT = 0.5
G_FLAG = True
G_LIST = [0, 4, 3]
G_DICT = {'a': 0, 'b': 1}
G_SET = {1, 3}
G_T = torch.full(S, 0.5)


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
    c1 = sum(1 for x in list(itertools.accumulate(l0))[1:] if x > G_BUMP())
    def inner2(z, w=5):
        return z + c1 * w
    c1 = c1 + 1
    G_T = inner2(G_T)
    G_SET.discard(max(l0, default=G_INT))
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 4, [2, 2, 4], {'a': 1, 'b': 2}, Point(2, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = []
