"""The network of a config, assembled as torso -> core -> heads (agents.core.Network), and the policy
head that reads its logits: the one place that picks them, by `agent.torso` and the env's action space."""

from __future__ import annotations

from impala_league.agents.core import Network
from impala_league.agents.heads import DiscreteHead, FunctionCallHead
from impala_league.agents.network import ActorCritic


def _sc2_sizes(spec) -> tuple[int, int]:
    """(screen_size, minimap_size) of a StarCraft II spec, read from its observation arrays."""
    shapes = {name: shape for name, shape, _ in spec.obs_arrays}
    return shapes["screen"][-1], shapes["minimap"][-1]


def policy_head(spec) -> DiscreteHead | FunctionCallHead:
    """The head for EnvSpec `spec`: FunctionCallHead for StarCraft II (kind "sc2"), DiscreteHead otherwise."""
    if spec.kind == "sc2":
        from impala_league.envs.sc2_wrappers.actions import FunctionCallCodec

        return FunctionCallHead(FunctionCallCodec(*_sc2_sizes(spec)))
    return DiscreteHead()


def make_model(spec, cfg) -> Network:
    """The actor-critic network for EnvSpec `spec` and AgentConfig `cfg`, chosen by `cfg.torso`: SC2LE's
    FullyConv for `fullyconv` (StarCraft II; config.validate pairs the two), else agents.network.ActorCritic
    with the torso of that name in agents.torsos.TORSOS. Both are agents.core.Network (torso -> core ->
    heads): called as `model(obs, action_mask)` with the identity core (`agent.core: none`), stepped with
    `model.step(obs, action_mask, core_input)`."""
    if cfg.torso == "fullyconv":  # pysc2 is imported by StarCraft II processes only
        from impala_league.agents.fullyconv import FullyConv
        from impala_league.envs.sc2_wrappers.actions import FunctionCallCodec
        from impala_league.envs.sc2_wrappers.observation import SC2ObservationSpec

        sizes = _sc2_sizes(spec)
        return FullyConv(SC2ObservationSpec(*sizes), FunctionCallCodec(*sizes), cfg)
    return ActorCritic(spec.obs_shape, spec.num_actions, cfg, spec.obs_image)
