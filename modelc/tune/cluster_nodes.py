"""Finding the nodes of a Ray cluster that may measure for a target, and saying why the others may not.

A record's target is the CPU that measured it, so a node measures only if what it would write into a
record (CPU model, ISA features, threads per measurement) is the target, and it runs the same modelc
and numba as the driver (another version compiles other kernels). Each node says so itself: the
actor started on it reports its own `current_target()`. A node labelled `modelc-cpu=<cpu_label(...)>`
(`ray start ... --labels modelc-cpu=...`) with another CPU is left out before any actor starts.
"""
from __future__ import annotations

import collections
import os
import re
import socket
from dataclasses import dataclass, field

from ..errors import ModelcError
from ..target import Target
from ..version import VERSION
from .cluster_node import PROTOCOL, numba_version

LABEL = "modelc-cpu"


def cpu_label(cpu: str) -> str:
    """A CPU model as a Ray label value (Kubernetes syntax: 63 characters of [a-z0-9-_.])."""
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-")[:63].strip("-") or "unknown"


@dataclass
class Node:
    """A Ray node as the driver sees it, and what it did in this run."""
    id: str
    address: str
    cpus: int
    labels: dict = field(default_factory=dict)
    actor: object = None
    info: dict | None = None          # the actor's describe()
    trials: int = 0
    busy_s: float = 0.0               # time its actor spent measuring (its own clock)
    calls: int = 0
    lost: str = ""

    @property
    def name(self) -> str:
        return f"{self.address} (node {self.id[:8]})"

    @property
    def builders(self) -> int:
        return int((self.info or {}).get("builders", 1))


def alive_nodes(ray) -> list:
    out = []
    for n in ray.nodes():
        if n.get("Alive"):
            out.append(Node(n["NodeID"], n.get("NodeManagerAddress", "?"), int(n.get("Resources", {}).get("CPU", 0)),
                            dict(n.get("Labels") or {})))
    return out


def pre_exclusion(node: Node, target_cpu: str) -> str:
    """Why a node is left out before an actor starts on it ("" if it is not)."""
    if node.cpus < 1:
        return "offers no CPU to Ray (started with --num-cpus 0)"
    label = node.labels.get(LABEL)
    if label is not None and label != cpu_label(target_cpu):
        return f"labelled {LABEL}={label}: another CPU than the target ({cpu_label(target_cpu)})"
    return ""


def exclusion(info: dict, target: dict) -> str:
    """Why a node whose actor described itself is left out ("" if it measures for `target`)."""
    if info.get("protocol") != PROTOCOL:
        return f"its modelc speaks cluster protocol {info.get('protocol')!r}, the driver's {PROTOCOL}"
    if info.get("modelc") != VERSION:
        return f"modelc {info.get('modelc')!r}, the driver's is {VERSION!r}"
    if info.get("numba") != numba_version():
        return f"numba {info.get('numba')!r}, the driver's is {numba_version()!r}"
    t = info.get("target") or {}
    if cpu_label(str(t.get("cpu", ""))) != cpu_label(target["cpu"]):
        return f"another CPU model: {t.get('cpu')!r}, the target is {target['cpu']!r}"
    if list(t.get("isa", [])) != list(target["isa"]):
        have, want = set(t.get("isa", [])), set(target["isa"])
        diff = [f"-{f}" for f in sorted(want - have)] + [f"+{f}" for f in sorted(have - want)]
        return f"another ISA than the target's ({' '.join(diff) or t.get('llvm_cpu')})"
    if t.get("threads") != target["threads"]:
        return f"measures with {t.get('threads')} threads, the target with {target['threads']}"
    return ""


def choose_target(infos: list, own: dict, target_cpu: str | None) -> dict:
    """The target records are written for: the driver's own (CPU, ISA, threads) by default; for
    another CPU, the ISA and thread count most of that CPU's nodes measure with."""
    if target_cpu is None:
        return own
    same = [i["target"] for i in infos
            if cpu_label(str((i.get("target") or {}).get("cpu", ""))) == cpu_label(target_cpu)]
    if not same:
        return {"cpu": target_cpu, "llvm_cpu": "", "isa": [], "threads": 0}
    counts = collections.Counter((tuple(t.get("isa", [])), t.get("threads")) for t in same)
    (isa, threads), _ = counts.most_common(1)[0]
    return next(t for t in same if (tuple(t.get("isa", [])), t.get("threads")) == (isa, threads))


def host_target(d, record: dict) -> Target:
    """The full description of a node's CPU (vectors, registers, caches) as its actor sent it."""
    fields, text = Target.__dataclass_fields__, ("cpu", "llvm_cpu", "isa")
    try:
        if set(d) != set(fields) or not all(isinstance(d[f], int) for f in fields if f not in text):
            raise ValueError
        t = Target(**{**d, "isa": tuple(str(x) for x in d["isa"]), "cpu": str(d["cpu"]),
                      "llvm_cpu": str(d["llvm_cpu"])})
    except (TypeError, ValueError):
        raise ModelcError(f"a node of {record['cpu']} described its CPU as {str(d)[:200]!r}") from None
    if t.record() != record:
        raise ModelcError(f"a node of {record['cpu']} described a CPU other than its records' target")
    return t


# ---- connecting ------------------------------------------------------------------------------------

def resolve(address: str) -> str:
    """HOST:PORT of the cluster: as given, or for "auto" as `ray start` left it (RAY_ADDRESS, then
    the address file in Ray's temp folder)."""
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env
    path = os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp", "ray", "ray_current_cluster")
    try:
        with open(path, encoding="utf-8") as f:
            found = f.read().strip()
    except OSError:
        found = ""
    if not found:
        raise ModelcError(f"--cluster auto found no Ray cluster: RAY_ADDRESS is not set and {path} names none; "
                          "start one with `ray start --head`, or pass --cluster HOST:PORT")
    return found


def probe(address: str, timeout: float):
    """A TCP connection to the cluster's GCS, so that an unreachable address is an error at once
    (Ray's own client retries for a minute, and may then abort the process)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ModelcError(f"cluster address {address!r} is not HOST:PORT (or 'auto')")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ModelcError(f"cannot reach the Ray cluster at {address}: {e.strerror or e} "
                          f"(waited {timeout:g} s for a TCP connection to its GCS port; is `ray start --head` "
                          "running there?)") from None
