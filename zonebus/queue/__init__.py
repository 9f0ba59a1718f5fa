"""Durable queue groups (seed 003, RobustMQ's storage-driven queue groups, made zone-aware).

A publish on a durable group's subjects is stored first (`log.GroupLog`), never routed to the group's members
directly; one primary server per group (`dispatcher.Dispatcher`) reads the log and pushes each message to one
member, preferring the server that stored it, then its zone, then any other. Modules:
- `model`: the group specs, subject matching, ack subjects and PubAck bodies;
- `log`: the group's log (a file store on the shared directory, or local disk);
- `intercept`: the server core's publish interceptor (capture + keeping members off the core path);
- `dispatcher`: the primary's pull-then-push loop, acks and redelivery;
- `wire`: the `qgroup` link channel between servers (forwarded publishes, remote deliveries);
- `service`: the extension wiring it together (primaries through the meta group, reload);
- `monitoring`: the `/queuez` page.
"""
