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


def capture_side_by_side(name: str, model, inputs) -> None:
    """Compiles `model` with dynamo_rs and with torch.compile (backend="eager") and prints
    graphs, operations, guards, capture time and whether the outputs match."""
    import gc

    import torch
    import torch._dynamo
    import torch._dynamo.testing

    import dynamo_rs
    from dynamo_rs.testing import CompileCounter

    def tensors(out):
        if isinstance(out, torch.Tensor):
            return [out]
        values = out.values() if hasattr(out, "values") else out
        return [v for v in values if isinstance(v, torch.Tensor)]

    with torch.no_grad():
        expected = model(*inputs)
        rows = []
        for front in ("dynamo_rs", "torch.compile"):
            gc.collect()
            if front == "dynamo_rs":
                dynamo_rs.reset()
                counter = CompileCounter()
                compiled = dynamo_rs.compile(model, backend=counter)
            else:
                torch._dynamo.reset()
                counter = torch._dynamo.testing.CompileCounter()
                compiled = torch.compile(model, backend=counter)
            start = time.perf_counter()
            got = compiled(*inputs)
            seconds = time.perf_counter() - start
            match = all(torch.allclose(g, e, atol=1e-5, rtol=1e-5) for g, e in zip(tensors(got), tensors(expected)))
            guards = compiled._dynamo_rs_converter.guards if front == "dynamo_rs" else None
            rows.append((front, counter.frame_count, counter.op_count, guards, seconds, match))
    print(f"\n{name}")
    print(f"  {'front end':<14} {'graphs':>6} {'ops':>5} {'guards':>7} {'first call':>11}  outputs")
    for front, graphs, ops, guards, seconds, match in rows:
        guards = "-" if guards is None else str(guards)
        print(f"  {front:<14} {graphs:>6} {ops:>5} {guards:>7} {seconds*1e3:>9.0f} ms  {'match' if match else 'DIFFER'}")


def demo() -> None:
    import logging

    import torch
    import torchvision

    logging.getLogger("dynamo_rs").setLevel(logging.ERROR)
    print("dynamo_rs.compile vs torch.compile, backend='eager', same process")
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None).eval()
    capture_side_by_side("torchvision resnet18, input 2x3x64x64", resnet, (torch.randn(2, 3, 64, 64),))
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                                      bos_token_id=0, eos_token_id=0)).eval()
    capture_side_by_side("transformers GPT-2 (4 layers), input 2x16 tokens", gpt2,
                         (torch.randint(0, 1000, (2, 16)),))
    print("\n(first call = capture + one run)")

    # The bytecode layer underneath, on the model's own code.
    code = type(resnet)._forward_impl.__code__
    print(f"\ntorchvision ResNet._forward_impl through dynamo_rs.bytecode.decode, next to dis:\n")
    side_by_side(code)
    print(f"\nassemble(decode(code)) vs original tables: {check_round_trip(code)}")


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
