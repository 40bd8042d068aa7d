"""The XA transaction log: the record codec (hypothesis), torn tails and corruption never
misread, compaction within txlogSize, mmap mode, a full disk (a real EFBIG from the
kernel, in a subprocess), tm.props settings, and the SQL log on sqlite3."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgemgr.jms.xa import Xid
from bridgemgr.xa.registry import open_txlog
from bridgemgr.xa.sqllog import SqlTxLog
from bridgemgr.xa.txlog import (
    DURABLE_MARK,
    FILE_MAGIC,
    CommitRecord,
    DoneRecord,
    FileTxLog,
    MemoryTxLog,
    Participant,
    RecordError,
    TxLogDamaged,
    TxLogError,
    TxLogFull,
    TxLogSettings,
    TxLogUnavailable,
    decode_payload,
    encode_payload,
    fold,
    frame,
    scan,
    txlog_path,
)

ROOT = Path(__file__).resolve().parents[1]

gtrids = st.binary(min_size=1, max_size=64)
bquals = st.binary(min_size=0, max_size=64)
rm_names = st.text(max_size=40)


@st.composite
def commit_records(draw) -> CommitRecord:
    gtrid = draw(gtrids)
    branches = draw(st.lists(st.tuples(rm_names, st.integers(-(2**31), 2**31 - 1), bquals), max_size=5))
    return CommitRecord(gtrid, tuple(Participant(rm, Xid(fmt, gtrid, bq)) for rm, fmt, bq in branches))


records = st.one_of(commit_records(), st.lists(gtrids, max_size=6).map(lambda g: DoneRecord(tuple(g))))


def commit(n: int, rms: int = 2) -> CommitRecord:
    gtrid = f"b|boot.{n:x}".encode()
    return CommitRecord(gtrid, tuple(Participant(f"b:rm{i}", Xid(7, gtrid, f"rm{i}#{i}".encode())) for i in range(rms)))


# --- the codec ----------------------------------------------------------------------------------


@given(records)
def test_records_round_trip(record):
    assert decode_payload(encode_payload(record)) == record
    found = scan(frame(record))
    assert found.records == [record] and found.problem is None


@pytest.mark.slow
@given(st.lists(records, max_size=8), st.data())
def test_a_truncated_log_reads_as_a_prefix(recs, data):
    body = b"".join(frame(r) for r in recs)
    cut = data.draw(st.integers(0, len(body)))
    found = scan(body[:cut])
    assert found.records == recs[: len(found.records)]
    # everything but the last started record is read
    whole = 0
    ends = []
    for r in recs:
        whole += len(frame(r))
        ends.append(whole)
    assert len(found.records) == sum(1 for e in ends if e <= cut)
    assert (found.problem is None) == (cut in (0, *ends))


@pytest.mark.slow
@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_a_damaged_byte_is_never_misread(recs, data):
    body = bytearray(b"".join(frame(r) for r in recs))
    at = data.draw(st.integers(0, len(body) - 1))
    body[at] ^= data.draw(st.integers(1, 255))
    found = scan(bytes(body))
    assert found.records == recs[: len(found.records)]  # a prefix: never a changed record
    assert found.end <= at  # nothing at or after the damage is read


@given(st.binary(max_size=300))
def test_garbage_payloads_raise_record_error_only(payload):
    try:
        decode_payload(payload)
    except RecordError:
        pass


def test_strict_decoding():
    good = encode_payload(commit(1))
    with pytest.raises(RecordError, match="after the record"):
        decode_payload(good + b"\0")
    with pytest.raises(RecordError, match="unknown record type"):
        decode_payload(b"\x09")
    with pytest.raises(RecordError):
        CommitRecord(b"g", (Participant("rm", Xid(1, b"other", b"")),))


def test_fold_keeps_live_commit_records():
    a, b = commit(1), commit(2)
    assert fold([a, b, DoneRecord((a.gtrid,))]) == {b.gtrid: b}


# --- the file log ------------------------------------------------------------------------------


def test_file_log_survives_reopen(tmp_path):
    path = txlog_path(tmp_path, "b")
    assert path.name == "txlog.b"
    log = FileTxLog(path)
    assert log.open() == {}
    log.log_commit(commit(1))
    log.log_commit(commit(2), forget=[commit(1).gtrid])
    log.log_commit(commit(3))
    log.log_done([commit(3).gtrid])
    assert path.stat().st_size > log.end  # zeros written ahead: the clean end of the log
    log.close()
    again = FileTxLog(path)
    assert again.open() == {commit(2).gtrid: commit(2)}
    again.close()
    assert path.read_bytes().startswith(FILE_MAGIC)


@pytest.mark.parametrize("tail", [b"\xa7", b"\xa7\x5c\0\0\0\x20", frame(commit(9))[:-3], b"\xa7\x5c" + bytes(200)])
def test_a_torn_tail_is_cut_off_and_never_read(tmp_path, caplog, tail):
    path = tmp_path / "txlog.b"
    log = FileTxLog(path)
    log.open()
    log.log_commit(commit(1))
    good = log.end
    log.close()
    with path.open("r+b") as f:  # the next record, torn (zeros written ahead follow it)
        f.seek(good)
        f.write(tail)
    log = FileTxLog(path)
    assert log.open() == {commit(1).gtrid: commit(1)}
    assert "torn by a crash" in caplog.text
    assert path.stat().st_size == good
    log.log_commit(commit(2))  # appends after the cut: readable again
    log.close()
    assert set(FileTxLog(path).open()) == {commit(1).gtrid, commit(2).gtrid}


def _three_commits(path: Path, sync: bool = True) -> int:
    """A log of three commit records; the offset after the last (with ``sync``, each
    followed by the mark its sync leaves)."""
    log = FileTxLog(path, TxLogSettings(sync=sync))
    log.open()
    for n in range(3):
        log.log_commit(commit(n))
    end = log.end
    log.close()
    return end


def test_a_flipped_byte_before_the_last_record_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "txlog.b"
    _three_commits(path)
    data = bytearray(path.read_bytes())
    second = len(FILE_MAGIC) + len(frame(commit(0))) + len(DURABLE_MARK)
    data[second + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(TxLogDamaged) as caught:
        FileTxLog(path).open()
    message = str(caught.value)
    assert str(path) in message and f"checksum mismatch at offset {second}" in message
    assert "imqbridgemgr list txn -bn b" in message and "commit txn -n ID -bn b" in message
    assert path.read_bytes() == bytes(data)  # not cut, not rewritten


@pytest.mark.parametrize("length", [0, 3])
def test_an_emptied_log_is_refused_and_left_untouched(tmp_path, length):
    path = tmp_path / "txlog.b"
    _three_commits(path)
    os.truncate(path, length)
    with pytest.raises(TxLogDamaged, match=f"is {length} bytes long, shorter than its"):
        FileTxLog(path).open()
    assert path.stat().st_size == length


def test_a_log_cut_by_a_few_bytes_loses_only_its_torn_last_record(tmp_path, caplog):
    """Without txlogSync nothing marks a record durable: a tear of the last one is what a
    crash of the machine leaves, and it is cut off."""
    path = tmp_path / "txlog.b"
    end = _three_commits(path, sync=False)
    os.truncate(path, end - 3)
    assert set(FileTxLog(path).open()) == {commit(0).gtrid, commit(1).gtrid}
    assert "torn by a crash" in caplog.text


def test_each_sync_leaves_a_mark_so_only_the_mark_can_pass_for_a_tear(tmp_path, caplog):
    path = tmp_path / "txlog.b"
    end = _three_commits(path)
    assert path.read_bytes()[end - len(DURABLE_MARK) : end] == DURABLE_MARK
    os.truncate(path, end - 3)  # the mark torn: every decision is still there
    assert set(FileTxLog(path).open()) == {commit(n).gtrid for n in range(3)}
    assert "torn by a crash" in caplog.text


@pytest.mark.parametrize("how", ["flipped", "cut"])
def test_a_damaged_last_record_that_was_synced_is_refused_not_cut_off(tmp_path, how):
    """The last decision was synced (and so may have been acted on: a branch committed):
    damage to it is refused like damage anywhere else, the file left as it is. (Before,
    it looked like a crash tear: cut off, the decision lost, the branch still prepared
    rolled back.)"""
    path = tmp_path / "txlog.b"
    end = _three_commits(path)
    last = end - len(DURABLE_MARK) - len(frame(commit(2)))
    data = bytearray(path.read_bytes())
    if how == "flipped":
        data[last + 20] ^= 0xFF
    else:  # its last bytes zeroed, as if never written
        data[end - len(DURABLE_MARK) - 5 : end - len(DURABLE_MARK)] = bytes(5)
    path.write_bytes(bytes(data))
    with pytest.raises(TxLogDamaged, match=f"at offset {last}, before intact records"):
        FileTxLog(path).open()
    assert path.read_bytes() == bytes(data)


def test_a_new_log_is_created_whole(tmp_path):
    path = tmp_path / "txlog.b"
    (tmp_path / "txlog.b.new").write_bytes(b"IMQ")  # a creation cut short by a crash
    assert FileTxLog(path).open() == {}
    assert path.read_bytes() == FILE_MAGIC
    assert not (tmp_path / "txlog.b.new").exists()
    assert path.stat().st_mode & 0o777 == 0o600


def test_not_a_transaction_log_is_refused(tmp_path):
    path = tmp_path / "txlog.b"
    path.write_bytes(b"something else entirely")
    with pytest.raises(TxLogError, match="not a transaction log"):
        FileTxLog(path).open()
    assert path.read_bytes() == b"something else entirely"


@pytest.mark.parametrize("mapped", [False, True])
def test_compaction_keeps_the_file_within_txlog_size(tmp_path, mapped):
    path = tmp_path / "txlog.b"
    log = FileTxLog(path, TxLogSettings(size=4096, sync=False, mmap=mapped))
    log.open()
    log.log_commit(commit(10_000))  # stays live throughout
    for n in range(400):
        log.log_commit(commit(n), forget=[commit(n - 1).gtrid] if n else [])
        assert log.end <= 4096
    assert log.compactions >= 5
    assert path.stat().st_size <= 4096
    log.close()
    assert set(FileTxLog(path, TxLogSettings(size=4096, mmap=mapped)).open()) == {
        commit(10_000).gtrid,
        commit(399).gtrid,
    }
    assert not (tmp_path / "txlog.b.compact").exists()


def test_live_records_that_do_not_fit_are_txlog_full(tmp_path):
    log = FileTxLog(tmp_path / "txlog.b", TxLogSettings(size=4096, sync=False))
    log.open()
    with pytest.raises(TxLogFull, match=r"in doubt .* txlogSize is 4096"):
        for n in range(200):
            log.log_commit(commit(n))
    live = log.live()
    log.close()
    assert FileTxLog(tmp_path / "txlog.b").open() == live  # what was written stays


def test_mmap_log_keeps_its_size_and_cuts_torn_bytes(tmp_path):
    path = tmp_path / "txlog.b"
    settings = TxLogSettings(size=8192, mmap=True)
    log = FileTxLog(path, settings)
    log.open()
    log.log_commit(commit(1))
    end = log.end
    log.close()
    assert path.stat().st_size == 8192
    data = bytearray(path.read_bytes())
    data[end : end + 5] = frame(commit(2))[:5]  # a record torn while being copied in
    path.write_bytes(bytes(data))
    log = FileTxLog(path, settings)
    assert log.open() == {commit(1).gtrid: commit(1)}
    assert path.read_bytes()[end:] == bytes(8192 - end)
    log.close()


def test_a_stale_compaction_file_is_removed(tmp_path):
    (tmp_path / "txlog.b.compact").write_bytes(b"half a compaction")
    FileTxLog(tmp_path / "txlog.b").open()
    assert not (tmp_path / "txlog.b.compact").exists()


FULL_DISK_CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    from bridgemgr.xa.txlog import FileTxLog, TxLogSettings, TxLogFull, CommitRecord, Participant
    from bridgemgr.jms.xa import Xid
    path = sys.argv[1]
    log = FileTxLog(path, TxLogSettings(size=-1))
    log.open()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel answers EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
    written, error = 0, None
    try:
        for n in range(1000):
            g = b"b|x.%d" % n
            log.log_commit(CommitRecord(g, (Participant("b:a", Xid(1, g, b"a")),
                                            Participant("b:b", Xid(1, g, b"b")))))
            written += 1
    except TxLogFull as exc:
        error = str(exc)
    print(json.dumps({"written": written, "error": error, "size": os.path.getsize(path)}))
""")


