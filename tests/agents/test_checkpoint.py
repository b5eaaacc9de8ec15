"""Checkpoints carry a SHA-256 of their tensor data; a corrupt file is refused by name, never loaded."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import save_file

from impala_league.agents.checkpoint import (DIGEST_KEY, CheckpointError, read_checkpoint, save_checkpoint,
                              tensors_digest)


def small_model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 5)).sum().backward()
    optimizer.step()  # optimizer moments and a step counter to save
    return model, optimizer


@pytest.fixture
def saved(tmp_path):
    model, optimizer = small_model_and_optimizer()
    path = tmp_path / "checkpoints" / "latest.safetensors"
    save_checkpoint(path, model, optimizer, "env:\n  name: tictactoe\n", {"step": 3, "agent_steps_trained": 120})
    return path, model


def data_region(path) -> tuple[int, int]:
    """[start, end) of the tensor bytes: after the 8-byte header length and the JSON header."""
    raw = path.read_bytes()
    return 8 + int.from_bytes(raw[:8], "little"), len(raw)


def test_saved_checkpoint_carries_the_digest_of_what_was_saved(saved):
    path, model = saved
    tensors, metadata = read_checkpoint(path)
    assert metadata[DIGEST_KEY] == tensors_digest(tensors)
    assert len(metadata[DIGEST_KEY]) == 64
    for name, value in model.state_dict().items():
        assert torch.equal(tensors[f"model.{name}"], value), name
    assert json.loads(metadata["meta"]) == {"step": 3, "agent_steps_trained": 120}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_flipped_byte_in_the_tensor_data_is_a_checkpoint_error_naming_the_file(saved, where):
    path, _ = saved
    start, end = data_region(path)
    offset = {"first": start, "middle": (start + end) // 2, "last": end - 1}[where]
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"{path}.*does not match the SHA-256"):
        read_checkpoint(path)


def test_digest_depends_on_names_dtypes_shapes_and_values():
    base = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(7)}
    digest = tensors_digest(base)
    assert tensors_digest(dict(reversed(list(base.items())))) == digest  # order of the dict does not matter
    assert tensors_digest({**base, "a": base["a"].t().contiguous()}) != digest  # other values
    assert tensors_digest({**base, "a": base["a"].reshape(3, 2)}) != digest  # same bytes, other shape
    assert tensors_digest({**base, "a": base["a"].view(torch.int32)}) != digest  # same bytes, other dtype
    assert tensors_digest({"c": base["a"], "b": base["b"]}) != digest  # other name


def test_a_wrong_digest_in_the_metadata_is_refused(tmp_path):
    path = tmp_path / "forged.safetensors"
    save_file({"model.w": torch.ones(3)}, str(path),
              metadata={"config": "x: 1\n", "meta": "{}", DIGEST_KEY: tensors_digest({"model.w": torch.zeros(3)})})
    with pytest.raises(CheckpointError, match="forged.safetensors is corrupt"):
        read_checkpoint(path)


def test_a_checkpoint_from_before_digests_loads_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.safetensors"
    save_file({"model.w": torch.ones(3)}, str(path), metadata={"config": "x: 1\n", "meta": "{}"})
    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        tensors, _ = read_checkpoint(path)
    assert torch.equal(tensors["model.w"], torch.ones(3))
    assert any("old.safetensors" in r.message and "without verifying" in r.message for r in caplog.records)


def test_load_policy_refuses_a_corrupt_checkpoint(tmp_path):
    """The evaluation path reads checkpoints through the same check."""
    from impala_league.agents.policy import load_policy
    from impala_league.config import load_config, to_yaml
    from impala_league.agents.network import ActorCritic
    from impala_league.envs.registry import env_spec

    cfg = load_config(None, ["env.name=tictactoe", "agent.hidden=8", "agent.channels=4"])
    spec = env_spec("tictactoe")
    model = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent)
    path = tmp_path / "latest.safetensors"
    save_checkpoint(path, model, None, to_yaml(cfg), {"step": 0, "agent_steps_trained": 0})
    load_policy(path)  # intact: loads
    start, end = data_region(path)
    raw = bytearray(path.read_bytes())
    raw[end - 3] ^= 0x80
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="latest.safetensors is corrupt"):
        load_policy(path)
