#!/usr/bin/env python3
"""Checks podium's numbered invariants: each is defined once and cited by a test.

An invariant ID is two uppercase letters, a dash and a number: CH-14, ME-11, SE-4.
The script scans cpp/, python/, docs/, tests/ and README.md under the repository root
(the parent of this script's folder, or the folder given as the only argument) and sorts
every occurrence of an ID into a definition, a test citation or a reference.

Definitions (the one statement of an invariant):
  * C++ (.h, .cc, .cpp outside *_test.cc and cpp/fuzz/): a comment line that starts in
    column 0 with `//`, then 1 to 3 spaces, then the ID, then a space and its text:
        //   CH-14 Each listener holds at most ...
    A comment with the ID then a colon (`// CH-14: closes ...`), an indented comment,
    or an ID later in the line is a reference.
  * Python (.py under python/): a line of the module docstring that starts with 1 to 4
    spaces, then the ID, then a space and its text:
          SE-4 A job started by a launcher ...
  * Markdown (docs/*.md, README.md): a list item whose first word is the ID, bold or not,
    with or without a colon or a title: `- **CH-14** a listener ...`,
    `- **HA-1 One controller.** ...`, `- SE-1: a controller ...`; unless the ID is
    followed by a pointer `(see ...)`, which makes the item a reference:
        - **CH-14** (see cpp/podium/channel/net.h): a listener's cap on handshakes.
  In every kind, the ID followed by `(see ...)` makes the line a reference: a pointer to
  the definition, with at most a short gist after it.
  An ID stated in code is defined there; a doc that lists it must use the `(see ...)`
  form. A doc defines only invariants that no code states (e.g. docs/host_agent.md).

Test citations: any occurrence of an ID (in a comment, docstring, name or string) in
cpp/**/*_test.cc or tests/python/test_*.py. Fuzz targets (cpp/fuzz/) are not tests.

References: every other occurrence. A range `CH-13..CH-15` (or `EP-1..4`) names each ID
in it.

Problems reported (exit 1): an ID defined more than once (each place, file:line), an ID
referenced or cited but never defined (often a typo), an ID defined but cited by no test.
With none, prints `invariants: N defined, all cited, none duplicated` and exits 0.

KNOWN_UNCITED below lists invariants that no test checks yet, each with the reason: they are
printed as gaps but do not fail the check. An entry that a test now cites, or that names no
defined ID, is a problem: the list only shrinks. Add to it only with the reason, never to
silence a typo or a missing citation of a test that does check the invariant.
"""

import ast
import os
import re
import sys
from collections import defaultdict

ID = r"[A-Z]{2}-[0-9]+"
ID_RE = re.compile(r"\b(" + ID + r")\b")
RANGE_RE = re.compile(r"\b([A-Z]{2})-([0-9]+)\s*\.\.\s*(?:\1-)?([0-9]+)\b")
CPP_DEF_RE = re.compile(r"^// {1,3}(" + ID + r") +(?!\(see )\S")
PY_DEF_RE = re.compile(r"^ {1,4}(" + ID + r") +(?!\(see )\S")
MD_DEF_RE = re.compile(r"^\s*[-*] +(?:\*\*)?(" + ID + r")(?![\w'’-])(.*)$")
MD_SEE_RE = re.compile(r"^(?:\*\*)?:?\s*\(see ")

KNOWN_UNCITED: dict = {}

SCAN_DIRS = ("cpp", "python", "docs", "tests")
SKIP_DIRS = {"build", "__pycache__", ".git", "third_party", ".venv", "node_modules"}
TEXT_EXTS = {".h", ".hpp", ".cc", ".cpp", ".py", ".md", ".pyi", ".txt"}


def ids_in(line):
    """The IDs a line names, a range expanded."""
    found = [m.group(1) for m in ID_RE.finditer(line)]
    for m in RANGE_RE.finditer(line):
        prefix, lo, hi = m.group(1), int(m.group(2)), int(m.group(3))
        if lo < hi <= lo + 50:
            found.extend(f"{prefix}-{n}" for n in range(lo + 1, hi))
    return found


