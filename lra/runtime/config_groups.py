"""Every config-group choice a command names must exist: ``experiment=listops_dep`` is refused before anything
runs or is written, with the options of the group and the closest one (``did you mean experiment=listops_deep?``).

Hydra refuses an unknown choice of a group whose default is not ``optional`` itself, in a message that lists the
options but names no closest one, and ignores one of an ``optional`` group silently (``optional experiment: null``
trained the plain recipe). :func:`check_command_line` runs before Hydra (``lra.train.main``, ``lra.evaluate.main``)
over the command line's overrides, every group of ``configs/`` (``experiment``, ``attention``, ``model/positions``,
...; Hydra's own ``hydra/...`` groups are Hydra's to check), single values and sweeps alike.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from lra.config import CONFIG_DIR

PLURAL = {"experiment": "experiments", "attention": "attention variants", "task": "tasks"}


def group_options(group: str, config_dirs: Sequence[Path] = (CONFIG_DIR,)) -> list[str]:
    """The options of config group ``group`` (``<config dir>/<group>/*.yaml`` in any of ``config_dirs``), or []
    when ``group`` is no group of ours (a plain key such as ``seed``, or one of Hydra's own groups)."""
    if group.split("/")[0] == "hydra":
        return []
    return sorted({path.stem for folder in config_dirs if (Path(folder) / group).is_dir()
                   for path in (Path(folder) / group).glob("*.yaml")})


def closest(value: str, options: list[str]) -> str | None:
    """The option nearest to ``value`` in spelling (difflib's ratio >= 0.6), or None."""
    found = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_choice(group: str, value: str, options: list[str]) -> str:
    """What is wrong with ``group=value`` and what to do: the closest option, then all of them."""
    near = closest(value, options)
    guess = f" Did you mean {group}={near}?" if near else ""
    return (f"{group}={value}: no config 'configs/{group}/{value}.yaml'.{guess} "
            f"The {PLURAL.get(group, f'options of {group}')}: {', '.join(options)}")


def chosen_values(override) -> list[str]:
    """The values an override chooses: one, or each of a sweep's (``attention=a,b``); [] for what cannot be listed
    (a ``glob`` sweep: Hydra lists it)."""
    try:
        if override.is_sweep_override():
            return [str(value) for value in override.sweep_string_iterator()]
        return [override.get_value_element_as_str()]
    except Exception:
        return []


def searched_dirs(overrides: list, config_dir: str | None) -> list[Path] | None:
    """The config dirs Hydra searches besides ours: ``--config-dir`` and ``hydra.searchpath=[file://...]``; None
    when one of them cannot be listed here (a ``pkg://`` path: then Hydra checks the choices itself)."""
    dirs = [Path(config_dir)] if config_dir else []
    for override in overrides:
        if override.key_or_group == "hydra.searchpath":
            for entry in override.value() or []:
                if not str(entry).startswith("file://"):
                    return None
                dirs.append(Path(str(entry)[len("file://"):]))
    return dirs


def unknown_choices(overrides: list[str], config_dirs: Sequence[Path] = (CONFIG_DIR,),
                    config_dir: str | None = None) -> list[str]:
    """One message (:func:`unknown_choice`) per override value naming an option of a group of ours that has no
    config in ``config_dirs`` or a dir the command adds (:func:`searched_dirs`); ``null`` (no choice) and deletions
    (``~group``) are not checked."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    extra = searched_dirs(parsed, config_dir)
    if extra is None:
        return []
    problems = []
    for override in parsed:
        group = override.key_or_group
        options = group_options(group, [*config_dirs, *extra])
        if not options or override.is_delete():
            continue
        for value in chosen_values(override):
            if value not in options and value != "null":
                problems.append(unknown_choice(group, value, options))
    return problems


def check_command_line(argv: list[str] | None = None, config_dirs: Sequence[Path] = (CONFIG_DIR,)) -> None:
    """Exit with one ``[lra] FAILED:`` line when the command line (``sys.argv[1:]``) names a config-group option
    that has no config; nothing has run or been written then. A command line Hydra cannot parse is left to Hydra."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
        problems = unknown_choices(args.overrides or [], config_dirs, args.config_dir)
    except (SystemExit, Exception):  # Hydra reports its own usage and parse errors
        return
    if problems:
        raise SystemExit(f"[lra] FAILED: {'; '.join(problems)}. Nothing was run or written.")
