"""Wire format of unrolls and weights. Nothing here unpickles: arrays travel as dtype + shape + bytes.

An unroll is one msgpack map `{"header": {...}, "arrays": {name: [dtype, shape, bytes]}}`, the bytes
raw or, with header `compression: zstd`, one zstd frame per array. The decoder trusts nothing: it checks
the schema, that exactly the expected arrays are present with the whitelisted dtype and the shape the
config implies (before touching the bytes, so a huge declared shape allocates nothing), that a zstd
frame declares exactly the bytes that shape needs (before decompressing it, so a decompression bomb
allocates nothing either), that floats are finite, and that actions, masks and done flags are in range.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import zstandard

from config import COMPRESSIONS
from envs.registry import EnvSpec

if TYPE_CHECKING:
    import torch

SCHEMA = "impala-unroll/2"  # 2: `truncated` and `final_obs` (time limits bootstrap), header `compression`
MAX_MESSAGE_BYTES = 64 << 20  # refuse anything larger before parsing it


class DecodeError(ValueError):
    """A stream entry that is not a valid unroll; the message is the reason sent to the dead-letter stream."""


@dataclass(frozen=True)
class UnrollSpec:
    """Expected arrays of one unroll of length T for env `env.name`: name -> (dtype, shape).

    obs             [T+1, *obs_shape]  env dtype  (index T is the bootstrap observation)
    action_mask     [T+1, A]           uint8      (1 = legal)
    action          [T]                int64
    reward          [T]                float32    (reward settled on that step, see envs/aec.py)
    done            [T]                uint8      (1 = the episode ended with this step, either way)
    truncated       [T]                uint8      (1 = it ended by a time limit, not the game: done is 1
                                                   too; the step bootstraps from V(final observation))
    final_obs       [N, *obs_shape]    env dtype  (N = sum(truncated): the final observation of each
                                                   truncated step, in step order; kept before the reset,
                                                   since obs[t+1] is then the next episode's first one;
                                                   left out when N = 0, decoded as [0, *obs_shape])
    behaviour_logits [T, A]            float32    (mu's masked logits, MASKED_LOGIT on illegal actions)

    Termination is `done & ~truncated` (discount 0). `truncated` costs 1 byte per step; `final_obs`
    one observation per time-limited episode (see docs/architecture.md for the numbers).

    Envs with several observation arrays and multi-head actions (`env.obs_arrays`, `env.action_heads`:
    StarCraft II) carry instead, with H heads:
    obs.<name>      [T+1, *shape]      its dtype  (one per observation array)
    final_obs.<name> [N, *shape]       its dtype  (one per observation array)
    action          [T, H]             int64      (head 0 is checked against action_mask)
    behaviour_log_probs [T, H]         float32    (log mu_h(a_h|x) per head, 0 for heads the action
                                                   does not use: log mu(a|x) is their sum)
    """

    env: EnvSpec
    unroll_length: int

    @cached_property  # the decoder reads it several times per unroll
    def arrays(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        T, A, heads = self.unroll_length, self.env.num_actions, self.env.action_heads
        if self.env.obs_arrays is None:
            obs = {"obs": (self.env.obs_dtype, (T + 1, *self.env.obs_shape))}
        else:
            obs = {f"obs.{name}": (dtype, (T + 1, *shape)) for name, shape, dtype in self.env.obs_arrays}
        behaviour = {"behaviour_logits": (np.dtype(np.float32), (T, A))} if heads is None else {
            "behaviour_log_probs": (np.dtype(np.float32), (T, len(heads)))}
        return {
            **obs,
            "action_mask": (np.dtype(np.uint8), (T + 1, A)),
            "action": (np.dtype(np.int64), (T,) if heads is None else (T, len(heads))),
            "reward": (np.dtype(np.float32), (T,)),
            "done": (np.dtype(np.uint8), (T,)),
            "truncated": (np.dtype(np.uint8), (T,)),
            **behaviour,
        }

    @cached_property
    def layout(self) -> tuple[tuple[str, np.dtype, tuple[int, ...], str, list[int], int], ...]:
        """`arrays` as the decoder's fast path compares them: (name, dtype, shape, dtype.str as sent,
        shape as sent, bytes)."""
        return tuple((name, dtype, shape, dtype.str, list(shape), dtype.itemsize * math.prod(shape))
                     for name, (dtype, shape) in self.arrays.items())

    @cached_property
    def final_arrays(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """The final observations of truncated steps: name -> (dtype, shape of one); each array of an
        unroll is [N, *shape] with N = sum(truncated)."""
        if self.env.obs_arrays is None:
            return {"final_obs": (self.env.obs_dtype, tuple(self.env.obs_shape))}
        return {f"final_obs.{name}": (dtype, tuple(shape)) for name, shape, dtype in self.env.obs_arrays}


HEADER_FIELDS = {"schema": str, "unroll_id": str, "policy_version": int, "actor_id": int,
                 "opponent_id": str, "env": str, "created_at": float, "compression": str}

_zstd = threading.local()  # zstandard's (de)compressor objects must not be shared between threads


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = _zstd.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def encode_unroll(arrays: dict[str, np.ndarray], *, unroll_id: str, policy_version: int, actor_id: int,
                  env: str, opponent_id: str = "self", compression: str = "none", level: int = 3) -> bytes:
    """Serialize an unroll (arrays as in `UnrollSpec`) with its header to bytes for XADD.

    `compression` (transport.compression): "none", or "zstd" at `level`, which makes each array's bytes
    one zstd frame that records its decompressed size. Raises ValueError for another compression.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    header = {"schema": SCHEMA, "unroll_id": unroll_id, "policy_version": int(policy_version),
              "actor_id": int(actor_id), "opponent_id": opponent_id, "env": env, "created_at": time.time(),
              "compression": compression}
    pack = _compressor(level).compress if compression == "zstd" else bytes
    body = {name: [a.dtype.str, list(a.shape), pack(np.ascontiguousarray(a).data)] for name, a in arrays.items()}
    return msgpack.packb({"header": header, "arrays": body}, use_bin_type=True)


