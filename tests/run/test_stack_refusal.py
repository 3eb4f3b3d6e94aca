"""A stack outside the tested range is refused in one line before any model loads: by
``mtad-run`` and ``mtad-sweep`` (exit 2), and by ``mtad.run.evaluate.build`` (a sweep's point)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtad.core import stack

CONF = Path(__file__).resolve().parents[2] / "conf"
OLD = {"torch": "2.10.0", "transformers": "5.24.0"}


@pytest.fixture
def old_stack(monkeypatch):
    monkeypatch.setattr(stack, "installed", lambda: dict(OLD))
    monkeypatch.setattr(stack, "_versions_checked", None)


def _refused_in_one_line(capsys) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: unsupported stack: torch 2.10.0, transformers 5.24.0") and err.count("\n") == 1


def test_mtad_run_refuses_before_reading_its_command_line(old_stack, monkeypatch, capsys, tmp_path):
    import mtad.run.main as main

    monkeypatch.setattr(main, "check_overrides", lambda argv: pytest.fail("the command line was read"))
    monkeypatch.setattr("sys.argv", ["mtad-run", "+experiment=debug", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as e:
        main.cli()
    assert e.value.code == 2
    _refused_in_one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_mtad_sweep_refuses_before_running_a_point(old_stack, monkeypatch, capsys, tmp_path):
    import mtad.run.sweep.cli as sweep_cli

    monkeypatch.setattr(sweep_cli, "run", lambda *a, **k: pytest.fail("a point ran"))
    sweep = Path(__file__).resolve().parents[2] / "experiments" / "table2.yaml"
    with pytest.raises(SystemExit) as e:
        sweep_cli.main([str(sweep), "--profile", "smoke", "--root", str(tmp_path)])
    assert e.value.code == 2
    _refused_in_one_line(capsys)


def test_a_point_is_refused_before_its_models_load(old_stack, monkeypatch):
    from mtad.run import evaluate

    monkeypatch.setattr(evaluate, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=debug"], return_hydra_config=False)
    with pytest.raises(stack.StackError, match="unsupported stack: torch 2.10.0"):
        evaluate.build(cfg)
