"""The execution layer's house rules, read from its source: JAX's private modules are imported by
``diffsoup/distributed/_kv.py`` alone, the modules of ``diffsoup/distributed`` import each other
without cycles (function-level imports included), and they read no ``DIFFSOUP_*`` variable
themselves (``diffsoup._settings`` does)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diffsoup"
DISTRIBUTED = PACKAGE / "distributed"


def _imports(path: Path) -> list[tuple[str, int, int]]:
    """(absolute module name, level, line) of every import in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                out.append((node.module, node.level, node.lineno))
            else:  # from . import _run
                out += [(alias.name, node.level, node.lineno) for alias in node.names]
            if node.level == 0 and node.module:
                out += [(f"{node.module}.{alias.name}", 0, node.lineno) for alias in node.names]
    return out


def test_only_the_key_value_store_imports_jax_private_modules():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for module, level, line in _imports(path):
            if level == 0 and (module == "jax._src" or module.startswith("jax._src.")):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert sorted({o.split(":")[0] for o in offenders}) == ["diffsoup/distributed/_kv.py"], offenders


def test_the_distributed_modules_import_each_other_without_cycles():
    graph: dict[str, set[str]] = {}
    for path in sorted(DISTRIBUTED.glob("*.py")):
        name = path.stem
        edges = set()
        for module, level, _ in _imports(path):
            if level == 1 and module and (DISTRIBUTED / f"{module.split('.')[0]}.py").exists():
                edges.add(module.split(".")[0])
            elif level == 0 and module.startswith("diffsoup.distributed."):
                edges.add(module.split(".")[2])
        graph[name] = edges - {name}
    assert graph["_clusters"] and graph["_campaign"]  # the walk sees imports at all

    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(trail + [node, nxt])}")
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_distributed_modules_read_no_diffsoup_variable_themselves():
    reads = re.compile(r"""(environ(\.get)?\s*[\[(]|getenv\s*\()\s*["']DIFFSOUP_""")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted(DISTRIBUTED.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert offenders == []
    # The pattern does catch a read.
    assert reads.search('x = os.environ.get("DIFFSOUP_CACHE_DIR")') and reads.search("os.environ['DIFFSOUP_X']")
