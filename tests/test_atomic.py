"""Atomic writes: the whole file or none of it, and one line for a folder that cannot be written."""

import json

import pytest

from pipeline.core.atomic import save_figure, write_json, write_text, write_with
from pipeline.core.errors import PipesplitError


def test_json_and_text_land_whole_with_no_temp_file_left(tmp_path):
    write_json(tmp_path / "a" / "x.json", {"v": 1.5})
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == {"v": 1.5}
    write_text(tmp_path / "y.md", "hello\n")
    assert (tmp_path / "y.md").read_text() == "hello\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "x.json", "y.md"]


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "t.csv"
    target.write_text("old")

    def boom(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_with(target, boom)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_an_unwritable_folder_is_one_line():
    with pytest.raises(PipesplitError, match=r"cannot write /proc/nope/x.json .*pick a writable folder"):
        write_json("/proc/nope/x.json", {})


def test_save_figure_writes_a_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    path = save_figure(fig, tmp_path / "f.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_written_files_get_the_usual_permissions(tmp_path):
    import os
    import stat

    mask = os.umask(0o022)
    try:
        path = write_json(tmp_path / "p.json", {})
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
