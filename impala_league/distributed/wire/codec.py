"""Wire format of unrolls and weights. Nothing here unpickles: arrays travel as dtype + shape + bytes.

A stream entry holds n >= 1 unrolls of one actor's send (`actor.send_batch`), stacked: one msgpack map
`{"header": {...}, "arrays": {name: [dtype, [n, *shape], bytes]}}`, the bytes raw or, with header
`compression: zstd`, one zstd frame per array. One entry of n unrolls costs the learner one parse and a
few numpy views, where n entries cost n of each: per-entry work is what limits a learner's ingest.

The decoder trusts nothing: it checks the schema, that exactly the expected arrays are present with the
whitelisted dtype and the shape the config and the header's `unrolls` imply (before touching the bytes,
so a huge declared shape allocates nothing), that a zstd frame declares exactly the bytes that shape
needs (before decompressing it, so a decompression bomb allocates nothing either) and is followed by
nothing (no byte, no second frame), that floats are finite, and that actions, masks and done flags are
in range. An entry with one invalid unroll is rejected whole (it is acked or dead-lettered as one).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import zstandard

from impala_league.config import COMPRESSIONS
from impala_league.envs.registry import EnvSpec

if TYPE_CHECKING:
    import torch

SCHEMA = "impala-unroll/4"  # 2: `truncated`, `final_obs`, header `compression`; 3: n unrolls per entry;
# 4: the recurrent core's `core_state`, `last_action`, `last_reward`
MAX_MESSAGE_BYTES = 64 << 20  # refuse anything larger before parsing it, or decompressing to it
UNUSED_DATA = re.compile(r"contains (\d+) bytes of unused data")  # zstandard's error for bytes after the frame


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

    With a recurrent core (`core_size` > 0, agent.core=lstm; agents/core.py), three more, each of one
    row (the time axis of length 1 keeps them time-major with the rest):
    core_state      [1, 2, core_size]  float32    (the stream's LSTM (h, c) before step 0: zeros when
                                                   step 0 starts an episode)
    last_action     [1]                int64      (the stream's action before step 0, head 0's for
                                                   multi-head actions; -1 at an episode start)
    last_reward     [1]                float32    (the reward of that action's step; 0 at an episode start)

    Termination is `done & ~truncated` (discount 0). `truncated` costs 1 byte per step; `final_obs`
    one observation per time-limited episode (see docs/architecture.md for the numbers).

    On the wire (and as `decode_unrolls` returns them) an entry of n unrolls carries each array above
    stacked, [n, ...], and the final observations of all its unrolls concatenated, [N, ...] with
    N = sum(truncated) over the entry, unroll after unroll, each in step order.

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
    core_size: int = 0

    @cached_property  # the decoder reads it several times per unroll
    def arrays(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        T, A, heads = self.unroll_length, self.env.num_actions, self.env.action_heads
        if self.env.obs_arrays is None:
            obs = {"obs": (self.env.obs_dtype, (T + 1, *self.env.obs_shape))}
        else:
            obs = {f"obs.{name}": (dtype, (T + 1, *shape)) for name, shape, dtype in self.env.obs_arrays}
        behaviour = {"behaviour_logits": (np.dtype(np.float32), (T, A))} if heads is None else {
            "behaviour_log_probs": (np.dtype(np.float32), (T, len(heads)))}
        core = {} if not self.core_size else {
            "core_state": (np.dtype(np.float32), (1, 2, self.core_size)),
            "last_action": (np.dtype(np.int64), (1,)),
            "last_reward": (np.dtype(np.float32), (1,))}
        return {
            **obs,
            "action_mask": (np.dtype(np.uint8), (T + 1, A)),
            "action": (np.dtype(np.int64), (T,) if heads is None else (T, len(heads))),
            "reward": (np.dtype(np.float32), (T,)),
            "done": (np.dtype(np.uint8), (T,)),
            "truncated": (np.dtype(np.uint8), (T,)),
            **behaviour,
            **core,
        }

    @cached_property
    def layout(self) -> tuple[tuple[str, np.dtype, tuple[int, ...], str, list[int], int], ...]:
        """`arrays` as the decoder's fast path compares them: (name, dtype, shape, dtype.str as sent,
        shape as sent, bytes)."""
        return tuple((name, dtype, shape, dtype.str, list(shape), dtype.itemsize * math.prod(shape))
                     for name, (dtype, shape) in self.arrays.items())

    @cached_property
    def max_unroll_nbytes(self) -> int:
        """The most bytes one decoded unroll can take: its arrays plus a final observation for each of
        its T steps (every step truncated)."""
        final = sum(dtype.itemsize * math.prod(shape) for dtype, shape in self.final_arrays.values())
        return sum(nbytes for *_, nbytes in self.layout) + self.unroll_length * final

    @cached_property
    def max_unrolls_per_entry(self) -> int:
        """The most unrolls one entry may hold: at most MAX_MESSAGE_BYTES decoded."""
        return max(1, MAX_MESSAGE_BYTES // self.max_unroll_nbytes)

    @cached_property
    def final_arrays(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """The final observations of truncated steps: name -> (dtype, shape of one); each array of an
        unroll is [N, *shape] with N = sum(truncated)."""
        if self.env.obs_arrays is None:
            return {"final_obs": (self.env.obs_dtype, tuple(self.env.obs_shape))}
        return {f"final_obs.{name}": (dtype, tuple(shape)) for name, shape, dtype in self.env.obs_arrays}


# unroll_id: the id of the entry's first unroll (`{actor_id}-{token}-{sequence}`), which names the entry
# wherever it is traced (the dead-letter stream keeps the whole entry); unrolls: n, how many it holds.
HEADER_FIELDS = {"schema": str, "unroll_id": str, "unrolls": int, "policy_version": int, "actor_id": int,
                 "opponent_id": str, "env": str, "created_at": float, "compression": str}

_zstd = threading.local()  # zstandard's (de)compressor objects must not be shared between threads


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = _zstd.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def encode_unrolls(unrolls: list[dict[str, np.ndarray]], *, unroll_id: str, policy_version: int, actor_id: int,
                   env: str, opponent_id: str = "self", compression: str = "none", level: int = 3) -> bytes:
    """Serialize n >= 1 unrolls (each name -> array as in `UnrollSpec`, the final observations left out
    or [N_i, ...]) with one header to the bytes of one stream entry: each array stacked, [n, ...], the
    final observations concatenated.

    `unroll_id`: the first unroll's id. `compression` (transport.compression): "none", or "zstd" at
    `level`, which makes each array's bytes one zstd frame that records its decompressed size.
    Raises ValueError for another compression or no unrolls.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if not unrolls:
        raise ValueError("an entry holds at least one unroll")
    header = {"schema": SCHEMA, "unroll_id": unroll_id, "unrolls": len(unrolls), "policy_version": int(policy_version),
              "actor_id": int(actor_id), "opponent_id": opponent_id, "env": env, "created_at": time.time(),
              "compression": compression}
    body = {}
    for name in dict.fromkeys(k for u in unrolls for k in u):  # every unroll's names, in order
        parts = [np.ascontiguousarray(u[name]) for u in unrolls if name in u]
        first = parts[0]
        if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in parts):
            raise ValueError(f"the unrolls' arrays '{name}' differ in dtype or shape: "
                             f"{sorted({(p.dtype.str, p.shape) for p in parts})}")
        if name.startswith("final_obs"):  # [N_i, ...] each, concatenated; an unroll without any leaves them out
            shape = [sum(len(p) for p in parts), *first.shape[1:]]
        else:
            if any(p.shape != first.shape for p in parts):
                raise ValueError(f"the unrolls' arrays '{name}' differ in shape: {sorted({p.shape for p in parts})}")
            shape = [len(parts), *first.shape]
        body[name] = [first.dtype.str, shape, _joined_bytes(parts, compression, level)]
    return msgpack.packb({"header": header, "arrays": body}, use_bin_type=True)


