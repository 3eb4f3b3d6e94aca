"""``bench/transfers.py --host-work``: random numbers and bytes copied to the device per step,
both draw schemes side by side, as a section of the transfers record (seconds, tiny pair)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import pytest  # noqa: E402
import transfers  # noqa: E402


@pytest.mark.slow  # a race draw over 5,000 entries per child on virtual devices: ~20 s on a quiet CPU
def test_host_work_counts_random_numbers_and_bytes_per_step(tmp_path):
    out = tmp_path / "transfers"
    out.with_suffix(".md").write_text("# the main table\n")
    args = ["--host-work", "--out", str(out), "--vocabs", "5000", "--decoders", "specinfer",
            "--gammas", "2", "--widths", "2", "--tokens", "3"]
    transfers.main(args)
    transfers.main(args)  # the section is replaced, not appended twice
    rows = {r["setting"]: r for r in json.loads((tmp_path / "transfers_host.json").read_text())["rows"]}
    assert set(rows) == set(transfers.HOST_SETTINGS)
    for s in ("1 plain", "1 top-p"):
        # the inverse CDF: a few uniforms a step; the race: about one exponential per entry and draw
        assert rows[s]["words_max"] <= 200 < 2 * 2500 < rows[f"{s} race"]["words_mean"]
        assert rows[s]["h2d_bytes_mean"] < rows[f"{s} race"]["h2d_bytes_mean"]
    md = out.with_suffix(".md").read_text()
    assert md.startswith("# the main table") and md.count(transfers.HOST_BEGIN) == 1
    assert "| 5000 | specinfer | 2 | 2 | 1 plain | inverse cdf |" in md
