"""Typed experiment configuration: loading it, checking it, writing it.

The fields (one dataclass per component, every field with a default, a one-line `help` and its `Rule`)
are `config_schema.py`'s; this module re-exports them, so `from impala_league.config import Config`
is the one import the rest of the code needs. YAML files in `configs/` set values, `--set a.b=c`
overrides them on the command line, and `run.py <role> --help-config` prints every field with its doc.
An unknown key is an error that names the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import math
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from impala_league.config_schema import (
    COMPRESSIONS, CORRECTIONS, MAX_ACTORS, MAX_BATCH_SIZE, MAX_BUFFERED_STEPS, MAX_ENVS, MAX_INT_BITS, MAX_LEARNERS,
    MAX_SHARDS, MAX_UNROLL_LENGTH, MAX_WEIGHT_DELAY, PFSP_WEIGHTINGS, REWARD_CLIPPINGS, SECTIONS, TORSOS, ActorConfig,
    AgentConfig, Config, ConfigError, EnvConfig, EvaluationConfig, LeagueConfig, LearnerConfig, Rule, RunConfig,
    TransportConfig, UserError, core_size, learners_in_flight, replayed_per_batch,
)

__all__ = [  # the schema's names, re-exported, then this module's
    "COMPRESSIONS", "CORRECTIONS", "MAX_ACTORS", "MAX_BATCH_SIZE", "MAX_BUFFERED_STEPS", "MAX_ENVS", "MAX_INT_BITS",
    "MAX_LEARNERS", "MAX_SHARDS", "MAX_UNROLL_LENGTH", "MAX_WEIGHT_DELAY", "PFSP_WEIGHTINGS", "REWARD_CLIPPINGS",
    "SECTIONS", "TORSOS", "ActorConfig", "AgentConfig", "Config", "ConfigError", "EnvConfig", "EvaluationConfig",
    "LeagueConfig", "LearnerConfig", "Rule", "RunConfig", "TransportConfig", "UserError", "core_size",
    "learners_in_flight", "replayed_per_batch",
    "RENAMED_KEYS", "check_arguments", "check_fields", "describe", "from_yaml_text", "load_config", "to_yaml",
    "validate", "without_secrets",
]


def _all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def describe() -> str:
    """Every config field with its default, its one-line doc and, in brackets, what it must be, for
    `--help-config`."""
    lines = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.metadata.get("default")
            rule = f" [{f.metadata['rule'].describe()}]" if "rule" in f.metadata else ""
            lines.append(f"  {section + '.' + f.name:34s} = {default!s:14s} {f.metadata['help']}{rule}")
    return "\n".join(lines)


def _unknown_key_error(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, _all_keys(), n=1, cutoff=0.4)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}'{hint} (run.py train --help-config lists every key)")


def _check_keys(node: Any, prefix: str = "") -> None:
    valid = set(_all_keys())
    sections = set(SECTIONS)
    if not isinstance(node, dict):
        raise ConfigError(f"config must be a mapping of sections {sorted(sections)}, got {type(node).__name__}")
    for k, v in node.items():
        if k not in sections:
            raise _unknown_key_error(str(k))
        if not isinstance(v, dict):
            raise ConfigError(f"config section '{k}' must be a mapping, got {v!r}")
        for sub, value in v.items():
            if f"{k}.{sub}" not in valid:
                raise _unknown_key_error(f"{k}.{sub}")
            _check_value(f"{k}.{sub}", value)


# Keys renamed since configs were first written: old dotted key -> new one. An old key still works,
# with a notice on stderr; the new one wins where a config gives both.
RENAMED_KEYS = {"run.total_frames": "run.total_agent_steps"}


def _notice_renamed(old: str, source: str) -> None:
    new = RENAMED_KEYS[old]
    print(f"notice: {source}: '{old}' is now '{new}' (the same agent steps); the old name still works",
          file=sys.stderr)


def _renamed(raw: Any, source: str) -> Any:
    """`raw` (a config mapping) with renamed keys under their new names (RENAMED_KEYS), each noticed."""
    if not isinstance(raw, dict):
        return raw
    out = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
    for old, new in RENAMED_KEYS.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        values = out.get(old_section)
        if isinstance(values, dict) and old_key in values:
            _notice_renamed(old, source)
            value = values.pop(old_key)
            out.setdefault(new_section, {}).setdefault(new_key, value)
    return out


def _integral_floats(raw: Any) -> Any:
    """`raw` with integral floats given to integer fields made ints: YAML reads `1e6` as a float, and
    run.total_agent_steps=1e6 means 1000000. A float with a fraction (1.5) is left for OmegaConf to refuse."""
    if not isinstance(raw, dict):
        return raw
    out = {}
    for section, values in raw.items():
        cls = SECTIONS.get(section)
        if cls is None or not isinstance(values, dict):
            out[section] = values
            continue
        types = typing.get_type_hints(cls)
        out[section] = {key: int(value) if (types.get(key) is int and isinstance(value, float)
                                             and value.is_integer()) else value
                        for key, value in values.items()}
    return out


def _yaml_error(source: str, e: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as `<file>, line L, column C: <problem>` (1-based, as editors count)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(e, "context", None)
    return ConfigError(f"{source}{where}: not valid YAML: {problem}" + (f" ({context})" if context else ""))


def _key_position(text: str, dotted: str) -> str:
    """", line L, column C" of key `section.key` in YAML `text`, or "" where it cannot be found."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return ""
    for part in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            return ""
        match = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
        if not match:
            return ""
        key_node, node = match[0]
    return f", line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1}"


