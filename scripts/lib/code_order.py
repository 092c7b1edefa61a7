#!/usr/bin/env python3
"""The code a program runs, laid out together.

A program's pages of code are mapped into it (and counted in its RSS)
wherever it executes, and the kernel maps the cached pages around each one a
fault touches (fault-around, 64 KiB). Spread over the 16 MB of code the
collector links, the 5 MB a serving collector runs end up mapping most of
it. Placing the functions that run next to each other, hottest first, maps
only their pages.

    code_order.py profile BINARY OUT CALLGRIND_OUT...
        The functions of BINARY that ran in the callgrind profiles (valgrind
        --tool=callgrind --demangle=no), hottest first by their own
        instructions: what scripts/code-order commits.

    code_order.py resolve BINARY LIST OUT
        LIST's functions as BINARY names them, in LIST's order: an ordering
        file for lld's --symbol-ordering-file. A name BINARY has is taken
        as it is. One it lacks is looked for without the hash legacy Rust
        mangling ends with (_ZN...17h<16 hex digits>E), which changes when a
        crate's version or the compiler does: it is taken when BINARY has
        exactly one function of that name, and left out when it has several
        (the instantiations of a generic function, which cannot be told
        apart) or none. Says on stderr how many were found each way.
"""

import re
import subprocess
import sys

# Legacy Rust mangling: _ZN<path>17h<16 hex digits>E. The hash changes with
# the build; the path does not.
HASH = re.compile(r"17h[0-9a-f]{16}E$")
# callgrind names a function's recursive calls `name'2`, `name'3`...
RECURSION = re.compile(r"'\d+$")


def header(program):
    """What a list says of itself, above its names."""
    return f"""\
# The functions {program} runs at work, hottest first, as the shipped build
# (scripts/package) names them: scripts/package has the linker lay them out
# in this order, together (scripts/lib/code_order_build.rs). Written by
# scripts/code-order; rewrite it when the code or its dependencies have moved.
"""


def key(symbol):
    """A symbol's name without its build's hash."""
    return HASH.sub("E", symbol)


def code_symbols(binary):
    """{name: size} of BINARY's functions."""
    out = subprocess.run(
        ["nm", "--defined-only", "--print-size", binary],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    sizes = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tTwW":
            sizes[fields[3]] = int(fields[1], 16)
    return sizes


def callgrind_costs(path, binary_name):
    """{function: own instructions} of the functions of the object whose
    file name ends with BINARY_NAME in one callgrind output (its name
    compression, `fn=(id) name` then `fn=(id)`, undone)."""
    names = {"ob": {}, "fn": {}}
    costs = {}
    obj = fn = None
    skip_next = False
    ref = re.compile(r"^(c?)(ob|fn|fl|fi|fe)=(?:\((\d+)\))?\s*(.*)$")
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = ref.match(line)
            if m:
                called, kind, ident, name = m.groups()
                if kind in names:
                    table = names[kind]
                    if ident is not None and name:
                        table[ident] = name
                    elif ident is not None:
                        name = table.get(ident, "")
                    if kind == "ob" and not called:
                        obj = name
                    elif kind == "fn" and not called:
                        fn = RECURSION.sub("", name)
                continue
            if line.startswith("calls="):
                skip_next = True  # the next line is the call's inclusive cost
                continue
            if not line or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            if skip_next:
                skip_next = False
                continue
            if fn is None or obj is None or not obj.endswith(binary_name):
                continue
            fields = line.split()
            if len(fields) >= 2:
                costs[fn] = costs.get(fn, 0) + int(fields[1])
    return costs


def profile(binary, out, profiles):
    program = binary.rsplit("/", 1)[-1]
    ran = {}
    for path in profiles:
        for fn, cost in callgrind_costs(path, "/" + program).items():
            ran[fn] = ran.get(fn, 0) + cost
    sizes = code_symbols(binary)
    order = sorted((fn for fn in ran if fn in sizes), key=lambda fn: (-ran[fn], fn))
    with open(out, "w") as f:
        f.write(header(program))
        for fn in order:
            f.write(fn + "\n")
    print(
        f"{len(order)} functions ran, {sum(sizes[fn] for fn in order) / 1e6:.2f} MB of the "
        f"{sum(sizes.values()) / 1e6:.2f} MB of functions {binary} has",
        file=sys.stderr,
    )


def resolve(binary, listed, out):
    with open(listed) as f:
        wanted = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    sizes = code_symbols(binary)
    by_key = {}
    for name in sizes:
        by_key.setdefault(key(name), []).append(name)
    exact = renamed = 0
    code = 0
    with open(out, "w") as f:
        for name in wanted:
            if name in sizes:
                exact += 1
            else:
                same = by_key.get(key(name), [])
                if len(same) != 1:
                    continue
                renamed += 1
                name = same[0]
            f.write(name + "\n")
            code += sizes[name]
    print(
        f"of the {len(wanted)} functions {listed} lists, {binary} has {exact} by their name "
        f"and {renamed} by their name without its hash; {len(wanted) - exact - renamed} are "
        f"not found ({code / 1e6:.2f} MB of code laid out first)",
        file=sys.stderr,
    )


def main(argv):
    if len(argv) >= 4 and argv[0] == "profile":
        profile(argv[1], argv[2], argv[3:])
    elif len(argv) == 4 and argv[0] == "resolve":
        resolve(argv[1], argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
