"""Two hosts on one machine: network namespaces joined by a veth pair, for the bandwidth benchmark
and the link-cut test. Needs root and iproute2; `namespaces_refused` says why a machine cannot."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from typing import Iterator, NamedTuple


class Link(NamedTuple):
    """Server and actor namespaces, their addresses (10.231.N.1 and .2, which exist only inside those
    namespaces) and their ends of the veth pair."""

    server_ns: str
    actor_ns: str
    server_ip: str
    actor_ip: str
    server_dev: str
    actor_dev: str


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespaces_refused() -> str | None:
    """Why this machine cannot make network namespaces, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    trial = f"impala-trial-{os.getpid()}"
    try:
        ip("netns", "add", trial)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` refused here: {e.stderr.strip()}"
    ip("netns", "del", trial)
    return None


@contextmanager
def linked_namespaces(tag: str, subnet: int) -> Iterator[Link]:
    """Namespaces `impala-srv-<tag>` and `impala-act-<tag>` on 10.231.<subnet>.0/30, each with its
    loopback up; both (and the veth pair with them) are deleted on exit. Raises CalledProcessError
    when `ip` refuses."""
    link = Link(f"impala-srv-{tag}", f"impala-act-{tag}", f"10.231.{subnet}.1", f"10.231.{subnet}.2",
                f"vs{tag}", f"va{tag}")
    made = []
    try:
        for ns in (link.server_ns, link.actor_ns):
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", link.server_dev, "netns", link.server_ns, "type", "veth", "peer", "name", link.actor_dev,
           "netns", link.actor_ns)
        for ns, dev, addr in ((link.server_ns, link.server_dev, link.server_ip),
                              (link.actor_ns, link.actor_dev, link.actor_ip)):
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        yield link
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
