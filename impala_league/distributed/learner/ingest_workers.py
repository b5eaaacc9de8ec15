"""Ingest worker processes (`learner.ingest_workers` = W): the learner's reading, decoding, value checks
and stacking in W processes beside it, so that one learner takes more actors than one Python thread
can decode for (its GIL bounds the ingest thread, distributed/learner/ingest_thread.py).

Each worker is its own consumer of the trajectory shards (`<learner's consumer>-ingest<i>`): it reads
its own pending entries first (what it held when a learner stopped), then new ones, dead-letters the
malformed, and stacks each batch time-major straight into one of the learner's shared-memory slots
(`multiprocessing.shared_memory`, `learner.prefetch_batches` of them). Worker 0 also runs the
dead-consumer sweep. The learner acks a batch after the update that used it, as with the thread, then
gives its slot back; nothing is acked by a worker except a dead-lettered entry. A learner that stops
or dies leaves the batches its workers held pending for the next one.

Learner and worker speak over the worker's stdin and stdout: length-prefixed msgpack maps, never
pickle. learner -> worker: the settings (first), {"slot": s} (fill slot s with a batch), {"release":
s} (the update has trained on slot s's batch: ack it), or both in one message (ack it, then fill slot
s again); closing stdin stops the worker. worker -> learner: {"slot": s, "meta": [offset, length]}
(slot s is filled; its description, a msgpack map of the entry ids as [shard, id], the entries'
`unrolls` and `policy_version`, and each array as [name, dtype, shape, byte offset], lies in the slot
at offset), {"end": true} (an exploiter's run is over) or {"error": text, "redis": whether it lost
Redis}. Every reply is a few dozen bytes, so a worker never
waits on a full pipe.

    python -m impala_league.distributed.learner.ingest_workers   # started by the learner, never by hand
"""

from __future__ import annotations

import logging
import math
import os
import queue
import selectors
import signal
import struct
import subprocess
import sys
import threading
from multiprocessing import resource_tracker, shared_memory
from typing import BinaryIO, Callable

import msgpack
import numpy as np
import redis

from impala_league import REPO
from impala_league.batch import stack_entries
from impala_league.config import UserError
from impala_league.distributed.launch.children import die_with_parent
from impala_league.distributed.learner.ingest_thread import BatchReader
from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, decode_unrolls
from impala_league.distributed.wire.shards import ShardedTrajectories, ShardEntry
from impala_league.distributed.wire.transport import RedisUnavailable, connect
from impala_league.envs.registry import env_spec

log = logging.getLogger("ingest")

_LENGTH = struct.Struct("<I")
ALIGN = 64  # each array of a slot starts on a cache line
LEARNER_HEADER = ("unrolls", "policy_version")  # what the learner reads of an entry's header
META_BASE, META_PER_ENTRY = 4096, 128  # room in a slot for its batch's description (ids, headers, arrays)
STOP_TIMEOUT_S = 10.0  # a worker ends its read (at most learner.read_block_ms) and exits within this


class IngestWorkerError(UserError, RuntimeError):
    """An ingest worker failed or died; the message names it and says why."""


def send(stream: BinaryIO, message: dict) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:  # an unbuffered stream may take part of it
        view = view[stream.write(view):]
    stream.flush()


def receive(stream: BinaryIO) -> dict | None:
    """The next message, or None at the end of the stream."""
    head = _read_exactly(stream, _LENGTH.size)
    data = head and _read_exactly(stream, _LENGTH.unpack(head)[0])
    return None if data is None else msgpack.unpackb(data, raw=False)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    """n bytes, or None at the end of the stream (an unbuffered stream may return fewer at a time)."""
    data = bytearray()
    while len(data) < n:
        part = stream.read(n - len(data))
        if not part:
            return None
        data += part
    return bytes(data)


def worker_consumer(consumer: str, i: int) -> str:
    """The consumer name of worker i of the learner whose own name is `consumer`."""
    return f"{consumer}-ingest{i}"