@pytest.mark.slow
def test_a_full_disk_is_a_clear_error_and_loses_nothing_written(tmp_path):
    path = tmp_path / "txlog.b"
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(path)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    result = json.loads(out.stdout)
    assert result["error"] and "cannot write the transaction log" in result["error"]
    assert 0 < result["written"] < 1000 and result["size"] <= 2000
    live = FileTxLog(path).open()  # no partial record was left behind
    assert len(live) == result["written"]


def test_tm_props_settings():
    assert TxLogSettings.from_tm_props({}) == TxLogSettings(10 * 1024 * 1024, True, False)
    assert TxLogSettings.from_tm_props(
        {"txlogSize": "64k", "txlogSync": "false", "txlogMmap": "true"}
    ) == TxLogSettings(65536, False, True)
    with pytest.raises(TxLogError, match="txlogSync='maybe'"):
        TxLogSettings.from_tm_props({"txlogSync": "maybe"})
    with pytest.raises(TxLogError, match="too small"):
        TxLogSettings.from_tm_props({"txlogSize": "100"})


def test_open_txlog_picks_the_kind(tmp_path):
    assert isinstance(open_txlog("b", None, {}), MemoryTxLog)
    log = open_txlog("b", tmp_path, {"txlogSize": "1m"})
    assert isinstance(log, FileTxLog) and log.path == tmp_path / "txlog.b"
    assert log.settings.size == 1024 * 1024
    log.close()
    sql = open_txlog("b", tmp_path, {}, sql=(lambda: sqlite3.connect(tmp_path / "db"), "qmark"))
    assert isinstance(sql, SqlTxLog)
    sql.close()


