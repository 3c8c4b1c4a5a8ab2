"""The manual builds with --strict (a broken link or a page it cannot make fails), and its reference holds every
flag of every command, generated from the command's own parser."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.usage import flag_names

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("search.optimize", "search.sweep", "pipeline.run", "pipeline.export", "costmodel.profile",
            "costmodel.validate")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_every_command_is_in_the_built_reference(site, command):
    html = (site / "reference" / "cli" / command / "index.html").read_text()
    missing = [f for f in flag_names(importlib.import_module(command).parser())
               if not re.search(rf"<code>{re.escape(f)}[ <]", html)]
    assert missing == []


@pytest.mark.slow
def test_every_picture_a_page_shows_is_in_the_site_and_the_api_is_read_from_docstrings(site):
    shown = {(page.parent / src).resolve() for page in site.rglob("*.html")
             for src in re.findall(r'<img[^>]* src="([^"]+\.png)"', page.read_text())}
    assert {p.name for p in shown} >= {"dashboard.png", "timeline_train.png", "sweep_speedup_vs_stages.png"}
    assert all(p.is_file() for p in shown)
    assert "measured.breakdown" in (site / "tasks" / "results" / "index.html").read_text()
    assert "trial_overhead.py" in (site / "benchmarks" / "index.html").read_text()
    api = (site / "reference" / "api" / "costmodel.types" / "index.html").read_text()
    assert "The code between two consecutive candidate cuts" in api


def test_the_readmes_links_lead_to_files_that_exist():
    for readme in (ROOT / "README.md", ROOT / "results" / "README.md", ROOT / "benchmarks" / "README.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme.read_text()):
            if "://" not in target:
                assert (readme.parent / target).exists(), f"{readme.name}: {target}"


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
