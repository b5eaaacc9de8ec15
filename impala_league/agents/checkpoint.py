"""Learner checkpoints: one safetensors file, written atomically (temp file + rename).

Tensors: `model.<name>` (the network) and `optim.<param index>.<state name>` (optimizer moments).
Metadata (strings in the safetensors header): `config` (resolved YAML), `meta` (JSON: update step,
`agent_steps_trained`, params version, consumed stream position), `optim_groups` (JSON: optimizer hyperparameters) and
`tensors_sha256` (see `tensors_digest`), which `read_checkpoint` verifies before returning anything.
A `checkpoint.json` beside it repeats `meta` for people; loading never reads it. Nothing is pickled.

The network's names are those of agents.core.Network (`torso.*`, `core.*`, `heads.*`). Checkpoints (and
league snapshots) written before the torso and heads were modules of their own name them as
ActorCritic's and FullyConv's attributes did (`fc.0.weight`, `pixels.trunk.0.weight`, `policy.weight`,
`head_layers.3.bias`, ...): `upgrade_model_keys` renames them, and Network.load_state_dict applies it,
so they load as they are. The parameters' order did not change, so the optimizer's `optim.<index>`
tensors still belong to the same parameters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

import torch
import yaml
from safetensors import SafetensorError
from safetensors import safe_open
from safetensors.torch import save_file

from impala_league.records import upgraded

from impala_league.config import UserError

log = logging.getLogger("checkpoint")

DIGEST_KEY = "tensors_sha256"


class CheckpointError(UserError, ValueError):
    """A checkpoint file that is missing, corrupt, or not one of ours; the message names the file."""


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over the tensors in name order: each name, dtype, shape and raw bytes.

    safetensors checks the header's offsets but not the data, so a flipped bit in a weight would load
    silently; this digest, stored in the metadata, catches it.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # raw bytes of any dtype (bfloat16 too)
    return h.hexdigest()


def save_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    config_yaml: str, meta: dict[str, Any]) -> None:
    """Write model, optimizer state, config and `meta` to `path` atomically, with the tensors' digest.

    A failed write (a full disk: OSError, or SafetensorError from the serializer) removes its temporary
    file and raises; the file already at `path` stays whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    groups = []
    if optimizer is not None:
        state = optimizer.state_dict()
        for idx, param_state in state["state"].items():
            for name, value in param_state.items():
                tensors[f"optim.{idx}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
        groups = state["param_groups"]
    metadata = {"config": config_yaml, "meta": json.dumps(meta), "optim_groups": json.dumps(groups),
                DIGEST_KEY: tensors_digest(tensors)}
    tmp = path.with_suffix(path.suffix + ".tmp")
    sidecar = path.with_suffix(".json")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        durable_replace(tmp, path)
        tmp = sidecar.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        durable_replace(tmp, sidecar)
    except (OSError, SafetensorError):
        tmp.unlink(missing_ok=True)
        raise


def durable_replace(tmp: Path, path: Path) -> None:
    """Rename the written file `tmp` to `path` so that a power loss leaves the old file or the whole
    new one: fsync the file's bytes before the rename, and the directory after it (the rename itself)."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_UNVERIFIED: set[str] = set()  # files already reported as carrying no digest


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors and the metadata of a checkpoint, after checking the tensors against their digest.

    Raises CheckpointError naming the file if it is missing, unreadable, not ours, or its tensor data
    does not match the digest saved with it. A file written before digests existed loads with a warning.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {e}") from None
    if "config" not in metadata or "meta" not in metadata:
        raise CheckpointError(f"{path} has no run config in its metadata; is it a checkpoint of this project?")
    expected = metadata.get(DIGEST_KEY)
    if expected is None:
        if str(path) not in _UNVERIFIED:  # once per file: evaluation may read one file several times
            _UNVERIFIED.add(str(path))
            log.warning("%s has no %s (written before checkpoints carried one): loaded without verifying its data",
                        path, DIGEST_KEY)
    elif tensors_digest(tensors) != expected:
        raise CheckpointError(f"{path} is corrupt: its tensor data does not match the SHA-256 saved with it")
    return tensors, metadata


def read_meta(path: str | Path) -> dict:
    """A checkpoint's `meta` JSON from its header alone: cheap, for listing many checkpoints; the tensors
    are neither read nor verified (`read_checkpoint` does that). Keys written under an older name read
    under the name now (`records.upgraded`). Raises CheckpointError naming the file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path} has no readable checkpoint meta: {e}") from None
    return upgraded(meta) if isinstance(meta, dict) else {}


