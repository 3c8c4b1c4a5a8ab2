"""A command's flags as Markdown, read from its own argparse parser, so the docs' reference cannot drift from it."""

from __future__ import annotations

import argparse

__all__ = ["flag_names", "usage_markdown"]


def flag_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string the parser takes (``--stages``, ``-h``), in the order it lists them."""
    return [o for a in parser._actions for o in a.option_strings]


def _prose(text: str) -> str:
    """Help text as Markdown: ``<model>`` stays visible (outside code spans, not taken for an HTML tag)."""
    parts = text.replace("``", "`").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(_prose(text).split()).replace("|", "\\|")


def _args(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """What follows the flag, as ``--help`` writes it (``SIZE``, ``{cpu,cuda}``, ``STAGES [STAGES ...]``)."""
    formatter = parser._get_formatter()
    return formatter._format_args(action, formatter._get_default_metavar_for_optional(action))


def _default(action: argparse.Action) -> str:
    """The default a user gets without the flag; nothing for switches and for defaults the command derives."""
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction,
                           argparse._VersionAction)):
        return ""
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    return f"`{action.default}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The flag's help as ``--help`` prints it (``%(default)s`` filled in), with its choices."""
    text = action.help or ""
    if "%(" in text:
        params = {**vars(action), "prog": parser.prog}
        text = text % {k: ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v for k, v in params.items()}
    if action.choices is not None:
        text += f" (one of: {', '.join(f'`{c}`' for c in action.choices)})"
    return text


def usage_markdown(parser: argparse.ArgumentParser, title: str) -> str:
    """The page a user reads for one command: its usage, what it does, every flag with its default, the examples."""
    lines = [f"# `{title}`", "", "```text", parser.format_usage().strip(), "```", ""]
    if parser.description:
        lines += [_prose(parser.description.strip()), ""]
    generic = [g for g in parser._action_groups if g.title in ("options", "optional arguments")]
    for group in [g for g in parser._action_groups if g not in generic] + generic:
        actions = [a for a in group._group_actions if a.option_strings and a.help != argparse.SUPPRESS]
        if not actions:
            continue
        if group in generic:
            heading = "other flags" if len(parser._action_groups) > 2 else "flags"
        else:
            heading = group.title or "flags"
        lines += [f"## {heading}", ""]
        if group.description:
            lines += [_cell(group.description), ""]
        lines += ["| flag | default | what it does |", "| --- | --- | --- |"]
        for a in actions:
            metavar = "" if a.nargs == 0 else " " + _args(parser, a)
            flags = ", ".join(f"`{o}{metavar}`" for o in a.option_strings)
            lines.append(f"| {flags} | {_default(a)} | {_cell(_help(parser, a))} |")
        lines.append("")
    positionals = [a for a in parser._actions if not a.option_strings]
    if positionals:
        lines += ["## positional arguments", ""]
        lines += [f"- `{a.metavar or a.dest}`: {_cell(_help(parser, a))}" for a in positionals]
    if parser.epilog:
        lines += ["## examples", "", "As `--help` prints them:", "", "```text", parser.epilog.strip(), "```"]
    return "\n".join(lines) + "\n"
