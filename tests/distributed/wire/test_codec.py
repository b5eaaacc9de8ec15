"""Tests for distributed/wire/codec.py: the unroll wire format and the weights format.

The valid unroll is played in the real connect_four env (one seat's learning stream, episodes
concatenated), so its observations, masks, actions, rewards and done flags are the ones an actor sends.
Every malformed input starts from that unroll's msgpack map and changes one thing.
"""

from __future__ import annotations

import re
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
import torch
import zstandard
from pettingzoo.classic import connect_four_v3
from safetensors import SafetensorError

from impala_league.distributed.wire.codec import (
    MAX_MESSAGE_BYTES,
    SCHEMA,
    DecodeError,
    UnrollSpec,
    decode_unroll,
    decode_unrolls,
    decode_weights,
    encode_unroll,
    encode_unrolls,
    encode_weights,
    split_unrolls,
)
from impala_league.batch import Batch
from impala_league.envs.registry import env_spec

T = 24
SPEC = env_spec("connect_four")
USPEC = UnrollSpec(SPEC, T)
SEAT = "player_0"
MASKED_LOGIT = -1e9  # agents/network.py: what the actor writes for illegal actions
HEADER = dict(unroll_id="3-abcd1234-17", policy_version=42, actor_id=3, env="connect_four", opponent_id="snap-5")


def play_unroll(seed: int = 0) -> dict[str, np.ndarray]:
    """One unroll of seat player_0 in connect_four with random legal moves for both seats.

    The reward that reaches player_0 when it next observes (or at game end) belongs to its previous step.
    """
    rng = np.random.default_rng(seed)
    a = {name: np.zeros(shape, dtype) for name, (dtype, shape) in USPEC.arrays.items()}
    t, episode = 0, 0
    env = connect_four_v3.env()
    while True:
        env.reset(seed=seed + episode)
        acted = False
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            done = term or trunc
            action = None if done else int(rng.choice(np.flatnonzero(obs["action_mask"])))
            if agent == SEAT:
                if acted:
                    a["reward"][t - 1] = reward
                    a["done"][t - 1] = done
                if not done:
                    a["obs"][t] = obs["observation"]
                    a["action_mask"][t] = obs["action_mask"]
                    if t == T:
                        return a
                    logits = rng.normal(size=SPEC.num_actions).astype(np.float32)
                    a["behaviour_logits"][t] = np.where(obs["action_mask"] == 1, logits, MASKED_LOGIT)
                    a["action"][t] = action
                    t += 1
                    acted = True
            env.step(action)
        episode += 1


UNROLL = play_unroll()


def test_played_unroll_is_realistic():
    """Guard for the fixture itself: legal actions, at least one finished game, a settled result."""
    assert UNROLL["action_mask"][np.arange(T), UNROLL["action"]].all()
    assert UNROLL["done"].sum() >= 1
    # connect_four gives +-1 exactly at game end, nothing in between.
    assert set(np.flatnonzero(UNROLL["reward"])) <= set(np.flatnonzero(UNROLL["done"]))
    assert np.abs(UNROLL["reward"][UNROLL["done"] == 1]).max() == 1.0
    assert (UNROLL["obs"].sum(axis=(1, 2, 3)) > 0).any()  # pieces on the board


def encode(arrays=None, **header) -> bytes:
    return encode_unroll(UNROLL if arrays is None else arrays, **{**HEADER, **header})


def test_round_trip_bit_for_bit():
    before = time.time()
    header, arrays = decode_unroll(encode(), USPEC)
    after = time.time()
    assert set(arrays) == set(UNROLL) | {"final_obs"}  # no step truncated: left out, decoded empty
    assert arrays["final_obs"].shape == (0, *SPEC.obs_shape) and arrays["final_obs"].dtype == SPEC.obs_dtype
    for name, original in UNROLL.items():
        assert arrays[name].dtype == original.dtype, name
        assert arrays[name].shape == original.shape, name
        assert arrays[name].tobytes() == original.tobytes(), name
        assert not arrays[name].flags.writeable, name  # documented: read-only views of the payload
    assert {k: header[k] for k in HEADER} == HEADER
    assert header["schema"] == SCHEMA
    assert before <= header["created_at"] <= after


