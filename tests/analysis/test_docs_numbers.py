"""Numbers the docs state about the committed records are the records' own: a test fails when
the records change and the sentence does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _examples(folder: Path) -> int:
    return len({json.loads(x)["example_id"] for x in (folder / "samples.jsonl").read_text().splitlines()})


def test_claims_docs_state_how_many_examples_bilds_points_hold():
    """docs/claims.md: "BiLD on N": N is the number of examples every BiLD claims point holds."""
    text = (ROOT / "docs" / "claims.md").read_text()
    stated = {int(n) for n in re.findall(r"BiLD on (\d+)", text)}
    assert stated, "docs/claims.md no longer says how many examples BiLD's points hold"
    held = set()
    for summary in (ROOT / "results" / "claims").glob("*/*/summary.json"):
        if json.loads(summary.read_text()).get("decoder") == "bild_sampling":
            held.add(_examples(summary.parent))
    assert held and stated == held, f"docs/claims.md says BiLD on {sorted(stated)}, its points hold {sorted(held)}"
