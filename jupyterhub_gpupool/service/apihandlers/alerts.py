"""Alerts the service raised itself (admins), and the demo's simulated GPU fault that shows
one: ``GET alerts``, ``POST nodes/{name}/gpus/{gpu}/simulated-fault``."""

from __future__ import annotations

from .base import APIError, APIHandler, needs


class AlertsHandler(APIHandler):
    """``GET alerts``: the alerts in force, most severe first (``service/alerts.py``)."""

    route_name = "alerts"

    @needs("admin", "read the pool's alerts")
    def get(self) -> None:
        monitor = self.settings.get("alerts")
        items = monitor.active() if monitor is not None else []
        self.write_json({"items": items, "total": len(items)})


class SimulatedFaultHandler(APIHandler):
    """``POST nodes/{name}/gpus/{gpu}/simulated-fault {"lost": bool}``: with the service's own
    simulated telemetry (``telemetry_source = sim``, the demo), make a simulated GPU fall off
    the bus, or come back; the node's inventory is read again at once, through the same NVML
    reader as real hardware."""

    route_name = "simulated-fault"

    @needs("admin", "simulate GPU faults")
    async def post(self, name: str, gpu: str) -> None:
        body = self.json_body({"lost": (bool, True)})
        telemetry = self.settings.get("telemetry")
        if telemetry is None or not telemetry.simulates(name):
            raise APIError(
                "conflict",
                f"node {name} is not simulated by this service (telemetry_source = sim only)",
            )
        if not telemetry.set_lost(name, gpu, body["lost"]):
            raise APIError("not_found", f"node {name} has no simulated GPU {gpu}")
        await telemetry.check_inventory(name)
        self.write_json({"node": name, "gpu": gpu, "lost": body["lost"]})


default_handlers = [
    (r"alerts", AlertsHandler),
    (r"nodes/([^/]+)/gpus/([^/]+)/simulated-fault", SimulatedFaultHandler),
]
