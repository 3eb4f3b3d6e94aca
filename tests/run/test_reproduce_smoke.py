"""The Table 2 pipeline end to end on the tiny pair: sweep (every decoder of experiments/table2.yaml's
smoke profile, what `make reproduce-table2 PROFILE=smoke` runs) -> render."""

from pathlib import Path

from mtad.analysis import render
from mtad.run import sweep

ROOT = Path(__file__).resolve().parents[2]


def test_table2_smoke_sweep_and_render(tmp_path):
    rc = sweep.main([str(ROOT / "experiments/table2.yaml"), "--profile", "smoke", "--root", str(tmp_path),
                     "limit=1", "max_new_tokens=4"])
    assert rc == 0
    points = [p for p in (tmp_path / "table2_smoke").iterdir() if (p / "summary.json").exists()]
    assert len(points) >= 8  # one per decoder in the grid
    out = tmp_path / "rendered"
    assert render.main([str(tmp_path / "table2_smoke"), "--out", str(out)]) == 0
    names = {p.name for p in out.rglob("*")}
    assert any(n.endswith(".md") for n in names)
    assert any(n.endswith(".tex") for n in names)
    assert any(n.endswith(".csv") for n in names)
    assert any(n.endswith(".png") for n in names)
    table = next(out.rglob("*.md")).read_text()
    for decoder in ("multinomial", "spd", "mtad", "tree_mtad"):
        assert decoder in table