def unpack_message(data: Any, keys: tuple[str, ...], what: str = "message") -> dict:
    """The msgpack map in `data`, which must be bytes of at most MAX_MESSAGE_BYTES holding a map with
    exactly the keys `keys`. Raises DecodeError (naming `what`) otherwise."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"{what} payload must be bytes of at most {MAX_MESSAGE_BYTES} bytes")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=MAX_MESSAGE_BYTES)
    except Exception as e:  # msgpack raises several unrelated types for garbage input
        raise DecodeError(f"not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict) or set(msg) != set(keys):
        raise DecodeError(f"{what} must be a map with exactly {' and '.join(repr(k) for k in keys)}")
    return msg


def decode_unroll(data: bytes, spec: UnrollSpec) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Parse and validate one unroll. Returns (header, arrays); arrays are read-only views of `data`.

    Raises:
      DecodeError: with the reason, for anything that does not match `spec` exactly.
    """
    (decoded,) = decode_unrolls([data], spec)
    if isinstance(decoded, DecodeError):
        raise decoded
    return decoded


def decode_unrolls(entries: list[bytes], spec: UnrollSpec) -> list[tuple[dict[str, Any], dict[str, np.ndarray]] | DecodeError]:
    """Parse and validate a batch of unrolls: for each entry, (header, arrays) as `decode_unroll` returns
    them, or the DecodeError that says why it is rejected (the others are unaffected).

    The structure (header, dtypes, shapes, sizes) is checked entry by entry before any bytes are
    touched; the values (finite floats, actions, masks and flags in range) are checked for the whole
    batch at once, a few numpy passes over all B unrolls rather than a dozen per unroll.
    """
    out: list = []
    for data in entries:
        try:
            out.append(_parse_unroll(data, spec))
        except DecodeError as e:
            out.append(e)
    parsed = [i for i, item in enumerate(out) if not isinstance(item, DecodeError)]
    if parsed:
        for i, reason in zip(parsed, _value_errors([out[i][1] for i in parsed], spec)):
            if reason is not None:
                out[i] = DecodeError(reason)
    return out


