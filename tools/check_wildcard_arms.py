"""`python tools/check_wildcard_arms.py`: fails when a `match` in the translator
(`crates/dynamo_python/src/capture/`) has a wildcard arm (`_ =>`, `other =>`) over an enum
that answers "unsupported" (a graph break).

Such an arm would silently turn a tracker kind added later (a new `VarKind` variant) into a
graph break wherever it is met; with the variants it covers spelled out, adding a kind makes
the compiler point at every one of those places. Wildcards that answer something else
(`_ => false` in a predicate, `_ => None` for "not this kind") are left alone: a new kind is
then not-that-kind, which is right.

Uses clippy's `wildcard_enum_match_arm` lint (which finds every wildcard arm over an enum)
and keeps those whose body mentions `unsupported`. `--fix` spells the arms out instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCOPE = "crates/dynamo_python/src/capture/"


def _arm_body(data: bytes, position: int) -> str:
    """The body of the match arm whose pattern starts at `position`: a block, or an
    expression up to the comma that ends the arm."""
    i = data.index(b"=>", position) + 2
    while data[i:i + 1].isspace():
        i += 1
    depth, j = 0, i
    while j < len(data):
        c = data[j:j + 1]
        if c in b"({[":
            depth += 1
        elif c in b")}]":
            if depth == 0:
                break
            depth -= 1
            if depth == 0 and data[i:i + 1] == b"{":
                j += 1
                break
        elif c == b"," and depth == 0:
            break
        j += 1
    return data[i:j].decode()


def _spelled_out(replacement: str) -> str:
    """Clippy's suggestion (`other @ A | other @ B`) as one binding over the alternatives."""
    parts = [p.strip() for p in replacement.split(" | ")]
    names = {p.split(" @ ")[0] for p in parts if " @ " in p}
    if len(names) == 1 and all(" @ " in p for p in parts) and len(parts) > 1:
        return f"{names.pop()} @ ({' | '.join(p.split(' @ ', 1)[1] for p in parts)})"
    return replacement


def offending_arms() -> list[tuple[str, int, int, int, str]]:
    """(file, line, byte start, byte end, the arm spelled out) of each wildcard arm in scope
    that answers unsupported."""
    result = subprocess.run(
        ["cargo", "clippy", "-p", "dynamo_python", "--message-format=json", "--quiet", "--",
         "-W", "clippy::wildcard_enum_match_arm"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    arms = set()
    for line in result.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-message":
            continue
        diagnostic = message["message"]
        code = diagnostic.get("code") or {}
        if code.get("code") != "clippy::wildcard_enum_match_arm":
            continue
        span = diagnostic["spans"][0]
        if not span["file_name"].startswith(SCOPE):
            continue
        with open(os.path.join(ROOT, span["file_name"]), "rb") as f:
            body = _arm_body(f.read(), span["byte_start"])
        if "unsupported" not in body:
            continue
        replacement = next((s["suggested_replacement"] for child in diagnostic["children"]
                            for s in child.get("spans", []) if s.get("suggested_replacement")), None)
        if replacement is not None:
            arms.add((span["file_name"], span["line_start"], span["byte_start"], span["byte_end"],
                      _spelled_out(replacement)))
    return sorted(arms)


def main() -> int:
    arms = offending_arms()
    if "--fix" in sys.argv:
        by_file: dict = {}
        for path, _, start, end, replacement in arms:
            by_file.setdefault(path, []).append((start, end, replacement))
        for path, edits in by_file.items():
            full = os.path.join(ROOT, path)
            with open(full, "rb") as f:
                data = f.read()
            for start, end, replacement in sorted(edits, reverse=True):
                data = data[:start] + replacement.encode() + data[end:]
            with open(full, "wb") as f:
                f.write(data)
        print(f"spelled out {len(arms)} wildcard arms; run `cargo fmt`")
        return 0
    for path, line, *_ in arms:
        print(f"{path}:{line}: a wildcard arm answers unsupported; list the variants it covers "
              f"(`python tools/check_wildcard_arms.py --fix`)")
    return 1 if arms else 0


if __name__ == "__main__":
    sys.exit(main())
