"""Found by `make fuzz` (seed 5295045); shrunk. Eager and compiled disagreed:
call 1: eager raised None, compiled raised TypeError('arg 5 (closure) expected cell, found Block')
"""
import collections
import functools
import itertools
import math
import operator

import torch

S = (3, 3)
SEED = 1542
G_INT = 1
G_FLOAT = 0.5
G_FLAG = True
G_LIST = [2, 4, 4]
G_DICT = {'a': 1, 'b': 0}
G_SET = {0, 4}
G_T = torch.full(S, 0.5)
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


G_ADD = make_adder(1)
G_BUMP = make_counter()


def helper(z, w=2):
    return z * w



def f(t0, t1, n0, l0, d0, p0, m0):
    global G_INT, G_FLOAT, G_FLAG, G_T
    if torch.is_grad_enabled():
        if (not torch.is_grad_enabled()):
            pass
        else:
            t1 -= torch.cat([t0, sum([layer(G_T) for layer in m0.layers], torch.stack([G_T, G_T]).sum(0))], 0)[:S[0]]
        n0 = max(G_LIST, default=(list(itertools.islice(l0, 2))[0] if sorted(G_SET) else t0.shape[-1]))
    else:
        pass
    with torch.no_grad():
        p0.t = (lambda z: z * m0.k)(t1)
    return (t0,)


def make_args():
    torch.manual_seed(SEED)
    return [torch.randn(S), torch.randn(S), 4, [2, 0, 3], {'a': 1, 'b': 2}, Point(0, torch.randn(S)),
            Block(S[-1])]

MUTATIONS = []
