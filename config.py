"""Typed experiment configuration: one dataclass per component.

Every field has a default and a one-line `help`. YAML files in `configs/` set values, `--set a.b=c`
overrides them on the command line, and `run.py <role> --help-config` prints every field with its doc.
An unknown key is an error that names the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException


MAX_ACTORS = 256
MAX_ENVS = 4096
MAX_UNROLL_LENGTH = 10_000
MAX_WEIGHT_DELAY = 1_000
MAX_BUFFERED_STEPS = 2_000_000
TORSOS = ("conv", "mlp", "fullyconv", "shallow", "resnet")  # agent.torso (agents/network.py, agents/torsos.py)
REWARD_CLIPPINGS = ("none", "abs_one", "soft_asymmetric")  # learner.reward_clipping (distributed/vtrace.py)
CORRECTIONS = ("vtrace", "is1", "epsilon", "none")  # off-policy corrections of IMPALA's Table 2
COMPRESSIONS = ("none", "zstd")  # transport.compression: how unroll arrays travel
MAX_SHARDS = 256  # transport.shards: one read per shard and Redis, one DeadConsumerSweeper claim each per minute
MAX_BATCH_SIZE = 4096  # a batch is acked in one Lua script, whose argument unpacking has a limit
MAX_LEARNERS = 64  # data-parallel learner processes of one agent (learner.num_learners)
MAX_INT_BITS = 63  # an integer config value beyond int64 is a typo, and too large for a float field


class UserError(Exception):
    """An error the user can act on, its message saying what to do: `run.py` prints it as one line and
    exits 2. Raised by every layer (each defines its own subclass), so it lives here, in plain data."""


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message says what to change."""


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def _f_list(default: list, help: str) -> Any:
    return field(default_factory=lambda: list(default), metadata={"help": help, "default": default})


@dataclass
class RunConfig:
    name: str = _f("connect_four", "run name; namespaces every Redis key ({name}:traj, ...) and the run directory")
    dir: str = _f("runs", "parent folder of run directories (config, metrics.jsonl, checkpoints)")
    seed: int = _f(0, "root random seed: the learner's initial weights and every actor's streams (numpy "
                   "SeedSequence of seed, actor id, start); see README 'What run.seed reproduces'")
    total_frames: int = _f(3_000_000, "stop once the learner has trained on this many agent steps (T per "
                           "fresh unroll; metrics.jsonl's agent_steps_trained, also the unit of SPS). Not env "
                           "steps (env_steps_played): a league game trains only the learner's seat, a battle "
                           "every unit of a learning team")
    max_minutes: float = _f(0.0, "also stop after this many minutes of training (0 = no time limit)")
    redis_url: Optional[str] = _f(None, "redis://[:password@]host:port/db of a shared Redis; unset = start an embedded one")
    wandb_mode: str = _f("offline", "wandb mode: offline (default, no network), online, or disabled")
    wandb_project: str = _f("impala-league", "wandb project name")
    tensorboard: bool = _f(False, "also write the metrics wandb gets as TensorBoard event files to "
                           "<run dir>/tensorboard (tensorboard --logdir <run dir>/tensorboard)")
    log_every_s: float = _f(10.0, "seconds between progress lines and metrics records")
    redis_retry_s: float = _f(60.0, "seconds a process retries a lost Redis connection (backoff up to 2 s) "
                              "before it exits")
    lease_ttl_s: float = _f(10.0, "seconds a lease on Redis (launcher, learner, league manager, actor id) outlives "
                            "its holder's last refresh; a process taking a held one waits this long (+1 s) first")


@dataclass
class EnvConfig:
    name: str = _f("connect_four", "env registry name (see envs/registry.py): connect_four, tictactoe, battle, "
                   "cue_recall, mpe:<scenario>, gym:<id>, popgym:<Env>, pettingzoo:<module>, atari:<Game> "
                   "(e.g. atari:Pong), atari2p:<game> (e.g. atari2p:boxing), sc2:<map>")
    kwargs: Dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the env's constructor, e.g. {map_size: 30} for battle", "default": {}})
    empty_mask: str = _f("error", "an acting agent whose action mask is all zeros: error (stop, naming the env, "
                         "agent and step) or skip (the game uses an empty mask for 'not acting now': that agent "
                         "does not act this step; simultaneous games only)")
    seats: Optional[List[List[str]]] = _f(None, "simultaneous-move envs: the seats (sides), each a list of agent "
                                          "names, e.g. [[player_0], [player_1]]; null = from the names: "
                                          "<team>_<n> share a team, player_<n> and other names are each a seat")