def test_round_trip_tictactoe_and_bytearray():
    """Another env's spec (obs 3x3x2, 9 actions), and a bytearray payload."""
    spec = UnrollSpec(env_spec("tictactoe"), 3)
    rng = np.random.default_rng(1)
    arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in spec.arrays.items()}
    arrays["obs"][:] = rng.integers(0, 2, arrays["obs"].shape)
    arrays["action_mask"][:] = 1
    arrays["action"][:] = [0, 8, 4]
    arrays["reward"][:] = [0.0, 0.0, -1.0]
    arrays["done"][:] = [0, 0, 1]
    arrays["behaviour_logits"][:] = rng.normal(size=(3, 9))
    data = encode_unroll(arrays, unroll_id="u", policy_version=0, actor_id=0, env="tictactoe")
    header, decoded = decode_unroll(bytearray(data), spec)
    assert header["opponent_id"] == "self" and header["policy_version"] == 0
    for name in arrays:
        np.testing.assert_array_equal(decoded[name], arrays[name])


# -- entries of several unrolls (actor.send_batch) ---------------------------------------------------

def time_limited(unroll: dict[str, np.ndarray], fill: int) -> dict[str, np.ndarray]:
    """`unroll` with every episode end marked as a time limit, each with a final observation of `fill`s."""
    ends = int(unroll["done"].sum())
    return {**unroll, "truncated": unroll["done"].copy(),
            "final_obs": np.full((ends, *SPEC.obs_shape), fill, SPEC.obs_dtype)}


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_an_entry_of_several_unrolls_round_trips_splits_and_stacks_as_the_unrolls_do(compression):
    """Three unrolls in one entry, the middle one time-limited: arrays come back stacked [3, ...], the
    final observations [N, ...] in unroll order (the encoder joins the unrolls' bytes, or compresses
    them as one frame, without stacking them first); split_unrolls gives each unroll back bit for bit,
    and the entry's batch is the batch of the three unrolls stacked one by one."""
    unrolls = [play_unroll(1), time_limited(play_unroll(2), 1), play_unroll(3)]
    [(header, arrays)] = decode_unrolls([encode_unrolls(unrolls, compression=compression, **HEADER)], USPEC)
    assert header["compression"] == compression
    assert header["unrolls"] == 3 and header["unroll_id"] == HEADER["unroll_id"]
    assert arrays["obs"].shape == (3, T + 1, *SPEC.obs_shape) and arrays["action"].shape == (3, T)
    assert arrays["final_obs"].shape == (int(unrolls[1]["done"].sum()), *SPEC.obs_shape) and len(arrays["final_obs"])
    for got, want in zip(split_unrolls(arrays), unrolls, strict=True):
        for name in USPEC.arrays:
            assert got[name].tobytes() == want[name].tobytes(), name
        np.testing.assert_array_equal(got["final_obs"], want.get("final_obs", np.zeros((0, *SPEC.obs_shape))))
    cpu = torch.device("cpu")
    one_by_one = Batch.stack(split_unrolls(arrays), cpu)
    together = Batch.concat([arrays], cpu)
    for field in ("obs", "action_mask", "action", "reward", "done", "behaviour_logits", "truncated",
                  "final_obs", "final_t", "final_b"):
        assert torch.equal(getattr(together, field), getattr(one_by_one, field)), field
    assert together.final_b.tolist() == [1] * len(arrays["final_obs"])  # the middle unroll's
    assert together.final_t.tolist() == np.flatnonzero(unrolls[1]["done"]).tolist()


def test_an_entry_is_rejected_whole_with_the_reason_of_its_first_invalid_unroll():
    """One non-finite reward in the second of three unrolls and an action out of range in the third:
    the entry gets the second's reason; the valid entries beside it decode."""
    nan = {**UNROLL, "reward": np.where(np.arange(T) == 3, np.nan, UNROLL["reward"]).astype(np.float32)}
    bad_action = {**UNROLL, "action": np.where(np.arange(T) == 0, 7, UNROLL["action"])}
    entries = [encode(), encode_unrolls([UNROLL, nan, bad_action], **HEADER), encode_unrolls([UNROLL, UNROLL], **HEADER)]
    ok, rejected, two = decode_unrolls(entries, USPEC)
    assert isinstance(rejected, DecodeError) and "'reward' has non-finite" in str(rejected)
    assert ok[0]["unrolls"] == 1 and two[0]["unrolls"] == 2 and two[1]["reward"].shape == (2, T)


