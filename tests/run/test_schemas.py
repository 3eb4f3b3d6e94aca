"""The config schemas (mtad.run.config): one per decoder class, in Hydra's ConfigStore; checked
against, never merged into, the composed config; the command line expanded by Hydra's sweeper."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from mtad.run.cli import check_jobs, check_overrides, compose_config, expand, group_options
from mtad.run.config import (
    KNOBS,
    ConfigError,
    decoder_knobs,
    decoder_schema,
    rule_for,
    validate,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


def _decoder(name: str):
    return compose_config([f"decoder={name}"], drop=("task", "model", "logger"))


@pytest.mark.parametrize("name", group_options("decoder"))
def test_the_composed_decoder_node_is_its_yaml_untouched(name):
    """A point's identity hashes the decoder node: no schema field (default or type) enters it."""
    from mtad.run.cli import load_decoder
    from mtad.testing import sampling_overrides

    cfg = compose_config([f"decoder={name}", *sampling_overrides(load_decoder(name))],
                         drop=("task", "model", "logger"))
    validate(cfg)
    assert OmegaConf.get_type(cfg.decoder) is dict
    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "decoder" / f"{name}.yaml"))
    assert OmegaConf.to_container(cfg.decoder, resolve=False) == yaml


def _yaml(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "decoder" / f"{name}.yaml"), resolve=False)


@pytest.mark.parametrize("name", group_options("decoder"))
def test_a_schema_is_derived_from_what_its_class_and_pieces_declare(name):
    """The schema's fields are the class's fields (its own knobs, or its pieces'), with the
    declared rules; it is stored in Hydra's ConfigStore; the built decoder takes exactly those."""
    from hydra.utils import get_class

    from mtad.run.cli import load_decoder

    node = _yaml(name)
    cls = get_class(node["_target_"])
    schema = decoder_schema(node)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.name not in ("_target_", "name")}
    declared = cls.fields(node)
    assert list(fields) == list(declared)
    assert all(fields[n].metadata["rule"] == k.rule for n, k in declared.items())
    store = ConfigStore.instance()
    assert any(OmegaConf.get_type(store.load(f"schema/decoder/{n}").node) is schema
               for n in store.list("schema/decoder"))
    dec = load_decoder(name)
    assert all(hasattr(dec, n) for n in declared)


@pytest.mark.parametrize("name", group_options("decoder"))
def test_knob_fields_interpolate_their_knob_and_every_field_has_a_rule(name):
    for f in dataclasses.fields(decoder_schema(_yaml(name))):
        if f.metadata.get("knob"):
            assert f.name in KNOBS and f.metadata["knob"] == f.name and f.default == f"${{{f.name}}}"
        assert f.name in ("_target_", "name") or f.metadata.get("rule") is not None, f.name


def test_knobs_come_from_the_schema():
    assert decoder_knobs(_decoder("tree_mtad").decoder) == ["gamma", "tau", "width"]
    assert decoder_knobs(_decoder("specinfer").decoder) == []
    # a knob given as the decoder's own value still belongs to the decoder
    cfg = compose_config(["decoder=spd", "decoder.gamma=3"], drop=("task", "model", "logger"))
    assert decoder_knobs(cfg.decoder) == ["gamma"]
    check_overrides(["decoder=spd", "decoder.gamma=3", "gamma=5", "model=tiny_random"])


def test_a_decoder_class_without_a_schema_is_refused():
    cfg = _decoder("spd")
    cfg.decoder._target_ = "mtad.decoders.spd.Unknown"
    with pytest.raises(ConfigError, match="has no schema"):
        validate(cfg)
    with pytest.raises(ConfigError, match="has no schema"):
        decoder_schema(cfg.decoder)


def test_an_added_decoder_key_is_refused_with_did_you_mean(capsys):
    with pytest.raises(SystemExit):
        check_overrides(["decoder=spd", "+decoder.gama=3", "model=tiny_random"])
    err = capsys.readouterr().err
    assert "unknown key 'decoder.gama'; did you mean 'gamma'?" in err and len(err.strip().splitlines()) == 1


def test_auto_only_where_the_decoder_takes_it(capsys):
    check_overrides(["decoder=tree_mtad", "gamma=auto", "width=auto", "model=tiny_random"])
    with pytest.raises(SystemExit):
        check_overrides(["decoder=spectr", "gamma=auto", "model=tiny_random"])
    err = capsys.readouterr().err
    assert "decoder.gamma must be an integer >= 1 (draft tokens per step), got 'auto'" in err
    assert rule_for("decoder.gamma", {"_target_": "mtad.decoders.spd.SpD"}).special == ("auto",)


def test_every_job_is_composed_once_and_checked():
    jobs = expand(["decoder=spd,mtad", "gamma=2,3", "model=tiny_random"])
    cfgs = check_jobs(jobs)
    assert [(c.decoder._target_.rsplit(".", 1)[1], c.decoder.gamma) for c in cfgs] == [
        ("SpD", 2), ("SpD", 3), ("MTAD", 2), ("MTAD", 3)]
    with pytest.raises(ConfigError, match=r"^gamma must be .*\[job: decoder=spd gamma=0 model=tiny_random\]$"):
        check_jobs(expand(["decoder=spd,mtad", "gamma=2,0", "model=tiny_random"]))


def test_sweeps_other_sweepers_take_are_refused_in_one_line(capsys):
    for argv in (["-m", "decoder=interval(1,2)"], ["-m", "seed=glob(*)"]):
        with pytest.raises(SystemExit) as e:
            check_overrides(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