# --- the SQL log ----------------------------------------------------------------------------------


def test_sql_log_on_sqlite(tmp_path):
    db = tmp_path / "store.db"
    log = SqlTxLog(lambda: sqlite3.connect(db), "b")
    other = SqlTxLog(lambda: sqlite3.connect(db), "other-bridge")
    assert log.open() == {} and other.open() == {}
    log.log_commit(commit(1))
    log.log_commit(commit(2), forget=[commit(1).gtrid])
    other.log_commit(commit(7))
    log.close()
    other.close()
    again = SqlTxLog(lambda: sqlite3.connect(db), "b")
    assert again.open() == {commit(2).gtrid: commit(2)}  # only this bridge's rows
    again.log_done([commit(2).gtrid])
    assert again.live() == {}
    again.close()


def test_sql_log_named_paramstyle_and_a_damaged_row(tmp_path):
    db = tmp_path / "store.db"
    log = SqlTxLog(lambda: sqlite3.connect(db), "b", paramstyle="named")
    log.open()
    log.log_commit(commit(1))
    log.close()
    conn = sqlite3.connect(db)
    text = conn.execute("SELECT record FROM imq_bridge_txlog").fetchone()[0]
    conn.execute("UPDATE imq_bridge_txlog SET record = ?", (text[:-2] + "00",))
    conn.commit()
    conn.close()
    with pytest.raises(TxLogDamaged, match="not a valid commit record") as caught:
        SqlTxLog(lambda: sqlite3.connect(db), "b").open()
    assert "imqbridgemgr list txn -bn b" in str(caught.value)
    conn = sqlite3.connect(db)  # left as it was
    assert conn.execute("SELECT record FROM imq_bridge_txlog").fetchone()[0] == text[:-2] + "00"
    conn.close()


