"""How much memory this process can still allocate.

Readers refuse a matrix that cannot fit before loading it (:func:`locusformer.io.expression.
check_memory`), and training decides from it whether the matrix stays on disk.
"""

from __future__ import annotations

from pathlib import Path


def available_memory() -> int | None:
    """Bytes this process can still allocate, or None where that cannot be told.

    ``MemAvailable`` of ``/proc/meminfo``, capped by the room left under the memory limit
    of the process's cgroup (what a cluster scheduler enforces); page cache counts as free.
    """
    rooms = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    rooms.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    rooms += _cgroup_rooms()
    return min(rooms) if rooms else None


def _cgroup_rooms() -> list[int]:
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        _, controllers, group = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":  # cgroup v2
            root = Path("/sys/fs/cgroup")
            names = ("memory.max", "memory.current", "memory.stat", "file")
        elif "memory" in controllers.split(","):  # cgroup v1
            root = Path("/sys/fs/cgroup/memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "cache")
        else:
            continue
        here = root / group.lstrip("/")
        while True:
            try:
                limit = (here / names[0]).read_text(encoding="ascii").strip()
                if limit != "max":
                    used = int((here / names[1]).read_text(encoding="ascii"))
                    stat = (here / names[2]).read_text(encoding="ascii").split()
                    cache = dict(zip(stat[::2], stat[1::2], strict=False)).get(names[3], "0")
                    rooms.append(max(0, int(limit) - used + int(cache)))
            except (OSError, ValueError):
                pass
            if here == root or root not in here.parents:
                break
            here = here.parent
    return rooms
