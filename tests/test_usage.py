"""A command's flags as Markdown: every flag in its group's table, one row each, whatever its help says."""

import argparse
import re

from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.usage import flag_names, usage_markdown


def _parser(help_text: str = "how many ranks") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tool", description="Does ``one`` thing to a <model>.",
                                epilog="example:\n  python -m tool --stages 2")
    g = p.add_argument_group("model")
    g.add_argument("--model", default="deit", help="timm name or hf:<model type>")
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="parameters' type")
    s = p.add_argument_group("search")
    s.add_argument("--stages", type=int, default=2, help=help_text)
    s.add_argument("--split", required=True, metavar="FILE", help="a plan")
    s.add_argument("--no-race", action="store_true", help="every plan the same repeats")
    s.add_argument("--device-memory", "--max-stage-memory", dest="device_memory", metavar="SIZE", help="per rank")
    return p


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| `")]


def test_every_flag_is_in_its_groups_table_with_its_default_and_choices():
    text = usage_markdown(_parser(), "python -m tool")
    assert flag_names(_parser()) == ["-h", "--help", "--model", "--dtype", "--stages", "--split", "--no-race",
                                     "--device-memory", "--max-stage-memory"]
    for flag in flag_names(_parser()):
        assert re.search(rf"`{re.escape(flag)}[ `]", text), flag
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## model", "## search", "## other flags", "## examples"]
    rows = {r.split("|")[1].strip(): r for r in _rows(text)}
    assert "`float32`" in rows["`--dtype {float32,bfloat16}`"] and "(one of: `float32`, `bfloat16`)" in rows[
        "`--dtype {float32,bfloat16}`"]
    assert "| required |" in rows["`--split FILE`"]
    assert rows["`--no-race`"].split("|")[2].strip() == ""
    assert "`--device-memory SIZE`, `--max-stage-memory SIZE`" in rows


def test_angle_brackets_stay_visible_and_code_spans_become_markdown():
    text = usage_markdown(_parser(), "python -m tool")
    assert "Does `one` thing to a &lt;model&gt;." in text
    assert "hf:&lt;model type&gt;" in text
    assert "python -m tool --stages 2" in text.split("## examples")[1]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_any_help_text_stays_one_row_of_three_cells(help_text):
    text = usage_markdown(_parser(help_text.replace("%", "%%")), "python -m tool")
    (row,) = [r for r in _rows(text) if r.startswith("| `--stages")]
    cells = re.split(r"(?<!\\)\|", row)
    assert len(cells) == 5 and cells[0] == "" and cells[-1] == ""
