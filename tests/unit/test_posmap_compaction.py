"""Compaction of the position map's small part files: the rows readers see are the same before and after, and a
kill between the merged file's appearance and the old parts' deletion loses nothing (pure file logic, no Pulsar)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulsar_migration.replication import posmap
from pulsar_migration.replication.posmap import MapRow


def row(topic: str, target_entry: int, source_entry: int) -> MapRow:
    return MapRow(topic=topic, partition=-1, source_ledger=100, source_entry=source_entry, source_messages=1,
                  source_batched=False, source_first_chunk=None, target_ledger=200, target_entry=target_entry,
                  target_messages=1, target_batched=False, target_first_chunk=None, source_publish_time=1,
                  mode="copy")


def fill(run_dir: Path, parts: int, topics: int = 5) -> None:
    """`parts` part files, each a few rows of every topic further on (as runs after runs append them)."""
    for part in range(parts):
        posmap.append_local(str(run_dir), [row(f"persistent://t/ns/x{t}", 3 * part + i, 10 + 3 * part + i)
                                           for t in range(topics) for i in range(3)])


def rows(run_dir: Path) -> list[tuple]:
    frame = posmap.read_local(str(run_dir))
    assert frame is not None
    return sorted(map(tuple, frame.itertuples(index=False)))


def test_small_parts_merge_into_one_with_the_same_rows_and_ends(tmp_path: Path) -> None:
    fill(tmp_path, 20)
    before, ends = rows(tmp_path), posmap.ends_local(str(tmp_path))
    assert len(posmap.part_files(str(tmp_path))) == 20

    done = posmap.compact_local(str(tmp_path))

    assert done is not None and done["files_merged"] == 20 and done["rows"] == 20 * 15
    assert done["duplicates_dropped"] == 0
    [merged] = posmap.part_files(str(tmp_path))
    assert merged.name.startswith("part-compact-")
    assert rows(tmp_path) == before
    assert posmap.ends_local(str(tmp_path)) == ends
    assert posmap.compact_local(str(tmp_path)) is None  # one file: nothing to do


def test_too_few_or_only_large_parts_are_left_alone(tmp_path: Path) -> None:
    fill(tmp_path, posmap.COMPACT_MIN_FILES - 1)
    assert posmap.compact_local(str(tmp_path)) is None
    assert len(posmap.part_files(str(tmp_path))) == posmap.COMPACT_MIN_FILES - 1
    fill(tmp_path, 1)
    assert posmap.compact_local(str(tmp_path), small_bytes=1) is None  # every part counts as large
    assert posmap.compact_local(str(tmp_path)) is not None
    assert posmap.compact_local(str(tmp_path / "nothing-here")) is None
    assert posmap.compact_local("s3a://bucket/run") is None  # only local run dirs


def test_a_kill_before_the_old_parts_are_deleted_leaves_duplicates_that_readers_and_the_next_compaction_drop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(tmp_path, 18)
    # A Spark write's checksum file next to a part: deleted with it.
    first = posmap.part_files(str(tmp_path))[0]
    crc = first.with_name(f".{first.name}.crc")
    crc.write_bytes(b"crc")
    before = rows(tmp_path)
    deleted: list[Path] = []
    real_unlink = Path.unlink

    def killed_after_three(self: Path, missing_ok: bool = False) -> None:
        if self.suffix == ".parquet" and len(deleted) == 3:
            raise KeyboardInterrupt("killed")
        if self.suffix == ".parquet":
            deleted.append(self)
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        posmap.compact_local(str(tmp_path))
    monkeypatch.undo()

    left = posmap.part_files(str(tmp_path))
    assert len(left) == 18 - 3 + 1  # the merged file and 15 old parts: their rows are there twice
    assert rows(tmp_path) == before  # readers drop the duplicates
    assert not crc.exists()

    done = posmap.compact_local(str(tmp_path))
    assert done is not None and done["files_merged"] == 16 and done["duplicates_dropped"] == 15 * 15
    assert len(posmap.part_files(str(tmp_path))) == 1
    assert rows(tmp_path) == before
