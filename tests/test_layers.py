"""The package's layers, and that imports only go down (docs/architecture.md).

Every ``import`` in ``mtad/`` and ``eval/`` (function-level ones included: a lazy import is still
a dependency) is checked against ``RANK``: a module may import from its own package, or from a
package of a strictly lower rank. Packages of equal rank are siblings and may not import each
other (``propose`` does not know ``verify``; ``decoders``, ``models`` and ``tasks`` do not know
one another).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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
}


def package_of(module: str) -> str | None:
    for pkg in sorted(RANK, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_pkg else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod in ("mtad", "eval"):  # from mtad import x: the import is of mtad.x
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


def sources() -> list[Path]:
    return sorted(p for d in ("mtad", "eval") for p in (ROOT / d).rglob("*.py"))


def violations(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        here = package_of(module_name(path))
        if here is None:
            if module_name(path) not in ("mtad", "eval"):
                bad.append(f"{path.relative_to(ROOT)}: in no layer; add its package to RANK")
            continue
        for line, mod in imports(path):
            if not (mod.startswith("mtad") or mod == "eval" or mod.startswith("eval.")):
                continue
            there = package_of(mod)
            if there is None:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}, which is in no layer")
            elif there != here and RANK[there] >= RANK[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({here}, rank {RANK[here]}) imports "
                           f"{mod} ({there}, rank {RANK[there]})")
    return bad


def test_every_package_is_in_a_layer():
    pkgs = {module_name(p.parent) for p in ROOT.glob("mtad/*/__init__.py")}
    assert pkgs <= set(RANK), f"packages without a rank: {sorted(pkgs - set(RANK))}"
    assert not [p.name for p in ROOT.glob("mtad/*.py") if p.name != "__init__.py"], \
        "modules directly under mtad/: put each in its layer's package"


def test_imports_only_go_down():
    bad = violations(sources())
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


@pytest.mark.parametrize("src, pkg, ok", [
    ("from mtad.run.results import store\n", "mtad/core/x.py", False),  # up
    ("from mtad.verify import multidraft\n", "mtad/propose/x.py", False),  # sideways
    ("def f():\n    from mtad.analysis import claims\n", "mtad/run/x.py", False),  # lazy, still up
    ("from mtad import stats\n", "mtad/verify/x.py", False),  # from mtad import <no layer>
    ("from ..core import sampling\n", "mtad/verify/x.py", True),  # relative, down
    ("from mtad.core.sampling import Support\n", "mtad/decoders/x.py", True),
])
def test_the_checker_catches_what_it_should(tmp_path, monkeypatch, src, pkg, ok):
    path = ROOT / pkg
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: src)
    assert (not violations([path])) is ok
