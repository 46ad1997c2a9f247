"""Which of the host's GPUs the job used: their NVML figures are the run's, no other GPU's.

In order of certainty (docs/gpus.md):
1. NVML's process list: a process of the command's tree holds memory on the GPU
   (``nvmlDeviceGetComputeRunningProcesses``; empty inside many containers, whose pids NVML does not
   know, and under MIG, where it reports no memory).
2. The device torch uses in the training process (the probe's ``cuda_device`` event), by UUID.
3. ``CUDA_VISIBLE_DEVICES`` (the training process's, else gpufeed's own): UUIDs (``GPU-...``, MIG
   instances ``MIG-...``, unique prefixes accepted like CUDA does) or indices, with torch's device
   index inside that list. Indices count CUDA's order, fastest first unless
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML counts by PCI bus, so an index is trusted only when the
   orders agree (PCI_BUS_ID, or GPUs all of one model).
4. The host's only GPU.
Otherwise none: several GPUs, none known to be the job's, are never averaged.
"""
from __future__ import annotations

from typing import Any

from gpufeed.record.reader import RunRecord

NVML_PROCESS, TORCH_DEVICE, VISIBLE_DEVICES, ONLY_GPU = (
    "NVML process list", "the device torch used", "CUDA_VISIBLE_DEVICES", "the host's only GPU")


def gpus_used(record: RunRecord) -> tuple[list[int], str | None]:
    """NVML indices of the job's GPUs, and how they were found; ([], why not) when none is known."""
    gpus = record.samples.gpus
    if not gpus:
        return [], None
    tree = {int(row.pid) for procs in record.samples.procs for row in procs}
    by_process = sorted({idx for per_gpu in record.samples.gpu_procs for idx, pids in per_gpu.items()
                         if tree & set(pids)})
    if by_process:
        return by_process, NVML_PROCESS
    devices = record.meta.sampler.get("gpus") or []
    by_uuid = sorted({i for ev in record.cuda_devices for i in _by_uuid(devices, ev.get("uuid"))})
    if by_uuid:
        return by_uuid, TORCH_DEVICE
    sampler = record.meta.sampler
    seen = record.cuda_devices or [{"visible": sampler.get("cuda_visible_devices"), "index": None,
                                    "order": sampler.get("cuda_device_order")}]
    by_visible = sorted({i for ev in seen for i in visible_gpus(devices, ev.get("visible"), ev.get("index"),
                                                              ev.get("order"))})
    if by_visible:
        return by_visible, VISIBLE_DEVICES if any(ev.get("visible") for ev in seen) else TORCH_DEVICE
    if len(gpus) == 1:
        return list(gpus), ONLY_GPU
    return [], (f"none of the host's {len(gpus)} GPUs could be matched to the job (no process of it in NVML's "
                "list, no CUDA device seen by the probe), and unrelated GPUs are not averaged")


OWN_NVML_PROCESS, OWN_TORCH_DEVICE = NVML_PROCESS, TORCH_DEVICE  # said the same way as the job's


def own_gpus(record: RunRecord, pid: int) -> tuple[list[int], str | None]:
    """NVML indices of the GPUs one process (a DDP rank) used, and how they were found: NVML's process
    list naming that pid, else its torch's device (``process_gpus``); ([], None) where neither says.
    A rank's figures come from its own GPU, never pooled over the job's: GPUs whose ranks wait in NCCL
    for a straggler read busy."""
    listed = sorted({idx for per_gpu in record.samples.gpu_procs for idx, pids in per_gpu.items() if pid in pids})
    if listed:
        return listed, OWN_NVML_PROCESS
    by_torch = process_gpus(record, pid)
    return (by_torch, OWN_TORCH_DEVICE) if by_torch else ([], None)


def process_gpus(record: RunRecord, pid: int) -> list[int]:
    """NVML indices of the GPU one process's torch used (its ``cuda_device`` event): by UUID, else by
    its CUDA_VISIBLE_DEVICES and device number."""
    devices = record.meta.sampler.get("gpus") or []
    found: set[int] = set()
    for ev in (e for e in record.cuda_devices if e.get("pid") == pid):
        found.update(_by_uuid(devices, ev.get("uuid"))
                     or visible_gpus(devices, ev.get("visible"), ev.get("index"), ev.get("order")))
    return sorted(found)


def _norm(uuid: Any) -> str:
    text = str(uuid or "").strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _by_uuid(devices: list[dict[str, Any]], uuid: Any) -> list[int]:
    """NVML indices whose UUID (or a MIG instance's on it) starts with ``uuid``."""
    want = _norm(uuid)
    if not want:
        return []
    return [d["index"] for d in devices
            if any(_norm(u).startswith(want) for u in [d.get("uuid")] + list(d.get("mig_uuids") or []) if u)]


def visible_gpus(devices: list[dict[str, Any]], visible: str | None, torch_index: int | None,
                 order: str | None) -> list[int]:
    """NVML indices named by ``CUDA_VISIBLE_DEVICES`` (all of them, or the ``torch_index``-th)."""
    same_order = order == "PCI_BUS_ID" or len({d.get("name") for d in devices}) == 1
    if visible is None and torch_index is None:
        return []  # nothing says which GPUs the job had
    if visible is None:
        entries = [str(d["index"]) for d in devices]
    else:
        entries = []
        for entry in (e.strip() for e in visible.split(",")):
            if not entry or entry.startswith("-"):
                break  # CUDA stops at the first invalid entry ("-1" hides every GPU)
            entries.append(entry)
    if torch_index is not None:
        entries = entries[torch_index:torch_index + 1]
    found: list[int] = []
    for entry in entries:
        if entry.isdigit():
            if same_order and int(entry) < len(devices):
                found.append(int(entry))
        else:
            found += _by_uuid(devices, entry)
    return found
