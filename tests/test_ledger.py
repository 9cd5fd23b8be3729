"""The JSON ledger: fingerprints, durable writes, backups, the lock, and refusing damaged files."""

import dataclasses
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffsoup.store import (
    LEDGER_VERSION,
    Ledger,
    LedgerError,
    LedgerLockedError,
    backup_ledger,
    fingerprint,
    write_text_durably,
)
from diffsoup.store import _ledger
from diffsoup.store._ledger import ledger_lock, new_record, remove_stale_temporaries

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Start:
    task_id: str
    x0: tuple
    tags: frozenset


def _sample_items():
    return [
        {"task_id": "a", "p": {"k2": 2.5, "k1": [1, 2, 3]}, "set": {"x", "y", "zeta", "w"}},
        Start("b", (1.0, 2.0), frozenset({"fast", "stiff", "gpu"})),
        {"task_id": "c", "array": np.arange(6.0).reshape(2, 3), "scalar": np.int64(4)},
    ]


def test_fingerprint_is_the_same_in_another_process():
    # Set iteration order depends on PYTHONHASHSEED, so other seeds would expose an unsorted set.
    here = [fingerprint(item) for item in _sample_items()]
    code = (
        "import sys; sys.path.insert(0, 'tests'); import test_ledger as t; "
        "from diffsoup.store import fingerprint; "
        "print(' '.join(fingerprint(i) for i in t._sample_items()))"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == here


def test_fingerprint_tells_items_apart_but_not_key_order():
    a = {"task_id": "a", "x": 1.0, "y": [1, 2]}
    assert fingerprint(a) == fingerprint({"y": [1, 2], "x": 1.0, "task_id": "a"})
    assert fingerprint(a) != fingerprint({**a, "x": 1.0000001})
    assert fingerprint(a) != fingerprint({**a, "x": 1})  # 1 and 1.0 are different parameters
    assert fingerprint({"v": np.array([1.0, 2.0])}) != fingerprint({"v": np.array([1.0, 2.0], np.float32)})
    assert len(fingerprint(a)) == 64


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.floats(allow_nan=False) | st.text()))
@settings(max_examples=60, deadline=None)
def test_fingerprint_ignores_insertion_order(mapping):
    reordered = dict(reversed(list(mapping.items())))
    assert fingerprint(mapping) == fingerprint(reordered)


def test_fingerprint_refuses_a_repr_with_a_memory_address():
    class Opaque:
        __slots__ = ()

    with pytest.raises(TypeError, match="memory address"):
        fingerprint({"task_id": "a", "thing": Opaque()})


def _ledger_with(path, n=3):
    ledger = Ledger(path, function="tests.fn")
    for i in range(n):
        record = new_record(f"t{i}", fingerprint({"task_id": f"t{i}"}))
        record.update(state="accepted", result={"value": i, "list": [i, "x"]}, attempts=1)
        ledger.set(f"t{i}", record)
    return ledger


