"""The config's fields: one dataclass per component, each field with its default, its one-line `help`
and its `Rule` (what the value must be), and the few numbers derived from them.

Plain data: this module imports nothing of ours. Reading YAML files and `--set` overrides into these
classes, and the checks that tie fields together, are `config.py`'s, which re-exports every name here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


MAX_ACTORS = 256
MAX_ENVS = 4096
MAX_UNROLL_LENGTH = 10_000
MAX_WEIGHT_DELAY = 1_000
MAX_BUFFERED_STEPS = 2_000_000
MODULE_TORSO = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.-]*")  # agent.torso=<module>:<name>


class TorsoNames:
    """The values agent.torso accepts: the names of agents.torsos.TORSOS, the one table of torsos, which
    `register_torso` fills, and `<module>:<name>`, a torso that importing <module> (through PYTHONPATH)
    registers as <name>. The names live here, not there, because config is plain data: it checks a
    config without importing torch or agents/, and agents/ writes each registration here (layers
    import one way). The built-in names are listed below so that a process that never imports agents/
    checks them too; tests/agents/test_layout.py holds them equal to the classes."""

    def __init__(self, *names: str):
        self._names = list(names)

    def add(self, name: str) -> None:
        if name not in self._names:
            self._names.append(name)

    def __contains__(self, value: object) -> bool:
        return value in self._names or (isinstance(value, str) and MODULE_TORSO.fullmatch(value) is not None)

    forms = ("<module>:<name>",)  # the values beside the names, as `Rule.describe` lists them

    def __iter__(self):
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"TorsoNames{tuple(self._names)!r}"


# agent.torso (agents/torsos.py; fullyconv: agents/fullyconv.py, built by agents.model.make_model)
TORSOS = TorsoNames("conv", "mlp", "fullyconv", "shallow", "resnet")
REWARD_CLIPPINGS = ("none", "abs_one", "soft_asymmetric")  # learner.reward_clipping (distributed/vtrace.py)
CORRECTIONS = ("vtrace", "is1", "epsilon", "none")  # off-policy corrections of IMPALA's Table 2
PFSP_WEIGHTINGS = ("hard", "variance", "uniform")  # league.pfsp_weighting (league/matchmaking.py)
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


@dataclass(frozen=True)
class Rule:
    """What one field's value must be, beside its type: one of `choices`, within [low, high] (either bound
    open, either absent), finite, or `predicate(value)` true. `text` says it in words; null passes for
    a field whose default is null (an Optional field), and `check_fields` reports the first field broken."""

    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    predicate: Any = None  # Callable[[value], bool], with `text` its description
    text: str = ""

    def ok(self, value: Any) -> bool:
        if self.choices and value not in self.choices:
            return False
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return self.predicate is None or bool(self.predicate(value))

    def describe(self) -> str:
        if self.choices:
            return _either([str(c) for c in self.choices] + list(getattr(self.choices, "forms", ())))
        if self.predicate is not None:
            return self.text
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            bounds = f"{left}{_num(self.low)}, {_num(self.high)}{right}"
            return "in " + bounds + (" and finite" if self.finite else "")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}" + (" and finite" if self.finite else "")
        return f"{'<' if self.high_open else '<='} {_num(self.high)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _field(metadata: dict, rule: dict) -> dict:
    if "rule" in rule:
        predicate, text = rule.pop("rule")
        rule.update(predicate=predicate, text=text)
    if rule:
        # A TorsoNames stays itself: registrations add to it after the field is made.
        metadata["rule"] = Rule(**{k: v if k != "choices" or isinstance(v, TorsoNames) else tuple(v)
                                   for k, v in rule.items()})
    return metadata


def _f(default: Any, help: str, **rule: Any) -> Any:
    """A config field: its default, its one-line doc and its `Rule` (keyword arguments: choices, low,
    high, low_open, high_open, finite, rule=(predicate, text))."""
    return field(default=default, metadata=_field({"help": help}, rule))


def _f_list(default: list, help: str, **rule: Any) -> Any:
    return field(default_factory=lambda: list(default), metadata=_field({"help": help, "default": default}, rule))


def _run_name_ok(name: str) -> bool:
    # The name becomes a directory under run.dir and the prefix of every Redis key.
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) is not None


def _server_urls_ok(urls: list[str]) -> bool:
    return all(re.fullmatch(r"(redis|rediss)://[^@/?]+(/\d+)?|unix://[^@?]+", u) for u in urls)


# transport.shard_urls and transport.params_urls: servers beside the run's Redis, reached with its password.
_SERVER_URLS_RULE = ("redis://host:port[/db], rediss://host:port[/db] or unix:///path, each without user or "
                     "password (config.yaml keeps them): these servers take the password of the run's Redis URL")


@dataclass
class RunConfig:
    name: str = _f("connect_four", "run name; namespaces every Redis key ({name}:traj, ...) and the run directory",
                   rule=(_run_name_ok, "letters, digits, '.', '_' or '-' (starting with a letter or digit)"))
    dir: str = _f("runs", "parent folder of run directories (config, metrics.jsonl, checkpoints)")
    seed: int = _f(0, "root random seed: the learner's initial weights and every actor's streams (numpy "
                   "SeedSequence of seed, actor id, start); see docs/configuration.md 'What run.seed reproduces'",
                   low=0, high=2**31, high_open=True)
    total_agent_steps: int = _f(3_000_000, "stop once the learner has trained on this many agent steps (T per "
                           "fresh unroll; metrics.jsonl's agent_steps_trained, also the unit of SPS). Not env "
                           "steps (env_steps_played): a league game trains only the learner's seat, a battle "
                           "every unit of a learning team", low=1)
    max_minutes: float = _f(0.0, "also stop after this many minutes of training (0 = no time limit)", low=0)
    redis_url: Optional[str] = _f(None, "redis://[:password@]host:port/db of a shared Redis; unset = start an embedded one")
    wandb_mode: str = _f("offline", "wandb mode: offline (default, no network), online, or disabled",
                         choices=("offline", "online", "disabled"))
    wandb_project: str = _f("impala-league", "wandb project name")
    tensorboard: bool = _f(False, "also write the metrics wandb gets as TensorBoard event files to "
                           "<run dir>/tensorboard (tensorboard --logdir <run dir>/tensorboard)")
    log_every_s: float = _f(5.0, "seconds between progress lines and metrics records (5 s: a minute's run still "
                            "draws its curves with a dozen points)", low=0, low_open=True)
    redis_retry_s: float = _f(60.0, "seconds a process retries a lost Redis connection (backoff up to 2 s) "
                              "before it exits", low=0, high=86_400)
    max_restarts: int = _f(20, "restarts of each crashed child (an actor, the league manager, an exploiter "
                           "learner) that `run.py train` and `run.py actors` allow within any run.restart_window_s "
                           "seconds, counting only its crashes within run.crash_loop_s of its (re)start; one more "
                           "is a crash loop: every child is stopped, exit 1", low=0)
    restart_window_s: float = _f(600.0, "seconds of the sliding window run.max_restarts counts in: a crash "
                                 "older than this no longer counts", low=0, low_open=True)
    crash_loop_s: float = _f(60.0, "a child's crash within this many seconds of its (re)start counts toward its "
                             "run.max_restarts (a crash loop); one after a longer run is restarted without counting, "
                             "so one event that ends many long-running children (a lost node) stops nothing",
                             low=0, low_open=True)
    lease_ttl_s: float = _f(10.0, "seconds a lease on Redis (launcher, learner, league manager, actor id) outlives "
                            "its holder's last refresh; a process taking a held one waits this long (+1 s) first",
                            low=0.1, high=3_600)


@dataclass
class EnvConfig:
    name: str = _f("connect_four", "env registry name (see envs/registry.py): connect_four, tictactoe, battle, "
                   "cue_recall, mpe:<scenario>, gym:<id>, popgym:<Env>, pettingzoo:<module>, atari:<Game> "
                   "(e.g. atari:Pong), atari2p:<game> (e.g. atari2p:boxing), sc2:<map>")
    kwargs: Dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the env's constructor, e.g. {map_size: 30} for battle", "default": {}})
    empty_mask: str = _f("error", "an acting agent whose action mask is all zeros: error (stop, naming the env, "
                         "agent and step) or skip (the game uses an empty mask for 'not acting now': that agent "
                         "does not act this step; simultaneous games only)", choices=("error", "skip"))
    seats: Optional[List[List[str]]] = _f(None, "simultaneous-move envs: the seats (sides), each a list of agent "
                                          "names, e.g. [[player_0], [player_1]]; null = from the names: "
                                          "<team>_<n> share a team, player_<n> and other names are each a seat")


@dataclass
class AgentConfig:
    torso: str = _f("conv", "network torso: conv (board games), mlp, fullyconv (StarCraft II, SC2LE's FullyConv), "
                    "or IMPALA's pixel torsos over frames [C, H, W]: shallow (2 convs, CPU-sized) or resnet "
                    "(the deep one: 3 stacks of conv, max-pool and 2 residual blocks; a GPU network); or one of "
                    "your own, registered with agents.torsos.register_torso: its name, or <module>:<name> to have "
                    "every process import <module> (docs/your-game-your-network.md)", choices=TORSOS)
    channels: int = _f(64, "conv torso: channels of each 3x3 conv layer", low=1)
    conv_layers: int = _f(2, "conv torso: number of conv layers", low=1)
    kernel_size: int = _f(3, "conv torso: kernel size (4 with valid padding sees every 4-in-a-row window)", low=1)
    padding: str = _f("same", "conv torso: same (keep the board size) or valid (no padding)", choices=("same", "valid"))
    landing_plane: bool = _f(False, "conv torso, connect four: add an input plane that marks each column's landing "
                             "cell (the empty cell a piece dropped there would take), so that one conv window "
                             "sees whether a three-in-a-row can be completed now")
    threat_planes: bool = _f(False, "conv torso, connect four: add two input planes that mark, for each player, the "
                             "empty cells that would complete a four-in-a-row (a threat, playable now or not)")
    resnet_channels: List[int] = _f_list([16, 32, 32], "resnet torso: channels of each stack (IMPALA: 16, 32, 32)",
                                         rule=(lambda v: bool(v) and all(1 <= c <= 4096 for c in v),
                                               "a non-empty list of channel counts in [1, 4096]"))
    center_frames: bool = _f(False, "shallow and resnet torsos: subtract each observation's mean pixel (over its "
                             "stacked frames) after scaling to [0, 1], so that the first convolution's inputs have "
                             "zero mean. With uncentered frames every weight of a filter gets a gradient of one "
                             "sign from the background, Adam moves them all by the learning rate together, and "
                             "filters die within minutes (docs/atari.md). Off for checkpoints that were trained "
                             "without it")
    hidden: int = _f(256, "width of the fully connected layer(s) before the policy and baseline heads", low=1)
    mlp_layers: int = _f(2, "mlp torso: number of hidden layers", low=1)
    sc2_embed_dim: int = _f(8, "fullyconv: categorical feature layers with more categories than this are embedded "
                            "in this many channels, smaller ones one-hot", low=1)
    core: str = _f("none", "recurrent core between the torso and the heads: none (feedforward: acts on the current "
                   "observation alone) or lstm (IMPALA's: remembers across steps; the state is carried across "
                   "unrolls, and what lies further back than one unroll is reached only through it)",
                   choices=("none", "lstm"))
    core_size: int = _f(256, "lstm core: hidden and cell size")
    core_inputs: Optional[bool] = _f(None, "lstm core: also feed it the previous action (one-hot) and the previous "
                                     "reward clipped to [-1, 1], as IMPALA does; null = on")


@dataclass
class ActorConfig:
    num_actors: int = _f(2, "actor processes that `run.py train` starts", low=1, high=MAX_ACTORS)
    num_envs: int = _f(32, "envs per actor process, stepped together with one batched forward pass",
                       low=1, high=MAX_ENVS)
    unroll_length: int = _f(40, "T: steps of one learning stream (agent steps) per unroll",
                            low=1, high=MAX_UNROLL_LENGTH)
    param_sync_every: int = _f(4, "check the params version after this many unrolls sent by this actor", low=1)
    send_batch: int = _f(1, "unrolls per trajectory stream entry: an actor sends its finished unrolls this many "
                         "to an entry, stacked (one round trip for all; one parse per entry for the learner, whose "
                         "ingest costs per entry); it must divide the fresh unrolls of a batch")
    weight_delay: int = _f(0, "act with the weights K publishes behind the learner's latest (policy lag on "
                           "purpose, for the off-policy correction study); 0 = the latest",
                           low=0, high=MAX_WEIGHT_DELAY)
    epsilon: float = _f(0.0, "exploration: env i plays uniformly random legal moves with probability "
                        "epsilon * i / (num_envs - 1); V-trace corrects for it", low=0, high=1)
    high_water_mark: int = _f(256, "wait while the trajectory stream holds more than this many unconsumed unrolls "
                              "(its entries times actor.send_batch)")
    nice: int = _f(0, "niceness (0-19) at which `run.py train` starts the main agent's actors: where the learner shares "
                   "the machine's cores with them and is the bottleneck, actors that give way to it feed it more",
                   low=0, high=19)


@dataclass
class LearnerConfig:
    algo: str = _f("impala", "impala (actors send unrolls, the learner corrects with learner.correction) or a3c "
                   "(actors push n-step actor-critic gradients to a parameter server; no league)",
                   choices=("impala", "a3c"))
    device: str = _f("auto", "torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ...",
                     rule=(lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                           "auto, cpu, mps, cuda or cuda:N"))
    batch_size: int = _f(32, "B: unrolls per update", low=1, high=MAX_BATCH_SIZE)
    precision: str = _f("auto", "the forward pass of the update: fp32, bf16 (a bfloat16 autocast: convolutions and "
                        "matrix products in bfloat16, weights, optimizer, losses and V-trace in float32) or auto: "
                        "bf16 for pixel torsos (shallow, resnet) on a CPU with AMX bfloat16 units, where it trains "
                        "them faster (bench/bench_pixels.py), else fp32", choices=("auto", "fp32", "bf16"))
    num_threads: int = _f(1, "torch's threads for the learner's update on CPU (torch.set_num_threads). 1 leaves "
                          "the other cores to the actors; more lets the update use cores the actors leave idle "
                          "while they wait at actor.high_water_mark (pixels on a few cores)", low=1, high=256)
    optimizer: str = _f("adam", "adam or rmsprop", choices=("adam", "rmsprop"))
    learning_rate: float = _f(6e-4, "optimizer learning rate", low=0, low_open=True, finite=True)
    lr_schedule: str = _f("constant", "constant, or linear: anneal the learning rate linearly to 0 at the end of "
                          "the run (IMPALA), whichever of run.total_agent_steps and run.max_minutes comes first",
                          choices=("constant", "linear"))
    rmsprop_alpha: float = _f(0.99, "RMSProp smoothing constant (IMPALA: 0.99)", low=0, high=1)
    rmsprop_eps: float = _f(1e-5, "RMSProp epsilon. The loss here is a mean over the T x B steps; IMPALA's 0.01 "
                             "was for a sum over its 20 x 32, where it equals 0.01 / 640 ~ 1.6e-5 here (the "
                             "1e-5 of A2C's reference implementations). 0.01 on a mean swamps the gradients. "
                             "PyTorch's RMSProp starts its mean of squared gradients at 0 (TensorFlow's at 1): "
                             "its first steps are up to 10x the learning rate", low=0)
    adam_eps: float = _f(1e-8, "Adam epsilon, added to the root of each parameter's mean squared gradient: "
                         "where it is larger than the gradients, the steps shrink below the learning rate "
                         "(PyTorch's default 1e-8; OpenAI Baselines' and CleanRL's PPO on Atari 1e-5)", low=0)
    redo_every: int = _f(0, "recycle the torso's dormant ReLU units every N updates (ReDo, Sokar et al. 2023: "
                         "fresh incoming weights, outgoing weights and optimizer moments 0), scored on that "
                         "update's batch; 0 = never. For a torso whose units die (the metric dead_units near 1); "
                         "impala only", low=0)
    redo_threshold: float = _f(0.0, "ReDo's tau: a unit is dormant when its mean output over the batch is at most tau "
                               "times its layer's mean output; 0 = only units that are 0 on every step (Sokar et al. "
                               "use 0.025 to 0.1)", low=0, high=1)
    discount: float = _f(0.99, "gamma", low=0, high=1)
    pg_discount: Optional[float] = _f(None, "gamma of the policy-gradient advantage only, r + gamma * v_{s+1} - V(x_s) "
                                      "(the value targets keep learner.discount): below it, a move that wins now "
                                      "gains more over one that wins later; null = learner.discount", low=0, high=1)
    reward_clipping: str = _f("none", "rewards as the loss sees them: none, abs_one (clip to [-1, 1]: Atari) or "
                              "soft_asymmetric (0.3 min(tanh r, 0) + 5 max(tanh r, 0): IMPALA's DMLab-30). Episode "
                              "statistics always report the game's own score", choices=REWARD_CLIPPINGS)
    normalize_advantages: bool = _f(False, "standardize the policy gradient's advantages over each batch (zero mean, "
                                    "unit std; Sample Factory's APPO and PPO do): the policy's step no longer "
                                    "shrinks with sparse rewards while the baseline's gradient stays")
    entropy_cost: float = _f(0.01, "weight of the entropy bonus", low=0)
    baseline_cost: float = _f(0.5, "weight of the baseline loss 0.5 * sum (vs - V)^2 (IMPALA: 0.5)", low=0)
    grad_norm_clip: float = _f(40.0, "clip the global gradient norm to this (IMPALA: 40)", low=0, low_open=True)
    clip_rho_threshold: Optional[float] = _f(1.0, "rho-bar; null = no clipping", low=0, low_open=True)
    clip_pg_rho_threshold: Optional[float] = _f(1.0, "pg-rho-bar; null = no clipping", low=0, low_open=True)
    clip_c_threshold: Optional[float] = _f(1.0, "c-bar; null = no clipping", low=0, low_open=True)
    lambda_: float = _f(1.0, "V-trace lambda (multiplies the c's)", low=0, high=1)
    correction: str = _f("vtrace", "off-policy correction (IMPALA Table 2): vtrace, is1 (1-step importance "
                         "sampling), epsilon (log(pi + 1e-6)) or none", choices=CORRECTIONS)
    mirror_augment: str = _f("random", "boards with a left-right symmetry: random (each unroll of a batch is "
                             "reflected with probability 1/2), both (each unroll and its reflection: twice "
                             "the update's compute), or none", choices=("random", "both", "none"))
    publish_every: int = _f(1, "publish weights every N updates", low=1)
    checkpoint_every_s: float = _f(60.0, "seconds between checkpoints", low=0, low_open=True)
    overwrite_checkpoint: bool = _f(False, "let a learner started without --resume train from scratch where its "
                                    "run directory holds a checkpoint, which its first checkpoint then replaces; "
                                    "false: it refuses to start (--resume continues that checkpoint)")
    read_block_ms: int = _f(1000, "XREADGROUP block time in milliseconds", low=1, high=30_000)
    prefetch_batches: int = _f(2, "batches read, decoded and stacked ahead of the update by the ingest thread; "
                               "0 = read in the update's own thread", low=0, high=64)
    ingest_workers: int = _f(0, "worker processes that read, decode, check and stack the batches beside the "
                             "learner (each its own consumer, handing batches over in shared memory), for a "
                             "learner whose one ingest thread cannot keep up (a GPU learner of many actors); "
                             "0 = the learner's own ingest thread. At most learner.prefetch_batches")
    num_learners: int = _f(1, "K: learner processes that train the main agent as one (data parallel, "
                           "torch.distributed): each reads its own B unrolls, gradients are averaged, so an "
                           "update trains on K * B unrolls", low=1, high=MAX_LEARNERS)
    replay_fraction: float = _f(0.0, "experience replay (IMPALA Table 2 'with replay'): share f of each batch of B "
                                "unrolls drawn uniformly from this learner's replay of recently trained unrolls, "
                                "k = round(f * B) of them (at most B - 1), corrected by V-trace with their own "
                                "behaviour policy; 0 = none. In [0, 1); impala only", low=0, high=1, high_open=True)
    replay_memory_mb: float = _f(256.0, "memory of the replay (MB of unroll arrays, 1 MB = 2**20 bytes); the "
                                 "oldest unrolls are evicted first", low=0, low_open=True, finite=True)


@dataclass
class LeagueConfig:
    enabled: bool = _f(False, "train against a league (snapshots, bots, exploiters) instead of the latest weights only")
    snapshot_every: int = _f(200, "freeze a snapshot of each learner every this many of its updates", low=1)
    snapshot_win_rate: float = _f(0.7, "also snapshot a learner once it beats every league member at this win rate",
                                  low=0, high=1)
    min_games: float = _f(20.0, "decayed games before a win rate between two players counts", low=1)
    payoff_decay: float = _f(0.99, "a pair's win/draw/loss counts are multiplied by this before each new game",
                             low=0, high=1, low_open=True)
    elo_k: float = _f(8.0, "Elo K-factor (rating points per game) of the league's online ratings", low=0, low_open=True)
    self_play: float = _f(0.35, "main agent: share of games against its own latest weights", low=0)
    pfsp: float = _f(0.5, "main agent: share of games drawn by PFSP over the whole league", low=0)
    forgotten: float = _f(0.15, "main agent: share of games against its own snapshots it no longer beats", low=0)
    bot_share: float = _f(0.0, "main agent: share of games drawn by PFSP over the baseline bots only, on top of "
                          "what PFSP over the whole league gives them (0: AlphaStar's mix). The four shares "
                          "(self_play, pfsp, forgotten, bot_share) are weights, divided by their sum", low=0)
    forgotten_below: float = _f(0.3, "a snapshot is forgotten when the main agent's win rate against it is below this",
                                low=0, high=1)
    pfsp_weighting: str = _f("hard", "PFSP weighting: hard (1-x)^p, variance x(1-x), or uniform",
                             choices=PFSP_WEIGHTINGS)
    pfsp_p: float = _f(2.0, "the exponent p of the hard weighting", low=0, low_open=True)
    pfsp_seat: str = _f("pooled", "the win rate PFSP weighs by: pooled (over both seats) or weaker (the learner's "
                        "lower per-seat win rate, for games with a first-move advantage)", choices=("pooled", "weaker"))
    bots: List[str] = _f_list(["random", "tactical"], "baseline bots that are league members: random, tactical (wins, else "
                                "blocks, else random), minimax:D (D-ply negamax; leaves count open twos and threes "
                                "and, in connect four, pieces in the centre column)")
    main_exploiters: int = _f(0, "main exploiter learners: train against the main agent, reset when they beat it",
                              low=0, high=8)
    league_exploiters: int = _f(0, "league exploiter learners: PFSP against the whole league", low=0, high=8)
    exploiter_actors: int = _f(1, "actor processes per exploiter learner", low=1, high=MAX_ACTORS)
    exploiter_nice: int = _f(10, "run.py train starts exploiter learners and actors at this niceness (0-19), so that "
                             "on a shared machine the main agent gets the CPU first", low=0, high=19)
    exploiter_reset_win_rate: float = _f(0.7, "a main exploiter that beats the main agent at this rate is "
                                         "snapshotted and reset", low=0, high=1)
    league_exploiter_reset_prob: float = _f(0.25, "chance that a league exploiter is reset after each snapshot",
                                            low=0, high=1)
    exploiter_gives_up_below: float = _f(0.1, "a main exploiter below this win rate against the main agent "
                                         "plays its snapshots instead", low=0, high=1)
    manager_every_s: float = _f(2.0, "seconds between league manager passes (results, snapshots, matchmaking)",
                                low=0, low_open=True)
    opponent_cache: int = _f(16, "snapshots an actor keeps in memory, least recently used dropped first", low=1)
    redis_snapshots: int = _f(64, "the most snapshots whose weights Redis holds (the newest of each learner, those "
                              "actors asked for, then those the opponent distributions weigh most); the others "
                              "stay members, their files are loaded back when actors draw them (league/residency.py). "
                              "64 x a 2.6 MB Atari network is 167 MB", low=1, high=100_000)
    redis_budget_mb: float = _f(1024.0, "the league manager warns, with the numbers, when Redis's used_memory passes "
                                "this many MB", low=0, low_open=True)
    disk_budget_mb: float = _f(20480.0, "the league manager warns, with the numbers, when the run directory (snapshot "
                               "files, checkpoints, metrics, the embedded Redis's append-only file) passes this many MB",
                               low=0, low_open=True)
    opponent_temperature: float = _f(1.0, "league opponents that are networks (snapshots, other learners) play "
                                     "softmax(logits / T): 1 samples their policy (AlphaStar), 0 plays its argmax",
                                     low=0, high=100)


@dataclass
class TransportConfig:
    compression: str = _f("none", "unroll arrays on the wire: none, or zstd (each array one zstd frame; the decoder "
                          "refuses a frame that declares more bytes than the array's shape needs)",
                          choices=COMPRESSIONS)
    compression_level: int = _f(3, "zstd level, 1 (fastest) to 19 (smallest)", low=1, high=19)
    shards: int = _f(1, "trajectory streams per learner (1 to 256); actor i writes to shard i % shards, the "
                     "learner reads them all. Shard 0 keeps <run>:traj, <run>:traj:produced ...; shard s > 0 has "
                     "{<run>:s<s>}:traj ... (a Redis Cluster hash tag per shard; on a cluster shard 0 is {<run>:s0})",
                     low=1, high=MAX_SHARDS)
    shard_urls: List[str] = _f_list([], "Redis of each shard: shard s lives on shard_urls[s % len]; empty = all on "
                                    "the run's Redis",
                                    rule=(_server_urls_ok, _SERVER_URLS_RULE))
    params_urls: List[str] = _f_list([], "read-only replicas of the run's Redis (redis-server --replicaof) that actors "
                                     "fetch weights from: actor i reads params_urls[i % len], and falls back to the "
                                     "run's Redis when a replica is unreachable, behind, or its blob fails the "
                                     "published SHA-256; empty = all from the run's Redis",
                                     rule=(_server_urls_ok, _SERVER_URLS_RULE))


@dataclass
class EvaluationConfig:
    judges: Optional[List[str]] = _f(None, "outside judges the end-of-run evaluation plays, reported apart from the "
                                     "training opponents: mcts:N (OpenSpiel's MCTS, N simulations a move; connect_four "
                                     "and tictactoe), solver or solver:E (connect four's perfect player, a random move "
                                     "with probability E) or another bot spec; never in league.bots. The first also plays the "
                                     "earlier policies (the held-out line of the over-training figure). null = the "
                                     "game's ladder (connect_four, tictactoe: mcts:100, mcts:400, mcts:1600), [] = none")
    judge_games: int = _f(10, "games per seat against each judge at the end of the run (its earlier policies: "
                          "--eval-history-games); 0 = no judges. 50 a seat is the protocol of the reported "
                          "ladders; a judge's time a game grows with its N and the game's length", low=0,
                          high=10_000)
    positions: int = _f(1000, "connect four: seeded positions where the final policy's and each earlier policy's "
                        "greedy move is scored by the perfect solver at the end of the run (optimal and blunder rates "
                        "by phase; evaluation/positions.py); 0 = none", low=0, high=100_000)
    built_in_games: int = _f(3, "two-player Atari (atari2p:<game>) whose ROM has a one-player atari:<Game> of the "
                             "same action set: games the final policy and its earlier policies play there as first_0 "
                             "against the game's built-in player at the end of the run (evaluation/atari_judge.py), "
                             "kept apart from the league's payoff; 0 = none", low=0, high=1_000)
    atari_protocol: str = _f("sticky", "Atari: the protocol of the end-of-run evaluation and the built-in "
                             "player's games (evaluation/atari_protocol.py, docs/atari.md): sticky (actions "
                             "repeated with probability 0.25, Machado et al. 2018) or deterministic (none)",
                             choices=("sticky", "deterministic"))


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    league: LeagueConfig = field(default_factory=LeagueConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)


SECTIONS: dict[str, type] = {
    "run": RunConfig, "env": EnvConfig, "agent": AgentConfig, "actor": ActorConfig, "learner": LearnerConfig, "league": LeagueConfig,
    "transport": TransportConfig, "evaluation": EvaluationConfig,
}


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

