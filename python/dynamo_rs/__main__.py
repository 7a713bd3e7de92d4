"""Command line of dynamo-rs.

    python -m dynamo_rs demo                      # what `make demo` runs
    python -m dynamo_rs dis MODULE:QUALNAME       # one function, ours next to `dis`
"""

from __future__ import annotations

import argparse
import dis
import importlib
import sys
import time
import types

from dynamo_rs import bytecode


def resolve(target: str) -> types.CodeType:
    module_name, _, qualname = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else []:
        obj = getattr(obj, part)
    obj = getattr(obj, "__func__", obj)
    code = getattr(obj, "__code__", obj)
    if not isinstance(code, types.CodeType):
        raise SystemExit(f"{target} is not a function or code object")
    return code


def side_by_side(code: types.CodeType, out=sys.stdout) -> None:
    """Our decoded instructions on the left, `dis` on the right, aligned on offsets."""
    theirs = {i.offset: i for i in dis.get_instructions(code)}
    ours = bytecode.decode(code)
    width = 58
    print(f"{'dynamo_rs.bytecode.decode':<{width}} | dis.get_instructions", file=out)
    print("-" * width + "-+-" + "-" * 40, file=out)
    for index, ins in enumerate(ours):
        if ins.target is not None:
            what = f"-> #{ins.target}"
        elif ins.arg is not None:
            what = repr(ins.argval)
        else:
            what = ""
        handler = f" !#{ins.exc_handler[0]}" if ins.exc_handler else ""
        line = ins.positions[0] if ins.positions[0] is not None else ""
        left = f"#{index:<4}{line!s:>5} {ins.offset:>5} {ins.opname:<24} {what}{handler}"
        ref = theirs.get(ins.offset)
        right = f"{ref.offset:>5} {ref.opname:<24} {ref.argrepr}" if ref else ""
        print(f"{left[:width]:<{width}} | {right}", file=out)
    ext = sum(1 for i in theirs.values() if i.opname == "EXTENDED_ARG")
    print(f"\n{len(ours)} instructions ({ext} EXTENDED_ARG folded; CACHE entries hidden; "
          "'!#n' = exception handler)", file=out)


def check_round_trip(code: types.CodeType) -> str:
    rebuilt = bytecode.assemble(bytecode.decode(code), like=code)
    fields = ("co_code", "co_exceptiontable", "co_linetable", "co_stacksize")
    same = [f for f in fields if getattr(rebuilt, f) == getattr(code, f)]
    return "identical" if len(same) == len(fields) else f"DIFFERS in {set(fields) - set(same)}"


def demo() -> None:
    import torchvision

    model = torchvision.models.resnet18(weights=None)
    code = type(model)._forward_impl.__code__
    print(f"torchvision ResNet._forward_impl ({code.co_filename}:{code.co_firstlineno})\n")
    side_by_side(code)
    print(f"\nassemble(decode(code)) vs original co_code/co_exceptiontable/co_linetable/"
          f"co_stacksize: {check_round_trip(code)}")

    # Every code object the model's modules are made of, timed against dis.
    import torch

    codes = []
    for module in {type(m) for m in model.modules()} | {torch.nn.Module}:
        for member in vars(module).values():
            member = getattr(member, "__func__", member)
            if isinstance(member, types.FunctionType):
                codes.append(member.__code__)
    start = time.perf_counter()
    for _ in range(20):
        for c in codes:
            bytecode.decode(c)
    ours = (time.perf_counter() - start) / 20
    start = time.perf_counter()
    for _ in range(20):
        for c in codes:
            list(dis.get_instructions(c))
    theirs = (time.perf_counter() - start) / 20
    exact = sum(check_round_trip(c) == "identical" for c in codes)
    print(f"\n{len(codes)} methods of resnet18's module classes: decode {ours*1e3:.2f} ms, "
          f"dis.get_instructions {theirs*1e3:.2f} ms ({theirs/ours:.0f}x); "
          f"{exact}/{len(codes)} round-trip byte for byte")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynamo_rs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="the main demo (what `make demo` runs)")
    p_dis = sub.add_parser("dis", help="disassemble a function through our decoder next to dis")
    p_dis.add_argument("target", help="MODULE:QUALNAME, e.g. torchvision.models.resnet:ResNet.forward")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo()
    else:
        code = resolve(args.target)
        side_by_side(code)
        print(f"round trip: {check_round_trip(code)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