def test_ledger_round_trip_and_layout(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger_with(path)
    ledger.save()
    text = path.read_text()
    data = json.loads(text)
    assert data["format"] == "diffsoup-ledger" and data["version"] == LEDGER_VERSION
    assert data["campaign"] == ledger.campaign and len(data["campaign"]) == 64
    assert list(data["tasks"]) == ["t0", "t1", "t2"]
    # One record per line, so a person can read and grep it.
    assert [line.split(':')[0].strip() for line in text.splitlines() if '"task_id"' in line] == ['"t0"', '"t1"', '"t2"']
    loaded = Ledger.load(path)
    assert loaded.task_ids() == ["t0", "t1", "t2"]
    assert all(loaded.get(t) == ledger.get(t) for t in loaded.task_ids())
    assert not list(tmp_path.glob(".*.tmp"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


@given(json_values)
@settings(max_examples=60, deadline=None)
def test_any_json_result_reads_back_equal(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("l") / "ledger.json"
    ledger = Ledger(path)
    record = new_record("t", "f" * 64)
    record.update(state="accepted", result=value, attempts=1)
    ledger.set("t", record)
    ledger.save()
    assert Ledger.load(path).get("t")["result"] == value


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "ledger.json"
    path.write_text("old content")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    write_text_durably(path, "new content")
    assert path.read_text() == "new content"
    assert len(synced) == 2  # the file, then its directory

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_durably(path, "newer content")
    assert path.read_text() == "new content"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # no temporary left behind


def _corrupt(path, kind):
    good = json.loads(path.read_text())
    if kind == "truncated":
        path.write_text(path.read_text()[:-40])
    elif kind == "empty":
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "other-json":
        path.write_text(json.dumps({"results": [1, 2, 3]}))
    elif kind == "newer-version":
        good["version"] = LEDGER_VERSION + 1
        path.write_text(json.dumps(good))
    elif kind == "bad-state":
        good["tasks"]["t1"]["state"] = "done"
        path.write_text(json.dumps(good))
    elif kind == "missing-field":
        del good["tasks"]["t1"]["attempts"]
        path.write_text(json.dumps(good))
    elif kind == "edited-fingerprint":
        good["tasks"]["t1"]["fingerprint"] = "0" * 64
        path.write_text(json.dumps(good))
    elif kind == "nan-result":
        path.write_text(path.read_text().replace('"value": 1,', '"value": NaN,'))
    elif kind == "edited-result":  # by hand, in place: the file stays well-formed
        path.write_text(path.read_text().replace('"value": 1,', '"value": 100,'))
    elif kind == "edited-attempts":
        good["tasks"]["t1"]["attempts"] = 0
        path.write_text(json.dumps(good))
    elif kind == "edited-state":
        good["tasks"]["t1"].update(state="failed", result=None, error="RuntimeError: edited")
        path.write_text(json.dumps(good))
    elif kind == "edited-worker":
        good["tasks"]["t2"]["worker"] = "somewhere else"
        path.write_text(json.dumps(good))
    elif kind == "no-checksum":
        del good["checksum"]
        path.write_text(json.dumps(good))
    elif kind == "old-version-0":
        good["version"] = 0
        path.write_text(json.dumps(good))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("truncated", "not valid JSON"),
        ("empty", "not valid JSON"),
        ("binary", "not valid JSON"),
        ("other-json", "is not a diffsoup ledger"),
        ("newer-version", "newer diffsoup"),
        ("bad-state", "state 'done'"),
        ("missing-field", "lacks attempts"),
        ("edited-fingerprint", "campaign fingerprint does not match"),
        ("nan-result", "Out of range float"),
        ("edited-result", "does not match its checksum: a task record .*resume=False .*--restart"),
        ("edited-attempts", "does not match its checksum"),
        ("edited-state", "does not match its checksum"),
        ("edited-worker", "does not match its checksum"),
        ("no-checksum", "lacks checksum"),
        ("old-version-0", "its version is 0"),
    ],
)
def test_a_damaged_ledger_is_refused_naming_the_file_and_left_untouched(tmp_path, kind, message):
    path = tmp_path / "ledger.json"
    _ledger_with(path).save()
    _corrupt(path, kind)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=message) as info:
        Ledger.load(path)
    assert str(path) in str(info.value)
    assert "left untouched" in str(info.value)
    assert path.read_bytes() == before


def test_an_unreadable_ledger_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "ledger.json"
    path.mkdir()  # unreadable as a file even for root
    with pytest.raises(LedgerError, match="cannot read the ledger .*ledger.json"):
        Ledger.load(path)


def test_backups_never_overwrite_each_other(tmp_path, monkeypatch):
    fixed = datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone.utc)

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(_ledger._dt, "datetime", Frozen)
    path = tmp_path / "ledger.json"
    names = []
    for content in ("first", "second", "third"):
        path.write_text(content)
        names.append(backup_ledger(path).name)
        assert not path.exists()
    assert names == [
        "ledger.json.20260102T030405.000006Z.bak",
        "ledger.json.20260102T030405.000006Z-1.bak",
        "ledger.json.20260102T030405.000006Z-2.bak",
    ]
    assert [(tmp_path / n).read_text() for n in names] == ["first", "second", "third"]


def test_the_lock_admits_one_writer(tmp_path):
    path = tmp_path / "ledger.json"
    with ledger_lock(path):
        # flock locks belong to an open file description, so a second open conflicts even here.
        with pytest.raises(LedgerLockedError, match=f"ledger {path} is in use by another process \\(pid {os.getpid()}"):
            with ledger_lock(path):
                pass
    with ledger_lock(path):  # released on exit
        pass


def test_the_lock_file_is_removed_with_the_lock_and_a_lock_on_a_removed_file_is_taken_again(tmp_path, monkeypatch):
    """The holder removes ``<ledger>.lock`` as it lets go (after a run as after Ctrl-C); a process
    whose lock landed on a file removed meanwhile (its holder let go between this one's open and
    its lock) opens the new file and locks that one."""
    import fcntl

    path = tmp_path / "ledger.json"
    lock = tmp_path / "ledger.json.lock"
    with ledger_lock(path):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")
    assert not lock.exists()
    with pytest.raises(KeyboardInterrupt), ledger_lock(path):
        raise KeyboardInterrupt
    assert not lock.exists()
    # The first flock lands on a file that is then removed (as by a holder letting go): locked again.
    real_flock, calls = fcntl.flock, []

    def flock(fd, op):
        real_flock(fd, op)
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(lock)

    monkeypatch.setattr(fcntl, "flock", flock)
    with ledger_lock(path):
        assert len(calls) == 2 and lock.is_file()
        assert os.path.samestat(os.fstat(calls[1]), os.stat(lock))
    assert not lock.exists()


