"""The core between a torso and the heads: the recurrent core of IMPALA (Espeholt et al. 2018, Fig. 3: an
LSTM that also reads the last action and the clipped last reward), or the identity core of a
feedforward network; and `Network`, every network as torso -> core -> heads.

Both cores have one interface (`Core`): `act` for one step of N streams, `replay` for the learner's
batch, `feature_readers` for ReDo. The identity core passes the torso's features through and carries no
state (None); the LSTM's state belongs to one stream of observations (a learning stream of an actor, an
opponent seat, a game of an evaluation): it starts at zeros at the stream's episode start and is carried
from step to step. The state is `[N, 2, core_size]`, the LSTM's h and c side by side, float32.

How the actor and the learner agree (docs/architecture.md, "Recurrent core"):
* the actor runs `Network.step` once per step of a stream, from the state before that step; an unroll
  carries the state its stream had before its first step, and the last action and reward before it;
* the learner runs `LSTMCore.unroll` over the T+1 steps of each unroll from that state, zeroing it (and
  the last action and reward) before every step that follows a `done` inside the unroll, so that step
  t sees exactly what the actor's step t saw.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from impala_league.agents.checkpoint import upgrade_model_keys
from impala_league.batch import Batch
from impala_league.config import AgentConfig

NO_ACTION = -1  # the last action at an episode's first step: fed to the core as an all-zero one-hot


class CoreInput(NamedTuple):
    """What a core needs besides the torso's features, for N streams.

    state: float32 [N, 2, core_size], the LSTM's (h, c) before this step (zeros at an episode start).
    last_action: int64 [N], the stream's previous action (its function id for multi-head actions),
      NO_ACTION at an episode start.
    last_reward: float32 [N], the reward of the stream's previous step (0 at an episode start); the
      core clips it to [-1, 1].
    """

    state: torch.Tensor
    last_action: torch.Tensor
    last_reward: torch.Tensor


def zero_core_input(n: int, core_size: int) -> CoreInput:
    """The CoreInput of n streams at their episode start."""
    return CoreInput(torch.zeros(n, 2, core_size), torch.full((n,), NO_ACTION, dtype=torch.long), torch.zeros(n))


class Core(nn.Module):
    """The interface of a core: torso features [N, F] -> the heads' input [N, out_size].

    `recurrent`: it carries a state from step to step (then of `core_size` units: [N, 2, core_size]).
    """

    recurrent: bool
    core_size: int
    out_size: int

    def act(self, features: torch.Tensor, core: CoreInput | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step of N streams: features [N, F] and their CoreInput (None for a core without state) ->
        (output [N, out_size], the state after this step [N, 2, core_size], or None)."""
        raise NotImplementedError

    def replay(self, features: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The outputs [(T+1) B + N, out_size] for the torso's features [(T+1) B + N, F] of a learner
        batch's T+1 steps (time-major) and then its N final observations, row for row."""
        raise NotImplementedError

    def feature_readers(self, next_readers: list[torch.Tensor]) -> list[torch.Tensor]:
        """The weights [out, in] whose first F input columns read the features: the core's own input
        weights, or `next_readers` (the heads') when the core passes the features through."""
        raise NotImplementedError


class IdentityCore(Core):
    """No core (`agent.core=none`): the heads read the torso's features [N, F] as they are; no state."""

    recurrent = False
    core_size = 0

    def __init__(self, input_size: int):
        super().__init__()
        self.out_size = input_size

    def act(self, features: torch.Tensor, core: CoreInput | None) -> tuple[torch.Tensor, None]:
        return features, None  # a CoreInput given (bench_sps gives zeros of size 0) is not read

    def replay(self, features: torch.Tensor, batch: Batch) -> torch.Tensor:
        return features

    def feature_readers(self, next_readers: list[torch.Tensor]) -> list[torch.Tensor]:
        return next_readers


class LSTMCore(Core):
    """An LSTM of `core_size` units over the torso's features [.., input_size] and, with `core_inputs`,
    the last action as a one-hot over `num_actions` and the last reward clipped to [-1, 1] (IMPALA)."""

    recurrent = True

    def __init__(self, input_size: int, core_size: int, num_actions: int, core_inputs: bool):
        super().__init__()
        self.out_size = core_size
        self.core_size = core_size
        self.num_actions = num_actions
        self.core_inputs = core_inputs
        self.lstm = nn.LSTM(input_size + (num_actions + 1 if core_inputs else 0), core_size)
        # The forget gate starts open (bias 1), as in the TensorFlow and Sonnet LSTMs of IMPALA's agents
        # (Jozefowicz et al. 2015): PyTorch's bias near 0 halves the cell each step, and with it the
        # gradient that must reach a cue several steps back.
        with torch.no_grad():
            self.lstm.bias_ih_l0[core_size:2 * core_size].fill_(1.0)
            self.lstm.bias_hh_l0[core_size:2 * core_size].zero_()

    def inputs(self, features: torch.Tensor, last_action: torch.Tensor, last_reward: torch.Tensor) -> torch.Tensor:
        """features [..., F]; last_action int64 [...] (NO_ACTION: none); last_reward [...] ->
        the LSTM's input [..., F (+ A + 1)]."""
        if not self.core_inputs:
            return features
        one_hot = nn.functional.one_hot(last_action.clamp(min=0), self.num_actions).to(features.dtype)
        one_hot = one_hot * (last_action >= 0).unsqueeze(-1).to(features.dtype)
        reward = last_reward.to(features.dtype).clamp(-1.0, 1.0).unsqueeze(-1)
        return torch.cat([features, one_hot, reward], -1)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of N streams: x [N, I] (`inputs`), state [N, 2, S] -> (output [N, S], new state [N, 2, S])."""
        out, (h, c) = self.lstm(x.unsqueeze(0), (state[:, 0].unsqueeze(0).contiguous(),
                                                 state[:, 1].unsqueeze(0).contiguous()))
        return out[0], torch.stack([h[0], c[0]], 1)

    def unroll(self, x: torch.Tensor, state: torch.Tensor,
               reset: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The core over T steps of B streams: x [T, B, I] (`inputs`), state [B, 2, S] before step 0,
        reset bool [T, B]: zero the state before step t (the step after a `done`).

        Returns (outputs [T, B, S], ends): ends[t] = the state [B, 2, S] after step t for every t after
        which some stream resets (t + 1 a reset step), the state a truncated step's final observation
        continues from. One nn.LSTM call per run of steps without a reset in any stream (cuDNN's fused
        kernel on a GPU), the state masked between runs: bench/bench_core.py measures it against a
        step-by-step loop.
        """
        T = x.shape[0]
        cuts = [0] + [t for t in torch.nonzero(reset[1:].any(1)).flatten().add(1).tolist()] + [T]
        h, c = state[:, 0].unsqueeze(0).contiguous(), state[:, 1].unsqueeze(0).contiguous()
        outputs, ends = [], {}
        for start, stop in zip(cuts[:-1], cuts[1:]):
            if start > 0:
                ends[start - 1] = torch.stack([h[0], c[0]], 1)
                keep = (~reset[start]).to(h.dtype)[None, :, None]
                h, c = h * keep, c * keep
            out, (h, c) = self.lstm(x[start:stop], (h, c))
            outputs.append(out)
        return torch.cat(outputs), ends


    def act(self, features: torch.Tensor, core: CoreInput | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of N streams from `core` (their state, last action and last reward). Raises TypeError
        without one: a recurrent network does not act without its memory."""
        if core is None:
            raise TypeError("a network with a recurrent core acts through step(obs, mask, core_input)")
        return self.step(self.inputs(features, core.last_action, core.last_reward), core.state)

    def replay(self, features: torch.Tensor, batch: Batch) -> torch.Tensor:
        """`Core.replay` of the LSTM: each unroll starts from the state it carries (`batch.core_state`: what
        its stream had before step 0) with its carried last action and reward; after a `done` step t the
        state, last action and last reward are zeroed before step t+1 (the next episode's first), as the
        actor zeroed them. A truncated step's final observation continues its episode: the state after
        step t, with action_t and reward_t as the last action and reward."""
        T, B = batch.reward.shape
        steps = features[:(T + 1) * B].view(T + 1, B, -1)
        reset = torch.cat([torch.zeros_like(batch.done[:1]), batch.done])  # [T+1, B]: zero the state first
        head0 = batch.action if batch.action.dim() == 2 else batch.action[..., 0]
        last_action = torch.cat([batch.last_action[None], head0]).masked_fill(reset, NO_ACTION)
        last_reward = torch.cat([batch.last_reward[None], batch.reward]).masked_fill(reset, 0.0)
        out, ends = self.unroll(self.inputs(steps, last_action, last_reward), batch.core_state, reset)
        out = out.flatten(0, 1)
        n = 0 if batch.final_t is None else len(batch.final_t)
        if not n:
            return out
        t, b = batch.final_t, batch.final_b
        state = torch.stack([ends[i][j] for i, j in zip(t.tolist(), b.tolist())])
        final_out, _ = self.step(self.inputs(features[(T + 1) * B:], head0[t, b], batch.reward[t, b]), state)
        return torch.cat([out, final_out])

    def feature_readers(self, next_readers: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.lstm.weight_ih_l0]


def make_core(cfg: AgentConfig, input_size: int, num_actions: int) -> Core:
    """The core AgentConfig `cfg` asks for over features of `input_size`: an IdentityCore (`core: none`)
    or an LSTMCore of `cfg.core_size` units (`core: lstm`) whose last-action one-hot has `num_actions`."""
    if cfg.core == "none":
        return IdentityCore(input_size)
    return LSTMCore(input_size, cfg.core_size, num_actions, cfg.core_inputs is not False)


class Network(nn.Module):
    """torso -> core -> heads: the three parts of every network, each a module of its own.

    torso: obs [N, ...] -> (features [N, F], extra) through `torso.encode` (agents.torsos.Torso; extra is
      what the heads read beside the features, row for row: FullyConv's spatial logits, or None).
    core: a `Core` over the features: the LSTM or the identity.
    heads: (core output [N, core.out_size], extra, action_mask) -> (logits [N, ...] with illegal actions
      masked, baseline [N]); `heads.feature_readers()` are their weights that read the core's output.

    The state-dict names are `torso.*`, `core.*`, `heads.*`; `load_state_dict` also takes those of the
    layout before (agents.checkpoint.upgrade_model_keys), so old checkpoints and snapshots load.
    """

    def __init__(self, torso: nn.Module, core: Core, heads: nn.Module):
        super().__init__()
        self.torso, self.core, self.heads = torso, core, heads  # in this order: the optimizer's param order

    def encode(self, obs) -> tuple[torch.Tensor, object]:
        """The torso: (features [N, F], extra)."""
        return self.torso.encode(obs)

    def feature_layer(self) -> nn.Module:
        """The module whose output is `encode`'s features [N, F]: ReLU units, read by `dead_units`."""
        return self.torso.feature_layer()

    def recyclable_layers(self) -> list:
        """The torso's layers whose ReLU units ReDo may recycle (agents.redo.Recyclable, in order; the last
        one's units are the features)."""
        return self.torso.recyclable_layers()

    def feature_readers(self) -> list[torch.Tensor]:
        """The weights [out, in] whose first F input columns read the features [N, F]: the core's input
        weights, or, through the identity core, every head's."""
        return self.core.feature_readers(self.heads.feature_readers())

    def forward(self, obs, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy logits [N, ...], baseline [N]) of obs [N, ...] without a core state: networks with the
        identity core. A recurrent one raises TypeError: it acts through `step`."""
        logits, baseline, _ = self.step(obs, action_mask, None)
        return logits, baseline

    def step(self, obs, action_mask: torch.Tensor,
             core: CoreInput | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One step of N streams: (logits, baseline [N], the state after it [N, 2, S]). With the identity
        core `core` may be None and the state is None."""
        features, extra = self.torso.encode(obs)
        out, state = self.core.act(features, core)
        logits, baseline = self.heads(out, extra, action_mask)
        return logits, baseline, state

    def replay(self, obs, action_mask: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The learner's pass: obs and action_mask [(T+1) B + N, ...] of `batch` (its steps time-major, then
        its N final observations) -> (logits, baseline), row for row (`Core.replay`)."""
        features, extra = self.torso.encode(obs)
        return self.heads(self.core.replay(features, batch), extra, action_mask)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """nn.Module.load_state_dict, after renaming the old layout's keys (`upgrade_model_keys`)."""
        return super().load_state_dict(upgrade_model_keys(state_dict), strict=strict, assign=assign)


class CoreStates:
    """The core inputs of many streams, by key (an actor's (env, agent) slot, an evaluation's game and
    seat): a stream never seen, or `reset`, is at its episode start (zero state, no last action, reward 0).

    Per step: `gather` the streams about to act, step the network, `advance` them with the new state
    and the actions taken; `add_reward` as rewards arrive; `reset` when a stream's episode ends.
    """

    def __init__(self, core_size: int):
        self.core_size = core_size
        self.streams: dict[object, tuple[torch.Tensor, int, float]] = {}

    def get(self, key) -> tuple[torch.Tensor, int, float]:
        """(state [2, core_size], last action, last reward) of stream `key`."""
        found = self.streams.get(key)
        return found if found is not None else (torch.zeros(2, self.core_size), NO_ACTION, 0.0)

    def gather(self, keys: list) -> CoreInput:
        """The CoreInput of streams `keys`, row for row."""
        rows = [self.get(k) for k in keys]
        return CoreInput(torch.stack([r[0] for r in rows]), torch.tensor([r[1] for r in rows], dtype=torch.long),
                         torch.tensor([r[2] for r in rows], dtype=torch.float32))

    def advance(self, keys: list, state: torch.Tensor, actions) -> None:
        """After a step of streams `keys`: their states [N, 2, core_size] and the actions taken (head 0's
        for multi-head actions); their last reward starts again at 0 (`add_reward` adds this step's)."""
        for key, s, a in zip(keys, state, actions):
            self.streams[key] = (s, int(a), 0.0)

    def add_reward(self, key, reward: float) -> None:
        state, action, total = self.get(key)
        self.streams[key] = (state, action, total + float(reward))

    def reset(self, key) -> None:
        """Stream `key`'s episode ended: its next step starts from zeros."""
        self.streams.pop(key, None)


def dead_units(features: torch.Tensor) -> torch.Tensor:
    """The share of the F ReLU units of features [N, F] that are 0 on all N rows (a 0-dim float tensor on
    their device): units that pass no gradient on this batch. Near 1, the torso no longer tells states apart
    and the policy is one for all of them ("dead ReLUs", Lu et al. 2019; dormant neurons with threshold 0,
    Sokar et al. 2023)."""
    return (features <= 0).all(0).float().mean()


def flatten_steps(obs):
    """A batch's observations [T+1, B, ...] (a tensor, or a dict of them) as [(T+1) B, ...], time-major."""
    return {k: v.flatten(0, 1) for k, v in obs.items()} if isinstance(obs, dict) else obs.flatten(0, 1)


def forward_batch(model: Network, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward pass of `model` over a learner batch's (impala_league.batch.Batch) T+1 observations and
    its final observations together.

    Returns logits [T+1, B, ...] and values [T+1, B] (with gradient), and final_values [T, B]: V of the
    final observation of each truncated step, 0 elsewhere (no gradient: it is a target), or None
    when the batch has no truncated step. The final observations get an all-legal mask: the baseline
    does not read the mask.

    The torso runs on all observations at once, then the core over the T+1 steps (`Network.replay`;
    `LSTMCore.replay`), and with the LSTM a truncated step's final observation continues from the core
    state of its own episode after that step.
    """
    T, B = batch.reward.shape
    obs, masks = flatten_steps(batch.obs), batch.action_mask.flatten(0, 1)
    n = 0 if batch.final_t is None else len(batch.final_t)
    if n:
        if isinstance(obs, dict):
            obs = {k: torch.cat([v, batch.final_obs[k].to(v.dtype)]) for k, v in obs.items()}
        else:
            obs = torch.cat([obs, batch.final_obs.to(obs.dtype)])
        masks = torch.cat([masks, masks.new_ones((n, masks.shape[1]))])
    if isinstance(model, Network):
        logits, values = model.replay(obs, masks, batch)
    else:  # a module that is only `model(obs, mask)` (a test's table of outputs): feedforward
        logits, values = model(obs, masks)
    final_values = None
    if n:
        final_values = torch.zeros(T, B, dtype=values.dtype, device=values.device)
        final_values[batch.final_t, batch.final_b] = values[-n:].detach()
        logits, values = logits[:-n], values[:-n]
    return logits.view(T + 1, B, -1), values.view(T + 1, B), final_values
