"""The package's layers, and that imports only go down (docs/architecture.md).

Every import in ``mtad/``, ``eval/`` and ``bench/`` is checked against ``RANK``: a module may
import from its own package, or from a package of a strictly lower rank. Packages of equal rank
are siblings and may not import each other (``propose`` does not know ``verify``; ``decoders``,
``models`` and ``tasks`` do not know one another). An import is:
- an ``import`` / ``from ... import`` statement, function-level ones included (a lazy import is
  still a dependency), relative ones resolved; ``from pkg import name`` is an import of the
  module ``pkg.name`` when there is one;
- a call of ``importlib.import_module``, ``__import__`` or ``runpy.run_module`` with a literal
  module name (a name computed at run time cannot be checked here).

Two more rules:
- **decoders do not know one another**: inside ``mtad/decoders`` a module imports, of that
  package, only ``mtad.decoders.compose`` (the composition base every decoder builds on) and
  the package itself; ``compose`` imports no decoder module (``mtad/decoders/__init__.py``);
- **bench/** (benchmark scripts, run as ``python bench/NAME.py`` or through ``mtad-bench``,
  ``mtad.run.bench``, which runs the file by path with ``runpy.run_path``: the one way the
  package reaches them) ranks above everything: a benchmark may import any of ``mtad`` and
  ``eval``, and its sibling scripts by their bare names; nothing in ``mtad`` or ``eval`` imports it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The folders whose imports are checked.
SCANNED = ("mtad", "eval", "bench")

#: package -> rank; lower ranks are lower layers.
RANK = {
    "mtad.core": 0,  # runtime and maths: protocols and the token tree, runner, engine, sampling, metrics
    "mtad.propose": 1,  # drafting: chains, i.i.d. trees, beams
    "mtad.verify": 1,  # acceptance rules
    "mtad.autotune": 2,  # the cost model and gamma/width = auto
    "mtad.decoders": 3,  # proposer + verifier compositions
    "mtad.models": 3,  # model pairs
    "mtad.tasks": 3,  # prompts and references
    "eval": 2,  # scorers (tasks build theirs)
    "mtad.run": 5,  # evaluate, config, CLI, energy, provenance, results store, sweeps
    "mtad.analysis": 6,  # statistics over records: claims, tables, figures, rescoring
    "mtad.testing": 7,  # test helpers: may use anything
    "bench": 8,  # benchmark scripts: may use anything; nothing imports them
}
#: The one module of ``mtad.decoders`` that the package's other modules may import.
DECODER_BASE = "mtad.decoders.compose"
#: Calls that import the module their first argument (or ``name=``) names.
IMPORT_CALLS = {"import_module", "__import__", "run_module"}


def package_of(module: str) -> str | None:
    for pkg in sorted(RANK, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    """Whether ``name`` is a module or package of the checkout at ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _literal(node: ast.Call, position: int, keyword: str) -> str | None:
    args = [a for a in node.args[position:position + 1]] + [k.value for k in node.keywords if k.arg == keyword]
    if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def imports(path: Path, source: str | None = None, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (its text, or ``source``)."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    script = here[0] == "bench"  # a script's folder is on sys.path: its siblings import by bare name

    def resolve(name: str, level: int = 0, anchor: list[str] = package) -> str:
        if level:
            name = ".".join(anchor[: len(anchor) - (level - 1)] + ([name] if name else []))
        if script and not level and is_module(f"bench.{name.split('.')[0]}", root):
            name = f"bench.{name}"
        return name

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, resolve(a.name)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(node.module or "", node.level)
            for a in node.names:  # `from pkg import x` imports the module pkg.x when there is one
                sub = f"{mod}.{a.name}"
                out.append((node.lineno, sub if mod in ("mtad", "eval") or is_module(sub, root) else mod))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            name = _literal(node, 0, "name" if called != "run_module" else "mod_name") \
                if called in IMPORT_CALLS else None
            if name:
                level = len(name) - len(name.lstrip("."))
                if level:  # import_module(".x", package="mtad.verify"); without a literal anchor, this package
                    anchor = _literal(node, 1, "package")
                    name = resolve(name[level:], level, anchor.split(".") if anchor else package)
                out.append((node.lineno, resolve(name)))
    return sorted(set(out))


def sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in SCANNED for p in (root / d).rglob("*.py"))