def kind_of(rel):
    """'test', 'cpp', 'py', 'md' or 'other' (references only)."""
    name = os.path.basename(rel)
    ext = os.path.splitext(name)[1]
    if rel.startswith("cpp/") and name.endswith("_test.cc"):
        return "test"
    if rel.startswith("tests/python/") and name.startswith("test_") and ext == ".py":
        return "test"
    if rel.startswith("cpp/fuzz/"):
        return "other"
    if ext in (".h", ".hpp", ".cc", ".cpp"):
        return "cpp"
    if ext == ".py" and rel.startswith("python/"):
        return "py"
    if ext == ".md":
        return "md"
    return "other"


def docstring_lines(text):
    """Line numbers (1-based) of a Python module's docstring; empty if it has none."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    if tree.body and isinstance(tree.body[0], ast.Expr):
        node = tree.body[0].value
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return set(range(node.lineno, node.end_lineno + 1))
    return set()


def definition_in(kind, line, lineno, doc_lines):
    """The ID a line defines, or None."""
    if kind == "cpp":
        m = CPP_DEF_RE.match(line)
        return m.group(1) if m else None
    if kind == "py":
        m = PY_DEF_RE.match(line)
        return m.group(1) if m and lineno in doc_lines else None
    if kind == "md":
        m = MD_DEF_RE.match(line)
        if m and not MD_SEE_RE.match(m.group(2).lstrip()):
            return m.group(1)
    return None


def files(root):
    paths = [os.path.join(root, "README.md")]
    for top in SCAN_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for f in sorted(filenames):
                if os.path.splitext(f)[1] in TEXT_EXTS:
                    paths.append(os.path.join(dirpath, f))
    return [p for p in paths if os.path.isfile(p)]


def scan(root):
    defs = defaultdict(list)  # id -> [file:line]
    cites = defaultdict(list)
    refs = defaultdict(list)
    for path in files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        kind = kind_of(rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        doc_lines = docstring_lines(text) if kind == "py" else set()
        for lineno, line in enumerate(text.splitlines(), 1):
            names = ids_in(line)
            if not names:
                continue
            where = f"{rel}:{lineno}"
            defined = definition_in(kind, line, lineno, doc_lines)
            if defined:
                defs[defined].append(where)
            for name in names:
                if name == defined:
                    defined = None  # the definition itself; later mentions are references
                    continue
                (cites if kind == "test" else refs)[name].append(where)
    return defs, cites, refs


def sort_key(name):
    prefix, number = name.split("-")
    return prefix, int(number)


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    defs, cites, refs = scan(root)
    duplicated = sorted((i for i in defs if len(defs[i]) > 1), key=sort_key)
    undefined = sorted((set(cites) | set(refs)) - set(defs), key=sort_key)
    uncited = sorted((i for i in defs if i not in cites and i not in KNOWN_UNCITED),
                     key=sort_key)
    waived = sorted((i for i in KNOWN_UNCITED if i in defs and i not in cites), key=sort_key)
    stale = sorted((i for i in KNOWN_UNCITED if i not in defs or i in cites), key=sort_key)

    if duplicated:
        print(f"Defined more than once ({len(duplicated)}):")
        for i in duplicated:
            print(f"  {i}: " + ", ".join(defs[i]))
    if undefined:
        print(f"Referenced but never defined ({len(undefined)}):")
        for i in undefined:
            places = (cites.get(i, []) + refs.get(i, []))
            more = f" (+{len(places) - 3} more)" if len(places) > 3 else ""
            print(f"  {i}: " + ", ".join(places[:3]) + more)
    if uncited:
        print(f"Defined but cited by no test ({len(uncited)}):")
        for i in uncited:
            print(f"  {i}: defined at {defs[i][0]}")
    if stale:
        print(f"KNOWN_UNCITED entries to remove (cited by a test now, or not defined) "
              f"({len(stale)}):")
        for i in stale:
            print(f"  {i}")
    if waived:
        print(f"Known gaps, cited by no test yet (KNOWN_UNCITED, {len(waived)}):")
        for i in waived:
            print(f"  {i}: defined at {defs[i][0]}: {KNOWN_UNCITED[i]}")
    if duplicated or undefined or uncited or stale:
        return 1
    gaps = "1 known gap" if len(waived) == 1 else f"{len(waived)} known gaps"
    cited = f"all cited but {gaps}" if waived else "all cited"
    print(f"invariants: {len(defs)} defined, {cited}, none duplicated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