def slot_capacity(fresh: int) -> int:
    """Unrolls one slot holds: twice a batch's F fresh ones, so that entries of other sizes than
    `actor.send_batch` still fit (what does not fit waits for the next batch)."""
    return 2 * fresh


def slot_nbytes(spec: UnrollSpec, fresh: int) -> int:
    """Bytes of a slot: `slot_capacity` unrolls at their largest (every step truncated), aligned, and
    the batch's description (`_describe`: at most one entry per unroll, each id and header well
    under META_PER_ENTRY bytes)."""
    arrays = slot_capacity(fresh) * spec.max_unroll_nbytes + ALIGN * (len(spec.arrays) + len(spec.final_arrays) + 1)
    return arrays + META_BASE + slot_capacity(fresh) * META_PER_ENTRY


class IngestWorkers:
    """W worker processes filling `depth` shared-memory slots ahead of the update; `Prefetcher`'s
    interface: `get` the next batch (None once there are no more), `release` a batch once acked, `close`.

    settings: what a worker needs to read (`worker_settings`). consumer: the learner's consumer name
    (worker i reads as `<consumer>-ingest<i>`). fresh: F, unrolls a batch reads. unrolls_left(): unrolls
    the run may still take (run.total_agent_steps), so that no slot is asked for beyond it. prepare(arrays):
    what `get` returns for a batch's time-major arrays (views of its slot, valid until `release`).
    keep_reading(): false once the learner stops (a `get` waiting then returns None).
    Raises RuntimeError from `get` when a worker fails or dies, with its reason.
    """

    def __init__(self, settings: dict, consumer: str, workers: int, depth: int, fresh: int, nbytes: int,
                 unrolls_left: Callable[[], float], prepare: Callable[[dict[str, np.ndarray]], object],
                 keep_reading: Callable[[], bool] = lambda: True):
        self.fresh = fresh
        self.keep_reading = keep_reading
        self.unrolls_left = unrolls_left
        self.prepare = prepare
        _check_shared_memory(depth * nbytes)
        self.slots = [shared_memory.SharedMemory(create=True, size=nbytes) for _ in range(depth)]
        self.idle: list[int] = list(range(depth))  # slots no worker has been asked to fill
        self.filled_by: dict[int, int] = {}  # slot -> worker, for slots asked for and not released
        self.slot_of: dict[ShardEntry, int] = {}  # a handed-out batch's first id -> its slot
        self.procs: list[subprocess.Popen] = []
        for i in range(workers):
            # Unbuffered: the receiver waits on the pipes with select, which sees no data held in a buffer.
            proc = subprocess.Popen([sys.executable, "-m", "impala_league.distributed.learner.ingest_workers"], cwd=REPO,
                                    bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_worker_signals)
            send(proc.stdin, {**settings, "consumer": worker_consumer(consumer, i), "sweep": i == 0,
                              "slots": [shm.name for shm in self.slots]})
            self.procs.append(proc)
        self.selector = selectors.DefaultSelector()
        for i, proc in enumerate(self.procs):
            self.selector.register(proc.stdout, selectors.EVENT_READ, i)
        self.ended = False
        self._ask()

    def _ask(self) -> None:
        """Ask the least busy workers to fill the idle slots, while the slots asked for hold fewer
        unrolls than the run may still take (as the ingest thread reads, `Ingest.next_batch`)."""
        while self.idle and len(self.filled_by) * self.fresh < self.unrolls_left():
            slot = self.idle.pop()
            busy = [sum(w == i for w in self.filled_by.values()) for i in range(len(self.procs))]
            worker = busy.index(min(busy))
            self.filled_by[slot] = worker
            self._send(worker, {"slot": slot})

    def _send(self, worker: int, message: dict) -> None:
        try:
            send(self.procs[worker].stdin, message)
        except (OSError, ValueError):
            pass  # the worker is gone: `get` reports it

    def get(self) -> tuple[list[ShardEntry], list[dict], object] | None:
        """The next batch a worker filled (ids, headers, `prepare`d arrays), waiting for it; None once
        the run has no more to read, or once `keep_reading()` turns false.

        Raises:
          redis.ConnectionError: a worker lost Redis (as the learner's own commands would raise it).
          IngestWorkerError: a worker failed otherwise, or died."""
        while not self.ended and self.keep_reading():
            for key, _ in self.selector.select(timeout=0.05):
                i, proc = key.data, self.procs[key.data]
                message = receive(proc.stdout)
                if message is None:
                    raise IngestWorkerError(f"learner ingest worker {i} {_exit(proc)}")
                if "error" in message:
                    error = redis.ConnectionError if message.get("redis") else IngestWorkerError
                    raise error(f"learner ingest worker {i} failed: {message['error']}")
                if message.get("end"):  # an exploiter's run is over
                    self.ended = True
                    return None
                return self._batch(message)
            self._ask()  # slots held back by run.total_agent_steps
        return None

    def _batch(self, message: dict) -> tuple[list[ShardEntry], list[dict], object]:
        slot, (start, length) = message["slot"], message["meta"]
        buf = self.slots[slot].buf
        meta = msgpack.unpackb(buf[start:start + length], raw=False)
        arrays = {name: np.ndarray(shape, np.dtype(dtype), buf, offset) for name, dtype, shape, offset in meta["arrays"]}
        ids = [ShardEntry(shard, entry_id) for shard, entry_id in meta["ids"]]
        self.slot_of[ids[0]] = slot
        return ids, meta["headers"], self.prepare(arrays)

    def release(self, ids: list[ShardEntry]) -> None:
        """The update has trained on the batch of these ids: its worker acks it (counting its unrolls as
        trained) and forgets it, and its slot takes the next batch."""
        slot = self.slot_of.pop(ids[0])
        worker = self.filled_by.pop(slot)
        message = {"release": slot}
        if len(self.filled_by) * self.fresh < self.unrolls_left():
            # The same worker fills it again, asked in the same message: one pipe write (and one wake-up
            # of the worker) a batch instead of two. Each worker keeps its share of the slots.
            self.filled_by[slot] = worker
            message["slot"] = slot
        else:
            self.idle.append(slot)
        self._send(worker, message)
        self._ask()  # slots held back by run.total_agent_steps, if the run now has room for them

    def close(self) -> None:
        """Stop the workers (their held batches stay pending for the next learner) and free the slots."""
        self.selector.close()
        for proc in self.procs:
            try:
                proc.stdin.close()  # the worker sends the acks it was asked for, and exits
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for shm in self.slots:
            try:
                shm.close()
            except BufferError:
                pass  # a batch's tensors still map it; the memory goes with them
            shm.unlink()