def _joined_bytes(parts: list[np.ndarray], compression: str, level: int) -> bytes:
    """The bytes of the C-contiguous arrays `parts` one after the other (those of their stack or
    concatenation), as one zstd frame that records its size, or raw: read from each array in place,
    so that no joined array is built first (a frame stack is written once, into its unroll, between
    the emulator and the wire)."""
    views = [memoryview(p.reshape(-1).view(np.uint8)) for p in parts]
    if compression != "zstd":
        return b"".join(views)
    stream = _compressor(level).compressobj(size=sum(v.nbytes for v in views))
    return b"".join([*(stream.compress(v) for v in views), stream.flush()])


def encode_unroll(arrays: dict[str, np.ndarray], **header: Any) -> bytes:
    """`encode_unrolls` of one unroll."""
    return encode_unrolls([arrays], **header)


def split_unrolls(arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The n unrolls of a decoded entry (`decode_unrolls`: arrays [n, ...], final observations
    [N, ...]), each as `UnrollSpec` lists its arrays, [T+1, ...] and [N_i, ...]: views, no copies."""
    n = len(arrays["reward"])
    counts = np.count_nonzero(arrays["truncated"], axis=1)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [{name: a[bounds[i]:bounds[i + 1]] if name.startswith("final_obs") else a[i] for name, a in arrays.items()}
            for i in range(n)]


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
    """Parse and validate an entry of one unroll. Returns (header, arrays), the arrays as `UnrollSpec`
    lists them ([T+1, ...], final observations [N, ...]), read-only views of `data`.

    Raises:
      DecodeError: with the reason, for anything that does not match `spec` exactly, or an entry of
        several unrolls (`decode_unrolls` reads those).
    """
    (decoded,) = decode_unrolls([data], spec)
    if isinstance(decoded, DecodeError):
        raise decoded
    header, arrays = decoded
    if header["unrolls"] != 1:
        raise DecodeError(f"the entry holds {header['unrolls']} unrolls, not one")
    return header, split_unrolls(arrays)[0]


def decode_unrolls(entries: list[bytes], spec: UnrollSpec) -> list[tuple[dict[str, Any], dict[str, np.ndarray]] | DecodeError]:
    """Parse and validate a batch of stream entries: for each, (header, arrays) with the arrays of its
    n = header["unrolls"] unrolls stacked, [n, ...] (final observations [N, ...], see `UnrollSpec`;
    `split_unrolls` separates them), read-only views of its bytes; or the DecodeError that says why
    it is rejected (the others are unaffected).

    The structure (header, dtypes, shapes, sizes) is checked entry by entry before any bytes are
    touched; the values (finite floats, actions, masks and flags in range) are checked for the whole
    batch at once, a few numpy passes over all its unrolls rather than a dozen per unroll.
    """
    out: list = []
    for data in entries:
        try:
            out.append(_parse_unroll(data, spec))
        except DecodeError as e:
            out.append(e)
    parsed = [i for i, item in enumerate(out) if not isinstance(item, DecodeError)]
    if parsed:  # (an entry is rejected with the first reason of its first invalid unroll)
        for i, reason in zip(parsed, _value_errors([out[i][1] for i in parsed], spec)):
            if reason is not None:
                out[i] = DecodeError(reason)
    return out


def _parse_unroll(data: bytes, spec: UnrollSpec) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) of one entry whose structure matches `spec`; its values are not checked yet."""
    msg = unpack_message(data, ("header", "arrays"))
    header, body = msg["header"], msg["arrays"]
    _check_header(header, spec)
    n = header["unrolls"]
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
                and item[1] == [n, *sent_shape] and type(item[2]) is bytes and len(item[2]) == n * nbytes:
            arrays[name] = np.ndarray((n, *shape), dtype, item[2])
        else:
            arrays[name] = _decode_array(name, item, dtype, (n, *shape), compressed)
    # At most n T: the final observations' count is bounded before they are decoded. A `truncated` that
    # is not 0/1, or 1 where done is not, is rejected with the values (`_value_errors`).
    finals = int(np.count_nonzero(arrays["truncated"]))
    for name, (dtype, shape) in spec.final_arrays.items():
        if name not in body and finals:
            raise DecodeError(f"{finals} steps are truncated but the entry has no '{name}'")
        arrays[name] = (_decode_array(name, body[name], dtype, (finals, *shape), compressed) if name in body
                        else np.zeros((0, *shape), dtype))
    return header, arrays


def _check_header(header: Any, spec: UnrollSpec) -> None:
    # The common case, every field of exactly its type, in one test; the slow checks find the reason.
    if not (type(header) is dict and header.keys() == HEADER_FIELDS.keys()
            and all(type(header[name]) is typ for name, typ in HEADER_FIELDS.items())):
        _check_header_fields(header)
    if header["schema"] != SCHEMA:
        raise DecodeError(f"schema '{header['schema']}' is not '{SCHEMA}': the actor that sent it runs another "
                          "version of this code; a run's actors and learners must run the same one")
    if header["env"] != spec.env.name:
        raise DecodeError(f"unroll is for env '{header['env']}', this learner trains '{spec.env.name}'")
    if header["compression"] not in COMPRESSIONS:
        raise DecodeError(f"compression '{header['compression']}' is not one of {', '.join(COMPRESSIONS)}")
    if header["policy_version"] < 0:
        raise DecodeError("policy_version must be >= 0")
    if not 1 <= header["unrolls"] <= spec.max_unrolls_per_entry:  # bounds what a compressed entry decompresses to
        raise DecodeError(f"unrolls must be in [1, {spec.max_unrolls_per_entry}] (at most {MAX_MESSAGE_BYTES} "
                          f"bytes decoded), got {header['unrolls']}")


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
    allocated for it. Raises DecodeError for a frame that is corrupt, declares another size, or is
    followed by anything (a byte, a second frame: our encoder writes one frame an array, nothing after)."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise DecodeError(f"array '{name}' is not a zstd frame: {e}") from None
    if declared != nbytes:  # -1: a frame without its size, which our encoder never writes
        raise DecodeError(f"array '{name}' is a zstd frame of {declared} bytes, its shape needs {nbytes}")
    if "decompressor" not in _zstd.__dict__:
        _zstd.decompressor = zstandard.ZstdDecompressor()
    try:
        return _zstd.decompressor.decompress(frame, max_output_size=nbytes, allow_extra_data=False)
    except zstandard.ZstdError as e:
        extra = UNUSED_DATA.search(str(e))
        if extra:
            count = int(extra.group(1))
            raise DecodeError(f"array '{name}' has {count} byte{'s' if count != 1 else ''} after its zstd "
                              "frame") from None
        raise DecodeError(f"array '{name}' does not decompress: {e}") from None


def _value_errors(entries: list[dict[str, np.ndarray]], spec: UnrollSpec) -> list[str | None]:
    """For each of E structurally valid entries (arrays [n_e, ...]), the first reason the values of its
    first invalid unroll are wrong, or None.

    Each array is concatenated once over all U = sum(n_e) unrolls. A few whole-batch reductions then
    clear a batch of valid entries (`_all_valid`, the common case); only a batch they do not clear is
    checked unroll by unroll, and each invalid unroll's reason passed to its entry: the rows of a
    per-step array are its T or T+1 steps, those of a final array its N_u observations.
    """
    A, heads, T = spec.env.num_actions, spec.env.action_heads, spec.unroll_length
    sizes = [len(e["reward"]) for e in entries]
    U = sum(sizes)
    floats = [name for name, (dtype, _) in {**spec.arrays, **spec.final_arrays}.items() if dtype.kind == "f"]
    core = ("last_action",) if spec.core_size else ()
    rows = {name: np.concatenate([e[name] for e in entries])
            for name in ("truncated", "done", "action", "action_mask", *core, *floats)}
    if _all_valid(rows, floats, spec, U):
        return [None] * len(entries)
    owner = np.repeat(np.arange(len(entries)), sizes)  # entry of each unroll
    checks: list[tuple[str, np.ndarray]] = []
    truncated, done = rows["truncated"].reshape(U, T), rows["done"].reshape(U, T)
    checks.append(("truncated must be 0 or 1, and 1 only where done is 1",
                   ((truncated > 1) | (truncated > done)).any(1)))
    finals = np.repeat(np.arange(U), np.count_nonzero(truncated, axis=1))  # unroll of each final row
    for name in floats:
        if name in spec.arrays:
            bad = ~np.isfinite(rows[name]).reshape(U, -1).all(1)
        else:
            bad = np.zeros(U, bool)
            if len(finals):
                bad[finals[~np.isfinite(rows[name]).reshape(len(finals), -1).all(1)]] = True
        checks.append((f"array '{name}' has non-finite values", bad))
    action = rows["action"].reshape(U, T, -1)  # [U, T, 1] or [U, T, H]
    checks.append((f"action out of range [0, {heads or A})",
                   ((action < 0) | (action >= (A if heads is None else np.asarray(heads)))).any((1, 2))))
    if spec.core_size:
        last = rows["last_action"].reshape(U)
        checks.append((f"last_action out of range [-1, {A})", (last < -1) | (last >= A)))
    mask = rows["action_mask"].reshape(U, T + 1, A)
    checks.append(("done and action_mask must be 0 or 1", (done > 1).any(1) | (mask > 1).any((1, 2))))
    head0 = np.clip(action[:, :, 0], 0, A - 1)  # multi-head: the mask is over head 0
    legal = np.take_along_axis(mask[:, :T], head0[:, :, None], 2)
    checks.append(("an action is illegal under its own action_mask", ~legal.all((1, 2))))
    found: dict[int, str] = {}  # invalid unroll -> its first reason (the checks run in order)
    for reason, bad in checks:
        for u in np.flatnonzero(bad):
            found.setdefault(int(u), reason)
    reasons: list[str | None] = [None] * len(entries)
    for u in sorted(found):  # an entry takes the reason of its first invalid unroll
        reasons[owner[u]] = reasons[owner[u]] or found[u]
    return reasons


def _all_valid(rows: dict[str, np.ndarray], floats: list[str], spec: UnrollSpec, U: int) -> bool:
    """Whether every value of the U unrolls in `rows` (each array concatenated over them) is valid, by
    whole-batch reductions. It never clears an invalid batch: a NaN or infinity makes a sum non-finite.
    It may fail a valid one (finite floats whose sum overflows), which `_value_errors` then clears
    unroll by unroll."""
    A, heads, T = spec.env.num_actions, spec.env.action_heads, spec.unroll_length
    truncated, done, mask = rows["truncated"], rows["done"], rows["action_mask"]
    if done.max(initial=0) > 1 or mask.max(initial=0) > 1 or (truncated > done).any():  # (truncated <= done <= 1)
        return False
    with np.errstate(over="ignore"):  # an overflowing sum of finite values is checked unroll by unroll after
        if not all(np.isfinite(rows[name].sum()) for name in floats):
            return False
    if "last_action" in rows and (rows["last_action"].min(initial=0) < -1
                                  or rows["last_action"].max(initial=0) >= A):
        return False
    action = rows["action"].reshape(U, T, -1)
    if action.min(initial=0) < 0 or (action.max(initial=0) >= A if heads is None else (action >= heads).any()):
        return False
    # Each step's own action looked up in the flat mask (head 0's: the mask is over head 0); in range, checked above.
    return bool(mask.reshape(-1)[_mask_offsets(U, T, A) + action[:, :, 0]].all())


@lru_cache(maxsize=16)
def _mask_offsets(U: int, T: int, A: int) -> np.ndarray:
    """[U, T]: where step t of unroll u starts in a flat action_mask of U unrolls, [U, T + 1, A] (a third of
    the time of take_along_axis in `_all_valid`, which runs for every batch)."""
    return (np.arange(U)[:, None] * (T + 1) + np.arange(T)) * A


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

