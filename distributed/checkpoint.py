"""Learner checkpoints: one safetensors file, written atomically (temp file + rename).

Tensors: `model.<name>` (the network) and `optim.<param index>.<state name>` (optimizer moments).
Metadata (strings in the safetensors header): `config` (resolved YAML), `meta` (JSON: update step,
frames, params version, consumed stream position) and `optim_groups` (JSON: optimizer hyperparameters).
A `checkpoint.json` beside it repeats `meta` for people; loading never reads it. Nothing is pickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors import safe_open
from safetensors.torch import save_file


class CheckpointError(ValueError):
    """A checkpoint file that is missing, corrupt, or not one of ours; the message names the file."""


def save_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    config_yaml: str, meta: dict[str, Any]) -> None:
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
    metadata = {"config": config_yaml, "meta": json.dumps(meta), "optim_groups": json.dumps(groups)}
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    sidecar = path.with_suffix(".json")
    tmp = sidecar.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, sidecar)


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors and the metadata of a checkpoint. Raises CheckpointError naming the file."""
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
    return tensors, metadata


def model_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         metadata: dict[str, str]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["optim_groups"])})
