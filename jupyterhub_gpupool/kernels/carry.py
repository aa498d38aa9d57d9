"""State carry-over for GPU kernels the pool reclaims (issue 36, item 3): a notebook's
variables outlive the kernel the pool shut down for idleness, where they can be pickled.

When the pool's idle notice reaches a kernel's provisioner, the kernel's namespace is
checkpointed at once (it is idle: nothing runs, so nothing changes it until a cell does, and a
cell withdraws the notice): each user variable is pickled on its own with ``dill`` (which keeps
functions, lambdas and classes defined in the notebook, beyond ``pickle``), so one that cannot
be (an open file, a generator, a lock, a CUDA context) is named, not fatal. Imported modules are
recorded by name and imported again. The checkpoint is *pending* until the pool reclaims the
kernel; then it is *kept* for the notebook (the kernel's ``JPY_SESSION_NAME``, which Jupyter
Server sets to the notebook's path), and the next GPU kernel of that notebook restores it once
started, then deletes it. A withdrawn notice, or a kernel shut down by its user, discards the
pending checkpoint. Files are the user's alone (mode 0600) under ``jupyter_data_dir()``.

What restores is what was pickled: objects holding GPU memory come back where their library
puts them (a PyTorch CUDA tensor on the new kernel's GPU); connections, threads and open files
do not come back and are listed as not kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Runs in the kernel (globals: ``get_ipython``, ``_path``): the checkpoint, then its summary
#: as JSON beside it. Names starting with ``_`` and IPython's own (``user_ns_hidden``) are
#: not the user's variables.
CHECKPOINT = r"""
import json as _json, os as _os, types as _types
_ip = get_ipython()
_hidden = set(_ip.user_ns_hidden)
_summary = {"kept": [], "lost": {}, "modules": {}}
try:
    import dill as _dill
except ImportError:
    _summary["error"] = "dill is not installed in the kernel's environment"
else:
    _blobs = {}
    for _name, _value in list(_ip.user_ns.items()):
        if _name.startswith("_") or _name in _hidden:
            continue
        if isinstance(_value, _types.ModuleType):
            _summary["modules"][_name] = _value.__name__
            continue
        try:
            _blobs[_name] = _dill.dumps(_value)
            _summary["kept"].append(_name)
        except Exception as _e:
            _summary["lost"][_name] = f"{type(_value).__name__}: {type(_e).__name__}"
    _fd = _os.open(_path + ".tmp", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
    with _os.fdopen(_fd, "wb") as _f:
        _dill.dump({"blobs": _blobs, "modules": _summary["modules"]}, _f)
    _os.replace(_path + ".tmp", _path)
_fd = _os.open(_path + ".json", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
with _os.fdopen(_fd, "w") as _f:
    _json.dump(_summary, _f)
"""

#: Runs in the new kernel: modules imported again, each variable unpickled on its own (one
#: that fails is listed), the summary as JSON beside the checkpoint.
RESTORE = r"""
import importlib as _importlib, json as _json, os as _os
_ip = get_ipython()
_summary = {"kept": [], "lost": {}, "modules": {}}
try:
    import dill as _dill
    with open(_path, "rb") as _f:
        _saved = _dill.load(_f)
except Exception as _e:
    _summary["error"] = f"the saved state could not be read: {type(_e).__name__}: {_e}"
else:
    for _name, _module in _saved["modules"].items():
        try:
            _ip.user_ns[_name] = _importlib.import_module(_module)
            _summary["modules"][_name] = _module
        except Exception as _e:
            _summary["lost"][_name] = f"module {_module}: {type(_e).__name__}"
    for _name, _blob in _saved["blobs"].items():
        try:
            _ip.user_ns[_name] = _dill.loads(_blob)
            _summary["kept"].append(_name)
        except Exception as _e:
            _summary["lost"][_name] = f"{type(_e).__name__}: {_e}"
_fd = _os.open(_path + ".json", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
with _os.fdopen(_fd, "w") as _f:
    _json.dump(_summary, _f)
"""


def in_kernel(source: str, path: Path) -> str:
    """``source`` as one cell that leaves nothing in the user's namespace (it runs in a
    namespace of its own that sees ``get_ipython``)."""
    return (
        f"exec(compile({source!r}, '<gpupool state>', 'exec'), "
        f"{{'get_ipython': get_ipython, '_path': {str(path)!r}}})"
    )


def state_file(folder: Path, session: str) -> Path:
    """Where the state of the notebook ``session`` (its path) is kept."""
    return folder / (hashlib.sha256(session.encode()).hexdigest()[:24] + ".dill")


def pending(path: Path) -> Path:
    """The checkpoint taken at the notice, before the pool reclaimed the kernel."""
    return path.with_suffix(".pending")


def summary(path: Path) -> dict[str, Any]:
    """The summary the kernel wrote beside ``path`` (empty if none)."""
    try:
        out = json.loads(Path(str(path) + ".json").read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def describe(done: Mapping[str, Any], *, restored: bool) -> str:
    """The user's sentence for a checkpoint (``restored`` False) or a restore summary."""
    if done.get("error"):
        return f"Variables not {'restored' if restored else 'saved'}: {done['error']}."
    kept = list(done.get("kept") or ()) + list(done.get("modules") or ())
    lost = dict(done.get("lost") or {})
    verb = (
        "Restored from the GPU kernel the pool shut down"
        if restored
        else ("Saved for the next GPU kernel of this notebook")
    )
    text = f"{verb}: {', '.join(sorted(kept)) or 'nothing'}."
    if lost:
        what = ", ".join(f"{k} ({v})" for k, v in sorted(lost.items()))
        text += f" Could not {'restore' if restored else 'keep'}: {what}."
    return text


def discard(path: Path) -> None:
    """Remove a checkpoint and its summary."""
    for p in (path, Path(str(path) + ".json"), Path(str(path) + ".tmp")):
        p.unlink(missing_ok=True)