@dataclass
class AgentConfig:
    torso: str = _f("conv", "network torso: conv (board games), mlp, fullyconv (StarCraft II, SC2LE's FullyConv), "
                    "or IMPALA's pixel torsos over frames [C, H, W]: shallow (2 convs, CPU-sized) or resnet "
                    "(the deep one: 3 stacks of conv, max-pool and 2 residual blocks; a GPU network)")
    channels: int = _f(64, "conv torso: channels of each 3x3 conv layer")
    conv_layers: int = _f(2, "conv torso: number of conv layers")
    kernel_size: int = _f(3, "conv torso: kernel size (4 with valid padding sees every 4-in-a-row window)")
    padding: str = _f("same", "conv torso: same (keep the board size) or valid (no padding)")
    landing_plane: bool = _f(False, "conv torso, connect four: add an input plane that marks each column's landing "
                             "cell (the empty cell a piece dropped there would take), so that one conv window "
                             "sees whether a three-in-a-row can be completed now")
    threat_planes: bool = _f(False, "conv torso, connect four: add two input planes that mark, for each player, the "
                             "empty cells that would complete a four-in-a-row (a threat, playable now or not)")
    resnet_channels: List[int] = _f_list([16, 32, 32], "resnet torso: channels of each stack (IMPALA: 16, 32, 32)")
    hidden: int = _f(256, "width of the fully connected layer(s) before the policy and baseline heads")
    mlp_layers: int = _f(2, "mlp torso: number of hidden layers")
    sc2_embed_dim: int = _f(8, "fullyconv: categorical feature layers with more categories than this are embedded "
                            "in this many channels, smaller ones one-hot")
    core: str = _f("none", "recurrent core between the torso and the heads: none (feedforward: acts on the current "
                   "observation alone) or lstm (IMPALA's: remembers across steps; the state is carried across "
                   "unrolls, and what lies further back than one unroll is reached only through it)")
    core_size: int = _f(256, "lstm core: hidden and cell size")
    core_inputs: Optional[bool] = _f(None, "lstm core: also feed it the previous action (one-hot) and the previous "
                                     "reward clipped to [-1, 1], as IMPALA does; null = on")


@dataclass
class ActorConfig:
    num_actors: int = _f(2, "actor processes that `run.py train` starts")
    num_envs: int = _f(32, "envs per actor process, stepped together with one batched forward pass")
    unroll_length: int = _f(40, "T: steps of one learning stream (agent steps) per unroll")
    param_sync_every: int = _f(4, "check the params version after this many unrolls sent by this actor")
    send_batch: int = _f(1, "unrolls per trajectory stream entry: an actor sends its finished unrolls this many "
                         "to an entry, stacked (one round trip for all; one parse per entry for the learner, whose "
                         "ingest costs per entry); it must divide the fresh unrolls of a batch")
    weight_delay: int = _f(0, "act with the weights K publishes behind the learner's latest (policy lag on "
                           "purpose, for the off-policy correction study); 0 = the latest")
    epsilon: float = _f(0.0, "exploration: env i plays uniformly random legal moves with probability "
                        "epsilon * i / (num_envs - 1); V-trace corrects for it")
    high_water_mark: int = _f(256, "wait while the trajectory stream holds more than this many unconsumed unrolls "
                              "(its entries times actor.send_batch)")


