"""benchmarks.cpu_split on real processes (two sleeping children stand in for the brokers, so the shared cluster
pair is never touched): every thread pinned, this process on the other CPUs, all of it undone at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from benchmarks import cpu_split

# A child with a few threads: pinning must reach all of them, not only the main one.
THREADED_SLEEPER = ("import threading, time\n"
                    "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                    "print('ready', flush=True); time.sleep(60)\n")


@pytest.fixture
def fake_brokers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    children = [subprocess.Popen([sys.executable, "-c", THREADED_SLEEPER], stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    pids = {"broker-a": children[0].pid, "broker-b": children[1].pid}
    monkeypatch.setattr(cpu_split, "broker_pids", lambda: dict(pids))
    yield pids
    for child in children:
        child.kill()
        child.wait()


def thread_cpus(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def test_cpu_lists_parse_like_linux_and_unknown_cpus_are_refused() -> None:
    assert cpu_split.parse_cpus("0") == {0}
    if len(cpu_split.all_cpus()) >= 2:
        assert cpu_split.parse_cpus("0,1") == cpu_split.parse_cpus("0-1") == {0, 1}
    with pytest.raises(ValueError, match="does not have"):
        cpu_split.parse_cpus("4096")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or len(cpu_split.all_cpus()) < 2, reason="needs two CPUs")
def test_split_pins_every_broker_thread_and_this_process_then_restores(fake_brokers: dict[str, int]) -> None:
    own = os.sched_getaffinity(0)
    with cpu_split.split({0}, {1}) as done:
        assert done["brokers"] == [0] and done["clients"] == [1]
        for name, pid in fake_brokers.items():
            cpus = thread_cpus(pid)
            assert done[f"{name}_threads"] == len(cpus) >= 4 and all(c == {0} for c in cpus)
        assert all(c == {1} for c in thread_cpus(os.getpid()))
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == "[1]"  # what the benchmark starts inherits the clients' CPUs
    for pid in fake_brokers.values():
        assert all(c == cpu_split.all_cpus() for c in thread_cpus(pid))
    assert os.sched_getaffinity(0) == own


def test_overlapping_lists_and_missing_brokers_change_nothing(fake_brokers: dict[str, int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    before = {pid: thread_cpus(pid) for pid in fake_brokers.values()}
    with pytest.raises(ValueError, match="overlap"), cpu_split.split({0}, {0}):
        pass
    monkeypatch.setattr(cpu_split, "broker_pids", lambda: {"broker-a": fake_brokers["broker-a"]})
    with pytest.raises(RuntimeError, match="both local brokers"), cpu_split.split({0}, {1}):
        pass
    assert {pid: thread_cpus(pid) for pid in fake_brokers.values()} == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or len(cpu_split.all_cpus()) < 2, reason="needs two CPUs")
def test_a_sigterm_inside_the_split_still_restores_the_brokers(fake_brokers: dict[str, int]) -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended, cpu_split.split({0}, {1}):
        os.kill(os.getpid(), signal.SIGTERM)
    assert ended.value.code == 128 + signal.SIGTERM
    for pid in fake_brokers.values():
        assert all(c == cpu_split.all_cpus() for c in thread_cpus(pid))
    assert signal.getsignal(signal.SIGTERM) == before
