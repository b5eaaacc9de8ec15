"""Tests for config.py and the CLI's handling of bad configs (run.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from impala_league import REPO
from impala_league.config import SECTIONS, Config, ConfigError, describe, to_yaml
from impala_league.checked_config import from_yaml_text, load_config

CONFIG_FILES = sorted((REPO / "configs").glob("*.yaml"))
ALL_KEYS = [(s, f) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.learner.batch_size == 32 and cfg.learner.discount == 0.99 and cfg.env.name == "connect_four"
    assert cfg.run.redis_url is None


def test_yaml_values_apply_and_the_rest_stay_default(tmp_path):
    cfg = load_config(write(tmp_path, "run:\n  name: exp1\nlearner:\n  batch_size: 16\n  clip_c_threshold: null\n"
                                      "actor:\n  high_water_mark: 64\nenv:\n  name: tictactoe\n"))
    assert cfg.run.name == "exp1"
    assert cfg.learner.batch_size == 16
    assert cfg.learner.clip_c_threshold is None
    assert cfg.actor.high_water_mark == 64
    assert cfg.env.name == "tictactoe"
    assert cfg.learner.learning_rate == 6e-4 and cfg.actor.unroll_length == 40  # untouched defaults


def test_overrides_apply_with_their_types_and_beat_the_file(tmp_path):
    path = write(tmp_path, "learner:\n  batch_size: 16\n")
    cfg = load_config(path, ["learner.batch_size=64", "learner.learning_rate=1e-3", "learner.mirror_augment=none",
                             "run.redis_url=redis://10.0.0.5:6379/2", "run.max_minutes=2.5", "run.name=42"])
    assert cfg.learner.batch_size == 64 and type(cfg.learner.batch_size) is int
    assert cfg.learner.learning_rate == 0.001 and type(cfg.learner.learning_rate) is float
    assert cfg.learner.mirror_augment == "none"
    assert cfg.run.redis_url == "redis://10.0.0.5:6379/2"
    assert cfg.run.max_minutes == 2.5
    assert cfg.run.name == "42" and type(cfg.run.name) is str


def test_null_clip_thresholds_are_accepted():
    cfg = load_config(None, ["learner.clip_rho_threshold=null", "learner.clip_pg_rho_threshold=null",
                             "learner.clip_c_threshold=null"])
    assert (cfg.learner.clip_rho_threshold, cfg.learner.clip_pg_rho_threshold, cfg.learner.clip_c_threshold) == \
        (None, None, None)


def test_unknown_key_in_yaml_names_it_and_the_closest_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "learner:\n  batch_sise: 3\n"))
    assert "learner.batch_sise" in str(info.value) and "learner.batch_size" in str(info.value)


def test_unknown_key_in_override_names_it_and_the_closest_key():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.batch_sise=3"])
    assert "learner.batch_sise" in str(info.value) and "learner.batch_size" in str(info.value)


@pytest.mark.parametrize("text", ["lerner:\n  batch_size: 3\n", "training:\n  steps: 3\n"])
def test_unknown_section_in_yaml(tmp_path, text):
    with pytest.raises(ConfigError, match=f"unknown config key '{text.split(':')[0]}'"):
        load_config(write(tmp_path, text))


def test_unknown_section_in_override():
    with pytest.raises(ConfigError, match="unknown config key 'lerner.batch_size'; did you mean 'learner.batch_size'"):
        load_config(None, ["lerner.batch_size=3"])


@pytest.mark.parametrize("text, message", [
    ("- learner\n- run\n", "config must be a mapping of sections"),
    ("learner: 3\n", "config section 'learner' must be a mapping"),
])
def test_yaml_of_the_wrong_structure(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent/exp.yaml")


@pytest.mark.parametrize("override", ["learner.batch_size=abc", "learner.batch_size=3.5",
                                      "league.enabled=maybe", "learner.discount=high", "run.name="])
def test_wrong_type_override(override):
    with pytest.raises(ConfigError, match="bad config value"):
        load_config(None, [override])


def test_wrong_type_in_yaml(tmp_path):
    with pytest.raises(ConfigError, match="bad config value.*'abc'"):
        load_config(write(tmp_path, "learner:\n  batch_size: abc\n"))


def test_override_without_equals():
    with pytest.raises(ConfigError, match="override 'learner.batch_size' must look like section.key=value"):
        load_config(None, ["learner.batch_size"])


def test_unknown_env_names_valid_envs_and_the_closest():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["env.name=conect_four"])
    message = str(info.value)
    assert "conect_four" in message and "did you mean 'connect_four'" in message
    assert "valid: connect_four, tictactoe" in message


@pytest.mark.parametrize("overrides, message", [
    (["learner.batch_size=0"], r"learner.batch_size must be in \[1, 4096\]"),
    (["learner.batch_size=4097", "actor.high_water_mark=5000"], r"learner.batch_size must be in \[1, 4096\]"),
    (["learner.discount=1.5"], r"learner.discount must be in \[0, 1\]"),
    (["learner.discount=-0.1"], r"learner.discount must be in \[0, 1\]"),
    (["learner.pg_discount=1.2"], r"learner.pg_discount must be in \[0, 1\] or null \(got 1.2\)"),
    (["actor.high_water_mark=31"], "actor.high_water_mark must be >= learner.batch_size"),
    (["learner.batch_size=300"], "actor.high_water_mark must be >= learner.batch_size"),
    (["learner.clip_rho_threshold=0"], "learner.clip_rho_threshold must be > 0 or null"),
    (["learner.clip_pg_rho_threshold=-1"], "learner.clip_pg_rho_threshold must be > 0 or null"),
    (["learner.clip_c_threshold=0.0"], "learner.clip_c_threshold must be > 0 or null"),
    (["learner.optimizer=sgd"], "learner.optimizer must be adam or rmsprop"),
    (["learner.lambda_=1.01"], r"learner.lambda_ must be in \[0, 1\]"),
    (["actor.unroll_length=0"], r"actor.unroll_length must be in \[1, 10000\] \(got 0\)"),
    (["actor.send_batch=0"], r"actor.send_batch must be in \[1, actor.high_water_mark\]"),
    (["actor.send_batch=257"], r"actor.send_batch must be in \[1, actor.high_water_mark\]"),
    (["actor.send_batch=3"], r"actor.send_batch=3 must divide the 32 fresh unrolls of each batch"),
    (["actor.send_batch=8", "learner.replay_fraction=0.875"], r"must divide the 4 fresh unrolls.*set it to a divisor"),
    (["league.opponent_temperature=-0.5"], r"league.opponent_temperature must be in \[0, 100\]"),
    (["learner.learning_rate=0"], "learner.learning_rate must be > 0"),
    (["learner.mirror_augment=sometimes"], "learner.mirror_augment must be random, both or none \\(got 'sometimes'\\)"),
    (["agent.landing_plane=true", "env.name=tictactoe"], "agent.landing_plane needs agent.torso=conv and a game "
                                                           "whose pieces fall"),
    (["agent.threat_planes=true", "agent.torso=mlp"], "agent.threat_planes needs agent.torso=conv and "
                                                      "env.name=connect_four"),
])
def test_range_checks(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides, message", [
    (["agent.mlp_layers=0"], "agent.mlp_layers must be >= 1"),
    (["agent.hidden=0"], "agent.hidden must be >= 1"),
    (["agent.channels=0"], "agent.channels must be >= 1"),
    (["agent.kernel_size=9", "agent.padding=valid"], "do not fit the 6x7 board of connect_four"),
    (["learner.grad_norm_clip=0"], "learner.grad_norm_clip must be > 0"),
    (["learner.entropy_cost=-1"], "learner.entropy_cost must be >= 0"),
    (["learner.rmsprop_eps=-1"], "learner.rmsprop_eps must be >= 0"),
    (["learner.read_block_ms=0"], r"learner.read_block_ms must be in \[1, 30000\]"),
    (["learner.read_block_ms=600000"], r"learner.read_block_ms must be in \[1, 30000\]"),
    (["learner.checkpoint_every_s=0"], "learner.checkpoint_every_s must be > 0"),
    (["learner.device=banana"], "learner.device must be auto, cpu"),
    (["learner.learning_rate=inf"], "learner.learning_rate must be > 0 and finite"),
    (["learner.entropy_cost=nan"], "learner.entropy_cost must be a number, not nan"),
    (["run.log_every_s=nan"], "run.log_every_s must be a number, not nan"),
    (["run.max_minutes=-1"], "run.max_minutes must be >= 0"),
    (["run.seed=-1"], r"run.seed must be in \[0, 2147483648\)"),
    (["run.name=../outside"], "run.name must be letters, digits"),
    (["run.name=/tmp/abs"], "run.name must be letters, digits"),
    (["actor.num_envs=100000000"], r"actor.num_envs must be in \[1, 4096\]"),
    (["actor.num_actors=100000"], r"actor.num_actors must be in \[1, 256\]"),
    (["actor.unroll_length=10000000"], r"actor.unroll_length must be in \[1, 10000\]"),
    (["actor.num_envs=4096", "actor.unroll_length=5000"], "actor.num_envs \\* actor.unroll_length must be <="),
])
def test_nonsense_values_are_refused_by_name(overrides, message):
    """Values that used to be accepted and then crashed a child process (or silently misbehaved)."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_bad_value_message_names_the_key():
    with pytest.raises(ConfigError, match="bad config value for learner.batch_size: .*'abc'"):
        load_config(None, ["learner.batch_size=abc"])
    with pytest.raises(ConfigError, match="bad config value for run.name"):
        load_config(None, ["run.name="])


def test_without_secrets_drops_the_redis_url():
    from impala_league.config import without_secrets

    cfg = load_config(None, ["run.redis_url=redis://:hunter2@h:1/0"])
    assert "hunter2" not in to_yaml(without_secrets(cfg))
    assert cfg.run.redis_url == "redis://:hunter2@h:1/0"  # the original is untouched


def test_boundary_values_are_accepted():
    cfg = load_config(None, ["learner.discount=1.0", "learner.batch_size=256", "actor.high_water_mark=256",
                             "learner.lambda_=0"])
    assert (cfg.learner.discount, cfg.learner.batch_size, cfg.actor.high_water_mark, cfg.learner.lambda_) == \
        (1.0, 256, 256, 0.0)


def test_yaml_round_trip():
    cfg = load_config(None, ["learner.batch_size=64", "learner.clip_rho_threshold=null", "run.name=rt",
                             "run.redis_url=redis://h:1/0", "learner.learning_rate=0.00031", "env.name=tictactoe",
                             "learner.mirror_augment=none"])
    text = to_yaml(cfg)
    assert "batch_size: 64" in text
    again = from_yaml_text(text)
    assert again == cfg
    assert again.learner.clip_rho_threshold is None and again.learner.learning_rate == 0.00031


def test_from_yaml_text_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="learner.batch_size"):
        from_yaml_text("learner:\n  batch_sise: 3\n")


def test_describe_lists_every_key_with_its_help_and_default():
    lines = {line.split()[0]: line for line in describe().splitlines()}
    assert len(lines) == len(ALL_KEYS)
    for section, f in ALL_KEYS:
        line = lines[f"{section}.{f.name}"]
        assert f.metadata["help"] in line
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert f"= {default!s}" in line


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_every_shipped_config_loads_with_its_values(path):
    cfg = load_config(path)
    raw = yaml.safe_load(path.read_text())
    for section, values in raw.items():
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"


def test_shipped_configs_exist():
    assert {p.name for p in CONFIG_FILES} >= {"connect_four.yaml", "tictactoe.yaml"}


# -- bugs -------------------------------------------------------------------------------------------

def test_malformed_yaml_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, "learner: [\n"))


def test_yaml_syntax_errors_give_the_line_and_column(tmp_path):
    path = write(tmp_path, "run:\n  seed: 3\n  name: [a\n  total_agent_steps: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}, line 4, column 20: not valid YAML: did not find expected ',' or ']'")


@pytest.mark.parametrize("text, message", [
    ("run:\n  seed: 3\nactor:\n  num_envz: 4\n", ", line 4, column 3: unknown config key 'actor.num_envz'; "
     "did you mean 'actor.num_envs'?"),
    ("run:\n  seed: 3\nactor:\n    num_envs: many\n", ", line 4, column 5: bad config value for actor.num_envs"),
    ("run:\n  seed: 3\n  total_agent_steps: 1.5\n", ", line 3, column 3: bad config value for run.total_agent_steps"),
])
def test_bad_keys_and_values_in_a_file_give_their_line_and_column(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}{message}")


