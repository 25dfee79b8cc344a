"""peagle.files: a file is written under a temp name of this process's own and takes its place in one rename."""
import os

import pytest

from peagle.files import temp_beside, written


def test_temp_name_is_beside_the_file_and_this_process_own(tmp_path):
    tmp = temp_beside(tmp_path / "model.safetensors")
    assert tmp.parent == tmp_path and tmp.name == f"model.safetensors.{os.getpid()}.tmp"


def test_written_replaces_the_file_whole_and_only_when_the_block_ends(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    with written(path) as tmp:
        tmp.write_text("new")
        assert path.read_text() == "old"  # readers see the old file until the rename
    assert path.read_text() == "new" and not list(tmp_path.glob("*.tmp"))


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk"):
        with written(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old" and not list(tmp_path.glob("*.tmp"))


def test_durable_writes_fsync_the_data_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    path = tmp_path / "state.pt"
    with written(path, durable=True) as tmp:
        tmp.write_bytes(b"x")
    assert events == [("fsync", str(tmp)), ("replace", str(tmp), str(path)), ("fsync", str(tmp_path))]
    events.clear()
    with written(path) as tmp:
        tmp.write_bytes(b"y")
    assert events == [("replace", str(tmp), str(path))]  # a cache: no fsync
