"""Every refusal code the pool answers with, declared once.

A code is the stable, machine-readable half of an error (``{"error": {"code", "message"}}``).
Each is declared here with what it means (the REST reference prints it), the sentence the spawn
page shows a user (``spawn``: ``{offer}`` and ``{message}`` are filled in) and, for the quota
verdicts the picker shows beside an offer, a short phrase (``picker``). The HTTP status of each
code lives in one table at the HTTP boundary (``service/apihandlers/errors.py``); a test checks
that every code raised anywhere is declared here, mapped there and listed in the OpenAPI spec.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What the spawn page says when the pool refused with a code that has nothing better to say.
GENERIC_SPAWN = "The GPU pool refused {offer}: {message}"
_OVER_QUOTA = "{offer} would take you over your GPU quota: {message}."


@dataclass(frozen=True)
class Code:
    """One refusal code: its meaning, the spawn page's sentence, the picker's phrase."""

    name: str
    meaning: str
    spawn: str = GENERIC_SPAWN
    picker: str | None = None

    def spawn_message(self, offer: str, message: str) -> str:
        """The sentence for the spawn page (``message`` is the pool's own text)."""
        return self.spawn.format(offer=offer, message=message)


_DECLARED = (
    # the request itself
    Code("invalid_json", "The body is not a JSON object."),
    Code("too_deep", "The body nests deeper than the service parses (32 levels)."),
    Code("body_too_large", "The body is larger than the service takes (4 MiB)."),
    Code("unknown_field", "The body has a field the operation does not take."),
    Code("missing_field", "A required field is missing."),
    Code("invalid_field", "A field has the wrong type, size or value."),
    Code("invalid_argument", "A query argument is malformed or out of range."),
    Code("invalid_state", "An unknown lease state in a filter."),
    Code("invalid_by", "Usage cannot be grouped that way."),
    Code("invalid_range", "A time range that ends before it starts."),
    Code("invalid_reason", "An unknown release reason."),
    Code("invalid_request", "A request no pool could satisfy as asked (no user, no offer)."),
    # who is asking
    Code("unauthorized", "No valid JupyterHub token."),
    Code("forbidden", "The token lacks the scope for this."),
    # what is asked for
    Code("not_found", "No such lease, node, quota kind or endpoint (or not yours to see)."),
    Code(
        "unknown_offer",
        "No offer of that name that the caller may use (an offer for groups the caller is not "
        "in is answered the same; `allowed` lists only the caller's offers).",
        spawn="There is no GPU offer called {offer!r} (any more).",
    ),
    Code("no_such_hardware", "No GPU in the pool can ever serve the offer."),
    Code(
        "cluster_not_served",
        "The offer runs only in clusters the asking hub does not launch into.",
        spawn="The GPU offer {offer!r} runs in clusters this hub cannot start servers in: "
        "{message}.",
    ),
    Code("exceeds_node_size", "The offer asks for more GPUs than the largest node has."),
    Code("same_offer", "A resize to the offer the lease already has."),
    # quotas
    Code(
        "no_quota",
        "The user (or group) has no GPU quota.",
        spawn="You have no GPU quota on this hub; ask an administrator for one.",
        picker="you have no GPU quota",
    ),
    Code(
        "exceeds_limit",
        "The lease would exceed a quota limit that nothing being released can lift.",
        spawn=_OVER_QUOTA,
        picker="beyond your quota limit",
    ),
    Code(
        "over_limit",
        "Beyond the quota limit until the user's other leases end (the request waits).",
        spawn=_OVER_QUOTA,
        picker="beyond your quota limit",
    ),
    Code(
        "budget_exhausted",
        "The unit-hour budget of the period is used up.",
        picker="your GPU-hour budget is used up",
    ),
    Code(
        "not_in_group",
        "The request names a group the user is not in.",
        picker="not for your groups",
    ),
    Code(
        "exceeds_exception_ceiling",
        "An exception request beyond the quota's exception ceiling (`allowed` names it).",
        spawn="{offer} is beyond what an exception to your quota may allow: {message}.",
    ),
    # jobs
    Code(
        "invalid_command", "A job's command is missing, empty, not a list of strings, or too long."
    ),
    Code("invalid_env", "A job's environment is not names → strings, or sets the runner's own."),
    Code("invalid_image", "A job's container image is empty, too long or has whitespace."),
    Code(
        "invalid_replicas",
        "A job's replicas are not a whole number from 1 to 64, or are asked for a class other "
        "than inference or an offer other than whole GPUs.",
    ),
    Code("unknown_class", "No workload class of that name (`allowed` lists them)."),
    Code("class_not_allowed", "The workload class is for other groups than the user's."),
    Code("job_lease", "The lease is a job's: only the runner and the jobs endpoints act on it."),
    Code("job_not_running", "A runner's report on a job that is queued or has ended."),
    # GPU kernels
    Code("kernel_exists", "The kernel already holds or waits for a lease of another offer."),
    # the lease's state
    Code("already_allocated", "The server already has a lease (live or queued)."),
    Code("duplicate_request", "A request with that id exists already."),
    Code(
        "too_many_requests",
        "The user has as many live GPU requests (queued, granted or held) as one may.",
        spawn="You already have as many GPU requests as one user may ({message}); stop a "
        "server or cancel a wait first.",
    ),
    Code("unknown_server", "The request names a server the hub does not know for that user."),
    Code("not_live", "The lease is queued or released."),
    Code("not_ready", "The grant waits for its MIG instance; bind it once the lease is ready."),
    Code("resize_pending", "The lease already has a resize pending (one target per lease)."),
    Code(
        "resize_target",
        "The lease is itself the target of a pending resize: resize the lease it replaces, or "
        "wait until this one is bound.",
    ),
    Code(
        "extension_limit",
        "A keepalive on a reclaim notice after every extension the policy allows was used.",
    ),
    Code(
        "not_extendable",
        "A reclaim notice no keepalive can extend (borrowed capacity owed, or the maximum age).",
    ),
    Code(
        "reclaim_in_progress",
        "The reclaimer is carrying out the reclaim of this lease: too late to keep it.",
        spawn="Your GPU is being reclaimed right now ({message}); start the server again "
        "once it has stopped.",
    ),
    Code("not_leader", "Another reclaimer replica holds the reclaim leadership (it names which)."),
    Code("not_acting", "An outcome for a lease no reclaim round claimed for action."),
    Code(
        "no_notice",
        "An admin's extension or cancellation of a reclaim notice on a lease that has none.",
    ),
    Code(
        "not_awaiting_approval",
        "An approval or denial of a request that was withdrawn, already decided or never asked.",
    ),
    # inventory and configuration
    Code("gpu_elsewhere", "A reported GPU belongs to another node."),
    Code(
        "unknown_device",
        "A device a lease is said to run on is not one the pool knows on the lease's node.",
    ),
    Code(
        "device_mismatch",
        "The devices given do not match the lease: another kind, MIG profile or number.",
    ),
    Code(
        "device_held",
        "The device cannot take the lease: an instance being destroyed, or a GPU without room "
        "for the share.",
    ),
    Code(
        "unknown_cluster",
        "A cluster the pool config does not list (the answer's `allowed` names the known ones).",
    ),
    Code("repartition_pending", "The GPU already has a MIG re-partition in progress."),
    Code(
        "repartition_applying",
        "The node is applying the re-partition already: it can no longer be cancelled.",
    ),
    Code("not_on_kubernetes", "The node is not a Kubernetes node the pool watches."),
    Code("invalid_config", "Invalid offers, quotas or inventory."),
    Code("unknown_gpu_model", "A GPU model the catalog does not know."),
    Code("unknown_mig_profile", "A MIG profile that does not exist for that GPU model."),
    Code("invalid_mig_layout", "MIG instances NVIDIA's placement rules do not allow together."),
    Code("pool_error", "Any other refusal of the pool core."),
    # the service
    Code("store_unavailable", "The pool database does not answer (down or restarting); try again."),
    Code("hub_unavailable", "JupyterHub's API did not answer; try again."),
    Code(
        "store_restarting",
        "The store process restarted mid-change: read the lease back or try again.",
    ),
    # answers of the HTTP layer without a code of their own (tornado's own errors)
    Code("bad_request", "A malformed HTTP request."),
    Code("method_not_allowed", "The endpoint does not take that method."),
    Code("conflict", "A conflict with the current state."),
    Code("unprocessable", "A well-formed request the pool cannot act on."),
    Code("internal_error", "A bug: reported in the service's log."),
    Code("unavailable", "The service cannot answer now."),
    Code("error", "Any other HTTP error without a code of its own."),
)

#: Every code, by name.
CODES: dict[str, Code] = {c.name: c for c in _DECLARED}


def describe(code: str | None) -> Code:
    """The declaration of ``code`` (an undeclared one reads as ``pool_error``)."""
    return CODES.get(code or "", CODES["pool_error"])


def picker_reason(code: str | None) -> str:
    """The picker's phrase for a quota verdict (empty when it fits)."""
    if code is None:
        return ""
    found = CODES.get(code)
    return (found.picker if found is not None else None) or code