@pytest.mark.parametrize("count", [0, -1, USPEC.max_unrolls_per_entry + 1])
def test_an_unroll_count_out_of_range_is_refused_before_any_array(count):
    """The count bounds what an entry may decompress to (at most MAX_MESSAGE_BYTES): it is checked with
    the header, before a zstd frame declaring count unrolls' bytes would be decompressed."""
    assert USPEC.max_unrolls_per_entry * USPEC.max_unroll_nbytes <= MAX_MESSAGE_BYTES
    data = tamper(_set(("header", "unrolls"), count))
    with pytest.raises(DecodeError, match=rf"unrolls must be in \[1, {USPEC.max_unrolls_per_entry}\].*got {count}"):
        decode_unroll(data, USPEC)


def test_decode_unroll_reads_entries_of_one_unroll_only():
    with pytest.raises(DecodeError, match="the entry holds 2 unrolls, not one"):
        decode_unroll(encode_unrolls([UNROLL, UNROLL], **HEADER), USPEC)


# -- malformed inputs -------------------------------------------------------------------------------

def tamper(mutate) -> bytes:
    """The valid unroll's message with `mutate(msg)` applied, re-packed."""
    msg = msgpack.unpackb(encode(), raw=False)
    mutate(msg)
    return msgpack.packb(msg, use_bin_type=True)


def set_array(name: str, values: np.ndarray):
    """Replace array `name` of the entry's one unroll with `values` (sent with the entry's leading [1])."""
    def mutate(msg):
        msg["arrays"][name] = [values.dtype.str, [1, *values.shape], values.tobytes()]
    return mutate


def with_values(name: str, change):
    """Array `name` of the valid unroll after `change(copy)`."""
    copy = UNROLL[name].copy()
    change(copy)
    return set_array(name, copy)


def illegal_action(a):
    a[5, UNROLL["action"][5]] = 0


def _set(path, value):
    def mutate(msg):
        msg[path[0]][path[1]] = value
    return mutate


def _del(path):
    def mutate(msg):
        del msg[path[0]][path[1]]
    return mutate


