"""A source log the executors cannot read (slices.py): the driver packs each slice's records
into the partition, the task's reader spills them into a folder of the executor's own, the
sink reads them there and removes it; which mode a master gets. No Spark needed."""

from __future__ import annotations

import dataclasses
import shutil
import stat

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from bridgemgr.jms import TextMessage, codec
from bridgemgr.props import ConfigError, load_properties
from bridgemgr.spark import slices as slices_module
from bridgemgr.spark.log import SourceLog, SourceLogError
from bridgemgr.spark.runner import link_options, spark_link_options
from bridgemgr.spark.slices import records, ship_parts, ships_log, spill_folder, task_records
from bridgemgr.spark.source import LinkStreamReader
from bridgemgr.spark.transfer import offset_runs


@pytest.mark.parametrize(
    "master,mode,ships",
    [
        ("local[2]", "auto", False),
        ("local", "auto", False),
        ("local[*]", "auto", False),
        ("spark://10.0.0.5:7077", "auto", True),
        ("yarn", "auto", True),
        ("k8s://h:443", "auto", True),
        ("spark://h:7077", "shared", False),
        ("local[2]", "shipped", True),
    ],
)
def test_the_driver_ships_records_unless_the_master_is_local_or_the_log_is_declared_shared(master, mode, ships):
    assert ships_log(master, mode) is ships


def test_an_unknown_sourcelog_mode_is_refused_by_name():
    with pytest.raises(ValueError, match=r"imq\.bridge\.spark\.sourcelog is 'nfs'"):
        ships_log("local", "nfs")


def fill(log: SourceLog) -> list[tuple[int, str, bytes, str]]:
    """Segments [0, 3) and [3, 7) of provider A, [7, 9) of provider B; the records."""
    expect = []
    for start, n, provider in ((0, 3, "A"), (3, 4, "A"), (7, 2, "B")):
        batch = []
        for i in range(start, start + n):
            m = TextMessage(f"m{i}")
            m.message_id = f"ID:src-{i}"
            batch.append((m.message_id, codec.encode(m)))
            expect.append((i, m.message_id, batch[-1][1], provider))
        log.append(start, batch, provider)
    return expect


def flat(items) -> list[tuple[int, str, bytes, str]]:
    return [(r.offset, r.message_id, r.blob, p) for r, p in items]


def test_a_packed_slice_holds_exactly_its_records_across_segments_and_providers(tmp_path):
    log = SourceLog(tmp_path / "sourcelog").open()
    expect = fill(log)
    options = link_options(tmp_path, xmlurl="/x.xml", bridge="b", link="l", broker_url="mq://h:1")
    packed = log.pack(2, 8)
    # a segment wholly inside goes as it is; the cut ones hold only the slice's records
    assert [(s, e) for s, e, _ in packed] == [(2, 3), (3, 7), (7, 8)]
    assert packed[1][2] == next(s for s in log.segments() if s.start == 3).path.read_bytes()
    assert flat(records(options, 2, 8, packed)) == expect[2:8]
    assert flat(records(options, 2, 8)) == expect[2:8]  # (the shared log: the same)
    assert flat(records(options, 3, 5, packed)) == expect[3:5]
    with pytest.raises(SourceLogError, match=r"records 9 \.\. 9 are not there"):
        log.pack(5, 10)


def test_shipped_partitions_reach_a_sink_that_cannot_read_the_log(tmp_path):
    """The driver's partitions carry the records; with the log gone (an executor on
    another machine), the reader's spill gives the sink exactly its slice, in order, and
    is removed after the task, private while it exists."""
    options = dataclasses.replace(
        link_options(tmp_path / "checkpoint", xmlurl="/x.xml", bridge="b", link="l", broker_url="mq://h:1"),
        ship_log=True,
    )
    expect = fill(SourceLog(options.source_log).open())
    driver = LinkStreamReader(options)
    parts = driver.partitions({"offset": 1}, {"offset": 9})
    driver.stop()
    assert [(p.lo, p.hi) for p in parts] == [(1, 5), (5, 9)]
    shutil.rmtree(options.source_log)
    got = []
    for part in parts:
        batches = list(LinkStreamReader(options).read(part))
        folder = spill_folder(options, part.lo, part.hi)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in folder.iterdir())
        with task_records(options, offset_runs(iter(batches))) as items:
            got += flat(items)
        assert not folder.exists()
    assert got == expect[1:9]
    # without the spill (and the log) the task fails naming what is missing
    with (
        pytest.raises(SourceLogError, match=r"records 1 \.\. 4 are not there"),
        task_records(options, [(1, 5)]) as items,
    ):
        list(items)


