"""Progress: one bar per process on a terminal, a log line per finished unit without one."""

from __future__ import annotations

import io
import logging

import pytest

from mtad.run.progress import Progress


class Stderr(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def stderr(monkeypatch):
    def install(tty):
        err = Stderr(tty)
        monkeypatch.setattr("sys.stderr", err)
        return err

    return install


def test_without_a_terminal_one_log_line_per_finished_unit_and_no_escape_codes(stderr, caplog):
    err = stderr(tty=False)
    caplog.set_level(logging.INFO)
    with Progress(3, "sweep demo", "pt") as outer:
        for i in range(3):
            with Progress(2, "spd/smoke", "ex") as inner:  # a point's examples: silent
                inner.update(1)
                inner.update(1)
            outer.update(1, done=i + 1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"sweep demo: {i}/3 pt (done={i})" for i in (1, 2, 3)]
    assert "\x1b" not in err.getvalue() and "\r" not in err.getvalue()


def test_on_a_terminal_one_bar_per_process(stderr, caplog):
    err = stderr(tty=True)
    caplog.set_level(logging.INFO)
    with Progress(2, "sweep demo", "pt") as outer:
        with Progress(2, "spd/smoke", "ex") as inner:
            inner.update(2)
        outer.update(2)
    shown = err.getvalue()
    assert "sweep demo" in shown and "spd/smoke" not in shown
    assert not caplog.records
    with Progress(1, "spd/smoke", "ex") as alone:  # a single run: its examples are the bar
        alone.update(1)
    assert "spd/smoke" in err.getvalue()


def test_a_disabled_progress_leaves_the_bar_to_the_next(stderr, caplog):
    err = stderr(tty=False)
    caplog.set_level(logging.INFO)
    with Progress(1, "sweep demo", "pt", enabled=False) as outer:  # e.g. a launcher job
        with Progress(2, "spd/smoke", "ex") as inner:
            inner.update(1)
            inner.update(1)
        outer.update(1)
    assert [r.getMessage() for r in caplog.records] == ["spd/smoke: 1/2 ex", "spd/smoke: 2/2 ex"]
    assert err.getvalue() == ""


def test_a_bar_left_open_by_an_exception_does_not_silence_the_next(stderr, caplog):
    stderr(tty=False)
    caplog.set_level(logging.INFO)

    def failing_run():
        bar = Progress(2, "failing", "ex")
        raise RuntimeError("generation failed")
        bar.close()  # unreachable, as in a run that raises mid-way

    with pytest.raises(RuntimeError):
        failing_run()
    with Progress(1, "next", "ex") as bar:
        bar.update(1)
    assert [r.getMessage() for r in caplog.records] == ["next: 1/1 ex"]
