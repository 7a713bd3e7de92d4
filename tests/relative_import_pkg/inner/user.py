import torch


def from_parent_module(x):
    from ..helpers import SCALE, shift

    return shift(x) * SCALE


def the_parent_package(x):
    from .. import helpers

    return helpers.shift(x * helpers.SCALE)


def from_own_package(x):
    from . import user

    return torch.relu(x) + (user.__name__ == __name__)


def not_loaded_yet(x):
    from ..never_imported import VALUE  # noqa: F401 - raises ModuleNotFoundError

    return x * VALUE
