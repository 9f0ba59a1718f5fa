"""Meta-group errors, shaped like JetStream API errors so the API layer can answer with them unchanged.

`MetaError` is a `zonebus.protocol.jserrors.JSError`: it has `code`, `err_code`, `description` and `to_dict()`.
The texts are nats-server's (server/errors.json): a meta group without a leader or without quorum answers
10008 "JetStream system temporarily unavailable" (JSClusterNotAvailErr, HTTP 503); a placement that finds
too few servers answers 10005 (JSClusterNoPeersErrF, HTTP 400) whose description is the placement error,
e.g. "no suitable peers for placement, tags not matched ['az:z9']". Rejections decided while applying an
operation (stream not found, name in use...) use the stream registry's names.
"""

from __future__ import annotations

from typing import Any

from zonebus.protocol.jserrors import REGISTRY, JSError

# name -> (http code, err_code, description); names not in zonebus.protocol.jserrors.REGISTRY
META_REGISTRY: dict[str, tuple[int, int, str]] = {
    "cluster_not_avail": (503, 10008, "JetStream system temporarily unavailable"),
    "cluster_no_peers": (400, 10005, "{err}"),
    # an operation guarded by a writer epoch lost its race (another move won); internal callers retry or drop
    "stale_epoch": (500, 10009, "JetStream cluster can not handle request"),
}

NO_PEERS_TEXT = "no suitable peers for placement"


def lookup(name: str) -> tuple[int, int, str]:
    """The (http code, err_code, description template) of an error name, meta names first."""
    if name in META_REGISTRY:
        return META_REGISTRY[name]
    if name in REGISTRY:
        return REGISTRY[name]
    return REGISTRY["bad_request"]


class MetaError(JSError):
    """Root of the meta-group errors; `retriable` says whether the same request may succeed later."""

    retriable = False

    def __init__(self, name: str, description: str | None = None, **fmt: Any) -> None:
        code, err_code, text = lookup(name)
        self.name = name
        self.code = code
        self.err_code = err_code
        if description is None:
            description = text.format(**fmt) if fmt else text
        self.description = description
        Exception.__init__(self, description)


class NoQuorum(MetaError):
    """This side of the cluster has no meta leader or no quorum: metadata writes are refused (10008)."""

    retriable = True

    def __init__(self, detail: str = "") -> None:
        super().__init__("cluster_not_avail")
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.description} ({self.detail})" if self.detail else self.description


class NotLeader(MetaError):
    """The meta leader changed while the proposal was in flight (10008).

    `outcome_unknown` is True when the proposal may still be applied by the new leader: the operations are
    idempotent or epoch-guarded, so the caller may resend it."""

    retriable = True

    def __init__(self, detail: str = "", outcome_unknown: bool = False) -> None:
        super().__init__("cluster_not_avail")
        self.detail = detail
        self.outcome_unknown = outcome_unknown

    def __str__(self) -> str:
        return f"{self.description} ({self.detail})" if self.detail else self.description


class NoSuitablePeers(MetaError):
    """Placement found fewer servers than `num_replicas` (10005), with nats-server's reasons appended."""

    def __init__(self, reasons: list[str] | None = None) -> None:
        text = ", ".join([NO_PEERS_TEXT, *(reasons or [])])
        super().__init__("cluster_no_peers", err=text)
        self.reasons = list(reasons or [])


class Rejected(MetaError):
    """The operation was refused by the replicated state (same answer on every server)."""


def error_result(name: str, description: str | None = None) -> dict[str, Any]:
    """The result of a refused operation, as stored and sent between servers."""
    if description is None:
        description = lookup(name)[2]
    return {"error": {"name": name, "description": description}}


def raise_for_result(result: Any) -> dict[str, Any]:
    """Return `result` when it reports success, else raise the error it carries."""
    if not isinstance(result, dict):
        raise Rejected("bad_request", f"unexpected meta result {result!r}")
    err = result.get("error")
    if err is None:
        return result
    name = str(err.get("name", "bad_request"))
    description = err.get("description")
    if name == "cluster_not_avail":
        raise NoQuorum(str(err.get("detail", "")))
    if name == "not_leader":
        raise NotLeader(str(err.get("detail", "")), outcome_unknown=bool(err.get("outcome_unknown")))
    if name == "cluster_no_peers":
        exc = NoSuitablePeers()
        exc.description = str(description)
        exc.args = (exc.description,)
        raise exc
    raise Rejected(name, None if description is None else str(description))


def to_result(exc: MetaError) -> dict[str, Any]:
    """The wire form of an error raised on the meta leader for a forwarded request."""
    err: dict[str, Any] = {"name": exc.name, "description": exc.description}
    if isinstance(exc, NotLeader):
        err = {"name": "not_leader", "detail": exc.detail, "outcome_unknown": exc.outcome_unknown}
    elif isinstance(exc, NoQuorum):
        err["detail"] = exc.detail
    return {"error": err}
