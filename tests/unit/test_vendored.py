"""The chart libraries in ``service/static/vendor/`` are the files npm publishes.

Each file's sha256, version, licence and npm tarball are recorded in ``VENDORED.json``: a
changed byte fails here. With ``GPUPOOL_CHECK_REGISTRY=1`` (network needed; ``make lint`` on a
release) the tarball is downloaded, its published ``integrity`` checked, and the file inside it
compared with ours.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import urllib.request
from pathlib import Path

import pytest

VENDOR = Path(__file__).resolve().parents[2] / "jupyterhub_gpupool/service/static/vendor"
RECORD = json.loads((VENDOR / "VENDORED.json").read_text())["files"]


@pytest.mark.parametrize("entry", RECORD, ids=lambda e: e["file"])
def test_a_vendored_file_is_the_recorded_one(entry: dict) -> None:
    data = (VENDOR / entry["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{entry['file']} was changed"
    assert f"v{entry['version']}" in data[:400].decode()  # the banner names the version
    licence = (VENDOR / entry["licence_file"]).read_text()
    assert entry["license"] == "MIT" and "MIT License" in licence


def test_every_shipped_script_is_recorded() -> None:
    assert {p.name for p in VENDOR.glob("*.js")} == {e["file"] for e in RECORD}


@pytest.mark.skipif(
    os.environ.get("GPUPOOL_CHECK_REGISTRY") != "1", reason="set GPUPOOL_CHECK_REGISTRY=1 (network)"
)
@pytest.mark.parametrize("entry", RECORD, ids=lambda e: e["file"])
def test_a_vendored_file_is_the_published_one(entry: dict) -> None:
    with urllib.request.urlopen(entry["tarball"], timeout=60) as r:
        tarball = r.read()
    algo, _, digest = entry["integrity"].partition("-")
    assert base64.b64encode(hashlib.new(algo, tarball).digest()).decode() == digest
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        member = tar.extractfile(entry["path_in_package"])
        assert member is not None
        assert member.read() == (VENDOR / entry["file"]).read_bytes()