def _check_value(key: str, value: Any) -> None:
    """Refuse by name what OmegaConf would mishandle: integers beyond int64 (an OverflowError on a float
    field) and its "???" placeholder (merged over a default, it would silently keep the default)."""
    if value == "???":
        raise ConfigError(f"{key} is '???' (OmegaConf's placeholder for a missing value): give it a value")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        shown = str(value) if len(str(value)) <= 30 else str(value)[:27] + "..."
        raise ConfigError(f"{key}={shown} is out of range (at most {MAX_INT_BITS} bits)")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load `path` (YAML) over the defaults, then apply `overrides` ("a.b=c" strings).

    Raises:
      ConfigError: unknown key (naming the closest valid key), a value of the wrong type, a malformed
        override, or a value out of range (see `validate`).
    """
    schema = OmegaConf.structured(Config)
    try:
        layers = []
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file not found: {p}")
            try:
                raw = _integral_floats(_renamed(OmegaConf.to_container(OmegaConf.load(p)) or {}, str(p)))
            except yaml.YAMLError as e:
                raise _yaml_error(str(p), e) from None
            except (UnicodeDecodeError, OSError) as e:
                raise ConfigError(f"cannot read config file {p}: {e}".splitlines()[0]) from None
            try:
                _check_keys(raw)
                layers.append(OmegaConf.create(raw))
                OmegaConf.merge(schema, layers[-1])  # a bad value is named with its line here
            except (ConfigError, OmegaConfBaseException) as e:
                raise _in_file(p, e) from None
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(f"override '{item}' must look like section.key=value")
            key = item.split("=", 1)[0].strip()
            if key in RENAMED_KEYS:
                _notice_renamed(key, "--set")
                key, item = RENAMED_KEYS[key], RENAMED_KEYS[key] + "=" + item.split("=", 1)[1]
            if key not in _all_keys() and not key.startswith("env.kwargs."):
                raise _unknown_key_error(key)
            try:  # one layer per override (later ones win), so a parse error names its override
                layer = OmegaConf.from_dotlist([item])
            except yaml.YAMLError as e:
                raise ConfigError(f"override '{item}': the value is not valid YAML: {e}".splitlines()[0]) from None
            container = _integral_floats(OmegaConf.to_container(layer))
            _check_keys(container)
            layers.append(OmegaConf.create(container))
        merged = OmegaConf.merge(schema, *layers)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except ConfigKeyError as e:
        raise _unknown_key_error(str(e.full_key) if getattr(e, "full_key", None) else str(e)) from None
    except OmegaConfBaseException as e:
        raise _bad_value(e) from None
    except OverflowError as e:  # a number no config field can hold (after the int64 check: e.g. a float field)
        raise ConfigError(f"bad config value: {e}") from None
    except TypeError as e:  # OmegaConf merging a mapping into a list field (league.bots={})
        raise ConfigError(f"bad config value: {e}") from None
    validate(cfg)
    return cfg


def _in_file(path: Path, e: Exception) -> ConfigError:
    """A key or value error of config file `path`, with the line and column of the key it names."""
    if isinstance(e, ConfigKeyError):
        error = _unknown_key_error(str(e.full_key) if getattr(e, "full_key", None) else str(e))
    else:
        error = e if isinstance(e, ConfigError) else _bad_value(e)
    key = re.search(r"key '([\w.]+)'|for ([\w.]+)|^([\w]+\.[\w.]+)|section '(\w+)'", str(error))
    try:
        where = _key_position(path.read_text(), next(k for k in key.groups() if k)) if key else ""
    except (OSError, UnicodeDecodeError):
        where = ""
    return ConfigError(f"{path}{where}: {error}")


def _bad_value(e: OmegaConfBaseException, prefix: str = "bad config value") -> ConfigError:
    """OmegaConf's first message line, naming the key (its own first line often does not)."""
    key = getattr(e, "full_key", None)
    where = f" for {key}" if key else ""
    return ConfigError(f"{prefix}{where}: {e}".splitlines()[0])


