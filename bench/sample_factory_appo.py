"""Sample Factory 2.1.1's APPO on Atari Pong, set up as configs/atari_pong.yaml trains it: the other side of
bench/bench_vs_sample_factory.py. It runs in Sample Factory's own virtual environment
(bench/.venv-sample-factory, which that benchmark creates on first use), never in the project's, and imports
nothing of the project.

    bench/.venv-sample-factory/bin/python bench/sample_factory_appo.py --train-dir /tmp/sf --seconds 480 \
        --progress /tmp/sf/progress.jsonl
    bench/.venv-sample-factory/bin/python bench/sample_factory_appo.py --count-params

What it sets up:

* The env `bench_pong`: ALE/Pong-v5 under gymnasium 0.29's `AtariPreprocessing` and `FrameStack`, the
  protocol of envs/atari.py: sticky actions at `--sticky-actions` (default 0.25, ALE v5's own and the
  project's; 0 for none), the minimal action set (6), a frame skip of 4 (max over the
  last two frames), 84 x 84 grayscale (area interpolation), a stack of 4 ([4, 84, 84] uint8), up to 30
  no-op starts, episodes cut at 108,000 emulator frames. Rewards unclipped: Pong's are -1 / +1, so the
  project's clipping for the loss changes nothing, and the returns are the game's scores.
* The network: Sample Factory's own `convnet_impala` encoder with one FC layer of 256
  (`--encoder_conv_mlp_layers 256`), which is IMPALA's shallow torso (agents/torsos.py `ShallowTorso`:
  conv 16 8x8 stride 4, conv 32 4x4 stride 2, FC 256, ReLU), then its linear policy and value heads:
  677,943 parameters on Pong's 6 actions, as the project's (`--count-params` prints the count).
* `APPO_ARGS`: the sizes and hyperparameters of configs/atari_pong.yaml where Sample Factory has them.
* Two fixes of Sample Factory 2.1.1's known bugs, applied when this module is imported (so in every
  process Sample Factory spawns too) by replacing two methods; site-packages stays as installed:
  1. V-trace: `Learner._record_summaries` reads `mb.advantages`, which only the GAE path computes, so a
     run with `--with_vtrace` dies at its first summary (upstream PRs #278 and #332). The replacement
     leaves the four advantage statistics out when the batch has none, as #332 does.
  2. `--train_for_seconds` never stops a run: `Runner.total_train_seconds` stays 0 (upstream PR #330).
     The replacement sets it before each stop check, to the seconds since the first training iteration:
     #330 counts from the runner's start, start-up included, while the project's run.max_minutes counts
     from its learner's start, so both sides train the same minutes after their start-ups.
* A progress file (`--progress`, JSON lines, one a second of training and one at the end): the wall-clock
  `time`, Sample Factory's own count of emulator frames trained (`frames_trained`: the learner's env
  steps, samples x `env_frameskip` 4 with `summaries_use_frameskip`) and the `returns` of the episodes that
  ended since the line before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import gymnasium
import torch

from sample_factory.algo.learning.learner import Learner
from sample_factory.algo.runners.runner import AlgoObserver, Runner
from sample_factory.algo.utils.misc import EPISODIC, ExperimentStatus
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
from sample_factory.envs.env_utils import register_env
from sample_factory.envs.env_wrappers import NumpyObsWrapper
from sample_factory.train import make_runner

ENV_NAME = "bench_pong"
# The sticky actions of every env, in the environment: Sample Factory builds its envs in processes it spawns.
STICKY_ENV = "BENCH_PONG_STICKY_ACTIONS"
ADVANTAGE_STATS = ("adv_min", "adv_max", "adv_std", "adv_mean")

# configs/atari_pong.yaml in Sample Factory's flags. V-trace needs recurrence == rollout (an unroll of 20);
# a batch is 80 agent steps (4 unrolls of 20), one SGD step on it (1 epoch of 1 minibatch), as IMPALA.
APPO_ARGS = {
    "algo": "APPO", "device": "cpu", "async_rl": True, "serial_mode": False, "batched_sampling": False,
    "num_workers": 2, "num_envs_per_worker": 16, "policy_workers_per_policy": 1, "num_policies": 1,
    "rollout": 20, "recurrence": 20, "batch_size": 80, "num_batches_per_epoch": 1, "num_epochs": 1,
    "with_vtrace": True, "use_rnn": False,
    "encoder_conv_architecture": "convnet_impala", "encoder_conv_mlp_layers": [256], "nonlinearity": "relu",
    "optimizer": "adam", "learning_rate": 0.0006, "lr_schedule": "constant", "adam_eps": 1e-8,
    "max_grad_norm": 40.0, "gamma": 0.99, "exploration_loss_coeff": 0.01, "value_loss_coeff": 0.5,
    # The project feeds frames / 255 and normalizes neither observations nor returns.
    "obs_scale": 255.0, "normalize_input": False, "normalize_returns": False,
    "env_frameskip": 4, "env_framestack": 4, "summaries_use_frameskip": True,
    "train_for_env_steps": 10**12, "with_wandb": False, "restart_behavior": "overwrite", "seed": 0,
}


def make_pong(full_env_name: str, cfg=None, env_config=None, render_mode: str | None = None) -> gymnasium.Env:
    """Pong as envs/atari.py's `make_atari` builds it (the module doc lists the settings): observations uint8
    [4, 84, 84], Discrete(6), rewards the game's. Sample Factory's env factory (`register_env`)."""
    import ale_py  # noqa: F401  (registers the ALE/* ids with gymnasium)

    sticky = float(os.environ.get(STICKY_ENV, "0.25"))
    env = gymnasium.make("ALE/Pong-v5", frameskip=1, obs_type="grayscale", repeat_action_probability=sticky,
                         full_action_space=False, max_num_frames_per_episode=108_000, render_mode=render_mode)
    env = gymnasium.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                                terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    return NumpyObsWrapper(gymnasium.wrappers.FrameStack(env, 4))


def _record_summaries_vtrace_safe(self, train_loop_vars):
    """`Learner._record_summaries` without the advantage statistics when the minibatch has no `advantages`
    (the V-trace path computes its advantages per minibatch and never stores them): upstream PR #332."""
    mb = train_loop_vars.mb
    if "advantages" in mb:
        return _record_summaries(self, train_loop_vars)
    mb["advantages"] = torch.zeros(1)  # read by the original, dropped below
    try:
        stats = _record_summaries(self, train_loop_vars)
    finally:
        del mb["advantages"]
    for key in ADVANTAGE_STATS:
        stats.pop(key, None)
    return stats