@dataclass
class LearnerConfig:
    algo: str = _f("impala", "impala (actors send unrolls, the learner corrects with learner.correction) or a3c "
                   "(actors push n-step actor-critic gradients to a parameter server; no league)")
    device: str = _f("auto", "torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ...")
    batch_size: int = _f(32, "B: unrolls per update")
    optimizer: str = _f("adam", "adam or rmsprop")
    learning_rate: float = _f(6e-4, "optimizer learning rate")
    lr_schedule: str = _f("constant", "constant, or linear: anneal the learning rate linearly to 0 at the end of "
                          "the run (IMPALA), whichever of run.total_frames and run.max_minutes comes first")
    rmsprop_alpha: float = _f(0.99, "RMSProp smoothing constant (IMPALA: 0.99)")
    rmsprop_eps: float = _f(1e-5, "RMSProp epsilon. The loss here is a mean over the T x B steps; IMPALA's 0.01 "
                             "was for a sum over its 20 x 32, where it equals 0.01 / 640 ~ 1.6e-5 here (the "
                             "1e-5 of A2C's reference implementations). 0.01 on a mean swamps the gradients. "
                             "PyTorch's RMSProp starts its mean of squared gradients at 0 (TensorFlow's at 1): "
                             "its first steps are up to 10x the learning rate")
    discount: float = _f(0.99, "gamma")
    pg_discount: Optional[float] = _f(None, "gamma of the policy-gradient advantage only, r + gamma * v_{s+1} - V(x_s) "
                                      "(the value targets keep learner.discount): below it, a move that wins now "
                                      "gains more over one that wins later; null = learner.discount")
    reward_clipping: str = _f("none", "rewards as the loss sees them: none, abs_one (clip to [-1, 1]: Atari) or "
                              "soft_asymmetric (0.3 min(tanh r, 0) + 5 max(tanh r, 0): IMPALA's DMLab-30). Episode "
                              "statistics always report the game's own score")
    entropy_cost: float = _f(0.01, "weight of the entropy bonus")
    baseline_cost: float = _f(0.5, "weight of the baseline loss 0.5 * sum (vs - V)^2 (IMPALA: 0.5)")
    grad_norm_clip: float = _f(40.0, "clip the global gradient norm to this (IMPALA: 40)")
    clip_rho_threshold: Optional[float] = _f(1.0, "rho-bar; null = no clipping")
    clip_pg_rho_threshold: Optional[float] = _f(1.0, "pg-rho-bar; null = no clipping")
    clip_c_threshold: Optional[float] = _f(1.0, "c-bar; null = no clipping")
    lambda_: float = _f(1.0, "V-trace lambda (multiplies the c's)")
    correction: str = _f("vtrace", "off-policy correction (IMPALA Table 2): vtrace, is1 (1-step importance "
                         "sampling), epsilon (log(pi + 1e-6)) or none")
    mirror_augment: str = _f("random", "boards with a left-right symmetry: random (each unroll of a batch is "
                             "reflected with probability 1/2), both (each unroll and its reflection: twice "
                             "the update's compute), or none")
    publish_every: int = _f(1, "publish weights every N updates")
    checkpoint_every_s: float = _f(60.0, "seconds between checkpoints")
    read_block_ms: int = _f(1000, "XREADGROUP block time in milliseconds")
    prefetch_batches: int = _f(2, "batches read, decoded and stacked ahead of the update by the ingest thread; "
                               "0 = read in the update's own thread")
    ingest_workers: int = _f(0, "worker processes that read, decode, check and stack the batches beside the "
                             "learner (each its own consumer, handing batches over in shared memory), for a "
                             "learner whose one ingest thread cannot keep up (a GPU learner of many actors); "
                             "0 = the learner's own ingest thread. At most learner.prefetch_batches")
    num_learners: int = _f(1, "K: learner processes that train the main agent as one (data parallel, "
                           "torch.distributed): each reads its own B unrolls, gradients are averaged, so an "
                           "update trains on K * B unrolls")
    replay_fraction: float = _f(0.0, "experience replay (IMPALA Table 2 'with replay'): share f of each batch of B "
                                "unrolls drawn uniformly from this learner's replay of recently trained unrolls, "
                                "k = round(f * B) of them (at most B - 1), corrected by V-trace with their own "
                                "behaviour policy; 0 = none. In [0, 1); impala only")
    replay_memory_mb: float = _f(256.0, "memory of the replay (MB of unroll arrays, 1 MB = 2**20 bytes); the "
                                 "oldest unrolls are evicted first")