def check_fields(cfg: Config) -> None:
    """Each field against its own `Rule` (choices, bounds, a predicate), in the order of SECTIONS; a float
    must be a number (not nan), and every float of `league` finite. Raises ConfigError naming the field,
    what it must be and what it was."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            key, value = f"{section}.{f.name}", getattr(getattr(cfg, section), f.name)
            if isinstance(value, float) and math.isnan(value):
                raise ConfigError(f"{key} must be a number, not nan")
            if isinstance(value, float) and math.isinf(value) and section == "league":
                raise ConfigError(f"{key} must be finite")
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            key, value, rule = f"{section}.{f.name}", getattr(getattr(cfg, section), f.name), f.metadata.get("rule")
            nullable = str(f.type).startswith("Optional[")
            if rule is None or (value is None and nullable) or rule.ok(value):
                continue
            got = "" if "@" in repr(value) else f" (got {value!r})"  # never echo a URL's password
            raise ConfigError(f"{key} must be {rule.describe()}{' or null' if nullable else ''}{got}")


def check_arguments(args: Any, rules: dict[str, Rule]) -> None:
    """A command's own arguments against their `Rule`s, as `check_fields` checks the config's: `rules`
    maps an argparse dest (e.g. "eval_games") to its rule; None passes (an option not given), and every
    element of a list must pass. Raises ConfigError naming the option (--eval-games), what it must be and
    what it was."""
    for dest, rule in rules.items():
        value = getattr(args, dest)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not rule.ok(v):
                raise ConfigError(f"--{dest.replace('_', '-')} must be {rule.describe()} (got {v!r})")


def _core_size_ok(cfg: Config) -> bool:
    """The LSTM's size is bounded only where there is an LSTM."""
    return cfg.agent.core == "none" or 1 <= cfg.agent.core_size <= 65536


def validate(cfg: Config) -> None:
    """Every field against its own rule (`check_fields`), then the rules that tie several fields
    together, each with why it holds. Raises ConfigError.

    Checks that need the env registry or the baseline bots (does env.name exist, do league.bots play
    it, does the network fit the board) are `checked_config.check`'s: this module imports nothing of ours but its schema.
    """
    check_fields(cfg)
    for ok, message in _actor_rules(cfg) + _learner_rules(cfg) + _league_rules(cfg):
        if not ok:
            raise ConfigError(message)
    if cfg.env.name.startswith("sc2:") and cfg.league.enabled and cfg.league.bots:
        raise ConfigError("league.bots: the baseline bots play Discrete actions, not StarCraft II; set league.bots: [] "
                          "(env.kwargs.bot plays against the game's built-in bot)")


