"""Found by `make fuzz` (seed 704507); shrunk. Eager and compiled disagreed:
call 1: eager raised RuntimeError('dictionary keys changed during iteration'), compiled raised None
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (2, 3)
SEED = 2526
G_INT = 1
G_FLOAT = -1.0
G_FLAG = True
G_LIST = [3, 0]
G_DICT = {'a': 1, 'b': 1}
G_SET = {1, 3}
G_T = torch.full(S, -1.0)


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


G_ADD = make_adder(1)
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w



def f(t0, t1, n0, l0, d0, p0, m0):
    global G_INT, G_FLOAT, G_FLAG, G_T
    if torch.stack([torch.cat([t1, t0], 0)[:S[0]], (t1 - G_T.mean())]).sum(0).is_contiguous():
        pass
    for k2, v3 in {k: v * 2 for k, v in G_DICT.items()}.items():
        try:
            G_DICT.pop('a', None)
        except (IndexError, KeyError, TypeError, AttributeError):
            pass
    if G_FLAG:
        for k5, v6 in G_DICT.items():
            if 'b' in G_DICT:
                del G_DICT['b']
            G_DICT.setdefault('b', n0)
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 2, [4, 4, 1], {'a': 1, 'b': 2}, Point(3, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = []
