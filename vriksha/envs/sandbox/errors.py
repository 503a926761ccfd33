"""The sandbox's errors: a bad request, and a sandbox that cannot run (or cannot isolate) here."""

from __future__ import annotations

from vriksha.errors import VrikshaError

__all__ = ["SandboxError", "SandboxUnavailableError", "ALLOW_UNSANDBOXED_ENV"]

ALLOW_UNSANDBOXED_ENV = "VRIKSHA_ALLOW_UNSANDBOXED"


class SandboxError(VrikshaError, ValueError):
    """The sandbox was asked for something it cannot do (bad file path, empty command)."""


class SandboxUnavailableError(VrikshaError, RuntimeError):
    """The sandbox cannot run on this machine, or cannot give the protections untrusted code needs.

    The message names what failed or what is missing, and how to proceed (fix the machine, or opt in
    with VRIKSHA_ALLOW_UNSANDBOXED=1 to run untrusted code with the protections that remain)."""