def _actor_rules(cfg: Config) -> list[tuple[bool, str]]:
    """(ok, message) of the rules that tie what the actors play and send to the network, the env and the
    learner's algorithm."""
    return [
        (1 <= cfg.actor.send_batch <= cfg.actor.high_water_mark, "actor.send_batch must be in [1, actor.high_water_mark]"),
        (cfg.actor.high_water_mark >= cfg.learner.batch_size,
         "actor.high_water_mark must be >= learner.batch_size, or the learner could starve"),
        (cfg.learner.algo == "impala" or not cfg.league.enabled,
         "learner.algo=a3c trains without a league: set league.enabled=false"),
        ((cfg.agent.torso == "fullyconv") == cfg.env.name.startswith("sc2:"),
         "StarCraft II envs (sc2:<map>) need agent.torso=fullyconv, and fullyconv needs one"),
        (_core_size_ok(cfg), "agent.core_size must be in [1, 65536]"),
        (cfg.agent.core == "none" or cfg.learner.mirror_augment == "none"
         or cfg.env.name not in ("connect_four", "tictactoe"),
         f"agent.core={cfg.agent.core} needs learner.mirror_augment=none on {cfg.env.name}: a reflected unroll would "
         "start from the core state of the game as it was played, not as reflected"),
        (cfg.actor.epsilon == 0 or not cfg.env.name.startswith("sc2:"),
         "actor.epsilon must be 0 for StarCraft II envs (their actions are FunctionCalls, not one Discrete)"),
        (not cfg.agent.landing_plane or (cfg.agent.torso == "conv" and cfg.env.name == "connect_four"),
         "agent.landing_plane needs agent.torso=conv and a game whose pieces fall (env.name=connect_four)"),
        (not cfg.agent.threat_planes or (cfg.agent.torso == "conv" and cfg.env.name == "connect_four"),
         "agent.threat_planes needs agent.torso=conv and env.name=connect_four (two piece planes, four in a row)"),
        (cfg.agent.padding == "valid" or cfg.agent.kernel_size % 2 == 1,
         "agent.padding=same needs an odd agent.kernel_size"),
        # Limits that keep one process's memory sane.
        (cfg.actor.num_envs * cfg.actor.unroll_length <= MAX_BUFFERED_STEPS,
         f"actor.num_envs * actor.unroll_length must be <= {MAX_BUFFERED_STEPS:,} (each actor buffers an "
         "unroll per env and seat)"),
    ]


def _learner_rules(cfg: Config) -> list[tuple[bool, str]]:
    """(ok, message) of the rules that tie the learners' reads (ingest workers, data-parallel ranks, replay,
    shards) to what the actors send."""
    return [
        (0 <= cfg.learner.ingest_workers <= cfg.learner.prefetch_batches,
         f"learner.ingest_workers={cfg.learner.ingest_workers} must be in [0, learner.prefetch_batches="
         f"{cfg.learner.prefetch_batches}]: each worker fills one of the batches read ahead"),
        (cfg.learner.ingest_workers == 0 or cfg.learner.algo == "impala",
         "learner.ingest_workers needs learner.algo=impala (A3C's parameter server applies one gradient at a time)"),
        # Unacked entries count against the mark: K-1 ranks may each hold prefetch_batches + 1 batches while the
        # last one still needs its B, and they wait for it in the next all-reduce; ingest workers may hold a
        # part of a batch in every slot.
        ((cfg.learner.num_learners == 1 and not cfg.learner.ingest_workers)
         or cfg.actor.high_water_mark >= learners_in_flight(cfg.learner),
         f"actor.high_water_mark must be >= {learners_in_flight(cfg.learner)}: the learners may hold that many "
         "unrolls unacked while one of them still waits for its batch ("
         + ("learner.num_learners * learner.prefetch_batches * learner.batch_size with ingest workers, each slot "
            "a batch read in part)" if cfg.learner.ingest_workers else
            "(learner.num_learners - 1) * (learner.prefetch_batches + 1) * learner.batch_size + learner.batch_size)")),
        (cfg.learner.algo != "impala" or (cfg.learner.batch_size - replayed_per_batch(cfg.learner)) % max(cfg.actor.send_batch, 1) == 0,
         f"actor.send_batch={cfg.actor.send_batch} must divide the {cfg.learner.batch_size - replayed_per_batch(cfg.learner)} "
         "fresh unrolls of each batch (learner.batch_size minus the round(learner.replay_fraction * batch_size) "
         "replayed): a batch takes whole stream entries of send_batch unrolls; set it to a divisor of that"),
        (cfg.learner.num_learners == 1 or cfg.learner.algo == "impala",
         "learner.num_learners > 1 needs learner.algo=impala (A3C's parameter server is one process)"),
        (cfg.learner.redo_every == 0 or cfg.learner.algo == "impala",
         "learner.redo_every > 0 needs learner.algo=impala (A3C's workers step the weights themselves)"),
        (cfg.learner.replay_fraction == 0 or cfg.learner.algo == "impala",
         "learner.replay_fraction > 0 needs learner.algo=impala (A3C's workers push gradients, not unrolls: "
         "there is nothing to replay)"),
        (not 0.0 < cfg.learner.replay_fraction < 1.0 or replayed_per_batch(cfg.learner) >= 1,
         f"learner.replay_fraction={cfg.learner.replay_fraction} replays no unroll of a batch of "
         f"learner.batch_size={cfg.learner.batch_size} (k = round(f * B), at most B - 1, is 0): raise "
         "learner.replay_fraction or learner.batch_size, or set learner.replay_fraction=0"),
        (len(cfg.transport.shard_urls) <= cfg.transport.shards,
         f"transport.shard_urls lists {len(cfg.transport.shard_urls)} servers for transport.shards="
         f"{cfg.transport.shards}: the extra servers would get no shard; raise transport.shards or list fewer"),
    ]