MALFORMED = {
    "not msgpack": (b"\xc1", "not msgpack"),
    "truncated msgpack": (encode()[:-10], "not msgpack"),
    "random bytes": (np.random.default_rng(0).bytes(4096), "msgpack|map"),
    "msgpack list": (msgpack.packb([1, 2, 3]), "map with exactly 'header' and 'arrays'"),
    "extra top-level key": (tamper(lambda m: m.update(pickle=b"x")), "map with exactly"),
    "missing array": (tamper(_del(("arrays", "done"))), r"arrays must be exactly .*got \['action', 'action_mask', "
                                                       r"'behaviour_logits', 'obs', 'reward', 'truncated'\]"),
    "extra array": (tamper(_set(("arrays", "extra"), ["|u1", [1], b"\x00"])), "arrays must be exactly.*'extra'"),
    "array not a triple": (tamper(_set(("arrays", "done"), "oops")), r"array 'done' must be \[dtype, shape, bytes\]"),
    "reward float64": (tamper(set_array("reward", UNROLL["reward"].astype(np.float64))),
                       "array 'reward' has dtype '<f8', expected '<f4'"),
    "object dtype": (tamper(_set(("arrays", "obs"), ["|O", [1, T + 1, 6, 7, 2], b"\x80\x04N."])),
                     "array 'obs' has dtype '|O'"),
    "T off by one": (tamper(set_array("action", UNROLL["action"][:-1])),
                     rf"array 'action' has shape \[1, {T - 1}\], expected \[1, {T}\]"),
    "byte length mismatch": (tamper(_set(("arrays", "reward"), ["<f4", [1, T], b"\x00" * (4 * T - 4)])),
                             rf"array 'reward' has {4 * T - 4} bytes, shape \[1, {T}\] needs {4 * T}"),
    "nan reward": (tamper(with_values("reward", lambda a: a.__setitem__(3, np.nan))), "'reward' has non-finite"),
    "inf reward": (tamper(with_values("reward", lambda a: a.__setitem__(0, np.inf))), "'reward' has non-finite"),
    "nan logits": (tamper(with_values("behaviour_logits", lambda a: a.__setitem__((2, 1), np.nan))),
                   "'behaviour_logits' has non-finite"),
    "-inf logits": (tamper(with_values("behaviour_logits", lambda a: a.__setitem__((0, 0), -np.inf))),
                    "'behaviour_logits' has non-finite"),
    "action 7": (tamper(with_values("action", lambda a: a.__setitem__(4, 7))), r"action out of range \[0, 7\)"),
    "action -1": (tamper(with_values("action", lambda a: a.__setitem__(0, -1))), r"action out of range \[0, 7\)"),
    "action illegal under mask": (tamper(with_values("action_mask", illegal_action)), "illegal under its own action_mask"),
    "done 2": (tamper(with_values("done", lambda a: a.__setitem__(1, 2))), "done and action_mask must be 0 or 1"),
    "mask 2": (tamper(with_values("action_mask", lambda a: a.__setitem__((T, 0), 2))),
               "done and action_mask must be 0 or 1"),
    "wrong schema": (tamper(_set(("header", "schema"), "impala-unroll/0")), "schema 'impala-unroll/0'"),
    "header missing field": (tamper(_del(("header", "actor_id"))), "header must have exactly the fields"),
    "header extra field": (tamper(_set(("header", "pickled"), "x")), "header must have exactly the fields"),
    "bool as int": (tamper(_set(("header", "policy_version"), True)),
                    "header field 'policy_version' must be int, got bool"),
    "str as int": (tamper(_set(("header", "actor_id"), "3")), "header field 'actor_id' must be int, got str"),
    "created_at str": (tamper(_set(("header", "created_at"), "now")), "header field 'created_at' must be float"),
    "negative policy_version": (tamper(_set(("header", "policy_version"), -1)), "policy_version must be >= 0"),
    "env mismatch": (encode(env="tictactoe"), "unroll is for env 'tictactoe', this learner trains 'connect_four'"),
    "over MAX_MESSAGE_BYTES": (b"\x00" * (MAX_MESSAGE_BYTES + 1), f"at most {MAX_MESSAGE_BYTES} bytes"),
    "not bytes": ("a str", "payload must be bytes"),
}