def test_sql_log_write_failure_is_a_txlog_error(tmp_path):
    db = tmp_path / "store.db"
    log = SqlTxLog(lambda: sqlite3.connect(db), "b")
    log.open()
    log.log_commit(commit(1))
    with pytest.raises(TxLogError, match="cannot write"):
        log.log_commit(commit(1))  # the primary key refuses a second decision
    assert log.live() == {commit(1).gtrid: commit(1)}
    log.close()


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(commit_records(), max_size=5, unique_by=lambda r: r.gtrid))
def test_sql_log_round_trips_any_record(tmp_path_factory, recs):
    db = tmp_path_factory.mktemp("sql") / "store.db"
    log = SqlTxLog(lambda: sqlite3.connect(db), "b")
    log.open()
    for r in recs:
        log.log_commit(r)
    log.close()
    assert SqlTxLog(lambda: sqlite3.connect(db), "b").open() == {r.gtrid: r for r in recs}


MMAP_FULL_DISK_CHILD = textwrap.dedent("""
    import json, os, sys
    from bridgemgr.xa.txlog import FileTxLog, TxLogSettings, TxLogFull, CommitRecord, Participant
    from bridgemgr.jms.xa import Xid
    disk = sys.argv[1]
    settings = TxLogSettings(64 * 1024, True, True)
    log = FileTxLog(os.path.join(disk, "txlog.b"), settings)
    log.open()
    with open(os.path.join(disk, "filler"), "wb") as f:  # every block left
        f.write(b"f" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize))
    written, error = 0, None
    try:
        for n in range(5000):
            g = b"b|x.%d" % n
            log.log_commit(CommitRecord(g, (Participant("b:a", Xid(1, g, b"a")),
                                            Participant("b:b", Xid(1, g, b"b")))))
            written += 1
    except TxLogFull as exc:
        error = str(exc)
    try:
        FileTxLog(os.path.join(disk, "txlog.c"), settings).open()
        opened = None
    except TxLogFull as exc:
        opened = str(exc)
    print(json.dumps({"written": written, "error": error, "opened": opened}))
""")


