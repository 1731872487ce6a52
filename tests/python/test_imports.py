"""The private package is layered: every module imports alone, the import graph of podium's
modules has no cycle, and nothing imports inside a function to dodge one.

The graph is read from the import statements themselves (ast), so a top-level import added
in a refactor that closes a cycle fails here, by name, instead of as a circular-import error
in some user's program. Function-level imports are allowed only for the optional modules in
_ALLOWED_IN_FUNCTIONS, each with its reason."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import podium

ROOT = Path(podium.__file__).resolve().parent

# (module, imported module): why it is imported inside a function.
_ALLOWED_IN_FUNCTIONS = {
    # An optional baseline of the benchmark; most machines have no ray.
    ("podium._src.bench_python", "ray"): "optional dependency",
    # proc_mesh(gpus=None) counts the GPUs torch sees, when torch is installed.
    ("podium._src.compat", "torch"): "optional dependency",
    # A received torch storage is rebuilt with torch (PK-1); senders without torch never
    # make one, and podium must import without torch.
    ("podium._src.pickling", "torch"): "optional dependency",
    # The benchmark's tensor-argument figures, where torch is installed.
    ("podium._src.bench_rdma", "torch"): "optional dependency",
    ("podium._src.bench_rdma_cuda", "torch"): "optional dependency",
    # The tensor engine needs torch, which is optional: `import podium` never imports it, and
    # ProcMesh's tensor methods import it when first called.
    ("podium", "podium.tensor"): "optional dependency (torch)",
    ("podium._src.tensor_mesh", "podium.tensor._remote"): "optional dependency (torch)",
    # podium.debug() is the debugger's prompt: `import podium` does not load the actor
    # modules for it (scripts that never debug pay nothing).
    ("podium", "podium.debugger.cli"): "loaded on first use",
    ("podium", "podium._src.dashboard"): "loaded on first use",
    # The zygote's purpose is to preload, in its main() before it forks; not a podium module.
    ("podium._src.zygote", "cloudpickle"): "preloaded on purpose",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_pkg = MODULES[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, node: ast.AST) -> list[str]:
    """The modules an import statement names (for ``from pkg import name``: pkg.name when
    that is a module, else pkg)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = _resolve(module, node)
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in MODULES else base)
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _walk(module: str):
    """(import node, inside a function?) for every import of the module that runs."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))

    def visit(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from visit(child, inner)

    yield from visit(tree, False)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module in MODULES:
        graph[module] = {m for node, in_fn in _walk(module) if not in_fn
                         for m in _imported(module, node) if m in MODULES and m != module}
    return graph


def test_no_function_imports_a_module_to_dodge_a_cycle():
    found = []
    for module in MODULES:
        for node, in_function in _walk(module):
            if not in_function:
                continue
            for name in _imported(module, node):
                if (module, name) not in _ALLOWED_IN_FUNCTIONS:
                    found.append(f"{module}:{node.lineno} imports {name} inside a function")
    assert not found, "\n".join(found)


def test_the_import_graph_of_podium_has_no_cycle():
    graph = _graph()
    # The private package has a bottom: runtime.py imports nothing that imports it back.
    assert "podium._src.runtime" in graph
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles among podium's modules: {cycles}"


def test_the_graph_reader_sees_the_imports_it_must():
    graph = _graph()
    assert "podium._src.server" in graph["podium._src.runtime"]
    assert "podium._src.port_ref" in graph["podium._src.server"]
    assert "podium._src.runtime" in graph["podium._src.ports"]
    assert "podium._src.proc_mesh" not in graph["podium._src.context"]
    assert "podium.actor" not in graph["podium._src.supervision"]


def test_each_private_module_imports_alone_in_a_fresh_interpreter():
    names = [m for m in MODULES if m.startswith("podium._src") or m in ("podium.actor",
                                                                           "podium.job")]
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for m in names}
    failed = []
    for m, p in procs.items():
        out, _ = p.communicate(timeout=60)
        if p.returncode != 0:
            failed.append(f"import {m} failed:\n{out}")
    assert not failed, "\n".join(failed)


def test_importing_podium_puts_libstdcxx_in_the_global_scope():
    """podium/__init__.py loads libstdc++ RTLD_GLOBAL before podium._core: loaded only as the
    dependency of an RTLD_LOCAL extension, it made PyTorch's CUDA build abort at a later
    `import torch` ("free(): invalid pointer"), in the controller and in every proc. A fresh
    interpreter (which does not link libstdc++ itself) finds std::terminate in the global
    scope after `import podium`, and not before."""
    probe = ("import ctypes, sys\n"
             "before = hasattr(ctypes.CDLL(None), '_ZSt9terminatev')\n"
             "import podium\n"
             "after = hasattr(ctypes.CDLL(None), '_ZSt9terminatev')\n"
             "print(before, after)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
