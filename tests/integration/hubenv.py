"""A real JupyterHub (with configurable-http-proxy) plus the pool service, for integration tests.

The pool service runs as an *external* hub service started by the test, so tests can kill it
(``kill -9``) and start it again against the same database. Tokens are real hub tokens: services
get theirs from the hub config, users get theirs from the hub's REST API.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jupyterhub_gpupool.demo import find_proxy

ROOT = Path(__file__).resolve().parents[2]


#: Ports this process has handed out: a port is picked free but bound only later (by a hub, a
#: proxy, a service), and the kernel may offer the same free port again meanwhile.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port nobody listens on right now, and not one handed out before by this process."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free TCP port that was not handed out already")


def chp_command() -> str:
    """configurable-http-proxy as the demo finds it (``make``'s local npm install, then PATH)."""
    try:
        return find_proxy()
    except OSError:
        pytest.fail("configurable-http-proxy not found: run `make test` (it installs it)")


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url`` answers at all (any HTTP status)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} while waiting for {url}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout}s")


def overridden(base: tuple[str, ...], extra: tuple[str, ...]) -> list[str]:
    """``base`` then ``extra`` command-line options, an ``--Option=value`` of ``extra``
    replacing the same option in ``base`` (traitlets refuses an option given twice)."""
    names = {a.split("=", 1)[0] for a in extra if a.startswith("--") and "=" in a}
    return [a for a in base if a.split("=", 1)[0] not in names] + list(extra)


@dataclass
class Response:
    """A minimal HTTP response."""

    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> object:
        """The body as JSON."""
        return json.loads(self.body)