@pytest.mark.slow
def test_a_mapped_log_on_a_full_disk_is_a_clear_error_not_a_sigbus(tmp_path):
    """txlogMmap mapped a sparse file: the first record stored into a hole the full disk could
    not fill killed the whole service with SIGBUS. Now the file's blocks are allocated when
    it is mapped: records fit up to txlogSize, and a log opened on a full disk is TxLogFull
    (it was a raw OSError)."""
    from disk_support import mount_tmpfs, unmount

    disk = tmp_path / "disk"
    if reason := mount_tmpfs(disk, "256k"):
        pytest.skip(reason)
    try:
        out = subprocess.run(
            [sys.executable, "-c", MMAP_FULL_DISK_CHILD, str(disk)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        unmount(disk)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    result = json.loads(out.stdout)
    assert result["written"] > 100 and "txlog" in result["error"], result
    assert "txlog.c" in result["opened"] and "No space left on device" in result["opened"], result


def test_sql_log_peek_reads_the_good_rows_of_a_damaged_table_and_changes_nothing(tmp_path):
    db = tmp_path / "store.db"
    log = SqlTxLog(lambda: sqlite3.connect(db), "b")
    log.open()
    log.log_commits([commit(1), commit(2)])
    log.close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE imq_bridge_txlog SET record = '00' WHERE gtrid = ?", (commit(1).gtrid.hex(),))
    conn.commit()
    conn.close()
    with pytest.raises(TxLogDamaged):
        SqlTxLog(lambda: sqlite3.connect(db), "b").open()
    assert SqlTxLog(lambda: sqlite3.connect(db), "b").peek() == {commit(2).gtrid: commit(2)}
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM imq_bridge_txlog").fetchone()[0] == 2
    conn.close()


def test_sql_log_that_cannot_reconnect_is_unavailable_not_broken(tmp_path):
    """A failed reconnect wraps the driver's OperationalError in the store's own error
    (pgstore's StoreError); it is still an outage (TxLogUnavailable: the link retries),
    not a broken log (TxLogError: the link stopped for good)."""
    from bridgemgr.jms.errors import StoreError

    db = tmp_path / "store.db"
    down = False

    def connect() -> sqlite3.Connection:
        if down:
            try:
                return sqlite3.connect(tmp_path / "no-such-folder" / "store.db")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"cannot connect: {exc}") from exc
        return sqlite3.connect(db)

    log = SqlTxLog(connect, "b")
    log.open()
    log.log_commit(commit(1))
    log._drop()  # the connection was lost with the database
    down = True
    with pytest.raises(TxLogUnavailable, match="cannot connect"):
        log.log_done([commit(1).gtrid])
    down = False
    log.log_done([commit(1).gtrid])  # back: the next write connects again
    assert log.live() == {}
    log.close()
