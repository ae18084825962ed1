"""The refusal rule of timing runs: fewer free cores than threads makes a timing inconclusive."""

import pytest

from headprune.engine import machine_load, timing
from headprune.engine.machine_load import busy_cores, cpu_times, free_cores, too_busy


@pytest.mark.parametrize(
    "threads,cores,busy,free,refused",
    [
        (2, 2, 0.03, 2, False),  # an idle 2-core machine, 2 threads
        (2, 2, 1.0, 1, True),  # one core taken by another job
        (1, 2, 1.0, 1, False),
        (2, 2, 0.6, 1, True),  # more than half a core counts as taken
        (2, 2, 0.4, 2, False),
        (1, 2, 6.0, 0, True),  # load 6 on 2 cores
        (8, 16, 5.5, 10, False),
    ],
)
def test_too_busy_compares_free_cores_with_threads(threads, cores, busy, free, refused):
    assert free_cores(cores, busy) == free
    assert too_busy(threads, cores, busy) is refused


def test_an_unknown_load_is_not_busy():
    assert too_busy(1, 2, None) is False


def test_busy_cores_is_the_busy_share_of_cpu_time_between_two_reads(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 2 3 100 5 1 1 0 0 0\ncpu0 5 1 1 50 2 0 0 0 0 0\n")
    assert cpu_times(stat) == (10 + 2 + 3 + 1 + 1 + 0, 10 + 2 + 3 + 100 + 5 + 1 + 1 + 0)
    reads = iter([(100, 1000), (150, 1100)])
    assert busy_cores(0.0, cores=2, read=lambda: next(reads)) == pytest.approx(1.0)
    assert busy_cores(0.0, cores=2, read=lambda: None) is None
    assert cpu_times(tmp_path / "missing") is None


def test_measure_gain_on_a_busy_machine_is_inconclusive_and_records_its_threads(monkeypatch):
    """A steady 2x gain stays a number on a free machine, and is inconclusive where the cores are taken."""
    import itertools

    import torch

    batches = [{"input_ids": torch.zeros(1, 2, dtype=torch.long)}]
    jitter = itertools.cycle([0.99, 1.0, 1.01])  # steady passes: the verdict depends on the machine record alone, not on this CPU's load
    monkeypatch.setattr(timing, "time_pass", lambda call, batches, device, clock="wall": call(batches) * next(jitter))
    slow, fast = (lambda b: 0.004), (lambda b: 0.002)
    for busy in (False, True):
        record = {"threads": 1, "cpu_count": 2, "load_average": [0.5, 0.5, 0.5], "busy_cores": 1.6 if busy else 0.1}
        record |= {"free_cores": 0 if busy else 2, "busy": busy}
        monkeypatch.setattr(timing, "machine_record", lambda threads, record=record: record)
        got = timing.measure_gain(slow, fast, batches, warmup=1, repeats=6)
        assert got["threads"] == 1 and got["busy"] is busy and got["load_average"] == [0.5, 0.5, 0.5]
        assert (got["verdict"] == "inconclusive") is busy
    assert machine_load.machine_record(1, seconds=0.05)["threads"] == 1
