"""JetStream's internal subscriptions besides the API (a mixin of `JetStreamService`): pull requests
(`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`), direct gets (`$JS.API.DIRECT.GET.<stream>`), acks
(`$JS.ACK.<stream>.>`) and push flow control replies (`$JS.FC.>`), each handed to its stream or consumer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.stream import direct

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer
    from zonebus.stream.service import JetStreamService


class Inbound:
    """`_on_pull`, `_on_direct_get`, `_on_ack`, `_on_fc` and `register_fc`, mixed into `JetStreamService`."""

    def _on_direct_get(self: JetStreamService, subject: str, reply: str | None, payload: bytes) -> None:
        if not reply:
            return
        name, key = direct.split_subject(subject)
        stream = self.streams.get(name)
        if stream is None or not stream.cfg.get("allow_direct"):
            self.send(reply, b"", headers=direct.no_responders(subject))
            return
        for hdrs, data in direct.answer(stream, key, payload):
            self.send(reply, data, headers=hdrs)

    def _on_pull(self: JetStreamService, subject: str, reply: str | None, payload: bytes) -> None:
        toks = subject.split(".")
        if len(toks) != 7 or not reply:
            return
        stream = self.streams.get(toks[5])
        cons = stream.consumers.get(toks[6]) if stream else None
        if cons is None:
            return  # nats-server does not answer either: the client sees no responders or a timeout
        cons.waiting.add(reply, payload)

    def _on_ack(self: JetStreamService, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        toks = subject.split(".")
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        if len(toks) != 9:
            return
        stream = self.streams.get(toks[2])
        cons = stream.consumers.get(toks[3]) if stream else None
        if cons is None:
            if reply:
                self.send(reply, b"")
            return
        try:
            sseq, dseq = int(toks[5]), int(toks[6])
        except ValueError:
            return
        cons.on_ack(sseq, dseq, payload, reply)

    def _on_fc(self: JetStreamService, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        cons = self._fc.pop(subject, None)
        if cons is not None:
            cons.on_flow_control_reply(subject)

    def register_fc(self: JetStreamService, token: str, consumer: Consumer) -> None:
        self._fc[token] = consumer
