"""The learner's batch: B unrolls stacked time-major, `[T, B, ...]` (`Batch`), and the numpy layout it
is stacked from (`stack_entries`, `unstack`).

Why here, in the base layer beside config.py: three layers read the batch — the network's forward pass
over it (agents.core.forward_batch), the losses (losses.actor_critic) and the roles that make it
(distributed/: the learner's ingest, A3C's workers) — and it belongs to none of them. Below all three,
each can name its type; in losses/ it would make the networks depend on the loss package for a record.
So it is plain data like the config: fields and pure array/tensor operations, importing nothing of
ours. What depends on a game (the board's mirror, distributed/learner/augmentation.py) or on the wire (decoding,
validation: distributed/wire/codec.py) lives with the roles.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

Observations = torch.Tensor | dict[str, torch.Tensor]


@dataclass
class Batch:
    """B unrolls stacked time-major. obs [T+1, B, *obs_shape]; action_mask [T+1, B, A];
    action [T, B] int64; reward [T, B]; done [T, B] bool; behaviour_logits [T, B, A].

    Time limits (see codec.UnrollSpec): truncated [T, B] bool (done where a time limit cut the episode;
    None = no step truncated); final_obs [N, *obs_shape], the final observation of each truncated step,
    at step (final_t[n], final_b[n]) (int64 [N] each).

    A recurrent core (agents/core.py): core_state [B, 2, core_size], the state each unroll's stream had
    before step 0; last_action int64 [B] and last_reward [B], its action and reward before step 0 (None
    without a core).

    Envs with several observation arrays and multi-head actions (StarCraft II, see UnrollSpec): obs is
    a dict name -> [T+1, B, ...] (final_obs name -> [N, ...]), action [T, B, H], and `behaviour_logits`
    holds the unroll's `behaviour_log_probs`, log mu_h(a_h|x) [T, B, H]: whatever the policy head records
    (agents/heads.py).
    """

    obs: Observations
    action_mask: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    behaviour_logits: torch.Tensor
    truncated: torch.Tensor | None = None
    final_obs: Observations | None = None
    final_t: torch.Tensor | None = None
    final_b: torch.Tensor | None = None
    core_state: torch.Tensor | None = None
    last_action: torch.Tensor | None = None
    last_reward: torch.Tensor | None = None

    @classmethod
    def stack(cls, unrolls: list[dict[str, np.ndarray]], device: torch.device, pin: bool = False) -> Batch:
        """Stack decoded unrolls (UnrollSpec arrays, [T+1, ...]; final observations [N_b, ...]) on
        `device`: `concat` of entries of one unroll each."""
        return cls.concat([as_entry(u) for u in unrolls], device, pin)

    @classmethod
    def concat(cls, entries: list[dict[str, np.ndarray]], device: torch.device, pin: bool = False) -> Batch:
        """The unrolls of decoded stream entries (codec.decode_unrolls: arrays [n_e, ...], final
        observations [N_e, ...]), one after the other, as one batch on `device`; `pin`: into pinned
        host memory, from which `to` copies to a GPU without blocking."""
        return cls.from_arrays(stack_entries(entries), device, pin)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], device: torch.device, pin: bool = False) -> Batch:
        """The batch of `stack_entries`'s time-major arrays ([T+1, B, ...], final observations [N, ...]),
        sharing their memory on the CPU (unless `pin`: pinned copies)."""
        names = arrays

        def tensor(name: str) -> torch.Tensor:
            return torch.from_numpy(arrays[name])

        obs = tensor("obs") if "obs" in names else {n[4:]: tensor(n) for n in names if n.startswith("obs.")}
        behaviour = tensor("behaviour_logits" if "behaviour_logits" in names else "behaviour_log_probs")
        batch = cls(obs=obs, action_mask=tensor("action_mask"), action=tensor("action"),
                    reward=tensor("reward"), done=tensor("done").bool(), behaviour_logits=behaviour)
        if "truncated" in names:
            batch.truncated = tensor("truncated").bool()
            # final_obs rows are in step order within each unroll, unrolls one after the other: the
            # order of the nonzeros of truncated [B, T].
            final_b, final_t = np.nonzero(arrays["truncated"].T)
            batch.final_t = torch.from_numpy(final_t).long()
            batch.final_b = torch.from_numpy(final_b).long()
            batch.final_obs = final_observations(obs, tensor, names)
        if "core_state" in names:  # [1, B, ...]: one row, before step 0
            batch.core_state, batch.last_action, batch.last_reward = (
                tensor(name)[0] for name in ("core_state", "last_action", "last_reward"))
        return batch.map(torch.Tensor.pin_memory) if pin else batch.to(device)

    def to(self, device: torch.device) -> Batch:
        """This batch on `device` (copies from pinned memory do not block the host); itself if it is there."""
        if self.reward.device == device:  # (a dozen no-op calls cost a tenth of a millisecond a batch)
            return self
        return self.map(lambda t: t.to(device, non_blocking=True))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """A batch of `fn(tensor)` for every tensor of this one (in dicts too; None stays None)."""
        def apply(x):
            return None if x is None else {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)

        return Batch(**{f.name: apply(getattr(self, f.name)) for f in dataclasses.fields(self)})


def final_observations(obs: Observations, tensor: Callable[[str], torch.Tensor], names) -> Observations:
    """The final observations of a batch's truncated steps, [N, ...] like one step of `obs` ([T+1, B, ...]
    or a dict of such): `tensor(name)` of the stacked `final_obs` arrays, or none (N = 0) where the
    unrolls carry none (an actor's own buffers leave them out when no step is truncated)."""
    def final(name: str, like: torch.Tensor) -> torch.Tensor:
        return tensor(name) if name in names else like.new_zeros((0, *like.shape[2:]))

    if isinstance(obs, dict):
        return {k: final(f"final_obs.{k}", v) for k, v in obs.items()}
    return final("final_obs", obs)


def as_entry(unroll: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One unroll's arrays as those of a decoded entry of one (the inverse of codec.split_unrolls): views
    with a leading [1], the final observations as they are."""
    return {name: a if name.startswith("final_obs") else a[None] for name, a in unroll.items()}


def stack_entries(entries: list[dict[str, np.ndarray]],
                  alloc: Callable[[str, tuple[int, ...], np.dtype], np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The unrolls of decoded stream entries (`codec.decode_unrolls`: arrays [n_e, ...], final
    observations [N_e, ...]), one after the other, as time-major arrays of U = sum n_e unrolls:
    obs [T+1, U, ...], action [T, U], ... (`UnrollSpec`'s arrays with U after the time axis), and the
    final observations concatenated, [N, ...] with N = sum N_e (unroll after unroll, in step order).

    alloc(name, shape, dtype) gives each output array, in the order of the entries' arrays (default:
    new memory; an ingest worker places them in a shared-memory slot). Each array is copied twice
    (concatenate, then the time-major copy): two numpy calls per array whatever the number of entries.

    An entry without final observations (an actor's own unrolls leave them out when no step is
    truncated: N_e = 0) adds no rows to them, whichever entry comes first. Raises KeyError when an entry
    lacks any other array."""
    out = {}
    for name in dict.fromkeys(name for e in entries for name in e):  # every entry's names, first seen first
        finals = name.startswith("final_obs")
        joined = np.concatenate([e[name] for e in entries if not finals or name in e])
        target = joined if finals else joined.swapaxes(0, 1)
        out[name] = alloc(name, target.shape, target.dtype) if alloc else np.empty(target.shape, target.dtype)
        np.copyto(out[name], target)
    return out


def unstack(arrays: dict[str, np.ndarray], first: int | None = None) -> list[dict[str, np.ndarray]]:
    """The U unrolls of `stack_entries`'s arrays (or the `first` of them), each as `UnrollSpec` lists them
    ([T+1, ...], final observations [N_u, ...]): views, no copies."""
    counts = np.count_nonzero(arrays["truncated"], axis=0)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [{name: a[bounds[u]:bounds[u + 1]] if name.startswith("final_obs") else a[:, u] for name, a in arrays.items()}
            for u in range(len(counts) if first is None else first)]