@dataclass
class LeagueConfig:
    enabled: bool = _f(False, "train against a league (snapshots, bots, exploiters) instead of the latest weights only")
    snapshot_every: int = _f(200, "freeze a snapshot of each learner every this many of its updates")
    snapshot_win_rate: float = _f(0.7, "also snapshot a learner once it beats every league member at this win rate")
    min_games: float = _f(20.0, "decayed games before a win rate between two players counts")
    payoff_decay: float = _f(0.99, "a pair's win/draw/loss counts are multiplied by this before each new game")
    elo_k: float = _f(8.0, "Elo K-factor (rating points per game) of the league's online ratings")
    self_play: float = _f(0.35, "main agent: share of games against its own latest weights")
    pfsp: float = _f(0.5, "main agent: share of games drawn by PFSP over the whole league")
    forgotten: float = _f(0.15, "main agent: share of games against its own snapshots it no longer beats")
    bot_share: float = _f(0.0, "main agent: share of games drawn by PFSP over the baseline bots only, on top of "
                          "what PFSP over the whole league gives them (0: AlphaStar's mix). The four shares "
                          "(self_play, pfsp, forgotten, bot_share) are weights, divided by their sum")
    forgotten_below: float = _f(0.3, "a snapshot is forgotten when the main agent's win rate against it is below this")
    pfsp_weighting: str = _f("hard", "PFSP weighting: hard (1-x)^p, variance x(1-x), or uniform")
    pfsp_p: float = _f(2.0, "the exponent p of the hard weighting")
    pfsp_seat: str = _f("pooled", "the win rate PFSP weighs by: pooled (over both seats) or weaker (the learner's "
                        "lower per-seat win rate, for games with a first-move advantage)")
    bots: List[str] = _f_list(["random", "tactical"], "baseline bots that are league members: random, tactical (wins, else "
                                "blocks, else random), minimax:D (D-ply negamax; leaves count open twos and threes "
                                "and, in connect four, pieces in the centre column)")
    main_exploiters: int = _f(0, "main exploiter learners: train against the main agent, reset when they beat it")
    league_exploiters: int = _f(0, "league exploiter learners: PFSP against the whole league")
    exploiter_actors: int = _f(1, "actor processes per exploiter learner")
    exploiter_nice: int = _f(10, "run.py train starts exploiter learners and actors at this niceness (0-19), so that "
                             "on a shared machine the main agent gets the CPU first")
    exploiter_reset_win_rate: float = _f(0.7, "a main exploiter that beats the main agent at this rate is "
                                         "snapshotted and reset")
    league_exploiter_reset_prob: float = _f(0.25, "chance that a league exploiter is reset after each snapshot")
    exploiter_gives_up_below: float = _f(0.1, "a main exploiter below this win rate against the main agent "
                                         "plays its snapshots instead")
    manager_every_s: float = _f(2.0, "seconds between league manager passes (results, snapshots, matchmaking)")
    opponent_cache: int = _f(16, "snapshots an actor keeps in memory, least recently used dropped first")
    opponent_temperature: float = _f(1.0, "league opponents that are networks (snapshots, other learners) play "
                                     "softmax(logits / T): 1 samples their policy (AlphaStar), 0 plays its argmax")


@dataclass
class TransportConfig:
    compression: str = _f("none", "unroll arrays on the wire: none, or zstd (each array one zstd frame; the decoder "
                          "refuses a frame that declares more bytes than the array's shape needs)")
    compression_level: int = _f(3, "zstd level, 1 (fastest) to 19 (smallest)")
    shards: int = _f(1, "trajectory streams per learner (1 to 256); actor i writes to shard i % shards, the "
                     "learner reads them all. Shard 0 keeps <run>:traj, <run>:traj:produced ...; shard s > 0 has "
                     "{<run>:s<s>}:traj ... (a Redis Cluster hash tag per shard; on a cluster shard 0 is {<run>:s0})")
    shard_urls: List[str] = _f_list([], "Redis of each shard: shard s lives on shard_urls[s % len]; empty = all on "
                                    "the run's Redis. No password in these URLs (config.yaml keeps them): a shard "
                                    "server takes the password of the run's Redis URL")
    params_urls: List[str] = _f_list([], "read-only replicas of the run's Redis (redis-server --replicaof) that actors "
                                     "fetch weights from: actor i reads params_urls[i % len], and falls back to the "
                                     "run's Redis when a replica is unreachable, behind, or its blob fails the "
                                     "published SHA-256; empty = all from the run's Redis. No password in these URLs: "
                                     "a replica takes the password of the run's Redis URL")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    league: LeagueConfig = field(default_factory=LeagueConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)


SECTIONS: dict[str, type] = {
    "run": RunConfig, "env": EnvConfig, "agent": AgentConfig, "actor": ActorConfig, "learner": LearnerConfig, "league": LeagueConfig,
    "transport": TransportConfig,
}


def _all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def describe() -> str:
    """Every config field with its default and one-line doc, for `--help-config`."""
    lines = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.metadata.get("default")
            lines.append(f"  {section + '.' + f.name:34s} = {default!s:14s} {f.metadata['help']}")
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