def _should_end_training_timed(self) -> bool:
    """`Runner._should_end_training` with `total_train_seconds` counted first (upstream PR #330), from the
    first training iteration (the runner checks after each one)."""
    now = time.time()
    self.first_training_time = getattr(self, "first_training_time", None) or now
    self.total_train_seconds = now - self.first_training_time
    return _should_end_training(self)


_record_summaries = Learner._record_summaries
_should_end_training = Runner._should_end_training
Learner._record_summaries = _record_summaries_vtrace_safe
Runner._should_end_training = _should_end_training_timed


class ProgressFile(AlgoObserver):
    """Writes `path` (JSON lines) from the runner's process: on the first training iteration, then at most
    once every `every_s` seconds, and when the run stops: `time` (s since the epoch), `frames_trained`
    (the runner's `env_steps` of policy 0) and `returns` (the episodes reported since the line before)."""

    def __init__(self, path: Path, every_s: float = 1.0):
        self.file = Path(path).open("w")
        self.every_s = every_s
        self.last = None
        self.returns: list[float] = []

    def episode(self, runner: Runner, msg: dict, policy_id: int) -> None:
        """A finished episode (Sample Factory's episodic-statistics handler): its return, the game's score."""
        self.returns.append(float(msg[EPISODIC]["reward"]))

    def write(self, runner: Runner) -> None:
        """Append one line now."""
        self.last = time.time()
        line = {"time": self.last, "frames_trained": int(runner.env_steps.get(0, 0)), "returns": self.returns}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()
        self.returns = []

    def on_training_step(self, runner: Runner, training_iteration_since_resume: int) -> None:
        if self.last is None or time.time() - self.last >= self.every_s:
            self.write(runner)

    def on_stop(self, runner: Runner) -> None:
        self.write(runner)


def sf_argv(train_dir: str, experiment: str, seconds: int) -> list[str]:
    """Sample Factory's command line: `APPO_ARGS`, the run's folder and its time limit. Its workers keep this
    process's niceness (Sample Factory sets the learner's to `--default_niceness`, 0 by default)."""
    args = {**APPO_ARGS, "env": ENV_NAME, "train_dir": train_dir, "experiment": experiment,
            "train_for_seconds": seconds, "default_niceness": os.nice(0)}
    argv = []
    for key, value in args.items():
        if isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv.append(f"--{key}={value}")
    return argv


def parse_cfg(argv: list[str]):
    """Sample Factory's config of `argv`."""
    parser, _ = parse_sf_args(argv=argv)
    return parse_full_cfg(parser, argv)


def count_params(cfg) -> int:
    """Trainable parameters of the actor-critic Sample Factory builds for `cfg` on Pong."""
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.utils.attr_dict import AttrDict

    env = make_env_func_batched(cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0))
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    env.close()
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def main() -> int:
    """Train (or, with --count-params, print the network's parameter count); the exit status is 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-dir", default="/tmp/sample_factory_appo", help="Sample Factory's --train_dir")
    parser.add_argument("--experiment", default="pong_appo", help="Sample Factory's --experiment")
    parser.add_argument("--seconds", type=int, default=480, help="Sample Factory's --train_for_seconds")
    parser.add_argument("--progress", default=None, help="the progress file (JSON lines); none if unset")
    parser.add_argument("--count-params", action="store_true", help="print the network's parameter count, exit")
    parser.add_argument("--sticky-actions", type=float, default=0.25,
                        help="the probability that the emulator repeats the previous action (default 0.25)")
    args = parser.parse_args()
    if not 0.0 <= args.sticky_actions < 1.0:
        parser.error("--sticky-actions must be in [0, 1)")
    os.environ[STICKY_ENV] = str(args.sticky_actions)
    register_env(ENV_NAME, make_pong)
    cfg = parse_cfg(sf_argv(args.train_dir, args.experiment, args.seconds))
    if args.count_params:
        print(json.dumps({"params": count_params(cfg)}))
        return 0
    cfg, runner = make_runner(cfg)
    if args.progress:
        progress = ProgressFile(Path(args.progress))
        runner.register_observer(progress)
        runner.register_episodic_stats_handler(progress.episode)
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
