"""The reclaimer as the hub runs it: ``configure_reclaimer`` registers it as a hub-managed
service, the hub starts ``jupyterhub-gpupool reclaimer`` with its token and API URL in the
environment, and it leads the pool's reclaim rounds with nothing else configured."""

from __future__ import annotations

from tests.fakes import HubEnv, request, wait_reconciled, wait_until

MANAGED = """
from jupyterhub_gpupool.hubconfig import configure_reclaimer
configure_reclaimer(
    c, service_url={api!r}.rsplit("/services/", 1)[0], args=["--interval=0.5", "--debug"]
)
"""


def test_the_hub_runs_the_reclaimer_and_it_leads(tmp_path, sqlite_url, demo_pool_file):
    env = HubEnv(tmp_path, sqlite_url, demo_pool_file, extra_config=MANAGED)
    with env.running():
        wait_reconciled(env)
        admin = env.token("admin")

        def led() -> list[dict]:
            events = request("GET", f"{env.api}/events?limit=1000", admin).json()["items"]  # type: ignore[index]
            return [e for e in events if e["kind"] == "reclaim-leader"]

        taken = wait_until(led, what="the hub-managed reclaimer to take the lead", step=0.3)
        assert taken[0]["actor"] == "service:gpupool-reclaimer"
        log = env.dir / "hub.log"  # a managed service's output goes to the hub's

        def rounds() -> bool:
            return "Round: 0 leases, 0 observed" in log.read_text(errors="replace")

        wait_until(rounds, what="a whole round (hub users read, round posted)", step=0.3)
        assert "unreachable" not in log.read_text(errors="replace")