def _integral_floats(raw: Any) -> Any:
    """`raw` with integral floats given to integer fields made ints: YAML reads `1e6` as a float, and
    run.total_frames=1e6 means 1000000. A float with a fraction (1.5) is left for OmegaConf to refuse."""
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
                raw = _integral_floats(OmegaConf.to_container(OmegaConf.load(p)) or {})
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


def learners_in_flight(learner: LearnerConfig) -> int:
    """Unrolls that K data-parallel learners may hold read but unacked while the last of them still waits
    for its batch: (K - 1) * (prefetch_batches + 1) * B + B with the ingest thread. With ingest workers
    every rank's prefetch_batches slots may each hold a batch read in part: K * prefetch_batches * B."""
    if learner.ingest_workers:
        return learner.num_learners * learner.prefetch_batches * learner.batch_size
    return ((learner.num_learners - 1) * (learner.prefetch_batches + 1) + 1) * learner.batch_size


def core_size(agent: AgentConfig) -> int:
    """Floats per half of the recurrent state an unroll carries (agent.core_size; 0 without a core)."""
    return 0 if agent.core == "none" else agent.core_size


def replayed_per_batch(learner: LearnerConfig) -> int:
    """k: unrolls of each batch of B drawn from the replay, round(replay_fraction * B), at most B - 1 so
    that every update trains on at least one fresh unroll."""
    return min(learner.batch_size - 1, round(learner.replay_fraction * learner.batch_size))


def _server_urls_check(key: str, urls: list[str], what: str) -> tuple[bool, str]:
    """(ok, message) of a list of Redis server URLs named in the config (transport.shard_urls,
    transport.params_urls): each redis://host:port[/db], rediss://host:port[/db] or unix:///path with no
    user or password, which the message never repeats (config.yaml keeps these lists)."""
    ok = all(re.fullmatch(r"(redis|rediss)://[^@/?]+(/\d+)?|unix://[^@?]+", u) for u in urls)
    return ok, (f"{key} must be redis://host:port[/db], rediss://host:port[/db] or unix:///path, each without user "
                f"or password (config.yaml keeps them): {what} take the password of the run's Redis URL; got "
                + ", ".join(u.split("@")[-1] if "@" in u else u for u in urls))