def request(
    method: str, url: str, token: str | None = None, body: object = None, raw: bytes | None = None
) -> Response:
    """One HTTP request with a hub token; never raises for HTTP error statuses."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Response(r.status, r.read(), dict(r.headers))
    except urllib.error.HTTPError as e:
        return Response(e.code, e.read(), dict(e.headers))


HUB_CONFIG = """
import sys
c = get_config()
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {hub_port}
c.JupyterHub.hub_port = {hub_api_port}
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.auth_token = {proxy_token!r}
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.base_url = {base_url!r}
c.JupyterHub.db_url = "sqlite:///{dir}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{dir}/cookie_secret"
c.JupyterHub.pid_file = "{dir}/hub.pid"
# the pool's part is the shipped helper (docs/howto/spawners.md), so the tests run what users run
from jupyterhub_gpupool.hubconfig import configure_hub
configure_hub(
    c,
    command=None,
    service_url="http://127.0.0.1:{service_port}",
    service_token={service_token!r},
    spawner_token={spawner_token!r},
    agent_token={agent_token!r},
    admin_users=["admin"],
    spawner=None,
)
c.JupyterHub.services.append({{"name": "hub-admin", "api_token": {admin_api_token!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "hub-admin", "services": ["hub-admin"], "scopes": ["admin:users", "tokens",
      "admin:servers", "admin:groups"]}}
)
c.Authenticator.allowed_users = {users!r}
c.Authenticator.admin_users = {{"admin"}}
# the spawners of other hubs the pool serves (HubEnv.remote_spawners): services of this hub,
# the pool's, with the spawn scope (docs/source/howto/multi-cluster.md)
from jupyterhub_gpupool.service.scopes import SPAWN
for name, token in {remote!r}.items():
    c.JupyterHub.services.append({{"name": name, "api_token": token}})
    c.JupyterHub.load_roles.append({{"name": name, "services": [name], "scopes": [SPAWN]}})
"""

#: A hub that does not run the pool service (``HubEnv.pool_env``): its spawner reaches the
#: pool of another hub with a token of that hub; the pool is not one of this hub's services.
REMOTE_HUB_CONFIG = """
c.GPUPoolSpawnerMixin.pool_api_url = {api!r}
c.GPUPoolSpawnerMixin.pool_api_token = {spawner_token!r}
"""


@dataclass
class HubEnv:
    """A running hub + proxy, and (when started) the pool service as an external service."""

    dir: Path
    db_url: str
    pool_config: Path | None
    users: tuple[str, ...] = ("alice", "bob", "admin")
    hub_port: int = field(default_factory=free_port)
    hub_api_port: int = field(default_factory=free_port)
    proxy_api_port: int = field(default_factory=free_port)
    service_port: int = field(default_factory=free_port)
    service_token: str = field(default_factory=lambda: secrets.token_hex(16))
    spawner_token: str = field(default_factory=lambda: secrets.token_hex(16))
    agent_token: str = field(default_factory=lambda: secrets.token_hex(16))
    admin_api_token: str = field(default_factory=lambda: secrets.token_hex(16))
    #: configurable-http-proxy's API token (tests read its routes' ``last_activity``)
    proxy_token: str = field(default_factory=lambda: secrets.token_hex(16))
    service_args: tuple[str, ...] = ()
    #: the hub's ``base_url`` (the admin panel's tests run under a non-default one)
    base_url: str = "/"
    #: more hub configuration, appended (``{dir}``, ``{api}``, ``{spawner_token}``, ``{bin}``
    #: are filled in): e2e tests configure the pool's spawner here
    extra_config: str = ""
    #: how to run Python for the service (a benchmark prefixes ``-m cProfile -o FILE``)
    python: tuple[str, ...] = (sys.executable,)
    hub: subprocess.Popen | None = None
    service: subprocess.Popen | None = None
    user_tokens: dict[str, str] = field(default_factory=dict)
    #: names of other hubs' spawners this hub's pool serves: services of this hub with the
    #: spawn scope, their tokens in ``remote_tokens`` (see :meth:`second_hub`)
    remote_spawners: tuple[str, ...] = ()
    remote_tokens: dict[str, str] = field(default_factory=dict)
    #: the environment whose pool service this hub's spawner uses (None: its own)
    pool_env: HubEnv | None = None

    def __post_init__(self) -> None:
        for name in self.remote_spawners:
            self.remote_tokens.setdefault(name, secrets.token_hex(16))

    def second_hub(self, where: Path, spawner: str, **kw: object) -> HubEnv:
        """Another hub (in ``where``) whose spawner uses this environment's pool service with
        the token of ``spawner`` (one of ``remote_spawners``): start it after this one."""
        return HubEnv(
            where,
            self.db_url,
            None,
            pool_env=self,
            spawner_token=self.remote_tokens[spawner],
            **kw,  # type: ignore[arg-type]
        )

    @property
    def hub_url(self) -> str:
        """Public URL of the hub (through the proxy)."""
        return f"http://127.0.0.1:{self.hub_port}"

    @property
    def hub_api(self) -> str:
        """The hub's own REST API, addressed directly."""
        return f"http://127.0.0.1:{self.hub_api_port}{self.base_url}hub/api"

    @property
    def api(self) -> str:
        """The pool API, addressed directly (not through the proxy: faster for load tests)."""
        if self.pool_env is not None:
            return self.pool_env.api
        return f"http://127.0.0.1:{self.service_port}{self.service_prefix}api/v1"

    @property
    def proxied_api(self) -> str:
        """The pool API through the proxy, as browsers and servers reach it."""
        return f"{self.hub_url}{self.service_prefix}api/v1"

    @property
    def service_prefix(self) -> str:
        """The pool service's URL prefix (``/services/gpupool/`` under the hub's base URL)."""
        return f"{self.base_url}services/gpupool/"

    def start(self) -> None:
        """Start the pool service, then the hub (which checks external services as it starts);
        a hub of another environment's pool (``pool_env``) starts only the hub."""
        if self.pool_env is not None:
            self.start_hub()
            return
        self.start_service(wait=False)
        self.start_hub()
        wait_http(f"{self.api}/pool", 60, self.service)

    def start_hub(self) -> None:
        """Start JupyterHub and wait for its API.

        Ports are picked free but not held until the hub (or its proxy) binds them, so another
        process on a busy machine may take one first: then the hub exits with EADDRINUSE, and it
        is started again on fresh ports (the pool service too, which must know the hub's API
        port). Any other failure is raised at once.
        """
        for attempt in range(3):
            log = self.dir / "hub.log"
            seen = log.stat().st_size if log.exists() else 0
            try:
                self._start_hub_once()
                return
            except (RuntimeError, TimeoutError):
                self.stop_hub()
                text = log.read_bytes()[seen:].decode(errors="replace") if log.exists() else ""
                if "EADDRINUSE" not in text and "Address already in use" not in text:
                    raise
                if attempt == 2:
                    raise
            self.hub_port, self.hub_api_port = free_port(), free_port()
            self.proxy_api_port = free_port()
            if self.service is not None:  # it was told the old hub API port
                self.kill_service()
                self.start_service(wait=False)

    def _hub_config(self) -> str:
        """This hub's own configuration, before ``extra_config``."""
        if self.pool_env is not None:
            head = HUB_CONFIG[: HUB_CONFIG.index("# the pool's part")]
            tail = HUB_CONFIG[
                HUB_CONFIG.index('c.JupyterHub.services.append({{"name": "hub-admin"') :
            ]
            tail = tail[: tail.index("# the spawners of other hubs")]
            return head + REMOTE_HUB_CONFIG + tail
        return HUB_CONFIG

    def _start_hub_once(self) -> None:
        (self.dir / "jupyterhub_config.py").write_text(
            textwrap.dedent(
                self._hub_config().format(
                    hub_port=self.hub_port,
                    hub_api_port=self.hub_api_port,
                    proxy_api_port=self.proxy_api_port,
                    proxy_token=self.proxy_token,
                    chp=chp_command(),
                    dir=self.dir,
                    service_port=self.service_port,
                    service_token=self.service_token,
                    spawner_token=self.spawner_token,
                    agent_token=self.agent_token,
                    admin_api_token=self.admin_api_token,
                    users=set(self.users),
                    base_url=self.base_url,
                    remote=self.remote_tokens,
                    api=self.api,
                )
            )
            + textwrap.dedent(self.extra_config).format(
                dir=self.dir,
                api=self.api,
                spawner_token=self.spawner_token,
                bin=str(Path(sys.executable).parent),
            )
        )
        log = open(self.dir / "hub.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.hub = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.dir / "jupyterhub_config.py")],
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_http(f"{self.hub_api}/", 60, self.hub)
        deadline = time.monotonic() + 60
        while not self._routed():  # the proxy listens and routes /hub/
            if self.hub.poll() is not None:  # it was another process on our port that answered
                raise RuntimeError(f"the hub exited with {self.hub.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("the proxy never routed /hub/")
            time.sleep(0.1)
        for user in self.users:
            r = request("POST", f"{self.hub_api}/users/{user}", self.admin_api_token)
            assert r.status in (201, 409), r.body

    def _routed(self) -> bool:
        """Whether the proxy answers for the hub (another test's process may hold a port this
        hub was given for a moment: then the hub exits with EADDRINUSE and starts again)."""
        try:
            return request("GET", f"{self.hub_url}{self.base_url}hub/api/").status == 200
        except OSError:  # not listening yet (URLError), or not answering in time
            return False

    def proxy_routes(self) -> dict[str, dict]:
        """configurable-http-proxy's routing table: prefix → ``target``, ``last_activity``
        (what the hub copies into its users' ``last_activity``)."""
        r = request("GET", f"http://127.0.0.1:{self.proxy_api_port}/api/routes", self.proxy_token)
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    def service_env(self) -> dict[str, str]:
        """The environment a hub gives a managed service."""
        env = dict(os.environ)
        env.update(
            JUPYTERHUB_API_TOKEN=self.service_token,
            JUPYTERHUB_API_URL=f"http://127.0.0.1:{self.hub_api_port}{self.base_url}hub/api",
            JUPYTERHUB_SERVICE_NAME="gpupool",
            JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{self.service_port}",
            JUPYTERHUB_SERVICE_PREFIX=self.service_prefix,
            JUPYTERHUB_BASE_URL=self.base_url,
            JUPYTERHUB_CLIENT_ID="service-gpupool",
            JUPYTERHUB_OAUTH_CALLBACK_URL=f"{self.service_prefix}oauth_callback",
            JUPYTERHUB_PUBLIC_HUB_URL=self.hub_url,
        )
        return env

    def start_service(self, *extra: str, wait: bool = True) -> None:
        """Start (or restart) the pool service and wait until it answers. An ``extra``
        ``--Option=value`` replaces the same option of ``service_args``."""
        args = [
            *self.python,
            "-m",
            "jupyterhub_gpupool.cli",
            "service",
            f"--db-url={self.db_url}",
        ]
        if self.pool_config is not None:
            args.append(f"--pool-config={self.pool_config}")
        log = open(self.dir / "service.log", "ab")  # noqa: SIM115
        self.service = subprocess.Popen(
            [*args, *overridden(self.service_args, extra)],
            cwd=self.dir,
            env=self.service_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if wait:
            wait_http(f"{self.api}/pool", 60, self.service)

    def kill_service(self, sig: int = signal.SIGKILL) -> None:
        """Stop the pool service abruptly (SIGKILL by default)."""
        if self.service is not None and self.service.poll() is None:
            os.killpg(self.service.pid, sig)
            self.service.wait(30)
        self.service = None

    def token(self, user: str, scopes: list[str] | None = None) -> str:
        """A fresh API token for ``user`` (all the user's scopes, or only ``scopes``)."""
        body: dict[str, object] = {"note": f"test-{uuid.uuid4().hex[:6]}"}
        if scopes is not None:
            body["scopes"] = scopes
        r = request("POST", f"{self.hub_api}/users/{user}/tokens", self.admin_api_token, body)
        assert r.status == 201, r.body
        return r.json()["token"]  # type: ignore[index]

    def login(self, user: str) -> urllib.request.OpenerDirector:
        """A cookie session logged in through the hub's login form (the dummy authenticator)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(f"{self.hub_url}{self.base_url}hub/login", timeout=30).read()
        xsrf = next(c.value for c in jar if c.name == "_xsrf")
        form = urllib.parse.urlencode({"username": user, "password": "x", "_xsrf": xsrf})
        opener.open(f"{self.hub_url}{self.base_url}hub/login", form.encode(), timeout=30).read()
        assert any(c.name == "jupyterhub-session-id" for c in jar), "login failed"
        return opener

    def start_agent(
        self, node: str, pool_config: Path, interval: float, cluster: str | None = None
    ) -> subprocess.Popen:
        """The node agent command on the simulated NVML of ``pool_config``'s ``node``,
        reporting to this service with the agent token (text output on its stdout), naming
        ``cluster`` when given (``--cluster``)."""
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterhub_gpupool.telemetry.agent",
                f"--service-url={self.api}",
                f"--node={node}",
                f"--interval={interval}",
                "--source=sim",
                f"--pool-config={pool_config}",
                *([f"--cluster={cluster}"] if cluster else []),
            ],
            env={**os.environ, "GPUPOOL_AGENT_TOKEN": self.agent_token},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def server_token(self, user: str) -> str:
        """A token with exactly the scopes of the hub's ``server`` role for ``user``."""
        return self.token(
            user,
            [
                f"users:activity!user={user}",
                f"access:servers!server={user}/",
                f"custom:gpupool:use!user={user}",
            ],
        )

    @contextmanager
    def running(self) -> Iterator[HubEnv]:
        """Start everything, hand it over, stop it; print the logs when something failed."""
        try:
            self.start()
            yield self
        except BaseException:
            print(self.logs())
            raise
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop everything (service first)."""
        self.kill_service(signal.SIGTERM)
        self.stop_hub()

    def stop_hub(self) -> None:
        """Stop JupyterHub and its proxy (SIGTERM, then SIGKILL after 20 s)."""
        if self.hub is not None and self.hub.poll() is None:
            os.killpg(self.hub.pid, signal.SIGTERM)
            try:
                self.hub.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.hub.pid, signal.SIGKILL)
        self.hub = None

    def logs(self) -> str:
        """Tail of the hub and service logs (for failure messages)."""
        out = []
        for name in ("hub.log", "service.log"):
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name}\n" + p.read_text(errors="replace")[-4000:])
        return "\n".join(out)


#: Hub configuration for tests that spawn real single-user servers through the pool's simple
#: local spawner (``HubEnv.extra_config``): JupyterLab servers in per-user homes under the
#: test's folder, the pool asked with the spawner's token, queue progress polled fast.
SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "gpupool-simple"
c.GPUPoolSpawnerMixin.pool_api_url = {api!r}
c.GPUPoolSpawnerMixin.pool_api_token = {spawner_token!r}
c.GPUPoolSpawnerMixin.queue_poll_interval = 0.3
c.Spawner.cmd = [{bin!r} + "/jupyterhub-singleuser"]
c.Spawner.args = ["--allow-root"] if __import__("os").geteuid() == 0 else []
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 60
c.SimpleLocalProcessSpawner.home_dir_template = "{dir}/home/{{username}}"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.load_roles.append(
    {{"name": "e2e-state", "services": ["hub-admin"], "scopes": ["admin:server_state"]}}
)
"""
