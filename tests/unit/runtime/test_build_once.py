"""``kvlab.runtime.cache_dirs.build_once``: a cached build made once while several processes want it (kvlab eval
and its forked probe helper each built the CPU kernel, and said so twice), with no lock left by a killed build."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from kvlab.runtime.cache_dirs import build_once


def test_it_builds_a_missing_target_once_and_then_never(tmp_path):
    target = tmp_path / "sub" / "k.so"
    built = []

    def build(path):
        built.append(path)
        path.write_bytes(b"x")

    assert build_once(target, build) is True  # the folder is created
    assert build_once(target, build) is False
    assert built == [target] and sorted(p.name for p in target.parent.iterdir()) == ["k.so"]  # no lock file


def test_a_second_caller_waits_for_the_build_under_way_and_does_not_build_again(tmp_path):
    """The test holds the folder's lock as another process's build would; the waiting caller finds the target built
    when the lock is released, and does not build it."""
    target = tmp_path / "k.so"
    built, done = [], []
    held = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    waiter = threading.Thread(target=lambda: done.append(build_once(target, built.append)))
    try:
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and built == []  # blocked on the lock, not building beside the holder
        target.write_bytes(b"x")  # the holder's build is finished
    finally:
        os.close(held)  # releases the lock
    waiter.join(10)
    assert done == [False] and built == []


def test_a_failed_build_releases_the_lock(tmp_path):
    target = tmp_path / "k.so"

    def broken(path):
        raise RuntimeError("cc exited with 1")

    with pytest.raises(RuntimeError, match="cc exited"):
        build_once(target, broken)
    assert build_once(target, lambda p: p.write_bytes(b"x")) is True and target.exists()
