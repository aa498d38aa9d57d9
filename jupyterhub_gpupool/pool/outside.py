"""GPUs held outside the pool, and the device a server really got (pure rules).

On Kubernetes the pool shares nodes with pods it did not place (a training Job, an inference
Deployment) and, with the device plugin, the plugin, not the pool, picks the device a pod gets.
Two rules follow, both values in, values out:

* :func:`place_outside`: a node's pods the pool did not place hold ``counts`` devices (whole
  GPUs, MIG instances per profile); that many devices the pool does not hold are marked held
  outside, so nothing is granted on them. The marks stay where they were while they still fit
  (a grant never moves under a running outside pod in the pool's books), and when no free
  device is left to mark (the pool granted it first) the shortfall is returned, not hidden.
* :func:`mark_exact`: with Dynamic Resource Allocation the cluster names the very devices
  (claims' allocations, devices no ResourceSlice publishes); exactly those are marked, each
  with its holder, and one a pool lease holds in the pool's books is a conflict, said, never
  hidden (nothing moves: the lease keeps it until its own claim says otherwise).
* :func:`rebind`: the node says a lease's server runs on other devices than the pool chose;
  the lease moves there, and what held the devices it moves to in the pool's books (another
  lease whose pod, by the same token, runs elsewhere, or an outside mark) takes the devices it
  leaves. Idle judgement, the panel and chargeback then follow the real device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import Refusal
from .model import RETIRING, Gpu, MigInstance, Node
from .placement import Slot

#: Holder of a MIG instance a pod the pool did not place holds (like ``RETIRING``, not a lease).
OUTSIDE = "~outside"
#: The ``counts`` key of whole GPUs (MIG instances are counted by profile name).
WHOLE = "gpu"
#: The device plugin's id of a time-slicing replica is ``<gpu uuid>::<n>``.
REPLICA_SEP = "::"


@dataclass(frozen=True)
class OutsideHolds:
    """What pods the pool did not place hold on one node, as marks on its devices.

    ``counts``: what the cluster says they hold (``gpu`` → whole GPUs, profile → MIG
    instances); ``gpus`` and ``instances`` (GPU uuid, start): the devices marked; ``short``:
    held outside but with no free device left to mark; ``pods``: who holds them (shown).
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    instances: tuple[tuple[str, int], ...] = ()
    short: Mapping[str, int] = field(default_factory=dict)
    pods: tuple[str, ...] = ()
    #: exact marks only (:func:`mark_exact`): who holds each device (:func:`device_key`), and
    #: the devices held outside that a pool lease holds in the pool's books
    by: Mapping[str, str] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The row's JSON (``nodes.outside``)."""
        out: dict[str, object] = {
            "counts": dict(self.counts),
            "gpus": list(self.gpus),
            "instances": [list(i) for i in self.instances],
            "short": dict(self.short),
            "pods": list(self.pods),
        }
        if self.by or self.conflicts:
            out["by"] = dict(self.by)
            out["conflicts"] = list(self.conflicts)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object] | None) -> OutsideHolds:
        """Back from ``to_json`` (None or empty: nothing held outside)."""
        if not data:
            return cls()
        raw: Mapping[str, Any] = data  # JSON we wrote (to_json): its shapes are known
        return cls(
            counts={str(k): int(v) for k, v in (raw.get("counts") or {}).items()},
            gpus=tuple(str(g) for g in raw.get("gpus") or ()),
            instances=tuple((str(g), int(s)) for g, s in raw.get("instances") or ()),
            short={str(k): int(v) for k, v in (raw.get("short") or {}).items()},
            pods=tuple(str(p) for p in raw.get("pods") or ()),
            by={str(k): str(v) for k, v in (raw.get("by") or {}).items()},
            conflicts=tuple(str(c) for c in raw.get("conflicts") or ()),
        )

    @property
    def empty(self) -> bool:
        """Nothing held outside (and nothing said to be)."""
        return not (self.gpus or self.instances or any(self.counts.values()) or self.conflicts)

    def holders_of(self, gpu: str) -> tuple[str, ...]:
        """Who holds GPU ``gpu`` or any of its MIG instances (exact marks only)."""
        return tuple(sorted({h for k, h in self.by.items() if k == gpu or k.startswith(gpu + "@")}))


def _free_whole(gpu: Gpu) -> bool:
    """A whole GPU the pool holds no part of (an outside mark does not count as held)."""
    return not gpu.mig_enabled and gpu.whole_lease is None and not gpu.shares


def _free_instance(gpu: Gpu, inst: MigInstance) -> bool:
    """An instance that exists (not one planned on a dynamic-MIG GPU) and no lease holds
    (``OUTSIDE`` marks may move)."""
    made = inst.uuid is not None or not gpu.dynamic_mig
    return made and inst.lease in (None, OUTSIDE)


