"""Is the machine free enough to time on: the timing run's threads beside the cores other processes keep busy (torch-free)."""

import math
import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (of: user nice system idle iowait irq softirq steal)


def cpu_times(stat: Path = STAT) -> tuple[int, int] | None:
    """(busy, total) CPU jiffies of the whole machine since boot (None where there is no /proc/stat)."""
    try:
        fields = [int(v) for v in stat.read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    return sum(fields[i] for i in BUSY_FIELDS), sum(fields)


def busy_cores(seconds: float = 0.5, cores: int | None = None, read=cpu_times) -> float | None:
    """Cores kept busy by other processes: the machine's busy share of CPU time over ``seconds`` while this process sleeps."""
    cores = cores or os.cpu_count() or 1
    first = read()
    time.sleep(seconds)
    second = read()
    if first is None or second is None or second[1] <= first[1]:
        return None
    return cores * (second[0] - first[0]) / (second[1] - first[1])


def free_cores(cores: int, busy: float) -> int:
    """Cores left to a timing run: a core counts as taken when other processes use more than half of it."""
    return max(0, cores - math.floor(busy + 0.5))


def too_busy(threads: int, cores: int, busy: float | None) -> bool:
    """True when the machine leaves fewer free cores than the timing run's threads (unknown load: not busy)."""
    return busy is not None and free_cores(cores, busy) < threads


def machine_record(threads: int, seconds: float = 0.5) -> dict:
    """{"threads", "cpu_count", "load_average" (1, 5, 15 min), "busy_cores", "free_cores", "busy"} of a timing run now."""
    cores = os.cpu_count() or 1
    busy = busy_cores(seconds, cores)
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {
        "threads": int(threads),
        "cpu_count": cores,
        "load_average": load,
        "busy_cores": None if busy is None else round(busy, 2),
        "free_cores": None if busy is None else free_cores(cores, busy),
        "busy": too_busy(int(threads), cores, busy),
    }


def busy_text(record: dict) -> str:
    """Why a timing run on a busy machine is not a measurement, for errors and notes."""
    return (
        f"the machine leaves {record['free_cores']} free core(s) of {record['cpu_count']} (others keep {record['busy_cores']} busy, "
        f"load {record['load_average']}) for {record['threads']} timing thread(s)"
    )
