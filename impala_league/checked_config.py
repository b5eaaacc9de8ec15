"""A config checked against what it names: the env registry, the network's fit to the game, the bots.

`config.py` is plain data: it checks types and ranges and imports nothing of ours. Whether `env.name`
exists, whether the network fits its board and whether `league.bots` can play the game need the env
registry and the baseline bots, which sit above the config; `check` asks them (and the wire
format, for the size of a stream entry). Every command loads its
config through `load_config` here (run.py), and so do readers of run directories (analysis/runs.py).
"""

from __future__ import annotations

from pathlib import Path

from impala_league import config
from impala_league.agents.spec import checked_spec
from impala_league.config import Config, ConfigError, core_size
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.evaluation.bots import check_bot_spec, make_bot
from impala_league.evaluation.judges import check_judges, resolve_judges


def check(cfg: Config) -> Config:
    """Check `cfg` against the env registry, its network and the baseline bots; returns `cfg`.

    Raises ConfigError: an unknown env (naming the valid ones and the closest), kwargs the env does not
    take, a network that does not fit the board (see agents.spec.checked_spec), a league bot that
    cannot play the game, a judge that cannot (`evaluation.judges`, see evaluation/judges.py), is named
    twice or is a training opponent (in league.bots), or stream entries of `actor.send_batch` unrolls
    over the decoder's size limit.
    """
    spec = checked_spec(cfg)
    most = UnrollSpec(spec, cfg.actor.unroll_length, core_size(cfg.agent)).max_unrolls_per_entry
    if cfg.actor.send_batch > most:
        raise ConfigError(f"actor.send_batch={cfg.actor.send_batch}: a stream entry of {spec.name} unrolls of length "
                          f"{cfg.actor.unroll_length} holds at most {most} (MAX_MESSAGE_BYTES): lower it")
    for bot in cfg.league.bots if cfg.league.enabled else ():
        try:
            make_bot(bot, cfg.env.name)
        except ValueError as e:
            raise ConfigError(f"league.bots: {e}") from None
    check_run_judges(cfg)
    return cfg


def check_run_judges(cfg: Config) -> tuple[str, ...]:
    """The run's judges (`evaluation.judges`, or the game's ladder where null), checked: each plays the game,
    none twice, none in league.bots (whether or not the league is on). Raises ConfigError (one line)."""
    judges = resolve_judges(cfg.evaluation.judges, cfg.env.name)
    try:
        check_judges(judges, cfg.env.name, cfg.league.bots)
        for judge in judges:
            check_bot_spec(judge, cfg.env.name)
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith("league.bots") else f"evaluation.judges: {e}") from None
    return judges


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """`config.load_config` (YAML file, then `--set` overrides, types and ranges), then `check`."""
    return check(config.load_config(path, overrides))


def from_yaml_text(text: str) -> Config:
    """`config.from_yaml_text` (a resolved config as `config.to_yaml` writes it), then `check`."""
    return check(config.from_yaml_text(text))
