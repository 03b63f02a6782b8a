"""Structure bars of the source tree (DESIGN §3, §10; issue 22 "Structure").

* `import jax_tcgemm` (in a fresh interpreter) loads no bench, timing or autotune module.
* No import cycles among the modules of jax_tcgemm/. An edge A -> B is an import of B that
  runs when A is imported: an `import` / `from ... import` statement anywhere in A's module
  body, including inside `if` / `try` / `with` / loops and class bodies, but not inside a
  function (a deferred import runs only when the function is called). `from . import x` and
  `from .pkg import x` count as an edge to the submodule x where x is one, else to the module
  they name. Only modules with a .py file in the package count (the compiled _tcgemm is a
  leaf), and a submodule's implicit import of its parent package is not an edge.
* No source file over 600 lines: jax_tcgemm/**/*.py, ffi/**/*.{cc,cu,h,cuh}, tools/*.
* Inline PTX (`asm(`, `asm volatile`, `__asm__`) only in ffi/ptx/.
"""
import ast
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "jax_tcgemm"
MAX_LINES = 600
CPP_SUFFIXES = (".cc", ".cu", ".h", ".cuh", ".cpp", ".hpp", ".c")


def test_import_loads_no_bench_timing_or_autotune():
    code = "import json, sys, jax_tcgemm; print(json.dumps(sorted(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("JAX_TCGEMM_AUTOTUNE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    assert "jax_tcgemm" in mods and "jax_tcgemm.primitive" in mods
    ours = [m for m in mods if m == "jax_tcgemm" or m.startswith("jax_tcgemm.")]
    bad = [m for m in ours if re.search(r"(bench|timing|autotune)", m.rsplit(".", 1)[-1])]
    assert not bad, f"`import jax_tcgemm` loads {bad} (all loaded: {ours})"


# ---------------------------------------------------------------------------------------------
# Import graph.

def _modules():
    """{dotted name: path} of every .py module of the package."""
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_package(name, mods):
    return mods.get(name) is not None and mods[name].name == "__init__.py"


def _module_level_imports(tree):
    """Import statements that run when the module is imported (not inside functions)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        todo.extend(ast.iter_child_nodes(node))


def _edges(name, path, mods):
    """Modules of the package that importing `name` imports (see the module docstring)."""
    pkg = name if _is_package(name, mods) else name.rpartition(".")[0]
    out = set()
    for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                       for a in node.names]
        for t in targets:
            while t and t not in mods:  # `import jax_tcgemm.x.y` where only x is ours
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # (a parent: implicit)
                out.add(t)
    return out


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def test_import_graph_checker():
    """The checker itself: finds a 2-cycle at module level, ignores deferred imports."""
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}  # a <-> b
    assert _cycles(graph) == [["p.a", "p.b"]] and _cycles({"p.a": {"p.b"}, "p.b": set()}) == []
    tree = ast.parse("import os\nif True:\n    from . import b\ndef f():\n    from . import c\n"
                     "class K:\n    import d\n")
    got = [n.names[0].name for n in _module_level_imports(tree)]
    assert sorted(got) == ["b", "d", "os"]


def test_no_import_cycles():
    mods = _modules()
    assert "jax_tcgemm.primitive" in mods
    graph = {name: _edges(name, path, mods) for name, path in mods.items()}
    assert graph["jax_tcgemm"] >= {"jax_tcgemm.ops"}  # the checker sees the package's imports
    cycles = _cycles(graph)
    assert not cycles, "import cycles (module-level imports): " + "; ".join(
        "{" + ", ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) + "}"
        for c in cycles)


# ---------------------------------------------------------------------------------------------
# Files.

def _sources():
    files = list(PKG.rglob("*.py"))
    files += [p for p in (ROOT / "ffi").rglob("*") if p.suffix in CPP_SUFFIXES]
    files += [p for p in (ROOT / "tools").glob("*") if p.is_file() and not p.name.startswith(".")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _lines(path):
    return path.read_bytes().count(b"\n")


def test_no_source_file_over_600_lines():
    files = _sources()
    assert any(p.suffix == ".cu" for p in files) and any(p.suffix == ".py" for p in files)
    long = sorted((_lines(p), str(p.relative_to(ROOT))) for p in files if _lines(p) > MAX_LINES)
    assert not long, f"files over {MAX_LINES} lines: " + ", ".join(f"{f} ({n})" for n, f in long)


_ASM = re.compile(r"\b(?:asm|__asm__)\s*(?:volatile\s*|__volatile__\s*)?\(")


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_inline_ptx_only_in_ffi_ptx():
    ptx = ROOT / "ffi" / "ptx"
    files = [p for p in ROOT.rglob("*") if p.suffix in CPP_SUFFIXES and p.is_file()
             and not {"build", "_skbuild", ".git"} & set(p.relative_to(ROOT).parts)]
    with_asm = {p for p in files if _ASM.search(_strip_comments(p.read_text(errors="replace")))}
    assert any(ptx in p.parents for p in with_asm), "no inline PTX found in ffi/ptx/ at all?"
    outside = sorted(str(p.relative_to(ROOT)) for p in with_asm if ptx not in p.parents)
    assert not outside, f"inline PTX (asm) outside ffi/ptx/: {outside}"