def save_model_only(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write the network of a checkpoint read by `read_checkpoint` (`tensors`, `metadata`) to `path`
    atomically, as a checkpoint without optimizer state (a third of the size under RMSProp) that
    `load_policy` reads: the same config and meta, the digest of the network's tensors."""
    model = {k: v for k, v in tensors.items() if k.startswith("model.")}
    header = {"config": metadata["config"], "meta": metadata["meta"], "optim_groups": "[]",
              DIGEST_KEY: tensors_digest(model)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(model, str(tmp), metadata=header)
    durable_replace(tmp, path)


def describe_network(agent: dict | object) -> str:
    """`torso shallow, core none`, or `torso mlp, core lstm (core_size N)`, of an AgentConfig or its dict."""
    get = agent.get if isinstance(agent, dict) else lambda k, d=None: getattr(agent, k, d)
    core = get("core", "none") or "none"
    core = core if core == "none" else f"{core} (core_size {get('core_size', 256)})"
    return f"torso {get('torso', 'conv')}, core {core}"


def check_network(metadata: dict[str, str], cfg, path: str | Path) -> None:
    """Raises CheckpointError naming both when the checkpoint's network has another torso (agent.torso) or
    recurrent core (agent.core, agent.core_size) than `cfg` (a Config) describes; a checkpoint written
    before cores existed has none."""
    try:
        saved = (yaml.safe_load(metadata["config"]) or {}).get("agent") or {}
    except yaml.YAMLError:
        return  # the config's own loading reports it
    if describe_network(saved) != describe_network(cfg.agent):
        raise CheckpointError(f"{path} holds a network with {describe_network(saved)}; this config asks for "
                              f"{describe_network(cfg.agent)}: set agent.torso, agent.core and agent.core_size as "
                              "the checkpoint's run had them, or start a new run")


# The first name of a key in the layout before agents.core.Network -> its name now. `core.` (the LSTM) kept
# its name; in the pixel torsos the torso module itself was `pixels`.
OLD_MODEL_PREFIXES = {
    "conv": "torso.conv", "fc": "torso.fc", "pixels": "torso",  # ActorCritic's torsos
    "policy": "heads.policy", "baseline": "heads.baseline",  # ActorCritic's heads, and FullyConv's baseline
    "screen_features": "torso.screen_features", "minimap_features": "torso.minimap_features",  # FullyConv
    "screen_tower": "torso.screen_tower", "minimap_tower": "torso.minimap_tower",
    "spatial_policy": "torso.spatial_policy", "head_layers": "heads.dense",
}


def upgrade_model_keys(state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """A network's state dict with the keys of the layout before agents.core.Network renamed by
    OLD_MODEL_PREFIXES (`fc.0.weight` -> `torso.fc.0.weight`, `pixels.trunk.0.bias` ->
    `torso.trunk.0.bias`, `head_layers.2.weight` -> `heads.dense.2.weight`); `state` itself, unchanged,
    when none of its keys is an old one."""
    def renamed(key: str) -> str:
        first, _, rest = key.partition(".")
        return f"{OLD_MODEL_PREFIXES[first]}.{rest}" if first in OLD_MODEL_PREFIXES and rest else key

    if not any(renamed(k) != k for k in state):
        return state
    return {renamed(k): v for k, v in state.items()}


def model_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The network's state dict from a checkpoint's tensors (names without the `model.` prefix)."""
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         metadata: dict[str, str]) -> None:
    """Restore `optimizer` from a checkpoint's `optim.*` tensors and its `optim_groups` metadata."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["optim_groups"])})
