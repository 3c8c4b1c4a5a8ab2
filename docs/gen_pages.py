"""Pages made at build time (mkdocs-gen-files): each command's flags from its own parser, the Python API from
docstrings, and the pictures the project's own commands drew under results/examples."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import mkdocs_gen_files

from pipeline.core.usage import usage_markdown

os.environ["COLUMNS"] = "80"  # argparse wraps the usage line at the terminal's width: the page's, not the shell's

COMMANDS = ("pipeline.run", "pipeline.export", "search.optimize", "search.sweep", "costmodel.profile",
            "costmodel.validate")
"""Every command a user types, as ``python -m <name>``; each module has ``parser()``."""

API = {
    "Plans and results (pipeline.core)": ("pipeline.core.spec", "pipeline.core.plan", "pipeline.core.result",
                                          "pipeline.core.policies", "pipeline.core.budget", "pipeline.core.stack",
                                          "pipeline.core.sharding"),
    "Running plans (pipeline)": ("pipeline.run", "pipeline.rounds", "pipeline.export", "pipeline.ranks.launch",
                                 "pipeline.ranks.pooling", "pipeline.ranks.protocol", "pipeline.peers.rules",
                                 "pipeline.peers.formats"),
    "Cost model (costmodel)": ("costmodel.types", "costmodel.profile", "costmodel.simulate", "costmodel.partition",
                               "costmodel.replay", "costmodel.train", "costmodel.validate"),
    "Search (search)": ("search.optimize", "search.sweep", "search.study.config", "search.plans.space",
                        "search.plans.sampler", "search.judging.racing", "search.judging.ties",
                        "search.judging.confirm", "search.trials.metric", "search.outputs.export",
                        "search.outputs.summary"),
}
"""The public Python API, by what a user does with it; each module gets a page of its docstrings."""

PICTURES = {
    "timeline_train.png": "training-deit_small-b32-s2-2cores/timeline_best.png",
    "timeline_llama.png": "search-llama-14.5GiB-s4-4.85GiB-2cores/timeline_best.png",
    "timeline_head_bound.png": "peers-llama64k-2cores/s4-train/timeline_best.png",
    "sweep_speedup_vs_stages.png": "sweep-deit_small-b32-cpu-2cores-machine/speedup_vs_stages.png",
    "sweep_predicted_vs_measured.png": "sweep-deit_small-b32-cpu-2cores-machine/predicted_vs_measured.png",
    "sweep_compute_comm.png": "sweep-deit_small-b32-cpu-2cores-machine/compute_comm.png",
    "sweep_timeline_best_s4.png": "sweep-deit_small-b32-cpu-2cores-machine/timeline_best_s4.png",
    "sweep_timeline_pippy_s4.png": "sweep-deit_small-b32-cpu-2cores-machine/timeline_pippy_s4.png",
}
"""Pictures in the pages, copied at build time from the examples that made them (not kept twice in git)."""

ROOT = Path(__file__).resolve().parents[1]

nav = ["# Reference", "", "## Commands", ""]
for name in COMMANDS:
    page = f"reference/cli/{name}.md"
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(usage_markdown(importlib.import_module(name).parser(), f"python -m {name}"))
    nav.append(f"- [`python -m {name}`](cli/{name}.md)")
for section, modules in API.items():
    nav += ["", f"## {section}", ""]
    for name in modules:
        with mkdocs_gen_files.open(f"reference/api/{name}.md", "w") as f:
            f.write(f"# `{name}`\n\n::: {name}\n")
        nav.append(f"- [`{name}`](api/{name}.md)")
with mkdocs_gen_files.open("reference/index.md", "w") as f:
    f.write("\n".join(nav) + "\n")
for dest, src in PICTURES.items():
    with mkdocs_gen_files.open(f"images/{dest}", "wb") as f:
        f.write((ROOT / "results" / "examples" / src).read_bytes())