@pytest.mark.parametrize("value", ["1e6", "1E6", "1.0e6", "1e+6", "1000000.0"])
def test_integral_floats_are_accepted_for_integer_fields(tmp_path, value):
    """YAML reads 1e6 as a float; an integer field takes it as the integer it is."""
    from_file = load_config(write(tmp_path, f"run:\n  total_agent_steps: {value}\n"))
    from_set = load_config(None, [f"run.total_agent_steps={value}"])
    assert from_file.run.total_agent_steps == from_set.run.total_agent_steps == 1_000_000
    assert type(from_file.run.total_agent_steps) is int and type(from_set.run.total_agent_steps) is int
    assert from_yaml_text(f"run:\n  total_agent_steps: {value}\n").run.total_agent_steps == 1_000_000


def test_fractions_for_integer_fields_are_still_refused(tmp_path):
    for value in ("1.5", "2.5e0"):
        with pytest.raises(ConfigError, match="run.total_agent_steps"):
            load_config(None, [f"run.total_agent_steps={value}"])
        with pytest.raises(ConfigError, match="run.total_agent_steps"):
            load_config(write(tmp_path, f"run:\n  total_agent_steps: {value}\n"))
    with pytest.raises(ConfigError, match="out of range"):
        load_config(None, ["run.total_agent_steps=1e30"])
    assert load_config(None, ["learner.learning_rate=1e-3"]).learner.learning_rate == 0.001  # floats stay floats
    assert type(load_config(None, ["run.max_minutes=2"]).run.max_minutes) is float


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"run:\n  name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(path)


def test_from_yaml_text_wrong_type_is_a_config_error():
    with pytest.raises(ConfigError):
        from_yaml_text("learner:\n  batch_size: abc\n")


# -- CLI --------------------------------------------------------------------------------------------

