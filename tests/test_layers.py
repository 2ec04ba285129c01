"""The import graph of `common/` and `algos/`, read from the source with `ast` (imports at
module level and inside functions alike): no import cycle, and `common/` outside
`common/host/` never imports the host side."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_name(path: pathlib.Path) -> str:
    """`common/host/cli.py` -> `common.host.cli`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports() -> dict[str, set[str]]:
    """Each module of `common/` and `algos/` -> the modules of both that it imports anywhere
    in its text (`import a.b`, `from a.b import c`, `from a import b` where `b` is a
    module)."""
    paths = sorted(p for d in ("common", "algos") for p in (ROOT / d).rglob("*.py"))
    modules = {module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
                imported.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle `[a, b, ..., a]` of `graph`, or None (a depth-first search)."""
    state, stack = {}, []  # state: 1 on the current path, 2 finished

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_of_common_or_algos_imports_itself_through_others():
    cycle = find_cycle(project_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle_and_nothing_else():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_common_never_imports_the_host_side():
    graph = project_imports()
    wrong = {m: sorted(i for i in graph[m] if i.startswith("common.host"))
             for m in graph if m.startswith("common") and not m.startswith("common.host")}
    assert not any(wrong.values()), {m: i for m, i in wrong.items() if i}
