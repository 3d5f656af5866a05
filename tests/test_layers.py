"""The import graph of ``onmt_doc/``: no cycle, and no import from a lower layer to a higher one;
and no import circle anywhere in the repository (benchmarks/, tools/, recipes/ with the package).

The layer order is the one written in docs/architecture.md ("Layers"), read from there, so the
documentation and the code cannot drift apart. Every import counts: at module level, inside a
function (lazy) and under ``TYPE_CHECKING``; parts reached through ``registry_for(kind)`` (an
import by name, the plugin mechanism) are not imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "onmt_doc"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The onmt_doc modules ``path`` imports (``from onmt_doc.x import y`` names ``onmt_doc.x.y``
    when that is a module, else ``onmt_doc.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("onmt_doc"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("onmt_doc"))
    return found


def layers() -> list[list[str]]:
    """The layer order of docs/architecture.md, bottom first: each line of the fenced block under
    "## Layers" is ``N  name, name …`` (package folders or top-level modules of onmt_doc)."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^## Layers\n.*?```\n(.*?)```", text, re.S | re.M)
    assert block, "docs/architecture.md has no '## Layers' section with a fenced layer list"
    rows = [re.match(r"\s*L(\d+)\s+(.*)", line) for line in block.group(1).splitlines() if line.strip()]
    assert all(rows), "each layer line reads 'L<number>  name, name …'"
    return [[n.strip() for n in m.group(2).split(",")] for m in rows]


def unit_of(module: str) -> str:
    """The layer unit of a module: its folder under onmt_doc (``data``), or a top-level module
    (``errors``); the package itself is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_folder_and_top_level_module_has_a_layer():
    placed = {name for layer in layers() for name in layer}
    units = {unit_of(m) for m in modules()}
    assert units <= placed, f"not in docs/architecture.md's layers: {sorted(units - placed)}"
    assert placed <= units, f"layers name what does not exist: {sorted(placed - units)}"


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    level = {name: i for i, layer in enumerate(layers()) for name in layer}
    known = modules()
    upward = [
        f"{m} (layer {level[unit_of(m)]}) imports {t} (layer {level[unit_of(t)]})"
        for m, path in known.items()
        for t in imports_of(path, known)
        if level[unit_of(t)] > level[unit_of(m)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def cycles_of(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of ``graph`` (module -> modules it imports) meets."""
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_the_import_graph_has_no_cycle():
    known = modules()
    graph = {m: {t for t in imports_of(p, known) if t in known and t != m} for m, p in known.items()}
    cycles = cycles_of(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# the folders of Python code in the repository: the package, the benchmark suite, the tools (scripts:
# their folder is the first entry of sys.path, so ``import x`` there names tools/x.py) and the recipes
REPOSITORY_FOLDERS = ("onmt_doc", "benchmarks", "tools", "recipes")
SCRIPT_FOLDERS = ("tools",)


def repository_modules() -> dict[str, Path]:
    return {module_name(p): p for folder in REPOSITORY_FOLDERS for p in (REPO / folder).rglob("*.py")}


def repository_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The repository modules importing ``module`` (at ``path``) may import: every import in it (at
    module level, in a function, under ``TYPE_CHECKING``). An import of a package's module runs the
    package's ``__init__`` first, so it names the packages on the way too, except ``module``'s own
    (already being imported); a script's bare ``import x`` names the script ``x`` beside it."""
    parts = module.split(".")
    own = {".".join(parts[:i]) for i in range(1, len(parts) + (path.name == "__init__.py"))}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            steps = name.split(".")
            found.update(".".join(steps[:i]) for i in range(1, len(steps) + 1))
            root = parts[0]
            if root in SCRIPT_FOLDERS:  # tools/ is on sys.path: ``hostile.steps`` is tools/hostile/steps.py
                found.update(f"{root}.{'.'.join(steps[:i])}" for i in range(1, len(steps) + 1))
    return (found & known) - own - {module}


def test_the_repository_imports_without_a_circle():
    """No import circle anywhere: the package, benchmarks/ (stages/__init__ -> peers ->
    stages/training made importing benchmarks.peers fail; a lazy import of the stage registry from
    the spec reader closed another through the stages), tools/ and recipes/, every import counted."""
    paths = repository_modules()
    graph = {m: repository_imports(m, p, set(paths)) for m, p in paths.items()}
    cycles = cycles_of(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_repository_graph_reader_sees_packages_scripts_and_lazy_imports(tmp_path):
    """The check above is only as good as this reader: a lazy import, the package an import runs
    the ``__init__`` of (not the importer's own) and a script's import of the script beside it."""
    known = {"benchmarks", "benchmarks.peers", "benchmarks.peers.export", "benchmarks.stages", "tools.x", "tools.y"}
    script = tmp_path / "tools" / "y.py"
    script.parent.mkdir()
    script.write_text("def f():\n    import x\n    from benchmarks.peers import export\n", encoding="utf-8")
    assert repository_imports("tools.y", script, known) == {
        "tools.x",
        "benchmarks",
        "benchmarks.peers",
        "benchmarks.peers.export",
    }
    stage = tmp_path / "stage.py"
    stage.write_text("from benchmarks.peers.export import run\n", encoding="utf-8")
    assert repository_imports("benchmarks.stages.s", stage, known) == {"benchmarks.peers", "benchmarks.peers.export"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert cycles_of(graph) == ["a -> b -> c -> a"]


def test_the_hostile_review_is_in_the_graph():
    """tools/hostile/ (the review's steps, server scenarios and fixtures, imported as ``hostile.x``
    with tools/ on the path; the import tests use the fixtures too) is read like the rest."""
    paths = repository_modules()
    scenarios = repository_imports("tools.hostile.scenarios", paths["tools.hostile.scenarios"], set(paths))
    assert scenarios >= {"tools.hostile.steps", "tools.hostile.fixtures"}


def test_the_graph_reader_sees_lazy_and_type_checking_imports(tmp_path):
    """The checks above are only as good as this reader: it must see every kind of import."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import onmt_doc.errors\n"
        "from onmt_doc.data import vocab\n"
        "if TYPE_CHECKING:\n    from onmt_doc.models.model import EncoderDecoder\n"
        "def f():\n    from onmt_doc.translate.translator import Translator\n",
        encoding="utf-8",
    )
    found = imports_of(src, modules())
    assert found == {"onmt_doc.errors", "onmt_doc.data.vocab", "onmt_doc.models.model", "onmt_doc.translate.translator"}
