"""What every part that reaches one Kubernetes API server is configured with, alike: the
server's address and credentials (three traits), and the client built from them."""

from __future__ import annotations

from traitlets import Unicode

from .client import KubeAPI, KubeClient


def api_traits() -> tuple[
    Unicode[str, str | bytes], Unicode[str, str | bytes], Unicode[str, str | bytes]
]:
    """``api_host``, ``token_file``, ``ca_file``: assign them in the class body (each class
    keeps its own traits, so its configuration reference lists them)."""
    return (
        Unicode(
            "",
            help="The Kubernetes API server, e.g. https://10.0.0.1:6443. Empty: the API of the "
            "pod the service runs in (its service account).",
        ).tag(config=True),
        Unicode("", help="File with the bearer token for api_host (read at every request).").tag(
            config=True
        ),
        Unicode("", help="CA bundle of api_host's certificate.").tag(config=True),
    )


def make_client(api_host: str, token_file: str, ca_file: str) -> KubeClient:
    """The client of ``api_host`` (none: the pod's own API server, its service account)."""
    api = (
        KubeAPI(api_host, token_file=token_file, ca_file=ca_file)
        if api_host
        else KubeAPI.in_cluster()
    )
    return KubeClient(api)


class OneAPIServer:
    """The client of the class's ``api_host``, built on first use (no I/O in a constructor),
    and its closing: for a configurable that assigns ``api_traits()``."""

    api_host: str
    token_file: str
    ca_file: str
    _client: KubeClient | None = None

    def client(self) -> KubeClient:
        """The API client."""
        if self._client is None:
            self._client = make_client(self.api_host, self.token_file, self.ca_file)
        return self._client

    async def close(self) -> None:
        """Close the API client's connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None