def _check_shared_memory(nbytes: int, where: str = "/dev/shm") -> None:
    """Raise IngestWorkerError if `where` (Linux's shared memory) has less than `nbytes` free: a slot
    written past it would kill its worker with SIGBUS."""
    try:
        stat = os.statvfs(where)
    except OSError:
        return  # no /dev/shm to look at (not Linux)
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise IngestWorkerError(
            f"learner.ingest_workers: the batch slots need up to {nbytes / 2**20:.1f} MB of shared memory, and {where} "
            f"has {free / 2**20:.1f} MB free: lower learner.prefetch_batches (or learner.batch_size), or give the "
            "machine more (a container: docker run --shm-size=1g)")


def _worker_signals() -> None:
    """preexec_fn of a worker: SIGINT and SIGTERM ignored from the start (a terminal's Ctrl-C reaches the
    learner's whole process group; the learner stops its workers by closing their stdin), and SIGKILL
    when the learner dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def _exit(proc: subprocess.Popen) -> str:
    try:
        code = proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"


def worker_settings(*, redis_url: str, namespace: str, env: str, env_kwargs: dict, env_seats: list | None,
                    unroll_length: int, core_size: int, shards: int, shard_urls: list[str], block_ms: int, retry_s: float,
                    unrolls_per_entry: int, fresh: int, done_key: str | None) -> dict:
    """What a worker reads with, as the first message sends it (done_key: the key whose existence ends
    an exploiter's reads; None for the main agent)."""
    return dict(redis_url=redis_url, namespace=namespace, env=env, env_kwargs=env_kwargs, env_seats=env_seats,
                unroll_length=unroll_length, core_size=core_size, shards=shards, shard_urls=shard_urls, block_ms=block_ms,
                retry_s=retry_s, unrolls_per_entry=unrolls_per_entry, fresh=fresh, done_key=done_key)


class _SlotWriter:
    """Places a batch's arrays one after the other in a slot's memory."""

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.offset = 0
        self.placed: list[list] = []

    def __call__(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        start = self.place(dtype.itemsize * math.prod(shape))  # (np.prod costs microseconds a call)
        self.placed.append([name, dtype.str, list(shape), start])
        return np.ndarray(shape, dtype, self.buf, start)

    def place(self, nbytes: int) -> int:
        """The offset of the next `nbytes`, aligned. Raises ValueError past the slot's end."""
        start = -(-self.offset // ALIGN) * ALIGN
        if start + nbytes > len(self.buf):
            raise ValueError(f"a batch of {start + nbytes} bytes does not fit its slot of {len(self.buf)}")
        self.offset = start + nbytes
        return start


def _attach(name: str) -> shared_memory.SharedMemory:
    """The learner's slot `name`. The learner owns it: this process's resource tracker must not unlink
    it when the worker exits (Python < 3.13 registers every attached segment)."""
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (the documented work-around)
    return shm


_reply_lock = threading.Lock()  # a worker's two threads both answer the learner


def reply(out: BinaryIO, message: dict) -> None:
    with _reply_lock:
        send(out, message)


def _worker() -> None:
    """A worker's life: fill the slots it is asked to fill until its stdin closes."""
    out = os.fdopen(os.dup(1), "wb")  # the protocol's own descriptor; stray prints go to stderr
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    inp = sys.stdin.buffer
    settings = receive(inp)
    if settings is None:
        return
    try:
        _serve(settings, inp, out)
    except Exception as e:  # reported to the learner, which stops with it
        _failed(out, e)
        raise SystemExit(1) from None


def _failed(out: BinaryIO, error: Exception) -> None:
    """Tell the learner why this worker ends (and whether it lost Redis)."""
    log.exception("learner ingest worker failed")
    try:
        reply(out, {"error": f"{type(error).__name__}: {error}", "redis": isinstance(error, (redis.RedisError, RedisUnavailable))})
    except OSError:
        pass  # the learner is gone or stopping


def _serve(settings: dict, inp: BinaryIO, out: BinaryIO) -> None:
    spec = UnrollSpec(env_spec(settings["env"], settings["env_kwargs"], settings["env_seats"]),
                      settings["unroll_length"], settings["core_size"])
    block_ms = settings["block_ms"]
    client = connect(settings["redis_url"], block_ms=block_ms, retry_s=settings["retry_s"])
    trajectories = ShardedTrajectories(client, settings["redis_url"], settings["namespace"], settings["shards"],
                                       settings["shard_urls"], block_ms)
    fresh, capacity = settings["fresh"], slot_capacity(settings["fresh"])
    reader = _reader(settings, trajectories, spec, capacity)
    done_key = settings["done_key"]
    slots = [_attach(name) for name in settings["slots"]]
    messages: queue.Queue = queue.Queue()
    stopping = threading.Event()

    ids_in: dict[int, tuple[list, list[int]]] = {}  # slot -> its batch's ids and unrolls per entry, until released

    def listen() -> None:
        """Requests to the main thread; releases acked here at once, while the main thread reads on
        (as the learner's update thread acks beside its ingest thread)."""
        try:
            while (message := receive(inp)) is not None:
                if "release" in message:
                    ids, counts = ids_in.pop(message["release"])
                    trajectories.ack(ids, counts)
                    reader.release(ids)
                if "slot" in message:
                    messages.put(message)
        except Exception as e:  # the main thread may be in a read: report and end the process here
            _failed(out, e)
            os._exit(1)
        stopping.set()
        messages.put(None)

    listener = threading.Thread(target=listen, name="stdin", daemon=True)
    listener.start()
    threading.Thread(target=reader.keep_alive, args=(stopping,), name="keep-alive", daemon=True).start()
    held: list[tuple] = []  # (id, header, payload) read beyond a slot's capacity: first in the next batch
    while (message := messages.get()) is not None:
        slot = message["slot"]
        have = sum(header["unrolls"] for _, header, _ in held)
        if have < fresh:
            got = reader.read(fresh - have, lambda: not stopping.is_set(),
                              lambda: done_key is not None and bool(client.exists(done_key)))
            if got is None:
                if not stopping.is_set():
                    reply(out, {"end": True})
                break
            held += zip(*got)
        batch, held = _fit(held, capacity)
        ids_in[slot] = ([entry_id for entry_id, _, _ in batch], [header["unrolls"] for _, header, _ in batch])
        reply(out, {"slot": slot, "meta": _write_batch(slots[slot].buf, batch)})
    listener.join()  # the acks of the batches the learner releases before it closes our stdin


def _reader(settings: dict, trajectories: ShardedTrajectories, spec: UnrollSpec, capacity: int) -> BatchReader:
    """The worker's reads of `trajectories`, decoded with `spec`; an entry of more unrolls than a slot's
    `capacity` is rejected with the malformed ones."""

    def decode(datas: list[bytes]) -> list:
        return [DecodeError(f"the entry holds {got[0]['unrolls']} unrolls, more than a learner's batch slot takes "
                            f"({capacity}): actor.send_batch must divide the fresh unrolls of each batch")
                if not isinstance(got, DecodeError) and got[0]["unrolls"] > capacity else got
                for got in decode_unrolls(datas, spec)]

    return BatchReader(trajectories, settings["consumer"], decode, lambda header: header["unrolls"],
                       settings["unrolls_per_entry"], settings["block_ms"], sweep=settings["sweep"])


def _write_batch(buf: memoryview, batch: list[tuple]) -> list[int]:
    """Stack the payloads of `batch` ((id, header, payload) entries) into slot buffer `buf`, then its
    description (ids, where each array lies, the learner's header fields), msgpack-packed after them.
    Returns [start, length] of the description in `buf`. It goes in the slot, not the reply: a pipe
    holds 64 KiB, and a reply the learner has not read yet must not stop this worker from reading on."""
    writer = _SlotWriter(buf)
    stack_entries([payload for _, _, payload in batch], writer)
    meta = msgpack.packb({"ids": [[entry_id.shard, entry_id.id] for entry_id, _, _ in batch], "arrays": writer.placed,
                          "headers": [{k: header[k] for k in LEARNER_HEADER} for _, header, _ in batch]})
    start = writer.place(len(meta))
    buf[start:start + len(meta)] = meta
    return [start, len(meta)]


def _fit(entries: list[tuple], capacity: int) -> tuple[list[tuple], list[tuple]]:
    """The first entries that fit a slot of `capacity` unrolls, and those left for the next batch (no
    entry holds more than a slot: the decoder rejects it)."""
    have = 0
    for k, (_, header, _) in enumerate(entries):
        have += header["unrolls"]
        if have > capacity:
            return entries[:k], entries[k:]
    return entries, []


if __name__ == "__main__":
    _worker()
