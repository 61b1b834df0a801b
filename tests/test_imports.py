"""The package's import graph has no cycle, counting imports made inside functions (a cycle
hidden in a function still couples the modules), neither between modules nor between the
package's folders (docs/design.md, Layout), and no module outgrows a screenful or two."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specbench"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """specbench modules `path` imports anywhere in its body (functions included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (discovered := _discovered(node, name, modules)) is not None:
            found |= discovered
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` imports the submodule pkg.mod when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import specbench.a.b.c` where only a.b is ours
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _discovered(node, name: str, modules: set[str]) -> set[str] | None:
    """`import_submodules("pkg")` (specbench/core/discover.py) imports pkg's public modules: the same
    edges as writing each import, so a discovery that closes a cycle is caught too."""
    if not isinstance(node, ast.Call) or getattr(node.func, "id", getattr(node.func, "attr", None)) != "import_submodules":
        return None
    arg = node.args[0] if node.args else None
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        package = name
    elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        package = arg.value
    else:
        raise AssertionError(f"{name}: import_submodules needs a literal package name (or __name__) to be checked")
    return {m for m in modules if m.rpartition(".")[0] == package and not m.rpartition(".")[2].startswith("_") and m != name}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    return {m: imports_of(p, set(files)) for m, p in files.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_cycle():
    # explicit imports only: a package's __init__ importing its submodules (registration) is fine,
    # a submodule importing its own package back (e.g. to trigger that registration) is a cycle
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def room(module: str) -> str:
    """A module's folder under specbench/ (core, config, run, ...); a module directly in specbench/
    (cli, __main__, the package itself) is a room of its own."""
    parts = module.split(".")
    return module if (PKG.parent / Path(*parts)).with_suffix(".py").is_file() and len(parts) <= 2 else ".".join(parts[:2])


def folder_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for m, deps in g.items():
        rooms.setdefault(room(m), set()).update(r for d in deps if (r := room(d)) != room(m))
    return rooms


def test_no_folder_cycle():
    """The folders' arrows all point one way (core <- config <- kernels <- models <- ... <- tools):
    a module importing one folder up (e.g. config reading run/) closes a circle between folders even
    when no module-level cycle exists."""
    g = graph()
    cycle = find_cycle(folder_graph(g))
    if cycle:
        why = [f"{a} imports {b}" for x, y in zip(cycle, cycle[1:]) for a in sorted(g) if room(a) == x
               for b in sorted(g[a]) if room(b) == y][:12]
        raise AssertionError("folders import each other in a circle: " + " -> ".join(cycle) + "\n" + "\n".join(why))


def test_rooms():
    assert room("specbench") == "specbench" and room("specbench.cli") == "specbench.cli"
    assert room("specbench.config") == room("specbench.config.compose") == "specbench.config"
    assert room("specbench.report.board") == "specbench.report"


def test_discovery_counts_as_imports():
    """The registries' packages are imported by discovery, not by name: those imports are edges."""
    g = graph()
    assert {"specbench.methods.pld", "specbench.methods.eagle"} <= g["specbench.methods"]
    assert {"specbench.train.eagle", "specbench.train.skipset"} <= g["specbench.train.session"]
    assert "specbench.train.__main__" not in g["specbench.train.session"]


def test_cycle_finder_bites():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_too_long():
    long = {module_name(p): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
