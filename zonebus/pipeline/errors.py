"""Errors the cost pipeline reports to the user as one clear message (never a stack trace)."""

from __future__ import annotations


class PipelineInputError(Exception):
    """Bad input (ledger, prices, topology, workload): the message says what and where."""


class PipelineOptionError(PipelineInputError):
    """A bad command-line option value: the message names the option (exit status 2)."""


class PipelineEnvironmentError(PipelineOptionError):
    """The machine lacks what the job needs (a Java runtime for Spark): the message says what to install.
    Reported like a bad option (exit status 2), before anything is started."""
