"""The ``gpupool-provisioner`` kernel provisioner: a local kernel process pinned to a GPU the
kernel holds a lease of its own for (not its server).

``pre_launch`` asks the pool for a kernel lease of the kernelspec's offer (its
``metadata.kernel_provisioner.config.offer``) with the server's token, waits in the queue with
a log line per position change (bounded by ``queue_timeout``; a cancelled start or a lease
released meanwhile ends the wait), then sets ``CUDA_VISIBLE_DEVICES`` /
``NVIDIA_VISIBLE_DEVICES`` to the granted device. While it waits, the start is on this
server's board (``board.BOARD``: the notebook shows its position and estimate, and Cancel
there gives the queued lease back). A kernel that cannot get one does not start: the error
says why (quota, offer gone, pool unreachable, no GPU in time, cancelled) and Jupyter shows it
as the kernel's start failure; other kernels are not touched. While the kernel runs, its
execution state is reported every ``report_interval`` (the lease's heartbeat and the pool's
idleness signal); an idle notice is logged and put on the board (the notebook shows it), and a
lease the pool ends (idle reclaim, an admin) shuts the kernel down. ``cleanup`` releases the
lease, except on a restart (same kernel, same offer: it keeps its GPU). With ``carry_state``,
the variables of a local kernel the pool reclaims are saved at its notice and restored in the
notebook's next GPU kernel (``kernels/carry.py``).

``launcher`` says where the kernel runs: ``local`` (this server's process, pinned by
``CUDA_VISIBLE_DEVICES``) or ``kubernetes`` (a pod on the granted node holding the device,
connected back to this server: ``kernels/kubelaunch.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from tornado import web
from traitlets import Bool, Float, TraitError, Unicode, default

from ..jobs.runner import NotReady, device_env
from ..kube.client import KubeError
from ..poolclient import PoolClient, PoolRefused, PoolUnavailable
from . import carry
from .board import BOARD
from .kubelaunch import KubeLaunch
from .kubepod import LAUNCHER_MODULE

#: Lease states in which the kernel may run.
_HELD = ("granted", "active", "reclaiming")


class GpuKernelError(web.HTTPError):
    """Why a GPU kernel was not started (the message is the user's). An ``HTTPError``, so
    Jupyter Server answers the kernel start with this message (an other exception is its bare
    "Unhandled error") and JupyterLab shows it in its kernel error dialog."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(status, message, reason="GPU kernel not started")
        self.message = message

    def __str__(self) -> str:
        return self.message


class GpuPoolProvisioner(KubeLaunch):
    """A kernel on a GPU leased from the pool for this kernel alone: a local process, or a
    pod on the granted node (``launcher``)."""

    offer = Unicode("", help="The pool offer this kernel asks for (from the kernelspec).").tag(
        config=True
    )
    offer_name = Unicode(
        "", help="The offer's display name, as the notebook shows it (default: the offer)."
    ).tag(config=True)
    queue_timeout = Float(
        600.0,
        help="Seconds a kernel start waits in the pool's queue before it gives up (its request "
        "withdrawn, the start failing with the queue position it had).",
    ).tag(config=True)
    poll_interval = Float(
        1.0, help="Seconds between looks at the queue while the kernel waits for its GPU."
    ).tag(config=True)
    report_interval = Float(
        15.0,
        help="Seconds between reports of the kernel's execution state to the pool (its lease's "
        "heartbeat: keep it well under PoolService.kernel_report_timeout).",
    ).tag(config=True)
    api_url = Unicode(
        help="The pool service's API. Default: $GPUPOOL_API_URL, as the lab extension reads it."
    ).tag(config=True)
    api_token = Unicode(
        help="The token the pool is asked with. Default: $JUPYTERHUB_API_TOKEN (the server's)."
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds one request to the pool may take.").tag(config=True)
    carry_state = Bool(
        True,
        help="Save the variables of a kernel the pool reclaims for idleness (at its notice, with "
        "dill, each on its own) and restore them in the notebook's next GPU kernel; names that "
        "cannot be pickled are listed. Needs dill in the kernel's environment (the kernels "
        "extra brings it); without it nothing is saved and the notice says so.",
    ).tag(config=True)
    state_dir = Unicode(
        help="Where carried-over kernel state is kept (files readable by the user alone). "
        "Default: <jupyter data dir>/gpupool-kernel-state."
    ).tag(config=True)

    @default("api_url")
    def _api_url(self) -> str:
        return os.environ.get("GPUPOOL_API_URL", "")

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("state_dir")
    def _state_dir(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return str(Path(jupyter_data_dir()) / "gpupool-kernel-state")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease: dict[str, Any] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._noticed: str | None = None
        self._client: PoolClient | None = None
        self._shutting: asyncio.Future[None] | None = None
        self._reported_at: datetime | None = None
        self._session: str | None = None  # the notebook's path (Jupyter's JPY_SESSION_NAME)
        self._own: tuple[datetime, datetime] | None = None  # our own cell's activity
        self._saved: str | None = None  # what the save at the standing notice said
        self._pod_env: dict[str, str] = {}
        self._pod_cwd: str | None = None

    @property
    def client(self) -> PoolClient:
        """The pool client (made on first use, from the traits as configured)."""
        if self._client is None:
            if not self.api_url or not self.api_token:
                raise GpuKernelError(
                    "This server was not told where the GPU pool is ($GPUPOOL_API_URL, "
                    "$JUPYTERHUB_API_TOKEN): GPU kernels cannot start here.",
                    500,
                )
            self._client = PoolClient(self.api_url, self.api_token, timeout=self.request_timeout)
        return self._client

    # -- start -------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Get the kernel's GPU (waiting in the queue), then prepare the launch on it: a
        local process pinned to it, or the pod's environment and directory."""
        try:
            lease, pin = await self.acquire()
        except GpuKernelError:
            self._forget_failed_start()
            raise
        if self.launcher == "kubernetes":
            # the pod gets the kernelspec's variables, not this server's (its token)
            self._pod_env = dict(self.kernel_spec.env or {}) if self.kernel_spec else {}
            self._pod_cwd = kwargs.pop("cwd", None)
            kwargs.pop("extra_arguments", None)
            kwargs["cmd"] = [self.python, "-m", LAUNCHER_MODULE]
            kwargs = await KernelProvisionerBase.pre_launch(self, **kwargs)
            return kwargs
        kwargs = await super().pre_launch(**kwargs)
        self._session = kwargs["env"].get("JPY_SESSION_NAME") or None
        kwargs["env"].update(pin)
        kwargs["env"]["GPUPOOL_KERNEL_LEASE"] = str(lease["id"])
        self.log.info(
            "GPU kernel %s: lease %s on %s (%s)",
            self.kernel_id,
            lease["id"],
            lease.get("node"),
            pin["CUDA_VISIBLE_DEVICES"],
        )
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the kernel: a local process, or its pod (the connection info is then the
        pod's answer)."""
        if self.launcher != "kubernetes":
            return await super().launch_kernel(cmd, **kwargs)
        if self.lease is None:
            raise GpuKernelError("The kernel's GPU lease ended before its pod was made.")
        try:
            info = await self.kube_launch(
                self.lease, str(self.kernel_id), self._pod_env, self._pod_cwd
            )
        except (RuntimeError, ValueError, KubeError) as e:
            await self.release()
            raise GpuKernelError(f"The GPU kernel's pod did not start: {e}") from None
        except BaseException:  # the start given up (cancelled): no pod, no lease
            await self.release()
            raise
        self.connection_info = info
        self.log.info("GPU kernel %s: pod %s at %s", self.kernel_id, self._pod, info["ip"])
        return info

    @property
    def has_process(self) -> bool:
        if self.launcher == "kubernetes":
            return self._pod is not None
        return bool(super().has_process)

    async def poll(self) -> int | None:
        if self.launcher == "kubernetes":
            return await self.kube_poll()
        return await super().poll()

    async def wait(self) -> int | None:
        if self.launcher == "kubernetes":
            return await self.kube_wait()
        return await super().wait()

    async def send_signal(self, signum: int) -> None:
        if self.launcher == "kubernetes":
            return await self.kube_signal(signum)
        return await super().send_signal(signum)

    async def kill(self, restart: bool = False) -> None:
        if self.launcher == "kubernetes":
            return await self.kube_delete_pod(0)
        return await super().kill(restart=restart)

    async def terminate(self, restart: bool = False) -> None:
        if self.launcher == "kubernetes":
            return await self.kube_delete_pod()
        return await super().terminate(restart=restart)

    def _forget_failed_start(self) -> None:
        """jupyter_client (8.x) keeps a kernel whose start failed among the server's pending
        kernels for good, and the server's stop then fails on it ("Kernel does not exist")
        before it has shut the running kernels down: the stopped server hangs, its GPU kernels
        left running. A start this provisioner refused is no kernel: it is taken off."""
        pending = getattr(getattr(self.parent, "parent", None), "_pending_kernels", None)
        if isinstance(pending, dict):
            pending.pop(str(self.kernel_id), None)

    async def acquire(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The kernel's lease once granted and its devices ready, and the pinning; or
        ``GpuKernelError`` (no lease is left behind)."""
        if not self.offer:
            raise GpuKernelError("This GPU kernelspec names no offer (config.offer).", 500)
        kid = str(self.kernel_id)
        try:
            lease = await self.client.request_kernel(self.offer, kid)
        except PoolUnavailable as e:
            raise GpuKernelError(
                f"The GPU pool is unreachable ({e.message}): the kernel was not started. "
                "Other kernels keep working; try again later."
            ) from None
        except PoolRefused as e:
            if e.code == "unknown_offer":
                raise GpuKernelError(
                    f"The GPU offer {self.offer!r} is no longer in the pool: pick another GPU "
                    "kernel (the list is refreshed from the pool's offers).",
                    404,
                ) from None
            raise GpuKernelError(f"The GPU pool refused {self.offer!r}: {e.message}", 409) from None
        self.lease = lease
        loop = asyncio.get_running_loop()
        deadline, shown = loop.time() + self.queue_timeout, None
        cancel: asyncio.Event | None = None
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    raise GpuKernelError(
                        "GPU kernel start cancelled: your place in the queue for "
                        f"{self.offer_name or self.offer} was given back.",
                        409,
                    )
                state = lease.get("state")
                if state in _HELD:
                    try:
                        return lease, device_env(lease)
                    except NotReady:  # a MIG slice still being made: ready in a round or two
                        cancel = self._on_board(lease, "preparing")
                elif state == "queued":
                    if lease.get("reason") == "quota":
                        raise GpuKernelError(
                            f"GPU quota exceeded ({lease.get('message')}): shut down another GPU "
                            "kernel or GPU server first. The kernel was not started.",
                            409,
                        )
                    cancel = self._on_board(lease, "queued")
                    where = (lease.get("position"), lease.get("eta_seconds"))
                    if where != shown:
                        shown = where
                        self.log.warning(
                            "GPU kernel %s waits for %s: position %s in the queue (about %s s)",
                            kid,
                            self.offer,
                            where[0],
                            where[1],
                        )
                else:  # released meanwhile: cancelled from the pool's pages, or by an admin
                    self.lease = None
                    raise GpuKernelError(
                        f"The GPU request for this kernel ended ({lease.get('release_reason')}):"
                        " the kernel was not started."
                    )
                if loop.time() >= deadline:
                    raise GpuKernelError(
                        f"No {self.offer} GPU became free within {self.queue_timeout:g} s "
                        f"(queue position {lease.get('position')}): the kernel was not started."
                        " Try again later."
                    )
                with contextlib.suppress(asyncio.TimeoutError):  # the next look, or a cancel
                    await asyncio.wait_for(cancel.wait(), self.poll_interval)
                if not cancel.is_set():
                    lease = await self.client.kernel(kid)
        except BaseException:  # refused, timed out, cancelled (shutdown, interrupt): no lease
            await self.release()
            raise
        finally:
            BOARD.done(kid)

    def _on_board(self, lease: dict[str, Any], state: str) -> asyncio.Event:
        """Show the waiting start on the server's board (what the notebook shows); answers
        the event a cancel from the board sets."""
        return BOARD.wait(
            str(self.kernel_id),
            state=state,
            lease_id=lease.get("id"),
            position=lease.get("position"),
            eta_seconds=lease.get("eta_seconds"),
            **self._names(),
        )

    def _names(self) -> dict[str, Any]:
        """The kernel as the notebook names it: its kernelspec and offer."""
        spec = getattr(self, "kernel_spec", None)
        return {
            "kernel_name": str(getattr(self.parent, "kernel_name", "") or ""),
            "display_name": str(getattr(spec, "display_name", "") or ""),
            "offer": self.offer,
            "offer_name": self.offer_name or self.offer,
        }

    async def post_launch(self, **kwargs: Any) -> None:
        """Report the kernel started (its lease turns active) and start the reports (the
        lease's heartbeat)."""
        await super().post_launch(**kwargs)
        if self.lease is not None:
            await self.report()
        if self.lease is not None and self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._report_loop())
        if self.lease is not None:
            await self.restore_state()

    # -- while it runs -----------------------------------------------------------------------

    def execution_state(self) -> str:
        """``busy`` if the kernel is executing or said anything since the last report, else
        ``idle``. Jupyter Server's kernel manager tracks both from the kernel's messages
        (``execution_state``, ``last_activity``), so a short cell between two reports counts;
        a plain jupyter_client manager has neither: ``idle``."""
        try:  # Jupyter Server sets them once the kernel has started: unset, they raise
            state = getattr(self.parent, "execution_state", None)
            last = getattr(self.parent, "last_activity", None)
        except TraitError:
            state = last = None
        since = self._reported_at
        if isinstance(last, datetime) and last.tzinfo is None:
            last = last.replace(tzinfo=timezone.utc)
        moved = isinstance(last, datetime) and since is not None and last > since
        if self._own is not None and (
            not moved or (isinstance(last, datetime) and self._own[0] <= last <= self._own[1])
        ):
            return "idle"  # saving its state is not the user's work: the notice stands
        return "busy" if state == "busy" or moved else "idle"

    async def report(self) -> dict[str, Any] | None:
        """One report; acts on the answer (a notice is logged once, an ended lease shuts the
        kernel down). Answers the lease (None if the pool was not reached)."""
        state, self._reported_at = self.execution_state(), datetime.now(timezone.utc)
        try:
            lease = await self.client.kernel_activity(str(self.kernel_id), state)
        except (PoolUnavailable, PoolRefused) as e:
            self.log.warning("GPU kernel %s: report not taken: %s", self.kernel_id, e.message)
            return None
        notice = (lease.get("notice") or {}).get("message")
        if notice and notice != self._noticed:
            self.log.warning("GPU kernel %s: %s", self.kernel_id, notice)
            if self._noticed is None:
                await self.save_state()
        elif not notice and self._noticed and lease.get("state") != "released":
            self.drop_state()  # a cell ran: the notice is withdrawn
        self._noticed = notice
        shown = lease.get("notice") or None
        if shown and self._saved:  # what was saved for the next kernel, and what could not be
            shown = {**shown, "message": f"{shown.get('message', '')} {self._saved}"}
        BOARD.notice(str(self.kernel_id), shown, **self._names())
        if lease.get("state") == "released":
            kept = lease.get("release_reason") == "idle" and self.keep_state()
            self.lease = None
            self.log.warning(
                "GPU kernel %s: its GPU was released (%s): shutting the kernel down; %s, the "
                "notebook is kept",
                self.kernel_id,
                lease.get("release_reason"),
                "its saved variables come back in the notebook's next GPU kernel"
                if kept
                else "its variables are lost",
            )
            self._shutting = asyncio.ensure_future(self._shut_down())
        return lease

    async def _report_loop(self) -> None:
        while self.lease is not None:
            await asyncio.sleep(self.report_interval)
            await self.report()

    async def _shut_down(self) -> None:
        """Shut the kernel down as its server would: through the server's kernel list when
        there is one (the notebook sees the kernel gone), else its own manager."""
        kernels = getattr(self.parent, "parent", None)
        if kernels is not None and str(self.kernel_id) in getattr(kernels, "_kernels", {}):
            await kernels.shutdown_kernel(str(self.kernel_id))
        elif self.parent is not None:
            await self.parent.shutdown_kernel(now=False)

    # -- end ---------------------------------------------------------------------------------

    async def cleanup(self, restart: bool = False) -> None:
        """Stop the reports; release the lease unless the kernel restarts (it keeps its GPU)."""
        task, self._heartbeat = self._heartbeat, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.launcher == "kubernetes":
            await self.kube_delete()
        if not restart:
            await self.release()
            self.drop_state()  # kept already if the pool reclaimed it; else its user ended it
            await self.kube_close()
            BOARD.forget(str(self.kernel_id))
        await super().cleanup(restart=restart)

    # -- state carry-over (kernels/carry.py) -------------------------------------------------

    def _state_path(self) -> Path | None:
        """The notebook's state file: local kernels only (a pod writes in its own filesystem,
        and its pre_launch takes no session)."""
        if not self.carry_state or not self._session or self.launcher != "local":
            return None
        return carry.state_file(Path(self.state_dir), self._session)

    async def _run_in_kernel(self, source: str, path: Path) -> dict[str, Any]:
        """Run one of carry's cells in the kernel (its own connection: nothing is shown in the
        notebook) and read the summary it writes; the activity it makes is not reported as the
        user's."""
        from jupyter_client.asynchronous.client import AsyncKernelClient

        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # its manager's ports, and its session (the key that signs the messages)
        kc = AsyncKernelClient(**self.parent.get_connection_info(session=True))  # type: ignore[union-attr]  # a provisioner always has its manager
        start = datetime.now(timezone.utc)
        self._own = (start, start + timedelta(days=1))
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            msg_id = kc.execute(carry.in_kernel(source, path), silent=True, store_history=False)
            while True:
                reply = await kc.get_shell_msg(timeout=600)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
        finally:
            kc.stop_channels()
            # the kernel's last status messages reach the server's activity tracking after
            # the reply: a few seconds of it are still ours
            end = datetime.now(timezone.utc) + timedelta(seconds=5)
            self._own = (start, end)
            self._reported_at = max(self._reported_at or start, end)
        if reply["content"].get("status") != "ok":
            raise RuntimeError(reply["content"].get("evalue") or "the state cell failed")
        return carry.summary(path)

    async def save_state(self) -> None:
        """At the idle notice: checkpoint the namespace, pending until the pool reclaims."""
        path = self._state_path()
        if path is None:
            return
        try:
            done = await self._run_in_kernel(carry.CHECKPOINT, carry.pending(path))
        except Exception as e:  # the kernel is going anyway: say so, never fail the report
            done = {"error": f"{type(e).__name__}: {e}"}
        self._saved = carry.describe(done, restored=False)
        self.log.warning("GPU kernel %s: %s", self.kernel_id, self._saved)

    def keep_state(self) -> bool:
        """The pool reclaimed the kernel: its checkpoint is the notebook's next start's.
        Whether there was one."""
        path = self._state_path()
        if path is None or not carry.pending(path).exists():
            return False
        carry.discard(path)
        os.replace(carry.pending(path), path)
        return True

    def drop_state(self) -> None:
        """A withdrawn notice or a shutdown by the user: the pending checkpoint goes."""
        self._saved = None
        path = self._state_path()
        if path is not None:
            carry.discard(carry.pending(path))

    async def restore_state(self) -> None:
        """After start: restore what the notebook's reclaimed kernel left, then delete it."""
        path = self._state_path()
        if path is None or not path.exists():
            return
        try:
            done = await self._run_in_kernel(carry.RESTORE, path)
        except Exception as e:
            done = {"error": f"{type(e).__name__}: {e}"}
        carry.discard(path)
        self.log.warning("GPU kernel %s: %s", self.kernel_id, carry.describe(done, restored=True))

    async def release(self) -> None:
        """Give the lease back (a pool out of reach: its reaper ends it when the reports stop)."""
        if self.lease is None:
            return
        self.lease = None
        try:
            await self.client.release_kernel(str(self.kernel_id))
        except (PoolUnavailable, PoolRefused) as e:
            self.log.warning("GPU kernel %s: release not taken: %s", self.kernel_id, e.message)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What a restarted server needs to find this kernel's lease again."""
        info: dict[str, Any] = await super().get_provisioner_info()
        info["gpupool_lease"] = self.lease
        if self.launcher == "kubernetes":
            info["gpupool_pod"] = self.kube_info()
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Take the lease back with the kernel."""
        await super().load_provisioner_info(provisioner_info)
        self.lease = provisioner_info.get("gpupool_lease")
        self.kube_load(provisioner_info.get("gpupool_pod"))