COMMANDS = {
    "train typo": ["train", "--config", str(REPO / "configs/connect_four.yaml"), "--set", "learner.batch_sise=3"],
    "help-config": ["train", "--help-config"],
    "train no config": ["train", "--set", "run.total_agent_steps=100"],
    "actor no redis": ["actor", "--redis-url", "redis://127.0.0.1:1/0", "--config",
                       str(REPO / "configs/connect_four.yaml")],
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Runs the three commands at once (each pays torch's import time) in empty working directories.

    Returns name -> (returncode, stdout, stderr, seconds, working directory).
    """
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    procs = {}
    for name, args in COMMANDS.items():
        cwd = tmp_path_factory.mktemp(name.replace(" ", "_"))
        procs[name] = (subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                       time.monotonic(), cwd)
    results = {}
    for name, (proc, start, cwd) in procs.items():
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[name] = (proc.returncode, out, err, time.monotonic() - start, cwd)
    return results


def test_cli_unknown_key_exits_2_and_starts_nothing(cli):
    code, out, err, seconds, cwd = cli["train typo"]
    assert code == 2, err
    assert "learner.batch_size" in err and "learner.batch_sise" in err
    assert err.startswith("error: ")
    assert "Traceback" not in err + out
    assert list(cwd.iterdir()) == []  # no run directory, no config.yaml written
    assert seconds < 30  # a few seconds of imports, not a training run (loose: the CPU may be busy)


def test_cli_train_without_a_config_is_refused_and_starts_nothing(cli):
    """The built-in defaults would start an open-ended connect-four run nobody asked for."""
    code, out, err, _, cwd = cli["train no config"]
    assert code == 2 and err.startswith("error: run.py train needs --config FILE"), err
    assert "configs/tictactoe.yaml" in err and "Traceback" not in err + out
    assert list(cwd.iterdir()) == []


def test_python_outside_the_environment_says_how_to_run_it(tmp_path):
    """`python3 run.py ...` with an interpreter that lacks the requirements: one line, exit 2."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONNOUSERSITE": "1"}
    # -S: no site-packages, as in a bare interpreter; -I would also hide the checkout from sys.path
    proc = subprocess.run([sys.executable, "-S", str(REPO / "run.py"), "train", "--config", "x.yaml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "bash scripts/bootstrap.sh" in proc.stderr and ".venv/bin/python run.py train --config x.yaml" in proc.stderr


def test_cli_help_config_lists_every_key(cli):
    code, out, err, _, _ = cli["help-config"]
    assert code == 0, err
    for section, f in ALL_KEYS:
        assert f"{section}.{f.name}" in out
    assert "Traceback" not in err


def test_cli_actor_without_redis_exits_4(cli):
    code, out, err, seconds, _ = cli["actor no redis"]
    assert code == 4, err  # Redis unreachable at start: not a config error (2), it may come up later
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in err
    assert "Traceback" not in err + out
    assert seconds < 30


def test_a_fields_rule_lives_beside_it_and_help_config_prints_it():
    from impala_league.config import Rule, describe

    assert Rule(low=0, high=1, low_open=True).describe() == "in (0, 1]"
    assert Rule(low=0, high=2**31, high_open=True).describe() == "in [0, 2147483648)"
    assert Rule(low=0, low_open=True, finite=True).describe() == "> 0 and finite"
    assert Rule(choices=("a", "b", "c")).describe() == "a, b or c"
    assert not Rule(low=0, low_open=True).ok(0.0) and Rule(low=0).ok(0.0)
    line = next(l for l in describe().splitlines() if "learner.optimizer " in l)
    assert line.endswith("[adam or rmsprop]")


def test_final_evaluation_defaults_are_fewer_games_for_atari_and_leave_what_was_given():
    """A 200-game evaluation of Pong would take over an hour on 2 cores: Atari games get 20, 3 and 5, and
    one-player Atari the evaluation protocol's 30 games."""
    from argparse import Namespace

    from impala_league.cli.train import evaluation_defaults

    given = dict(eval_games=None, eval_history=None, eval_history_games=None)
    for env, want in (("connect_four", (200, 6, 50)), ("atari:Pong", (30, 3, 5)), ("atari2p:boxing", (20, 3, 5))):
        args = Namespace(**given)
        evaluation_defaults(args, env)
        assert (args.eval_games, args.eval_history, args.eval_history_games) == want, env
    args = Namespace(eval_games=0, eval_history=1, eval_history_games=None)
    evaluation_defaults(args, "atari:Pong")
    assert (args.eval_games, args.eval_history, args.eval_history_games) == (0, 1, 5)


def test_the_old_name_of_total_agent_steps_still_works_with_a_notice(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text("run:\n  total_frames: 2e4\n")
    assert load_config(path).run.total_agent_steps == 20_000
    assert "'run.total_frames' is now 'run.total_agent_steps'" in capsys.readouterr().err
    assert load_config(None, ["run.total_frames=300"]).run.total_agent_steps == 300
    assert "--set: 'run.total_frames'" in capsys.readouterr().err
    both = tmp_path / "both.yaml"
    both.write_text("run:\n  total_frames: 5\n  total_agent_steps: 7\n")
    assert load_config(both).run.total_agent_steps == 7
