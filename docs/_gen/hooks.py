"""MkDocs hooks: the parts of the site that are generated, not written by hand.

Pages ask for them with an HTML comment on a line of its own:

    <!-- generate: layers -->
        the layer table, from ``LAYERS`` in tests/test_layers.py (the one place the layers are
        written down) and the first sentence of each module's docstring

    <!-- generate: imports -->
        the kinds of function-level imports allowed, from ``DEFERRED_IMPORT_KINDS`` and
        ``CYCLE_BREAKING_IMPORTS`` in tests/test_layers.py

    <!-- generate: benchmark FILE [table=KEY] [rows=PATH] [cols=COL,COL,...] -->
        tables from benchmarks/results/FILE: the markdown table the benchmark stored (``table=``,
        by default every ``table``/``table_markdown``/``memory_table_markdown`` string), or rows
        (``rows=`` a dotted path to a list of records; by default every list of records) with
        columns ``cols=`` (each ``key``, ``a.b`` for a nested key, ``label:key``, or
        ``label:a/b`` for a ratio of two keys); a line on the machine and the command comes first

    <!-- generate: api MODULE [skip=NAME,NAME] -->
        one mkdocstrings block (``::: MODULE.NAME``) per name the package's ``__init__`` re-exports
        (``from ._x import NAME as NAME``)

The same functions serve tests/test_docs.py, which checks the pages against the sources.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DIRECTIVE = re.compile(r"^<!--[ \t]*generate:[ \t]*(\w+)[ \t]*(.*?)[ \t]*-->[ \t]*$", re.MULTILINE)
STORED_TABLES = ("table_markdown", "table", "memory_table_markdown")


# ---------------------------------------------------------------------------------------------
# the layer table


def _test_layers_constant(name: str):
    """The constant ``name`` of tests/test_layers.py, read as a literal (the test module is not imported)."""
    tree = ast.parse((ROOT / "tests" / "test_layers.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise ValueError(f"tests/test_layers.py defines no {name}")


def layers() -> dict[str, float]:
    """``LAYERS`` of tests/test_layers.py."""
    return _test_layers_constant("LAYERS")


def _module_file(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def first_sentence(module: str) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(_module_file(module).read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.search(r"^(.+?[.:])(\s|$)", paragraph)
    sentence = (match.group(1) if match else paragraph).rstrip(":").rstrip(".")
    return sentence.replace(":func:", "").replace(":class:", "").replace(":data:", "")


def layer_table() -> str:
    rows = ["| layer | module | what it holds |", "| --- | --- | --- |"]
    for module, layer in sorted(layers().items(), key=lambda item: (item[1], item[0])):
        path = _module_file(module).relative_to(ROOT).as_posix()
        if path.endswith("/__init__.py"):
            path = path[: -len("__init__.py")]
        rows.append(f"| {layer:g} | `{path}` | {first_sentence(module)} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# the kinds of function-level imports


def deferred_imports_table() -> str:
    """``DEFERRED_IMPORT_KINDS`` and ``CYCLE_BREAKING_IMPORTS`` of tests/test_layers.py: what a
    function-level import may defer, and the imports that break a cycle instead."""
    rows = ["| a function-level import may defer | names |", "| --- | --- |"]
    for kind, names in _test_layers_constant("DEFERRED_IMPORT_KINDS").items():
        rows.append(f"| {kind} | {', '.join(f'`{n}`' for n in names)} |")
    cycles = _test_layers_constant("CYCLE_BREAKING_IMPORTS")
    listed = "; ".join(f"`{a}` imports `{b}`: {why}" for (a, b), why in sorted(cycles.items())) or "none"
    rows.append(f"| an import cycle at module level, listed with its reason | {listed} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# benchmark tables


def _get(record, path: str):
    for key in path.split("."):
        if not isinstance(record, dict) or key not in record:
            return None
        record = record[key]
    return record


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "✓" if value else "✗"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) if len(value) <= 4 else f"[{len(value)} values]"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flatten(record: dict, prefix: str = "", depth: int = 2) -> dict:
    out = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if depth > 0:
                out.update(_flatten(value, name + ".", depth - 1))
        elif not isinstance(value, list) or (len(value) <= 4 and all(not isinstance(v, (dict, list)) for v in value)):
            out[name] = value
    return out


def _cell(record: dict, column: str) -> tuple[str, str]:
    label, _, expr = column.rpartition(":")
    expr = expr or column
    if "/" in expr:
        num, den = (_get(record, part) for part in expr.split("/", 1))
        ok = isinstance(num, (int, float)) and isinstance(den, (int, float)) and den
        return (label or expr), (f"{num / den:.3g}x" if ok else "–")
    return (label or expr), _fmt(_get(record, expr))


def records_table(records: list[dict], columns: list[str] | None = None) -> str:
    if not columns:
        columns = []
        for record in records:
            columns += [key for key in _flatten(record) if key not in columns]
    header = [_cell({}, column)[0] for column in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(record, column)[1] for column in columns) + " |" for record in records]
    return "\n".join(lines)


def _record_lists(data, path: str = "") -> list[tuple[str, list[dict]]]:
    found = []
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return [(path, data)]
    if isinstance(data, dict):
        for key, value in data.items():
            if key != "machine":
                found += _record_lists(value, f"{path}.{key}" if path else key)
    return found


def _machine_line(name: str, data: dict) -> str:
    parts = [f"`benchmarks/results/{name}`"]
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    cpu = machine.get("cpu") or machine.get("platform")
    if cpu:
        cores = machine.get("cpu_count")
        parts.append(f"{cpu}" + (f", {cores} cores" if cores else ""))
    devices = machine.get("jax_devices") or data.get("device") or meta.get("device")
    if devices:
        parts.append(f"devices: {_fmt(devices)}")
    versions = machine.get("versions") if isinstance(machine.get("versions"), dict) else {}
    if versions.get("jax"):
        parts.append(f"JAX {versions['jax']}")
    load = machine.get("load_average_at_start")
    if load is not None:
        parts.append(f"load average at start {_fmt(load)}")
    if machine.get("started"):
        parts.append(f"measured {str(machine['started'])[:10]}")
    command = data.get("command")
    if isinstance(command, str):
        parts.append(f"command `{command}`")
    return "*" + "; ".join(parts) + "*"


def _demote_headings(markdown: str) -> str:
    return re.sub(r"^#+\s*(.+)$", r"**\1**", markdown.strip(), flags=re.MULTILINE)


def benchmark_tables(arguments: str) -> str:
    name, _, rest = arguments.strip().partition(" ")
    if not name:
        raise ValueError("<!-- generate: benchmark --> needs a file of benchmarks/results/")
    # options: key=value, a value running to the next " key=" (column labels may hold spaces)
    options = dict(re.findall(r"(\w+)=(.*?)(?=\s+\w+=|$)", rest.strip()))
    if rest.strip() and not options:
        raise ValueError(f"benchmark {name}: cannot read the options {rest.strip()!r}")
    unknown = set(options) - {"table", "rows", "cols"}
    if unknown:
        raise ValueError(f"benchmark {name}: unknown option(s) {sorted(unknown)}; use table=, rows=, cols=")
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"benchmark table: {path} does not exist")
    data = json.loads(path.read_text(encoding="utf-8"))
    blocks = [_machine_line(name, data)]
    columns = options["cols"].split(",") if "cols" in options else None
    if "table" in options:
        if not isinstance(data.get(options["table"]), str):
            raise ValueError(f"{name} has no stored table {options['table']!r}")
        blocks.append(_demote_headings(data[options["table"]]))
    elif "rows" in options:
        records = _get(data, options["rows"])
        if not (isinstance(records, list) and records and all(isinstance(r, dict) for r in records)):
            raise ValueError(f"{name}: {options['rows']!r} is not a list of records")
        blocks.append(records_table(records, columns))
    else:
        stored = [data[key] for key in STORED_TABLES if isinstance(data.get(key), str)]
        if stored:
            blocks += [_demote_headings(table) for table in stored]
        else:
            for where, records in _record_lists(data):
                blocks.append(f"`{where}`:\n\n" + records_table(records, columns))
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------
# API reference: one mkdocstrings block per public name a package re-exports


EXPORT = re.compile(r"^\s*from \S+ import (\w+) as (\w+)$", re.MULTILINE)


def exported_names(module: str) -> list[str]:
    """The names ``module``'s ``__init__`` re-exports (``from ._x import Name as Name``, those loaded
    lazily too: they are repeated under ``if TYPE_CHECKING:``), in order, each once."""
    source = _module_file(module).read_text(encoding="utf-8")
    names = [alias for name, alias in EXPORT.findall(source) if name == alias and not alias.startswith("_")]
    return list(dict.fromkeys(names))


def api_blocks(arguments: str) -> str:
    tokens = arguments.split()
    module, skip = tokens[0], set(tokens[1].removeprefix("skip=").split(",")) if len(tokens) > 1 else set()
    names = [name for name in exported_names(module) if name not in skip]
    if not names:
        raise ValueError(f"{module} re-exports no public names")
    return "\n\n".join(f"::: {module}.{name}" for name in names)


# ---------------------------------------------------------------------------------------------
# the hook


def expand(markdown: str) -> str:
    def replace(match: re.Match) -> str:
        kind, arguments = match.group(1), match.group(2)
        if kind == "layers":
            return layer_table()
        if kind == "imports":
            return deferred_imports_table()
        if kind == "benchmark":
            return benchmark_tables(arguments)
        if kind == "api":
            return api_blocks(arguments)
        raise ValueError(f"unknown generated part {kind!r}: layers, imports, benchmark or api")

    return DIRECTIVE.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (the MkDocs hook signature)
    return expand(markdown)