@pytest.mark.parametrize("data, reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_raises_decode_error_naming_the_problem(data, reason):
    with pytest.raises(DecodeError, match=reason):
        decode_unroll(data, USPEC)


def test_one_illegal_step_anywhere_in_a_batch_rejects_its_entry_alone():
    """The batch-wide legality check looks each step's action up in the flat action_mask of all the
    batch's unrolls. Random actions under masks that allow every action, in entries of 1-3 unrolls (so a
    lookup in the wrong place would pass); then one step of one unroll made illegal: exactly its entry is
    rejected, wherever the step is."""
    rng = np.random.default_rng(0)
    A = SPEC.num_actions
    for _ in range(20):
        unrolls = []
        for _ in range(7):
            unrolls.append({**UNROLL, "action_mask": np.ones((T + 1, A), np.uint8),
                            "action": rng.integers(0, A, T).astype(np.int64)})
        sizes = [2, 1, 3, 1]
        entry_of = np.repeat(np.arange(len(sizes)), sizes)
        u, t = rng.integers(len(unrolls)), rng.integers(T)
        unrolls[u]["action_mask"][t, unrolls[u]["action"][t]] = 0
        bounds = np.cumsum([0, *sizes])
        entries = [encode_unrolls(unrolls[bounds[e]:bounds[e + 1]], **HEADER) for e in range(len(sizes))]
        rejected = [isinstance(got, DecodeError) and "illegal under its own action_mask" in str(got)
                    for got in decode_unrolls(entries, USPEC)]
        assert rejected == [e == entry_of[u] for e in range(len(sizes))], (u, t)


def test_a_batch_rejects_exactly_its_malformed_entries_each_with_its_own_reason():
    """The batched value checks reduce per unroll: every malformed entry of MALFORMED, each between two
    valid unrolls (one of them with a different reward), is rejected with the reason it gets alone, and
    the valid ones decode to their own arrays."""
    entries, expected = [], []
    for k, (data, reason) in enumerate(MALFORMED.values()):
        rewarded = {**UNROLL, "reward": np.full(T, k, np.float32)}
        entries += [encode(rewarded), data]
        expected += [k, reason]
    entries.append(encode())
    expected.append(None)
    for got, want in zip(decode_unrolls(entries, USPEC), expected, strict=True):
        if isinstance(want, str):
            assert isinstance(got, DecodeError) and re.search(want, str(got)), (want, got)
        else:
            header, arrays = got
            assert header["unroll_id"] == HEADER["unroll_id"]
            np.testing.assert_array_equal(arrays["reward"][0], UNROLL["reward"] if want is None else np.full(T, want))
            np.testing.assert_array_equal(arrays["obs"][0], UNROLL["obs"])


def test_finite_values_whose_sum_overflows_are_valid():
    """The whole-batch check sums each float array (a NaN or infinity makes the sum non-finite); finite
    rewards whose sum overflows float32 fail that check only, and the per-unroll check clears them."""
    big = {**UNROLL, "reward": np.full(T, 3e38, np.float32)}
    with np.errstate(over="ignore"):
        assert np.isinf(big["reward"].sum())
    header, arrays = decode_unroll(encode(big), USPEC)
    np.testing.assert_array_equal(arrays["reward"], big["reward"])
    inf = {**UNROLL, "reward": np.where(np.arange(T) == 3, np.inf, 0).astype(np.float32)}
    with pytest.raises(DecodeError, match="array 'reward' has non-finite values"):
        decode_unroll(encode(inf), USPEC)


def test_unroll_length_mismatch_against_spec():
    """An unroll of length T read by a learner configured for T + 1 is refused by shape."""
    with pytest.raises(DecodeError, match=rf"array 'obs' has shape \[1, {T + 1}, 6, 7, 2\], expected \[1, {T + 2}, 6, 7, 2\]"):
        decode_unroll(encode(), UnrollSpec(SPEC, T + 1))


@pytest.mark.parametrize("shape", [[10**12], [2**62, 2**62], [T, 2**40]])
def test_huge_declared_shape_is_refused_without_allocating(shape):
    data = tamper(_set(("arrays", "behaviour_logits"), ["<f4", shape, b"\x00" * 16]))
    start = time.perf_counter()
    with pytest.raises(DecodeError, match="array 'behaviour_logits' has shape"):
        decode_unroll(data, USPEC)
    assert time.perf_counter() - start < 0.5


# -- compression ------------------------------------------------------------------------------------

def test_unrolls_that_disagree_on_an_array_s_dtype_or_shape_are_refused_by_the_encoder():
    """Their bytes are joined as they are, so one entry's unrolls must agree (np.stack would have cast)."""
    other_dtype = {**UNROLL, "reward": UNROLL["reward"].astype(np.float64)}
    with pytest.raises(ValueError, match="'reward' differ in dtype or shape"):
        encode_unrolls([UNROLL, other_dtype], **HEADER)
    shorter = {**UNROLL, "action": UNROLL["action"][:-1]}
    with pytest.raises(ValueError, match="'action' differ in shape"):
        encode_unrolls([UNROLL, shorter], **HEADER)


def test_zstd_round_trip_bit_for_bit_and_smaller():
    data = encode(compression="zstd", level=3)
    header, arrays = decode_unroll(data, USPEC)
    assert header["compression"] == "zstd"
    for name, original in UNROLL.items():
        assert arrays[name].dtype == original.dtype and arrays[name].tobytes() == original.tobytes(), name
    # One-hot boards, one-hot masks and small int64 actions are mostly zeros.
    assert len(data) < 0.5 * len(encode())
    assert decode_unroll(encode(), USPEC)[0]["compression"] == "none"


def zstd_tamper(name: str, frame: bytes) -> bytes:
    msg = msgpack.unpackb(encode(compression="zstd"), raw=False)
    msg["arrays"][name][2] = frame
    return msgpack.packb(msg, use_bin_type=True)


def test_a_decompression_bomb_is_refused_before_it_is_allocated():
    """obs as a 2 kB frame that declares (and holds) 64 MiB of zeros, where the shape needs 3,000 bytes."""
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))
    data = zstd_tamper("obs", bomb)
    assert len(bomb) < 4096
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=rf"array 'obs' is a zstd frame of {64 << 20} bytes, its shape needs "
                                              rf"{(T + 1) * 6 * 7 * 2}"):
            decode_unroll(data, USPEC)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


