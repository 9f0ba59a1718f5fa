"""Gateways: joining clusters into a supercluster (connections, interest modes, queue and reply routing)."""

from zonebus.gateway.manager import GatewayConfigError, GatewayManager

__all__ = ["GatewayConfigError", "GatewayManager"]