def _parse_unroll(data: bytes, spec: UnrollSpec) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) of one unroll whose structure matches `spec`; its values are not checked yet."""
    msg = unpack_message(data, ("header", "arrays"))
    header, body = msg["header"], msg["arrays"]
    _check_header(header, spec)
    if not (type(body) is dict and body.keys() == spec.arrays.keys()) and (  # no step truncated, or:
            not isinstance(body, dict) or not set(spec.arrays) <= set(body) <= set(spec.arrays) | set(spec.final_arrays)):
        got = sorted(map(str, body)) if isinstance(body, dict) else type(body).__name__  # keys: str or bytes
        raise DecodeError(f"arrays must be exactly {sorted(spec.arrays)}, and {sorted(spec.final_arrays)} where a "
                          f"step is truncated, got {got}")
    compressed = header["compression"] == "zstd"
    arrays = {}
    for name, dtype, shape, sent_dtype, sent_shape, nbytes in spec.layout:
        item = body[name]
        # The common case, uncompressed and exactly as expected, in one test; anything else is decoded
        # (and its reason found) by `_decode_array`.
        if not compressed and type(item) is list and len(item) == 3 and item[0] == sent_dtype \
                and item[1] == sent_shape and type(item[2]) is bytes and len(item[2]) == nbytes:
            arrays[name] = np.frombuffer(item[2], dtype).reshape(shape)
        else:
            arrays[name] = _decode_array(name, item, dtype, shape, compressed)
    # At most T: the final observations' count is bounded before they are decoded. A `truncated` that is
    # not 0/1, or 1 where done is not, is rejected with the values (`_value_errors`).
    n = int(np.count_nonzero(arrays["truncated"]))
    for name, (dtype, shape) in spec.final_arrays.items():
        if name not in body and n:
            raise DecodeError(f"{n} steps are truncated but the unroll has no '{name}'")
        arrays[name] = (_decode_array(name, body[name], dtype, (n, *shape), compressed) if name in body
                        else np.zeros((0, *shape), dtype))
    return header, arrays


def _check_header(header: Any, spec: UnrollSpec) -> None:
    # The common case, every field of exactly its type, in one test; the slow checks find the reason.
    if not (type(header) is dict and header.keys() == HEADER_FIELDS.keys()
            and all(type(header[name]) is typ for name, typ in HEADER_FIELDS.items())):
        _check_header_fields(header)
    if header["schema"] != SCHEMA:
        raise DecodeError(f"schema '{header['schema']}' is not '{SCHEMA}'")
    if header["env"] != spec.env.name:
        raise DecodeError(f"unroll is for env '{header['env']}', this learner trains '{spec.env.name}'")
    if header["compression"] not in COMPRESSIONS:
        raise DecodeError(f"compression '{header['compression']}' is not one of {', '.join(COMPRESSIONS)}")
    if header["policy_version"] < 0:
        raise DecodeError("policy_version must be >= 0")


def _check_header_fields(header: Any) -> None:
    """Raises DecodeError for a header without exactly HEADER_FIELDS of their types (an int counts as a float)."""
    if not isinstance(header, dict) or set(header) != set(HEADER_FIELDS):
        raise DecodeError(f"header must have exactly the fields {sorted(HEADER_FIELDS)}")
    for name, typ in HEADER_FIELDS.items():
        value = header[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if typ is float else (
            isinstance(value, typ) and not isinstance(value, bool))
        if not ok:
            raise DecodeError(f"header field '{name}' must be {typ.__name__}, got {type(value).__name__}")


def _decode_array(name: str, item: Any, dtype: np.dtype, shape: tuple[int, ...], compressed: bool) -> np.ndarray:
    nbytes = dtype.itemsize * math.prod(shape)
    if type(item) is list and len(item) == 3 and item[0] == dtype.str and item[1] == list(shape) \
            and type(item[2]) is bytes:  # the common case in one test; the reason is found below
        data = _decompress(name, item[2], nbytes) if compressed else item[2]
        if len(data) == nbytes:
            return np.ndarray(shape, dtype, buffer=data)
        raise DecodeError(f"array '{name}' has {len(data)} bytes, shape {list(shape)} needs {nbytes}")
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
            and isinstance(item[1], list) and isinstance(item[2], bytes)):
        raise DecodeError(f"array '{name}' must be [dtype, shape, bytes]")
    if item[0] != dtype.str:
        raise DecodeError(f"array '{name}' has dtype '{item[0]}', expected '{dtype.str}'")
    raise DecodeError(f"array '{name}' has shape {item[1]}, expected {list(shape)}")


def _decompress(name: str, frame: bytes, nbytes: int) -> bytes:
    """The `nbytes` bytes in zstd `frame`; the size the frame declares is checked before anything is
    allocated for it. Raises DecodeError for a frame that is corrupt or declares another size."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise DecodeError(f"array '{name}' is not a zstd frame: {e}") from None
    if declared != nbytes:  # -1: a frame without its size, which our encoder never writes
        raise DecodeError(f"array '{name}' is a zstd frame of {declared} bytes, its shape needs {nbytes}")
    if "decompressor" not in _zstd.__dict__:
        _zstd.decompressor = zstandard.ZstdDecompressor()
    try:
        return _zstd.decompressor.decompress(frame, max_output_size=nbytes)
    except zstandard.ZstdError as e:
        raise DecodeError(f"array '{name}' does not decompress: {e}") from None