def place_outside(
    node: Node,
    counts: Mapping[str, int],
    previous: OutsideHolds | None = None,
    pods: Sequence[str] = (),
) -> OutsideHolds:
    """Mark ``counts`` devices of ``node`` as held outside: the ``previous`` marks first while
    they are still free of pool leases, then the highest-indexed free ones (the pool's grants
    fill from the lowest). What cannot be marked is ``short``."""
    previous = previous or OutsideHolds()
    counts = {k: int(v) for k, v in counts.items() if int(v) > 0}
    short: dict[str, int] = {}
    was = set(previous.gpus)
    whole = [g for g in node.gpus if _free_whole(g)]
    whole.sort(key=lambda g: (g.uuid not in was, -g.index))
    want = counts.get(WHOLE, 0)
    gpus = tuple(g.uuid for g in whole[:want])
    if want > len(gpus):
        short[WHOLE] = want - len(gpus)
    had = set(previous.instances)
    instances: list[tuple[str, int]] = []
    for profile, n in sorted(counts.items()):
        if profile == WHOLE:
            continue
        free = [
            (g, i)
            for g in node.gpus
            if g.mig_enabled
            for i in g.instances
            if i.profile == profile and _free_instance(g, i)
        ]
        free.sort(key=lambda gi: ((gi[0].uuid, gi[1].start) not in had, -gi[0].index, -gi[1].start))
        instances += [(g.uuid, i.start) for g, i in free[:n]]
        if n > len(free):
            short[profile] = n - len(free)
    return OutsideHolds(counts, gpus, tuple(sorted(instances)), short, tuple(sorted(pods)))


# --- exact marks (Dynamic Resource Allocation) --------------------------------------------------

#: One device the cluster says is held outside the pool: (GPU uuid, the MIG instance's placement
#: start or None for the whole GPU, who holds it).
Held = tuple[str, int | None, str]


def device_key(gpu: str, start: int | None = None) -> str:
    """The name of a device in :attr:`OutsideHolds.by`: the GPU's uuid, ``uuid@start`` for a
    MIG instance."""
    return gpu if start is None else f"{gpu}@{start}"


def mark_exact(node: Node, held: Sequence[Held]) -> OutsideHolds:
    """Mark exactly the devices of ``held`` on ``node``. A whole GPU the pool runs in MIG mode
    takes all its instances; a MIG instance of a GPU the pool holds whole takes the GPU. A device
    a pool lease holds is not marked but named in ``conflicts`` and counted ``short``; a GPU or
    placement the pool does not know on the node is not the pool's to mark (left alone)."""
    gpus = {g.uuid: g for g in node.gpus}
    counts: dict[str, int] = {}
    short: dict[str, int] = {}
    marked_gpus: set[str] = set()
    marked: set[tuple[str, int]] = set()
    by: dict[str, str] = {}
    conflicts: list[str] = []
    holders: set[str] = set()

    def conflict(key: str, what: str, lease: str, holder: str) -> None:
        short[key] = short.get(key, 0) + 1
        conflicts.append(f"{what} is held by {holder} and by lease {lease}")

    for uuid, start, holder in sorted(held, key=lambda h: (h[0], h[1] is not None, h[1] or 0)):
        gpu = gpus.get(uuid)
        if gpu is None:
            continue
        inst = None
        if start is not None and gpu.mig_enabled:
            inst = next((i for i in gpu.instances if i.start == start), None)
            if inst is None:
                continue
        key = inst.profile if inst is not None else WHOLE
        counts[key] = counts.get(key, 0) + 1
        holders.add(holder)
        if inst is not None:
            if inst.lease == RETIRING:
                continue
            if inst.lease not in (None, OUTSIDE):
                conflict(key, f"MIG device {device_key(uuid, start)}", inst.lease, holder)
                continue
            marked.add((uuid, inst.start))
            by.setdefault(device_key(uuid, start), holder)
        elif gpu.mig_enabled:  # the whole GPU (in whatever mode the node has it) is taken
            for i in gpu.instances:
                if i.lease in (None, OUTSIDE):
                    marked.add((uuid, i.start))
                elif i.lease != RETIRING:
                    conflict(i.profile, f"MIG device {device_key(uuid, i.start)}", i.lease, holder)
            by.setdefault(uuid, holder)
        elif gpu.whole_lease is not None or gpu.shares:
            lease = gpu.whole_lease or ", ".join(sorted(gpu.shares))
            conflict(WHOLE, f"GPU {uuid}", lease, holder)
        else:
            marked_gpus.add(uuid)
            by.setdefault(uuid, holder)
    return OutsideHolds(
        counts,
        tuple(sorted(marked_gpus)),
        tuple(sorted(marked)),
        short,
        tuple(sorted(holders)),
        by,
        tuple(conflicts),
    )


# --- the device a pod really got --------------------------------------------------------------


@dataclass(frozen=True)
class Rebinding:
    """The outcome of :func:`rebind`: the lease's new slots; other leases' new slots (those that
    held the devices it moves to take the ones it leaves); the node's outside marks after it."""

    slots: tuple[Slot, ...]
    others: Mapping[str, tuple[Slot, ...]]
    outside: OutsideHolds
    moved: tuple[tuple[str, str], ...]  # (slot key before, slot key after)

    @property
    def changed(self) -> bool:
        """Whether anything moves at all (the node said what the pool already had)."""
        return bool(self.moved)


