"""The board's mirror symmetry as data augmentation of a learner batch (`learner.mirror_augment`).

A board game whose env spec has a mirror (EnvSpec.mirror_actions: the action each action becomes in
the reflected board; EnvSpec.mirror_axis: the observation axis the reflection flips) plays the same
after a reflection, so a reflected unroll is as good a sample as the unroll itself. This needs the
game's spec, so it lives with the roles, not with the batch record (impala_league/batch.py).
"""

from __future__ import annotations

import dataclasses

import torch

from impala_league.batch import Batch
from impala_league.envs.registry import EnvSpec


def mirrored(batch: Batch, spec: EnvSpec) -> Batch:
    """`batch` and its reflection through the board's symmetry, side by side: [.., 2B, ..] (final
    observations [2N, ...], the reflected ones pointing at the reflected unrolls)."""
    perm = torch.tensor(spec.mirror_actions, device=batch.action.device)
    obs_axis = 2 + spec.mirror_axis  # skip the T and B dimensions
    B = batch.reward.shape[1]
    both = Batch(
        obs=torch.cat([batch.obs, batch.obs.flip(obs_axis)], 1),
        action_mask=torch.cat([batch.action_mask, batch.action_mask[..., perm]], 1),
        action=torch.cat([batch.action, perm[batch.action]], 1),
        reward=torch.cat([batch.reward, batch.reward], 1),
        done=torch.cat([batch.done, batch.done], 1),
        behaviour_logits=torch.cat([batch.behaviour_logits, batch.behaviour_logits[..., perm]], 1),
    )
    if batch.truncated is not None:
        both.truncated = torch.cat([batch.truncated, batch.truncated], 1)
        both.final_obs = torch.cat([batch.final_obs, batch.final_obs.flip(1 + spec.mirror_axis)], 0)
        both.final_t = torch.cat([batch.final_t, batch.final_t])
        both.final_b = torch.cat([batch.final_b, batch.final_b + B])
    return both


def randomly_mirrored(batch: Batch, spec: EnvSpec, flip: torch.Tensor) -> Batch:
    """`batch` with unroll b replaced by its reflection where flip[b] (flip [B] bool): the board's
    symmetry as data augmentation at the cost of one batch, where `mirrored` costs two. Only the
    flipped unrolls (and their final observations) are copied."""
    perm = torch.tensor(spec.mirror_actions, device=batch.action.device)
    obs_axis = 2 + spec.mirror_axis  # skip the T and B dimensions

    def reflect(x: torch.Tensor, fn) -> torch.Tensor:
        x = x.clone()
        x[:, flip] = fn(x[:, flip])
        return x

    chosen = dataclasses.replace(
        batch, obs=reflect(batch.obs, lambda o: o.flip(obs_axis)),
        action_mask=reflect(batch.action_mask, lambda m: m[..., perm]),
        action=torch.where(flip, perm[batch.action], batch.action),
        behaviour_logits=reflect(batch.behaviour_logits, lambda b: b[..., perm]))
    if batch.truncated is not None:
        rows = flip[batch.final_b]  # a final observation is reflected with its own unroll
        chosen.final_obs = batch.final_obs.clone()
        chosen.final_obs[rows] = batch.final_obs[rows].flip(1 + spec.mirror_axis)
    return chosen


class Mirror:
    """`learner.mirror_augment` on a board with a mirror symmetry (EnvSpec.mirror_actions; `none` on other
    games), applied to a batch on the learner's `device`: `both` trains on every unroll and its reflection
    ([.., 2B, ..], `mirrored`); `random` reflects each unroll with probability 1/2 (`randomly_mirrored`),
    drawn from a generator of its own, seeded by `seed` (one stream per rank, reproducible from
    run.seed); `none` leaves the batch as it is."""

    def __init__(self, spec: EnvSpec, mode: str, device: torch.device, seed: int):
        self.spec = spec
        self.mode = mode if spec.mirror_actions is not None else "none"
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, batch: Batch) -> Batch:
        if self.mode == "both":
            return mirrored(batch, self.spec)
        if self.mode == "random":
            flip = torch.rand(batch.reward.shape[1], generator=self.generator, device=self.device) < 0.5
            return randomly_mirrored(batch, self.spec, flip)
        return batch
