"""Atomic files: a reader sees the old file or the new one, never half; a failed write leaves the
old file and no temporary file."""

from __future__ import annotations

import json
import os
import stat

import pytest

from posenc.runtime.files import (
    inside,
    read_json,
    replacing,
    temporary_folder,
    write_json,
    write_text,
)


def test_a_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "metrics.json"
    write_json(path, {"bleu": 1.0})
    write_json(path, {"bleu": 2.5})
    assert json.loads(path.read_text()) == {"bleu": 2.5}
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_text(path, "old")
    with pytest.raises(RuntimeError), replacing(path) as handle:
        handle.write("half of the new")
        raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_binary_writes(tmp_path):
    with replacing(tmp_path / "x.bin", "wb") as handle:
        handle.write(b"\x00\x01")
    assert (tmp_path / "x.bin").read_bytes() == b"\x00\x01"


def test_read_json_is_none_for_what_is_not_a_json_object(tmp_path):
    assert read_json(tmp_path / "missing.json") is None
    write_text(tmp_path / "broken.json", '{"a": ')
    write_text(tmp_path / "list.json", "[1, 2]")
    assert read_json(tmp_path / "broken.json") is None and read_json(tmp_path / "list.json") is None
    write_json(tmp_path / "ok.json", {"a": 1})
    assert read_json(tmp_path / "ok.json") == {"a": 1}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_a_temporary_folder_has_the_umasks_permissions_not_mkdtemps(tmp_path, umask, mode):
    """A folder made aside and renamed into place (a standalone evaluation, a restored run, an
    HParams summary) keeps its permissions: they must be what the umask gives a folder."""
    previous = os.umask(umask)
    try:
        folder = temporary_folder(tmp_path, ".made.")
    finally:
        os.umask(previous)
    assert folder.parent == tmp_path and folder.name.startswith(".made.")
    assert stat.S_IMODE(folder.stat().st_mode) == mode


@pytest.mark.parametrize(
    "name",
    ["/etc/x", "run//tmp/x", "run/../../x", "..", ".", "", "run/./x", "run\\..\\x", "run/"],
)
def test_a_name_from_an_archive_or_a_file_that_is_not_plainly_inside_its_folder_is_refused(
    tmp_path, name
):
    with pytest.raises(ValueError, match="not a plain relative path inside"):
        inside(tmp_path, name)


def test_a_name_that_a_link_leads_out_of_its_folder_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "out").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="leads out of"):
        inside(folder, "out/x")
    odd = "ｒｕｎ∕．．∕x"  # fullwidth letters, a division slash and fullwidth dots: one odd name
    assert inside(folder, odd) == folder / odd
    assert inside(folder, "a/b.txt") == folder / "a" / "b.txt"