def test_a_big_batch_is_shipped_in_more_slices(tmp_path, monkeypatch):
    log = SourceLog(tmp_path / "sourcelog").open()
    fill(log)
    size = sum(s.path.stat().st_size for s in log.segments())
    assert ship_parts(log, 0, 9, 2) == 2
    monkeypatch.setattr(slices_module, "SHIP_BYTES", size // 4)
    assert ship_parts(log, 0, 9, 2) >= 4
    assert ship_parts(log, 7, 9, 1) == 1  # only the segments the range touches count


def test_a_shipped_micro_batch_ends_once_its_segments_hold_the_batch_bound(tmp_path, monkeypatch):
    """latestOffset of a link that ships: the batch ends after the segment at which the
    segments' files reach ship_batch_bytes (at least one segment), however few messages
    that is; a shared link's batch is cut by maxPerBatch alone."""
    options = link_options(
        tmp_path / "checkpoint", xmlurl="/x.xml", bridge="b", link="l", broker_url="mq://h:1", parallelism=2
    )
    log = SourceLog(options.source_log).open()
    for start in range(0, 40, 4):  # ten segments of 4 records of ~10 KB
        batch = []
        for i in range(start, start + 4):
            m = TextMessage(f"{i:02d}" + "x" * 10_000)
            m.message_id = f"ID:src-{i}"
            batch.append((m.message_id, codec.encode(m)))
        log.append(start, batch, "A")
    segment = log.segments()[0].path.stat().st_size
    monkeypatch.setattr(slices_module, "SHIP_BYTES", segment * 3 // 4)  # 4 tasks: 3 segments
    assert 2 * segment < slices_module.ship_batch_bytes(2) <= 3 * segment
    limit = ReadMaxRows(1000)

    def batches(opts) -> list[int]:
        reader, ends, first = LinkStreamReader(opts), [], 0
        try:
            while first < 40:
                first = reader.latestOffset({"offset": first}, limit)["offset"]
                ends.append(first)
        finally:
            reader.stop()
        return ends

    assert batches(dataclasses.replace(options, ship_log=True)) == [12, 24, 36, 40]
    assert batches(options) == [40]
    assert log.end_within(2, 40, 3 * segment) == 16  # a cut segment counts its share
    assert log.end_within(2, 40, 1) == 4  # one segment at least


@pytest.mark.parametrize(
    "lines,ships",
    [
        ([], False),
        (["imq.bridge.spark.master=spark://10.0.0.5:7077"], True),
        (["imq.bridge.spark.master=spark://10.0.0.5:7077", "imq.bridge.spark.sourcelog=shared"], False),
        (["imq.bridge.spark.sourcelog=shipped"], True),
    ],
)
def test_a_service_link_ships_records_by_its_master_and_imq_bridge_spark_sourcelog(tmp_path, lines, ships):
    file = tmp_path / "broker.properties"
    file.write_text(
        "\n".join(
            [
                f"imq.varhome={tmp_path / 'var'}",
                "imq.bridge.b.type=jms",
                "imq.bridge.b.xmlurl=/b.xml",
                "imq.bridge.b.runner=spark",
                *lines,
            ]
        )
        + "\n"
    )
    options, _ = spark_link_options(load_properties([file], environ={}), "b", "l", "mq://127.0.0.1:1")
    assert options.ship_log is ships


def test_a_bad_sourcelog_setting_is_a_property_error(tmp_path):
    file = tmp_path / "broker.properties"
    file.write_text("imq.bridge.spark.sourcelog=nfs\n")
    with pytest.raises(ConfigError, match=r"imq\.bridge\.spark\.sourcelog"):
        load_properties([file], environ={})