def _device_slot(node: Node, device: str, like: Slot) -> tuple[Slot, Gpu, MigInstance | None]:
    """The slot of ``node`` that ``device`` (a GPU uuid, a MIG device uuid, a replica id) is,
    shaped like ``like`` (kind, share); refusals name the device."""
    uuid = device.split(REPLICA_SEP, 1)[0]
    for gpu in node.gpus:
        if like.kind == "mig":
            for inst in gpu.instances:
                if inst.uuid == uuid:
                    if inst.profile != like.profile:
                        raise Refusal(
                            "device_mismatch",
                            f"device {device} is a {inst.profile} MIG instance; the lease holds "
                            f"a {like.profile}",
                            field="device",
                        )
                    return replace(like, gpu=gpu.uuid, start=inst.start, create=False), gpu, inst
        elif gpu.uuid == uuid:
            if gpu.mig_enabled:
                raise Refusal(
                    "device_mismatch",
                    f"device {device} is a MIG-enabled GPU; the lease holds a {like.kind} slot",
                    field="device",
                )
            return replace(like, gpu=gpu.uuid), gpu, None
    raise Refusal(
        "unknown_device",
        f"device {device} is not a {'MIG instance' if like.kind == 'mig' else 'GPU'} the pool "
        f"knows on node {node.name}",
        field="device",
    )


def rebind(
    lease_id: str,
    slots: Sequence[Slot],
    devices: Sequence[str],
    node: Node,
    held: Mapping[str, Sequence[Slot]],
    outside: OutsideHolds | None = None,
    exclusive: bool = False,
) -> Rebinding:
    """Move lease ``lease_id``'s ``slots`` onto ``devices`` of ``node`` (one device per slot,
    in any order). ``held``: the other live leases' slots on the node, by lease id. A device it
    moves to that another lease holds gives that lease the device this one leaves (the plugin
    put each where the other was); an outside mark moves the same way. A retiring instance, or a
    GPU without room for a moved share, refuses; so does, when ``exclusive`` (DRA: a device
    is allocated to one claim, so the other lease's server cannot be on the one this leaves),
    a device another lease holds."""
    outside = outside or OutsideHolds()
    devices = list(dict.fromkeys(devices))
    if len(devices) != len(slots):
        raise Refusal(
            "device_mismatch",
            f"lease {lease_id} holds {len(slots)} device(s); {len(devices)} given",
            field="device",
        )
    targets = [_device_slot(node, d, slots[0]) for d in devices]
    if any(s.kind != slots[0].kind for s in slots):
        raise Refusal("device_mismatch", "a lease of mixed slots is not rebound", field="device")
    keys = {s.key for s in slots}
    staying = [s for s in slots if any(t.key == s.key for t, _, _ in targets)]
    leaving = [s for s in slots if s not in staying]
    arriving = [t for t in targets if t[0].key not in keys]
    new_slots = [*staying]
    others: dict[str, list[Slot]] = {}
    moved: list[tuple[str, str]] = []
    marks_gpu = list(outside.gpus)
    marks_inst = list(outside.instances)
    owner = {s.key: lid for lid, ss in held.items() for s in ss}
    for old, (new, gpu, inst) in zip(leaving, arriving, strict=True):
        new_slots.append(new)
        moved.append((old.key, new.key))
        if new.kind == "shared":
            room = 1000 - gpu.used_milli if not gpu.whole_lease else 0
            if gpu.mig_enabled or room < new.milli:
                raise Refusal(
                    "device_held",
                    f"device {gpu.uuid} has no room for a share of {new.milli / 1000:g}",
                    field="device",
                )
            continue
        if new.kind == "gpu" and gpu.shares:
            raise Refusal(
                "device_held", f"GPU {gpu.uuid} is shared by other leases", field="device"
            )
        if inst is not None and inst.lease == RETIRING:
            raise Refusal(
                "device_held", f"MIG device {inst.uuid} is being destroyed", field="device"
            )
        other = owner.get(new.key)
        if other is not None and exclusive:
            raise Refusal(
                "device_held",
                f"device {new.gpu if new.kind == 'gpu' else new.key} is granted to lease {other}",
                field="device",
            )
        if other is not None:  # the other lease's pod got the device this one leaves
            mine = others.setdefault(other, list(held[other]))
            at = next(k for k, s in enumerate(mine) if s.key == new.key)
            mine[at] = replace(old, milli=mine[at].milli, create=False)
        elif new.kind == "gpu" and new.gpu in marks_gpu:
            marks_gpu[marks_gpu.index(new.gpu)] = old.gpu
        elif new.kind == "mig" and (new.gpu, new.start or 0) in marks_inst:
            marks_inst[marks_inst.index((new.gpu, new.start or 0))] = (old.gpu, old.start or 0)
    after = replace(outside, gpus=tuple(marks_gpu), instances=tuple(sorted(marks_inst)))
    return Rebinding(
        tuple(new_slots), {k: tuple(v) for k, v in others.items()}, after, tuple(moved)
    )