def _value_errors(unrolls: list[dict[str, np.ndarray]], spec: UnrollSpec) -> list[str | None]:
    """For each of B structurally valid unrolls, the first reason its values are invalid, or None.

    Each check runs once over the B unrolls concatenated ([B * rows, ...]) and is reduced per unroll:
    the rows of a per-step array are its T or T+1 steps, those of a final array its N_b observations.
    """
    B, A, heads = len(unrolls), spec.env.num_actions, spec.env.action_heads
    T = spec.unroll_length

    def rows(name: str) -> np.ndarray:
        return np.concatenate([u[name] for u in unrolls])

    checks: list[tuple[str, np.ndarray]] = []
    truncated, done = rows("truncated").reshape(B, T), rows("done").reshape(B, T)
    checks.append(("truncated must be 0 or 1, and 1 only where done is 1",
                   ((truncated > 1) | (truncated > done)).any(1)))
    finals = np.repeat(np.arange(B), [np.count_nonzero(u["truncated"]) for u in unrolls])  # owner of each final row
    for name, (dtype, _) in {**spec.arrays, **spec.final_arrays}.items():
        if dtype.kind != "f":
            continue
        if name in spec.arrays:
            bad = ~np.isfinite(rows(name)).reshape(B, -1).all(1)
        else:
            bad = np.zeros(B, bool)
            if len(finals):
                bad[finals[~np.isfinite(rows(name)).reshape(len(finals), -1).all(1)]] = True
        checks.append((f"array '{name}' has non-finite values", bad))
    action = rows("action").reshape(B, T, -1)  # [B, T, 1] or [B, T, H]
    checks.append((f"action out of range [0, {heads or A})",
                   ((action < 0) | (action >= (A if heads is None else np.asarray(heads)))).any((1, 2))))
    mask = rows("action_mask").reshape(B, T + 1, A)
    checks.append(("done and action_mask must be 0 or 1", (done > 1).any(1) | (mask > 1).any((1, 2))))
    head0 = np.clip(action[:, :, 0], 0, A - 1)  # multi-head: the mask is over head 0
    legal = np.take_along_axis(mask[:, :T], head0[:, :, None], 2)
    checks.append(("an action is illegal under its own action_mask", ~legal.all((1, 2))))
    reasons: list[str | None] = [None] * B
    for reason, bad in checks:
        for b in np.flatnonzero(bad):
            reasons[b] = reasons[b] or reason
    return reasons


def encode_weights(state_dict: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Weights as safetensors bytes (no pickle). Tensors are copied to CPU and made contiguous."""
    from safetensors.torch import save as st_save  # here, not above: `run.py train` itself never imports torch

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    return st_save(tensors, metadata=metadata)


class WeightsCorrupt(ValueError):
    """Weight bytes whose SHA-256 is not the one published with them (or none was): never loaded."""


def weights_digest(data: bytes) -> str:
    """SHA-256 (hex) of a weight blob, published beside it so readers can verify what they load."""
    return hashlib.sha256(data).hexdigest()


def verify_weights(data: bytes, digest: bytes | str | None, what: str) -> bytes:
    """`data` if its SHA-256 is `digest` (as published, hex; bytes or str). Raises WeightsCorrupt
    naming `what` otherwise, also when no digest was published with it."""
    expected = digest.decode() if isinstance(digest, bytes) else digest
    if expected is None:
        raise WeightsCorrupt(f"{what}: no SHA-256 was published with the weights")
    actual = weights_digest(data)
    if actual != expected:
        raise WeightsCorrupt(f"{what}: SHA-256 {actual[:16]}... does not match the published {expected[:16]}...")
    return data


def decode_weights(data: bytes) -> dict[str, torch.Tensor]:
    """Inverse of `encode_weights`. Raises safetensors.SafetensorError on a corrupt payload."""
    from safetensors.torch import load as st_load

    return st_load(data)