COMPRESSED_MALFORMED = {
    "frame without its size": (zstd_tamper("reward", zstandard.ZstdCompressor(write_content_size=False).compress(
        bytes(4 * T))), "array 'reward' is a zstd frame of -1 bytes"),
    "not a frame": (zstd_tamper("reward", b"\x00" * 16), "array 'reward' is not a zstd frame"),
    "frame cut short": (zstd_tamper("obs", zstandard.ZstdCompressor().compress(UNROLL["obs"].tobytes())[:-3]),
                        "array 'obs' does not decompress"),
    "raw bytes under zstd": (zstd_tamper("done", UNROLL["done"].tobytes()), "array 'done' is not a zstd frame"),
    "unknown compression": (tamper(_set(("header", "compression"), "lz4")), "compression 'lz4' is not one of none, zstd"),
}


@pytest.mark.parametrize("data, reason", COMPRESSED_MALFORMED.values(), ids=COMPRESSED_MALFORMED.keys())
def test_malformed_compressed_input_raises_decode_error_naming_the_problem(data, reason):
    with pytest.raises(DecodeError, match=reason):
        decode_unroll(data, USPEC)


def test_encoding_with_an_unknown_compression_raises():
    with pytest.raises(ValueError, match="compression must be one of"):
        encode(compression="gzip")


# -- weights ----------------------------------------------------------------------------------------

def small_state_dict() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    net(torch.randn(8, 5))  # moves BatchNorm's running stats off their initial values
    state = dict(net.state_dict())
    state["half"] = torch.randn(2, 3).to(torch.bfloat16)
    state["strided"] = torch.arange(12.0).reshape(3, 4).t()  # not contiguous
    return state


def test_weights_round_trip():
    state = small_state_dict()
    decoded = decode_weights(encode_weights(state))
    assert set(decoded) == set(state)
    for name, tensor in state.items():
        assert decoded[name].dtype == tensor.dtype, name
        assert torch.equal(decoded[name], tensor), name
    assert decoded["1.num_batches_tracked"].item() == 1
    assert decoded["strided"][1, 0].item() == 1.0  # transposed values, not the storage order


def corrupt_payloads() -> dict[str, bytes]:
    good = encode_weights(small_state_dict())
    header_len = int.from_bytes(good[:8], "little")
    return {
        "garbage": b"definitely not safetensors",
        "empty": b"",
        "truncated": good[:-7],
        "header length beyond payload": (len(good) * 4).to_bytes(8, "little") + good[8:],
        "header not json": good[:8] + b"{" * header_len + good[8 + header_len:],
    }


@pytest.mark.parametrize("data", corrupt_payloads().values(), ids=corrupt_payloads().keys())
def test_corrupt_weights_do_not_decode(data):
    with pytest.raises((ValueError, SafetensorError)):
        decode_weights(data)


def test_corrupt_weights_raise_safetensor_error_as_documented():
    from safetensors import SafetensorError

    with pytest.raises(SafetensorError):
        decode_weights(b"definitely not safetensors")


SECOND_FRAME = zstandard.ZstdCompressor().compress(bytes(range(64)))  # a whole zstd frame of its own


@pytest.mark.parametrize("extra", [b"\x00", b"\x28\xb5\x2f\xfd\x00\x00\x00\x00", SECOND_FRAME],
                         ids=["1 byte", "8 bytes", "a second frame"])
def test_bytes_after_a_compressed_array_s_frame_are_refused(extra):
    frame = zstandard.ZstdCompressor().compress(UNROLL["obs"].tobytes())
    assert decode_unroll(zstd_tamper("obs", frame), USPEC)[1]["obs"].tobytes() == UNROLL["obs"].tobytes()
    with pytest.raises(DecodeError, match=rf"^array 'obs' has {len(extra)} bytes? after its zstd frame"):
        decode_unroll(zstd_tamper("obs", frame + extra), USPEC)
