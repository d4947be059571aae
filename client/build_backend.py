"""A build backend of the standard library alone (PEP 517), so that ``pip install client/``
needs nothing from a package index: it writes a pure-Python wheel of ``retention_client``
with the name, version, summary and console script of ``pyproject.toml``."""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "retention_client"


def _project() -> dict:
    return tomllib.loads((HERE / "pyproject.toml").read_text())["project"]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    project = _project()
    dist = project["name"].replace("-", "_")
    version = project["version"]
    info = f"{dist}-{version}.dist-info"
    files: dict[str, bytes] = {
        f"{PACKAGE}/{path.name}": path.read_bytes()
        for path in sorted((HERE / PACKAGE).glob("*.py"))
    }
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n"
        f"Summary: {project.get('description', '')}\n"
        f"Requires-Python: {project.get('requires-python', '>=3')}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: retention_client build_backend\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{scripts}".encode()
    record = [_record_line(name, data) for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    name = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return name