def validate(cfg: Config) -> None:
    """Range checks that the type system cannot express. Raises ConfigError.

    Checks that need the env registry or the baseline bots (does env.name exist, do league.bots play
    it, does the network fit the board) are `experiment.check`'s: this module imports nothing of ours.
    """
    checks = [
        (cfg.env.empty_mask in ("error", "skip"), "env.empty_mask must be error or skip"),
        (cfg.actor.num_actors >= 1, "actor.num_actors must be >= 1"),
        (cfg.actor.num_envs >= 1, "actor.num_envs must be >= 1"),
        (cfg.actor.unroll_length >= 1, "actor.unroll_length must be >= 1"),
        (0.0 <= cfg.actor.epsilon <= 1.0, "actor.epsilon must be in [0, 1]"),
        (cfg.actor.param_sync_every >= 1, "actor.param_sync_every must be >= 1"),
        (1 <= cfg.actor.send_batch <= cfg.actor.high_water_mark, "actor.send_batch must be in [1, actor.high_water_mark]"),
        (0 <= cfg.actor.weight_delay <= MAX_WEIGHT_DELAY,
         f"actor.weight_delay must be in [0, {MAX_WEIGHT_DELAY}] (Redis keeps that many copies of the weights)"),
        (cfg.actor.high_water_mark >= cfg.learner.batch_size,
         "actor.high_water_mark must be >= learner.batch_size, or the learner could starve"),
        (1 <= cfg.learner.batch_size <= MAX_BATCH_SIZE, f"learner.batch_size must be in [1, {MAX_BATCH_SIZE}]"),
        (cfg.learner.optimizer in ("adam", "rmsprop"), "learner.optimizer must be adam or rmsprop"),
        (cfg.learner.lr_schedule in ("constant", "linear"), "learner.lr_schedule must be constant or linear"),
        (cfg.learner.mirror_augment in ("random", "both", "none"),
         f"learner.mirror_augment={cfg.learner.mirror_augment!r} must be random, both or none"),
        (cfg.learner.algo in ("impala", "a3c"), "learner.algo must be impala or a3c"),
        (cfg.learner.algo == "impala" or not cfg.league.enabled,
         "learner.algo=a3c trains without a league: set league.enabled=false"),
        (cfg.learner.reward_clipping in REWARD_CLIPPINGS,
         f"learner.reward_clipping={cfg.learner.reward_clipping!r} must be one of {', '.join(REWARD_CLIPPINGS)}"),
        (cfg.learner.correction in CORRECTIONS,
         "learner.correction must be vtrace, is1, epsilon or none"),
        (0.0 <= cfg.learner.discount <= 1.0, "learner.discount must be in [0, 1]"),
        (cfg.learner.pg_discount is None or 0.0 <= cfg.learner.pg_discount <= 1.0,
         f"learner.pg_discount={cfg.learner.pg_discount} must be in [0, 1] (or null: learner.discount)"),
        (0.0 <= cfg.learner.lambda_ <= 1.0, "learner.lambda_ must be in [0, 1]"),
        (cfg.learner.learning_rate > 0, "learner.learning_rate must be > 0"),
        (cfg.agent.torso in TORSOS, f"agent.torso={cfg.agent.torso!r} must be one of {', '.join(TORSOS)}"),
        (bool(cfg.agent.resnet_channels) and all(1 <= c <= 4096 for c in cfg.agent.resnet_channels),
         "agent.resnet_channels must be a non-empty list of channel counts in [1, 4096]"),
        ((cfg.agent.torso == "fullyconv") == cfg.env.name.startswith("sc2:"),
         "StarCraft II envs (sc2:<map>) need agent.torso=fullyconv, and fullyconv needs one"),
        (cfg.agent.sc2_embed_dim >= 1, "agent.sc2_embed_dim must be >= 1"),
        (cfg.agent.core in ("none", "lstm"), f"agent.core={cfg.agent.core!r} must be none or lstm"),
        (cfg.agent.core == "none" or 1 <= cfg.agent.core_size <= 65536, "agent.core_size must be in [1, 65536]"),
        (cfg.agent.core == "none" or cfg.learner.mirror_augment == "none"
         or cfg.env.name not in ("connect_four", "tictactoe"),
         f"agent.core={cfg.agent.core} needs learner.mirror_augment=none on {cfg.env.name}: a reflected unroll would "
         "start from the core state of the game as it was played, not as reflected"),
        (cfg.actor.epsilon == 0 or not cfg.env.name.startswith("sc2:"),
         "actor.epsilon must be 0 for StarCraft II envs (their actions are FunctionCalls, not one Discrete)"),
        (cfg.agent.padding in ("same", "valid"), "agent.padding must be same or valid"),
        (not cfg.agent.landing_plane or (cfg.agent.torso == "conv" and cfg.env.name == "connect_four"),
         "agent.landing_plane needs agent.torso=conv and a game whose pieces fall (env.name=connect_four)"),
        (not cfg.agent.threat_planes or (cfg.agent.torso == "conv" and cfg.env.name == "connect_four"),
         "agent.threat_planes needs agent.torso=conv and env.name=connect_four (two piece planes, four in a row)"),
        (cfg.agent.padding == "valid" or cfg.agent.kernel_size % 2 == 1,
         "agent.padding=same needs an odd agent.kernel_size"),
        (cfg.run.wandb_mode in ("offline", "online", "disabled"), "run.wandb_mode must be offline, online or disabled"),
        (cfg.run.total_frames >= 1, "run.total_frames must be >= 1"),
        (cfg.learner.publish_every >= 1, "learner.publish_every must be >= 1"),
        # Limits that keep one process's memory and the machine's process count sane.
        (cfg.actor.num_actors <= MAX_ACTORS, f"actor.num_actors must be <= {MAX_ACTORS}"),
        (cfg.actor.num_envs <= MAX_ENVS, f"actor.num_envs must be <= {MAX_ENVS}"),
        (cfg.actor.unroll_length <= MAX_UNROLL_LENGTH, f"actor.unroll_length must be <= {MAX_UNROLL_LENGTH}"),
        (cfg.actor.num_envs * cfg.actor.unroll_length <= MAX_BUFFERED_STEPS,
         f"actor.num_envs * actor.unroll_length must be <= {MAX_BUFFERED_STEPS:,} (each actor buffers an "
         "unroll per env and seat)"),
        (cfg.agent.channels >= 1, "agent.channels must be >= 1"),
        (cfg.agent.conv_layers >= 1, "agent.conv_layers must be >= 1"),
        (cfg.agent.kernel_size >= 1, "agent.kernel_size must be >= 1"),
        (cfg.agent.hidden >= 1, "agent.hidden must be >= 1"),
        (cfg.agent.mlp_layers >= 1, "agent.mlp_layers must be >= 1"),
        (cfg.learner.grad_norm_clip > 0, "learner.grad_norm_clip must be > 0"),
        (cfg.learner.entropy_cost >= 0, "learner.entropy_cost must be >= 0"),
        (cfg.learner.baseline_cost >= 0, "learner.baseline_cost must be >= 0"),
        (0.0 <= cfg.learner.rmsprop_alpha <= 1.0, "learner.rmsprop_alpha must be in [0, 1]"),
        (cfg.learner.rmsprop_eps >= 0, "learner.rmsprop_eps must be >= 0"),
        (cfg.learner.checkpoint_every_s > 0, "learner.checkpoint_every_s must be > 0"),
        # Redis reads BLOCK 0 as "forever": the learner could then never notice a stop signal.
        # ... and it notices one only between reads: the launcher waits 60 s for its final checkpoint.
        (1 <= cfg.learner.read_block_ms <= 30_000, "learner.read_block_ms must be in [1, 30000]"),
        (0 <= cfg.learner.prefetch_batches <= 64, "learner.prefetch_batches must be in [0, 64]"),
        (0 <= cfg.learner.ingest_workers <= cfg.learner.prefetch_batches,
         f"learner.ingest_workers={cfg.learner.ingest_workers} must be in [0, learner.prefetch_batches="
         f"{cfg.learner.prefetch_batches}]: each worker fills one of the batches read ahead"),
        (cfg.learner.ingest_workers == 0 or cfg.learner.algo == "impala",
         "learner.ingest_workers needs learner.algo=impala (A3C's parameter server applies one gradient at a time)"),
        (1 <= cfg.learner.num_learners <= MAX_LEARNERS, f"learner.num_learners must be in [1, {MAX_LEARNERS}]"),
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
        (0.0 <= cfg.learner.replay_fraction < 1.0,
         f"learner.replay_fraction={cfg.learner.replay_fraction} must be in [0, 1) (the share of each batch drawn "
         "from the replay; every update trains on at least one fresh unroll)"),
        (cfg.learner.replay_fraction == 0 or cfg.learner.algo == "impala",
         "learner.replay_fraction > 0 needs learner.algo=impala (A3C's workers push gradients, not unrolls: "
         "there is nothing to replay)"),
        (not 0.0 < cfg.learner.replay_fraction < 1.0 or replayed_per_batch(cfg.learner) >= 1,
         f"learner.replay_fraction={cfg.learner.replay_fraction} replays no unroll of a batch of "
         f"learner.batch_size={cfg.learner.batch_size} (k = round(f * B), at most B - 1, is 0): raise "
         "learner.replay_fraction or learner.batch_size, or set learner.replay_fraction=0"),
        (0.0 < cfg.learner.replay_memory_mb < math.inf,
         f"learner.replay_memory_mb={cfg.learner.replay_memory_mb} must be > 0 and finite"),
        (re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.learner.device) is not None,
         "learner.device must be auto, cpu, mps, cuda or cuda:N"),
        (cfg.run.log_every_s > 0, "run.log_every_s must be > 0"),
        (cfg.transport.compression in COMPRESSIONS, f"transport.compression must be one of {', '.join(COMPRESSIONS)}"),
        (1 <= cfg.transport.compression_level <= 19, "transport.compression_level must be in [1, 19]"),
        (1 <= cfg.transport.shards <= MAX_SHARDS,
         f"transport.shards must be in [1, {MAX_SHARDS}] (got {cfg.transport.shards}): one trajectory stream per shard"),
        (len(cfg.transport.shard_urls) <= cfg.transport.shards,
         f"transport.shard_urls lists {len(cfg.transport.shard_urls)} servers for transport.shards="
         f"{cfg.transport.shards}: the extra servers would get no shard; raise transport.shards or list fewer"),
        _server_urls_check("transport.shard_urls", cfg.transport.shard_urls, "shard servers"),
        _server_urls_check("transport.params_urls", cfg.transport.params_urls, "weight replicas"),
        (0 <= cfg.run.redis_retry_s <= 86_400, "run.redis_retry_s must be in [0, 86400]"),
        (0.1 <= cfg.run.lease_ttl_s <= 3_600, "run.lease_ttl_s must be in [0.1, 3600]"),
        (cfg.run.max_minutes >= 0, "run.max_minutes must be >= 0 (0 = no time limit)"),
        (0 <= cfg.run.seed < 2**31, "run.seed must be in [0, 2**31)"),
        # The name becomes a directory under run.dir and the prefix of every Redis key.
        (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", cfg.run.name) is not None,
         "run.name must be letters, digits, '.', '_' or '-' (starting with a letter or digit)"),
    ]
    league = cfg.league
    checks += [
        (league.snapshot_every >= 1, "league.snapshot_every must be >= 1"),
        (0.0 < league.payoff_decay <= 1.0, "league.payoff_decay must be in (0, 1]"),
        (league.min_games >= 1, "league.min_games must be >= 1"),
        # Decayed counts level off at 1 / (1 - decay): a pair could never reach more games than that.
        (league.payoff_decay == 1.0 or league.min_games < 0.9 / (1.0 - league.payoff_decay),
         f"league.min_games={league.min_games} can never be reached with league.payoff_decay="
         f"{league.payoff_decay} (decayed game counts level off at 1 / (1 - decay)); lower min_games or "
         "raise payoff_decay"),
        (league.elo_k > 0, "league.elo_k must be > 0"),
        (min(league.self_play, league.pfsp, league.forgotten, league.bot_share) >= 0
         and league.self_play + league.pfsp > 0,
         "league.self_play, league.pfsp, league.forgotten and league.bot_share must be >= 0, "
         "with self_play + pfsp > 0"),
        (league.pfsp_weighting in ("hard", "variance", "uniform"),
         "league.pfsp_weighting must be hard, variance or uniform"),
        (league.pfsp_p > 0, "league.pfsp_p must be > 0"),
        (league.pfsp_seat in ("pooled", "weaker"), "league.pfsp_seat must be pooled or weaker"),
        (0 <= league.main_exploiters <= 8 and 0 <= league.league_exploiters <= 8,
         "league.main_exploiters and league.league_exploiters must be in [0, 8]"),
        (1 <= league.exploiter_actors <= MAX_ACTORS, f"league.exploiter_actors must be in [1, {MAX_ACTORS}]"),
        (league.manager_every_s > 0, "league.manager_every_s must be > 0"),
        (0 <= league.exploiter_nice <= 19, "league.exploiter_nice must be in [0, 19]"),
        (league.opponent_cache >= 1, "league.opponent_cache must be >= 1"),
        (0 <= league.opponent_temperature <= 100, "league.opponent_temperature must be in [0, 100]"),
        (league.enabled or not (league.main_exploiters or league.league_exploiters),
         "exploiters need league.enabled=true"),
        (cfg.learner.num_learners == 1 or not (league.main_exploiters or league.league_exploiters),
         "learner.num_learners > 1 is not supported with league exploiters (league.main_exploiters, "
         "league.league_exploiters): set them to 0 or learner.num_learners=1"),
    ]
    for key in ("snapshot_win_rate", "forgotten_below", "exploiter_reset_win_rate", "league_exploiter_reset_prob",
                "exploiter_gives_up_below"):
        checks.append((0.0 <= getattr(league, key) <= 1.0, f"league.{key} must be in [0, 1]"))
    for threshold in ("clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold"):
        value = getattr(cfg.learner, threshold)
        checks.append((value is None or value > 0, f"learner.{threshold} must be > 0 or null"))
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            value = getattr(getattr(cfg, section), f.name)
            if isinstance(value, float) and math.isnan(value):
                raise ConfigError(f"{section}.{f.name} must be a number, not nan")
            if isinstance(value, float) and math.isinf(value) and section == "league":
                raise ConfigError(f"{section}.{f.name} must be finite")
    checks.append((math.isfinite(cfg.learner.learning_rate), "learner.learning_rate must be finite"))
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if cfg.env.name.startswith("sc2:") and league.enabled and league.bots:
        raise ConfigError("league.bots: the baseline bots play Discrete actions, not StarCraft II; set league.bots: [] "
                          "(env.kwargs.bot plays against the game's built-in bot)")


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