def test_temporaries_of_a_killed_writer_are_removed(tmp_path):
    path = tmp_path / "ledger.json"
    stale = tmp_path / ".ledger.json.999.abcd.tmp"
    stale.write_text("half a ledg")
    other = tmp_path / ".other.json.1.ab.tmp"
    other.write_text("not ours")
    assert remove_stale_temporaries(path) == [stale]
    assert other.exists() and not stale.exists()


def test_the_checksum_covers_every_field_of_every_record(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger_with(path)
    before = ledger.checksum
    for name, value in [("result", {"value": 0, "list": [0, "y"]}), ("attempts", 2), ("state", "pending"),
                        ("error", "E"), ("traceback", "T"), ("started", "s"), ("finished", "f"), ("worker", "w")]:
        record = ledger.get("t0")
        original = record[name]
        record[name] = value
        ledger.set("t0", record)
        assert ledger.checksum != before, name
        record[name] = original
        ledger.set("t0", record)
        assert ledger.checksum == before, name
    # Independent of the order of the records and of the keys within a result.
    reordered = Ledger(path, tasks={t: ledger.get(t) for t in reversed(ledger.task_ids())})
    assert reordered.checksum == before
    record = ledger.get("t1")
    record["result"] = dict(reversed(list(record["result"].items())))
    ledger.set("t1", record)
    assert ledger.checksum == before


# A ledger written by diffsoup before the checksum (format version 1), byte for byte.
LEDGER_V1 = """{
 "format": "diffsoup-ledger",
 "version": 1,
 "campaign": "4b781945a3f773e3ba151c696f105647fc49ddb1ed1f98c9704c92a64a5ac7da",
 "function": "tests.fn",
 "created": "2026-01-02T03:04:05.000006+00:00",
 "updated": "2026-12-03T20:48:37.619668+00:00",
 "tasks": {
  "t0": {"task_id": "t0", "fingerprint": "e8e42f4ff8c7e067331d287424046032a50f87717a6a0a5c02ab3ff1ce74a1a3", "state": "accepted", "result": {"value": 0}, "error": null, "traceback": null, "attempts": 1, "started": "2026-01-02T03:04:06.000000+00:00", "finished": "2026-01-02T03:04:07.000000+00:00", "worker": "host pid 1"},
  "t1": {"task_id": "t1", "fingerprint": "382cb69b9b31c842dd9f401c3d1c7dd195aad95b1958edb59711ab47b354e829", "state": "accepted", "result": {"value": 1}, "error": null, "traceback": null, "attempts": 1, "started": "2026-01-02T03:04:06.000000+00:00", "finished": "2026-01-02T03:04:07.000000+00:00", "worker": "host pid 1"},
  "t2": {"task_id": "t2", "fingerprint": "9430ca0ed031a6d649c2f341226914023b3882c8956b9437fd174cf34052f98b", "state": "accepted", "result": {"value": 2}, "error": null, "traceback": null, "attempts": 1, "started": "2026-01-02T03:04:06.000000+00:00", "finished": "2026-01-02T03:04:07.000000+00:00", "worker": "host pid 1"}
 }
}
"""


def test_a_version_1_ledger_is_read_and_written_back_with_its_checksum(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(LEDGER_V1)
    ledger = Ledger.load(path)
    assert ledger.read_version == 1 and LEDGER_VERSION == 2
    assert ledger.task_ids() == ["t0", "t1", "t2"]
    assert [ledger.get(t)["result"] for t in ledger.task_ids()] == [{"value": 0}, {"value": 1}, {"value": 2}]
    assert ledger.get("t1")["fingerprint"] == fingerprint({"task_id": "t1", "x": 1})
    ledger.save()
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["campaign"] == json.loads(LEDGER_V1)["campaign"]
    assert data["checksum"] == ledger.checksum
    again = Ledger.load(path)
    assert again.read_version == 2 and all(again.get(t) == ledger.get(t) for t in ledger.task_ids())
    # From now on the results are covered.
    path.write_text(path.read_text().replace('"value": 1}', '"value": 7}'))
    with pytest.raises(LedgerError, match="does not match its checksum"):
        Ledger.load(path)
    # A version-1 ledger whose identity was edited is refused as before.
    path.write_text(LEDGER_V1.replace('"fingerprint": "38', '"fingerprint": "00'))
    with pytest.raises(LedgerError, match="campaign fingerprint does not match"):
        Ledger.load(path)
