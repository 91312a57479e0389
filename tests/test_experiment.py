"""Experiment files: loading, validation messages, ``--set`` overrides, TOML round trips, and the
generated reference in docs/ staying in sync with the code."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import ClassVar

import pytest
from rlpar.agents.a3c import A3C

import rlpar
from rlpar.app.experiment import (
    LogConfig,
    apply_overrides,
    experiment_from_dict,
    load_experiment,
    parse_override,
    to_toml,
    tomllib,  # the stdlib's, or tomli before Python 3.11
)
from rlpar.app.reference import (
    DOCUMENTS,
    SECTIONS,
    agent_reference,
    config_reference,
    describe,
    flat_keys,
    format_agents,
    main,
    render_sections,
    sections_in,
)

ROOT = Path(__file__).resolve().parent.parent
IMPALA = ROOT / "experiments" / "cartpole_impala.toml"


def write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_cartpole_experiment_loads_with_every_default_filled_in() -> None:
    exp = load_experiment(IMPALA)
    assert exp.name == "cartpole_impala"
    assert exp.env.id == "CartPole-v1"
    assert exp.agent_name == "impala"
    assert exp.agent.optim.lr == 0.003 and exp.agent.optim.name == "adam"
    assert exp.agent.net.hidden == (64, 64)
    assert exp.runtime.target_return == 475.0
    assert exp.log == LogConfig()
    resolved = exp.to_dict()
    assert set(resolved) == {"name", "env", "agent", "runtime", "eval", "log"}
    assert resolved["agent"]["name"] == "impala"
    assert resolved["runtime"]["max_policy_lag"] is None


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.toml")), ids=str)
def test_every_shipped_experiment_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    exp = load_experiment(path)
    again = load_experiment(write(tmp_path, to_toml(exp.to_dict())))
    assert again == exp
    exp.make_agent().check_runtime(exp.runtime)  # e.g. APPO's minibatches divide the batch


def test_the_resolved_toml_keeps_none_and_non_defaults(tmp_path: Path) -> None:
    exp = load_experiment(
        IMPALA,
        [
            "runtime.checkpoint_interval_s=none",
            "runtime.max_policy_lag=3",
            "env.kwargs.max_episode_steps=100",
        ],
    )
    text = to_toml(exp.to_dict())
    assert 'checkpoint_interval_s = "none"' in text
    again = load_experiment(write(tmp_path, text))
    assert again.runtime.checkpoint_interval_s is None
    assert again.runtime.max_policy_lag == 3
    assert again.env.kwargs == {"max_episode_steps": 100}
    assert again == exp


def test_every_unknown_key_is_named_at_once_with_nested_suggestions(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[agent]\nname = 'impala'\nlr = 0.003\n[agent.optim]\nlrr = 1\n[runtime]\nnum_actor = 2\n",
    )
    with pytest.raises(rlpar.ConfigError) as info:
        load_experiment(path, ["log.logdri=runs"])
    assert str(info.value) == (
        f"{path}: 4 unknown keys:\n"
        "  'agent.lr' (did you mean 'agent.optim.lr'?)\n"
        "  'agent.optim.lrr' (did you mean 'agent.optim.lr'?)\n"
        "  'runtime.num_actor' (did you mean 'runtime.num_actors'?)\n"
        "  'log.logdri' (did you mean 'log.logdir'?), from --set log.logdri=runs"
    )


def test_a_key_of_a_nested_table_given_one_level_up_is_pointed_to_it() -> None:
    with pytest.raises(rlpar.ConfigError, match=r"^unknown key 'agent.lr' \(did you mean "
                       r"'agent.optim.lr'\?\); valid keys: "):  # fmt: skip
        rlpar.make_agent("impala", {"lr": 0.003})
    with pytest.raises(rlpar.ConfigError, match=r"'agent.hiden' \(did you mean 'agent.net.hidden'"):
        rlpar.make_agent("impala", {"hiden": [64], "lr": 0.1})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("runtme = {}", r"unknown key 'runtme' \(did you mean 'runtime'\?\)"),
        ("[runtime]\nnum_actorz = 2", r"unknown key 'runtime.num_actorz' .*'runtime.num_actors'"),
        ("[log]\nlogdri = 'x'", r"unknown key 'log.logdri' \(did you mean 'log.logdir'\?\)"),
        ("[agent]\nname = 'impala'\nentropy_cots = 0.1", r"'agent.entropy_cots'.*entropy_cost"),
        (
            "[agent]\nname = 'impala'\n[agent.optim]\nlrr = 1",
            r"'agent.optim.lrr'.*'agent.optim.lr'",
        ),
        ("[agent]\nname = 'impalla'", r"agent.name: unknown agent 'impalla' .*'impala'"),
        ("[agent]\ngamma = 0.9", r"agent.name: required; registered agents: .*impala"),
        ("[runtime]\nnum_actors = 'two'", r"runtime.num_actors: expected an integer, got 'two'"),
        ("[runtime]\nnum_actors = 0", r"runtime.num_actors: expected an integer >= 1, got 0"),
        ("[runtime]\nseed = 'none'", r"runtime.seed: expected an integer, got 'none'"),
        (
            "[runtime]\nnum_actors = 1\nbatch_rollouts = 4",  # 2 buffers: no batch of 4, ever
            r"runtime.buffers_per_actor: expected at least ceil\(batch_rollouts / num_actors\) = 4",
        ),
        ("[runtime]\ntarget_return = true", r"runtime.target_return: expected float \| None"),
        ("[agent]\nname = 'impala'\ngamma = 1.5", r"agent.gamma: expected a number in \[0, 1\]"),
        ("[agent]\nname='a3c'\n[agent.net]\nactivation='gelu'", r"agent.net.activation: .*'gelu'"),
        ("[log]\nscalar_interval_s = 0", r"log.scalar_interval_s: expected a number > 0, got 0"),
        ("[log]\nhistogram_interval = -1", r"log.histogram_interval: .*>= 0, got -1"),
        ("env = 3", r"env: expected a table \(\[env\]\), got 3"),
        ("name = '../x'", r"name: expected a name usable as a folder"),
        ("[runtime\n", r"not valid TOML"),
    ],
)
def test_bad_files_name_the_key_the_expectation_and_the_value(
    tmp_path: Path, text: str, message: str
) -> None:
    if "[agent]" not in text:
        text += "\n[agent]\nname = 'impala'\n"
    path = write(tmp_path, text)
    with pytest.raises(rlpar.ConfigError, match=message) as info:
        load_experiment(path)
    assert str(info.value).startswith(str(path))


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(rlpar.ConfigError, match="no such experiment file"):
        load_experiment(tmp_path / "nope.toml")


def test_the_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, "[agent]\nname = 'a3c'\n", "my_run.toml")).name == (
        "my_run"
    )


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("runtime.seed=3", ["runtime", "seed"], 3),
        ("agent.optim.lr=1e-3", ["agent", "optim", "lr"], 0.001),
        ("runtime.deterministic=true", ["runtime", "deterministic"], True),
        ("agent.net.hidden=[32, 32]", ["agent", "net", "hidden"], [32, 32]),
        ("env.id=CartPole-v1", ["env", "id"], "CartPole-v1"),
        ('env.id="rlpar/CartPole-v1"', ["env", "id"], "rlpar/CartPole-v1"),
        ("runtime.max_wall_s=none", ["runtime", "max_wall_s"], "none"),
        ("name = spaced ", ["name"], "spaced"),
        ("log.logdir=", ["log", "logdir"], ""),
    ],
)
def test_override_values_are_read_as_toml_else_as_strings(text, path, value) -> None:
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["runtime.seed", "=3", "runtime..seed=3", "run time.seed=1"])
def test_malformed_overrides_are_errors(text: str) -> None:
    with pytest.raises(rlpar.ConfigError, match=r"expected section\.key=value"):
        parse_override(text)


def test_overrides_are_checked_like_the_file() -> None:
    exp = load_experiment(
        IMPALA,
        ["runtime.seed=7", "agent.optim.lr=0.01", "agent.net.hidden=[16]", "runtime.max_wall_s=9"],
    )
    assert exp.runtime.seed == 7 and exp.agent.optim.lr == 0.01
    assert exp.agent.net.hidden == (16,) and exp.runtime.max_wall_s == 9.0
    with pytest.raises(rlpar.ConfigError, match=r"'runtime.sede' \(did you mean 'runtime.seed'"):
        load_experiment(IMPALA, ["runtime.sede=1"])
    with pytest.raises(rlpar.ConfigError, match=r"runtime.seed: expected an integer, got 1.5"):
        load_experiment(IMPALA, ["runtime.seed=1.5"])
    with pytest.raises(rlpar.ConfigError, match=r"'runtime.seed' is a value, not a table"):
        load_experiment(IMPALA, ["runtime.seed.x=1"])
    with pytest.raises(rlpar.ConfigError, match=r"unknown key 'agent.rho_bar'"):
        load_experiment(IMPALA, ["agent.rho_bar=2.0", "agent.name=a3c"])  # IMPALA's key


@dataclasses.dataclass(frozen=True)
class _RenamedConfig(A3C.Config):  # type: ignore[name-defined]
    renamed_keys: ClassVar[dict[str, str]] = {
        "value_coef": "baseline_cost",
        "entropy_coef": "entropy_cost",
    }


class _Renamed(A3C):
    """A3C with a config that renamed two keys (a plug-in's `renamed_keys`)."""

    Config = _RenamedConfig


def test_an_old_key_name_still_reads_with_warnings_naming_the_new(
    tmp_path, caplog, monkeypatch
) -> None:
    """A config's ``renamed_keys``: value_coef and entropy_coef read as baseline_cost and
    entropy_cost, with warnings naming the new keys."""
    rlpar.register_agent("a3c-renamed", _Renamed, overwrite=True)
    path = write(
        tmp_path, "[agent]\nname = 'a3c-renamed'\nentropy_coef = 0.05\nvalue_coef = 0.25\n"
    )
    with caplog.at_level("WARNING", logger="rlpar"), pytest.warns(DeprecationWarning) as seen:
        exp = load_experiment(path)
    for old, new in (("entropy_coef", "entropy_cost"), ("value_coef", "baseline_cost")):
        message = f"'agent.{old}' is deprecated: it is now 'agent.{new}' (same meaning)"
        assert message in caplog.text and message in [str(w.message) for w in seen]
    assert exp.agent.entropy_cost == 0.05 and exp.agent.baseline_cost == 0.25
    assert "entropy_coef" not in exp.to_dict()["agent"]  # a run saves the new names
    assert load_experiment(IMPALA, ["agent.name=a3c-renamed"]).agent.entropy_cost == 0.01
    with pytest.warns(DeprecationWarning, match="is deprecated: it is now"):
        assert load_experiment(path, ["agent.entropy_coef=0.5"]).agent.entropy_cost == 0.5
    both = "[agent]\nname = 'a3c-renamed'\nentropy_coef = 0.1\nentropy_cost = 0.1\n"
    both = write(tmp_path, both)
    with pytest.raises(rlpar.ConfigError, match=r"'agent\.entropy_coef' is the old name of 'agent"):
        load_experiment(both)
    with pytest.warns(DeprecationWarning, match="it is now 'agent.baseline_cost'"):
        agent = rlpar.make_agent("a3c-renamed", {"value_coef": 0.25})
    assert agent.loss_options == rlpar.LossOptions(baseline_cost=0.25)


def test_apply_overrides_does_not_touch_its_input() -> None:
    data = {"runtime": {"seed": 1}}
    assert apply_overrides(data, ["runtime.seed=2"]) == {"runtime": {"seed": 2}}
    assert data == {"runtime": {"seed": 1}}


def test_a_checkpoint_config_with_json_lists_validates() -> None:
    exp = load_experiment(IMPALA)
    data = exp.to_dict()
    data["agent"]["net"]["conv"] = [[16, 3, 1]]  # JSON has no tuples
    assert experiment_from_dict(data) == exp


def test_to_toml_round_trips_plain_data() -> None:
    data = {
        "name": "x",
        "a": {"s": 'q"uote\\ \n tab\t é 😀', "i": 123_456, "f": 1e-5, "neg": -2.5, "b": False},
        "b": {"lst": [[1, 2], [3]], "empty": {}, "nested": {"deep": {"k": "v"}}},
        "c": {"inf": math.inf, "odd key": 1, "inline": [{"x": 1}]},
    }
    back = tomllib.loads(to_toml(data))
    assert back == data
    assert math.isnan(tomllib.loads(to_toml({"x": math.nan}))["x"])
    assert tomllib.loads(to_toml({"t": {"x": None}})) == {"t": {"x": "none"}}
    with pytest.raises(TypeError, match="cannot write"):
        to_toml({"x": object()})


def test_every_config_key_has_a_docstring() -> None:
    classes = [rlpar.EnvConfig, rlpar.RuntimeConfig, LogConfig]
    classes += [entry.config for entry in rlpar.registered_agents().values()]
    for cls in classes:
        for key in flat_keys(cls):
            assert key.doc, f"{cls.__name__}.{key.name} has no docstring (docs/config.md needs one)"


def test_describe_reports_types_and_defaults() -> None:
    rows = {r.name: r for r in describe(rlpar.RuntimeConfig)}
    assert rows["num_actors"].type == "int" and rows["num_actors"].default == 2
    assert rows["max_policy_lag"].type == "int or none"
    assert rows["target_return"].type == "float or none"
    net = {r.name: r for r in flat_keys(rlpar.registered_agents()["impala"].config)}
    assert net["net.hidden"].type == "list of int"
    assert net["net.conv"].type == "list of [int, int, int]"


@pytest.mark.parametrize(("document", "names"), DOCUMENTS.items())
def test_the_generated_doc_sections_match_the_code(document: str, names: tuple[str]) -> None:
    text = (ROOT / document).read_text()
    assert sections_in(text) == list(names)  # each section in one place, where it belongs
    assert render_sections(text, names) == text, (
        f"{document}'s generated sections are stale: run "
        f"`python -P -m rlpar.app.reference {' '.join(DOCUMENTS)}`"
    )


def test_every_generated_section_lives_in_a_document() -> None:
    placed = [name for names in DOCUMENTS.values() for name in names]
    assert sorted(placed) == sorted(SECTIONS)
    reference = config_reference()
    for cls in (rlpar.EnvConfig, rlpar.RuntimeConfig, rlpar.EvalConfig, LogConfig):
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in reference


def test_the_reference_generator_rewrites_a_document_and_refuses_one_without_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "tags.md"
    markers = "<!-- tensorboard-tags:begin -->\nOLD BODY\n<!-- tensorboard-tags:end -->\n"
    doc.write_text("before\n" + markers)
    assert main([str(doc)]) == 0
    text = doc.read_text()
    assert "OLD BODY" not in text and "| `return/mean` |" in text and text.startswith("before\n")
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert main([str(plain)]) == 1
    assert "holds none of the generated sections" in capsys.readouterr().err
    assert plain.read_text() == "no markers\n"
    with pytest.raises(ValueError, match="config-reference:begin/end"):
        render_sections("no markers", ["config-reference"])


def test_agent_reference_lists_every_key_with_default() -> None:
    agents = agent_reference()
    assert {"impala", "a3c"} <= set(agents)
    impala = agents["impala"]
    assert impala["source"] == "built-in"
    assert impala["keys"]["optim.lr"]["default"] == 0.001
    assert impala["keys"]["net.hidden"]["default"] == [64, 64]
    text = format_agents(agents)
    assert "impala  (built-in: rlpar.agents.impala.Impala)" in text
    assert "optim.lr" in text and "Learning rate." in text
