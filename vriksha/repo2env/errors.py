"""Errors of the repo2env package; each says what went wrong and what to do."""

from __future__ import annotations

from vriksha.errors import VrikshaError


class Repo2EnvError(VrikshaError):
    """Something about turning a repository into tasks went wrong."""


class SourceError(Repo2EnvError, ValueError):
    """The input (directory, git checkout, sdist archive, index name) cannot be used."""


class BootstrapError(Repo2EnvError):
    """The project's virtual environment or its baseline test run could not be set up."""


class TaskFormatError(Repo2EnvError, ValueError):
    """A task directory or dataset manifest is missing pieces or does not match its hashes."""