def problems(path: Path, source: str | None = None, root: Path = ROOT) -> list[str]:
    """Each import of ``path`` (its text, or ``source``) that breaks a rule, one line each."""
    name = module_name(path, root)
    here, shown = package_of(name), path.relative_to(root)
    if here is None:
        return [] if name in ("mtad", "eval") else [f"{shown}: in no layer; add its package to RANK"]
    bad = []
    for line, mod in imports(path, source, root):
        if not mod.startswith(("mtad.", "eval.", "bench.")) and mod not in ("mtad", "eval", "bench"):
            continue  # a third-party or standard-library module
        there = package_of(mod)
        if there is None:
            bad.append(f"{shown}:{line} imports {mod}, which is in no layer")
        elif there != here and RANK[there] >= RANK[here]:
            bad.append(f"{shown}:{line} ({here}, rank {RANK[here]}) imports {mod} ({there}, rank {RANK[there]})")
        elif here == there == "mtad.decoders" and mod not in (name, DECODER_BASE, "mtad.decoders"):
            bad.append(f"{shown}:{line} imports the decoder module {mod}: decoders do not know one "
                       f"another; share code through {DECODER_BASE} or a lower layer")
    return bad


def violations(files: list[Path], root: Path = ROOT) -> list[str]:
    return [p for path in files for p in problems(path, root=root)]


def test_every_package_is_in_a_layer():
    pkgs = {module_name(p.parent) for p in ROOT.glob("mtad/*/__init__.py")}
    assert pkgs <= set(RANK), f"packages without a rank: {sorted(pkgs - set(RANK))}"
    assert not [p.name for p in ROOT.glob("mtad/*.py") if p.name != "__init__.py"], \
        "modules directly under mtad/: put each in its layer's package"
    assert {p.parent.name for p in sources()} >= {"bench", "decoders"}  # the scan reaches them


def test_imports_only_go_down():
    bad = violations(sources())
    assert not bad, "imports that break the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("src, pkg, ok", [
    ("from mtad.run.results import store\n", "mtad/core/x.py", False),  # up
    ("from mtad.verify import multidraft\n", "mtad/propose/x.py", False),  # sideways
    ("def f():\n    from mtad.analysis import claims\n", "mtad/run/x.py", False),  # lazy, still up
    ("from mtad import stats\n", "mtad/verify/x.py", False),  # from mtad import <no layer>
    ("from ..core import sampling\n", "mtad/verify/x.py", True),  # relative, down
    ("from mtad.core.sampling import Support\n", "mtad/decoders/x.py", True),
    # import_module / __import__ / runpy.run_module with a literal name
    ("import importlib\nm = importlib.import_module('mtad.run.results')\n", "mtad/core/x.py", False),
    ("from importlib import import_module\ndef f():\n    return import_module('mtad.analysis.claims')\n",
     "mtad/run/x.py", False),
    ("m = __import__('mtad.run.config')\n", "mtad/models/x.py", False),
    ("import importlib\nm = importlib.import_module('.multidraft', package='mtad.verify')\n",
     "mtad/propose/x.py", False),  # relative, with its anchor
    ("import importlib\nm = importlib.import_module('..verify.multidraft', __package__)\n",
     "mtad/propose/x.py", False),  # relative to this module's package
    ("import runpy\nrunpy.run_module('mtad.analysis.render')\n", "mtad/run/x.py", False),
    ("import importlib\nm = importlib.import_module('mtad.core.sampling')\n", "mtad/verify/x.py", True),
    ("import importlib\nm = importlib.import_module(name)\n", "mtad/core/x.py", True),  # not knowable here
    # a decoder importing another decoder; the composition base is allowed
    ("from mtad.decoders.spd import SpD\n", "mtad/decoders/x.py", False),
    ("from . import mcns\n", "mtad/decoders/x.py", False),
    ("from .typical import Typical\n", "mtad/decoders/x.py", False),
    ("from mtad.decoders import spd\n", "mtad/decoders/compose.py", False),  # the base knows no decoder
    ("import importlib\nimportlib.import_module('mtad.decoders.mcss')\n", "mtad/decoders/x.py", False),
    ("from mtad.decoders.compose import Composition\n", "mtad/decoders/x.py", True),
    ("from mtad.decoders import compose\n", "mtad/decoders/x.py", True),
    ("from .compose import Composition\n", "mtad/decoders/x.py", True),
    ("from mtad.decoders.spd import SpD\n", "mtad/run/x.py", True),  # other layers may know decoders
    # bench: above everything, imported by nothing
    ("import bench.speed\n", "mtad/run/x.py", False),
    ("from bench import overhead\n", "eval/x.py", False),
    ("def f():\n    from bench.speed import parse_decoder\n", "mtad/testing/x.py", False),
    ("import importlib\nimportlib.import_module('bench.gpu_check')\n", "mtad/run/x.py", False),
    ("from mtad.run.cli import load_decoder\nfrom mtad.testing.devicecheck import virtual_pair\n",
     "bench/x.py", True),
    ("from speed import parse_task\nimport gpu_check\n", "bench/x.py", True),  # sibling scripts
    ("from eval.rouge_l import RougeLScorer\n", "bench/x.py", True),
])
def test_the_checker_catches_what_it_should(src, pkg, ok):
    assert (not problems(ROOT / pkg, src)) is ok, problems(ROOT / pkg, src)


