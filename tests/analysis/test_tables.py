"""mtad.analysis.tables: the settings line under a table's title."""

import math

import pandas as pd

from mtad.analysis.tables import settings_line


def test_settings_line_prints_integral_floats_as_integers():
    # pandas stores a numeric column with a missing value as float: 10 -> 10.0
    df = pd.DataFrame({"temperature": [1.0, 1.0, math.nan], "top_k": [10.0, 10.0, math.nan],
                       "top_p": [0.9, 0.9, 0.9], "max_new_tokens": [128.0, 128.0, math.nan],
                       "seed": [42, 42, 42]})
    line = settings_line(df)
    assert line == "T=1, top-k 10, top-p 0.9, new tokens 128, seed 42", line


def test_settings_line_leaves_out_a_setting_that_differs():
    df = pd.DataFrame({"temperature": [1.0, 0.0], "top_k": [10, 10]})
    assert settings_line(df) == "top-k 10"


def test_notes_name_partial_points():
    """A point the sweep index calls partial (fewer examples than it asks for) renders with the
    n it has and a note naming it; finished points get no such note."""
    from mtad.analysis.tables import notes

    df = pd.DataFrame({
        "pair": ["p", "p", "p"], "task": ["spider", "spider", "humaneval"],
        "decoder": ["bild_sampling", "spd", "bild_sampling"],
        "label": ["bild_sampling", "spd", "bild_sampling"],
        "status": ["done", "done", "done"], "reason": [None, None, None],
        "indexed_status": ["partial", "done", None],
        "tokens_per_s": [1.0, 2.0, 3.0], "speedup_multinomial": [1.0] * 3, "speedup_spd": [1.0] * 3,
    })
    part = [n for n in notes(df) if n.startswith("partial")]
    assert part == ["partial (spider: bild_sampling): fewer examples than the point asks for (n shows "
                    "how many); the next run of the sweep completes them in place"], notes(df)
    assert not [n for n in notes(df.assign(indexed_status="done")) if n.startswith("partial")]
