"""Several learner processes acting as one (data parallel, `learner.num_learners: K`) via torch.distributed.

Each rank reads its own B unrolls (it is its own consumer of the `learners` group), computes the
gradient of its batch's loss, and `average_gradients` all-reduces the gradients to their mean before
the optimizer step, so every rank applies the same update to the same weights. The learner's loss is
a *mean* over the T x B steps of a batch (`actor_critic_loss`), and every rank's batch has the same
T x B steps, so the mean of the K ranks' gradients is exactly the gradient of the mean loss over the
union of their K x B unrolls: grad (1/(K T B)) sum_k sum_steps l = (1/K) sum_k grad (1/(T B)) sum_steps l.
Global-norm clipping (`optimizer_step`) runs after the all-reduce, on that global gradient.

Rendezvous: a `tcp://host:port` URL that every rank is given (`run.py learner --rank R --dist-url URL`);
rank 0 listens there (torch's TCPStore). On one machine the launcher picks a free loopback port; across
machines, start rank 0 with `--dist-url tcp://<rank 0's address>:<port>` and every other rank with the
same URL (the port open between the hosts). Backend: gloo on CPU, NCCL when the learner runs on CUDA.

Every collective has a timeout (`COLLECTIVE_TIMEOUT_S`): a rank whose peer died does not wait forever;
the collective raises and `DataParallelError` says so.

K = 1 is `Group.single()`: no process group, every method a no-op, the same code path as before.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

log = logging.getLogger("data_parallel")

# How long a rank waits in one collective (or at the rendezvous) for the others. A rank also waits
# there while a peer blocks on reading its batch, so this bounds how long actors may leave a rank unfed.
COLLECTIVE_TIMEOUT_S = 600.0


class DataParallelError(RuntimeError):
    """A collective or the rendezvous failed: a peer rank died, or did not arrive within the timeout."""


@dataclass(frozen=True)
class Group:
    """This process's place among the K learners of one agent: `rank` in [0, size); rank 0 is the main one
    (lease, published weights, checkpoints, metrics). `size == 1`: no process group at all."""

    rank: int = 0
    size: int = 1

    @staticmethod
    def single() -> "Group":
        """One learner: no process group."""
        return Group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def agree(self, flags: tuple[bool, ...], value: float, device: torch.device) -> tuple[tuple[bool, ...], float]:
        """One small all-reduce (MAX) that gives every rank, for each of `flags`, whether it is true on at
        least one rank, and rank 0's `value` (e.g. its learning rate). The ranks agree to stop together
        this way: a rank that left the loop alone would leave the others waiting in the next all-reduce.
        With one learner: (flags, value) unchanged. Raises DataParallelError."""
        if not self.distributed:
            return flags, value
        mine = value if self.is_main else -math.inf  # MAX then picks rank 0's
        t = torch.tensor([float(f) for f in flags] + [mine], dtype=torch.float64, device=device)
        _collective(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        out = t.tolist()
        return tuple(f > 0 for f in out[:-1]), out[-1]

    def close(self) -> None:
        """Leave the process group (nothing with one learner)."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def cuda_device_for(rank: int, device: torch.device) -> torch.device:
    """The CUDA device of `rank` on its machine: `cuda` without an index means one GPU per rank
    (rank mod the GPUs this machine has); an explicit `cuda:N` is kept (one rank per machine)."""
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", rank % max(torch.cuda.device_count(), 1))


def join(rank: int, size: int, url: str, device: torch.device,
         timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Group:
    """Join the process group of `size` learners as `rank` through the rendezvous `url` (tcp://host:port;
    rank 0 listens there). Blocks until all ranks arrived. Backend: NCCL if `device` is CUDA, else gloo.
    Raises ValueError on a bad rank, DataParallelError when the rendezvous fails or times out."""
    if size == 1:
        return Group.single()
    if not 0 <= rank < size:
        raise ValueError(f"learner rank {rank} is not in [0, {size}) (learner.num_learners={size})")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as e:
        raise DataParallelError(f"learner rank {rank}: rendezvous at {url} with {size} learners failed: "
                                f"{e}".splitlines()[0]) from None
    log.info("learner rank %d of %d joined the process group at %s (%s)", rank, size, url, backend)
    return Group(rank, size)


def _collective(collective, *args, **kwargs) -> None:
    try:
        collective(*args, **kwargs)
    except (RuntimeError, ValueError) as e:  # DistBackendError and gloo's errors are RuntimeErrors
        raise DataParallelError(f"learner rank {dist.get_rank()}: a collective failed (another learner rank "
                                f"died or timed out): {e}".splitlines()[0]) from None


def average_gradients(model: torch.nn.Module, group: Group) -> None:
    """Replace every parameter's .grad by its mean over the ranks (one all-reduce of one flat buffer).

    A parameter without a gradient on some rank counts as a zero gradient there; one without a
    gradient on every rank keeps none (as a single learner's would, and the optimizer skips it).
    Call after `loss.backward()` and before clipping and the optimizer step. Raises DataParallelError.
    """
    if not group.distributed:
        return
    params = list(model.parameters())
    if not params:
        return
    like = params[0]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=like.dtype, device=like.device)
    flat = torch.cat([g.reshape(-1) for g in grads] + [has_grad])
    _collective(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
    flat[:-len(params)] /= group.size
    offset = 0
    for p, used in zip(params, flat[-len(params):].tolist()):
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype, copy=True) if used else None
        offset += n


def average_tensor(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """The mean of `tensor` over the ranks (one all-reduce; `tensor` itself with one learner). Raises
    DataParallelError."""
    if not group.distributed:
        return tensor
    total = tensor.clone()
    _collective(dist.all_reduce, total, op=dist.ReduceOp.SUM)
    return total / group.size


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict,
                    group: Group, device: torch.device) -> dict:
    """Make every rank's model and optimizer state (Adam's or RMSProp's moments, steps) rank 0's, and
    return rank 0's `meta` (JSON-able: update step, agent steps, ...) on every rank.

    Called at every start, fresh or resumed, so the initial weights are identical too. The state travels
    as safetensors bytes in a uint8 tensor (nothing pickled), as a checkpoint would hold it. The
    optimizer's hyperparameters (learning rate, ...) stay each rank's own: they come from the config.
    Raises DataParallelError."""
    if not group.distributed:
        return meta
    if group.is_main:
        tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        for idx, state in optimizer.state_dict()["state"].items():
            for name, value in state.items():
                tensors[f"optim.{idx}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous().clone()
        blob = safetensors_save(tensors, metadata={"meta": json.dumps(meta)})
        payload = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    _collective(dist.broadcast, size, src=0)
    if not group.is_main:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _collective(dist.broadcast, payload, src=0)
    if group.is_main:
        return meta
    blob = bytes(payload.cpu().numpy().tobytes())
    tensors = safetensors_load(blob)
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    groups = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    return json.loads(_metadata(blob)["meta"])


def _metadata(blob: bytes) -> dict[str, str]:
    """The string metadata in a safetensors blob's header (8-byte little-endian length, then JSON)."""
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]).get("__metadata__", {})