def test_planted_violations_in_a_copy_of_the_tree_are_caught(tmp_path):
    """The scan itself (every file of mtad/, eval/, bench/), on a copy of the tree with one
    violating file planted per rule: each is reported, and the copy passes without them."""
    for d in SCANNED:
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(sources(tmp_path), tmp_path) == []
    planted = {
        "mtad/core/dynamic.py": "import importlib\nimportlib.import_module('mtad.run.results')\n",
        "mtad/models/dunder.py": "def f():\n    return __import__('mtad.tasks.base')\n",
        "mtad/decoders/sibling.py": "from mtad.decoders.spd import SpD\n",
        "mtad/run/uses_bench.py": "from bench.speed import parse_decoder\n",
    }
    for rel, src in planted.items():
        (tmp_path / rel).write_text(src)
    found = violations(sources(tmp_path), tmp_path)
    assert len(found) == len(planted), found
    for rel in planted:
        assert any(f.startswith(rel + ":") for f in found), (rel, found)


# ------------------------------------------------------------ one way inside a package
def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines of ``if TYPE_CHECKING:`` bodies: imports there are never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports when run (lazy imports included; those under
    ``if TYPE_CHECKING:`` and of its own enclosing packages, which are loaded first, left out)."""
    files = {module_name(p, root): p for p in sorted((root / package.replace(".", "/")).rglob("*.py"))}
    graph = {}
    for mod, path in files.items():
        parents = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        skip = _type_checking_lines(ast.parse(path.read_text(encoding="utf-8")))
        graph[mod] = {m for line, m in imports(path, root=root)
                      if m in files and m != mod and m not in parents and line not in skip}
    return graph


def import_cycles(package: str, root: Path = ROOT) -> list[list[str]]:
    """The groups of modules of ``package`` that import one another in a circle (Tarjan's strongly
    connected components of more than one module)."""
    graph = import_graph(package, root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_core_modules_import_one_another_one_way():
    """No circle inside ``mtad/core`` (the runner imports the stack checks; the stack's probe gets
    the runner class as an argument)."""
    assert import_cycles("mtad.core") == []


def test_the_cycle_check_catches_a_lazy_circle(tmp_path):
    core = tmp_path / "mtad" / "core"
    core.mkdir(parents=True)
    (tmp_path / "mtad" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "a.py").write_text("from mtad.core import b\n")
    (core / "b.py").write_text("def f():\n    from mtad.core.c import g\n")
    (core / "c.py").write_text("import mtad.core.a\n")
    (core / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mtad.core.e import E\n")
    (core / "e.py").write_text("from mtad.core.d import D\n")  # a circle only for the type checker
    assert import_cycles("mtad.core", tmp_path) == [["mtad.core.a", "mtad.core.b", "mtad.core.c"]]


def test_no_code_under_results():
    """results/ holds records; the scripts that made them live in bench/ (or are named, with the
    commit to ``git show`` them from, in the record)."""
    code = [p.relative_to(ROOT) for p in (ROOT / "results").rglob("*")
            if p.suffix in (".py", ".sh", ".ipynb") and p.is_file()]
    assert not code, f"code under results/: {code}"
