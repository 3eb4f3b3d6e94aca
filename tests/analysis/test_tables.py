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