def _league_rules(cfg: Config) -> list[tuple[bool, str]]:
    """(ok, message) of the rules that tie the league's settings to each other and to the learners."""
    league = cfg.league
    return [
        # Decayed counts level off at 1 / (1 - decay): a pair could never reach more games than that.
        (league.payoff_decay == 1.0 or league.min_games < 0.9 / (1.0 - league.payoff_decay),
         f"league.min_games={league.min_games} can never be reached with league.payoff_decay="
         f"{league.payoff_decay} (decayed game counts level off at 1 / (1 - decay)); lower min_games or "
         "raise payoff_decay"),
        # Bots alone (bot_share, self_play = pfsp = 0) are a mix too: a league of bots only.
        (league.self_play + league.pfsp > 0 or (league.bot_share > 0 and bool(league.bots)),
         "league.self_play + league.pfsp must be > 0, or league.bot_share > 0 with league.bots (bots only)"),
        (league.enabled or not (league.main_exploiters or league.league_exploiters),
         "exploiters need league.enabled=true"),
        (cfg.learner.num_learners == 1 or not (league.main_exploiters or league.league_exploiters),
         "learner.num_learners > 1 is not supported with league exploiters (league.main_exploiters, "
         "league.league_exploiters): set them to 0 or learner.num_learners=1"),
        # Redis holds each learner's newest snapshot, and as many as one actor caches.
        (not league.enabled or league.redis_snapshots >= max(league.opponent_cache,
                                                               1 + league.main_exploiters + league.league_exploiters),
         f"league.redis_snapshots={league.redis_snapshots} is below league.opponent_cache={league.opponent_cache} "
         f"or the {1 + league.main_exploiters + league.league_exploiters} learning players (Redis keeps each one's "
         "newest snapshot): raise league.redis_snapshots"),
    ]


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def without_secrets(cfg: Config) -> Config:
    """A copy without `run.redis_url` (it may hold a password), for files and logs that outlive the run:
    config.yaml, checkpoints, wandb. Processes get the URL from --redis-url or $IMPALA_REDIS_URL."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, redis_url=None))


def from_yaml_text(text: str) -> Config:
    """Parse a resolved config (as written by `to_yaml`), validating keys and values.

    Raises ConfigError like `load_config`.
    """
    try:
        # OmegaConf.load, not create: create asserts on a document that is a bare number.
        raw = _integral_floats(OmegaConf.to_container(OmegaConf.load(io.StringIO(text))) or {})
        _check_keys(raw)
        cfg: Config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), raw))  # type: ignore
    except (yaml.YAMLError, OSError, OverflowError, TypeError) as e:  # OSError: a document that is not a mapping
        raise ConfigError(f"bad config: {e}".splitlines()[0]) from None
    except OmegaConfBaseException as e:
        raise _bad_value(e, "bad config") from None
    validate(cfg)
    return cfg
