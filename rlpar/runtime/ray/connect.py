"""Connecting to Ray for every rlpar user of it (backend "ray", ``rlpar train --seeds --ray``,
``rlpar sweep``, ``rlpar bench ray``): a local instance on 127.0.0.1 only, or a cluster
whose address answers, with workers that import the installed rlpar and find the user's
modules."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlpar.runtime.env_setup import add_import_folders, import_folders

__all__ = [
    "LOOPBACK_ENV",
    "check_cpus",
    "connect",
    "connect_ray",
    "import_ray",
    "init_local_ray",
    "on_loopback",
]

log = logging.getLogger("rlpar")


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""Set (unless already set) before importing Ray for a local instance, or a cluster on
loopback: every Ray process then listens on 127.0.0.1 only (Ray's single-machine mode; without
it Ray also maps a 127.0.0.1 address to this machine's network address), and sends no usage
statistics."""


def on_loopback(address: str | None) -> bool:
    """A local instance (None), or a cluster at a loopback address."""
    if address is None:
        return True
    host = address.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def import_ray(local: bool) -> Any:
    if local and "ray" not in sys.modules:
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError as e:
        raise ImportError('runtime.backend = "ray" needs Ray: pip install "rlpar[ray]"') from e
    return ray


def connect_ray(
    address: str | None, num_cpus: int | None = None, what: str = "runtime.ray_address"
) -> tuple[Any, bool]:
    """Import Ray and connect as ``runtime.ray_address = address`` would (None: a local
    instance of ``num_cpus`` CPUs, default all, on 127.0.0.1 only), for other users of Ray
    such as ``rlpar sweep``; errors name the address as ``what``. Returns (the ``ray``
    module, whether this call made the connection: then ``ray.shutdown()`` is the caller's
    to call; a connection the process already had is left alone)."""
    ray = import_ray(local=on_loopback(address))
    return ray, connect(ray, address, num_cpus or os.cpu_count() or 1, 100 << 20, what)


def connect(
    ray: Any,
    address: str | None,
    num_cpus: int,
    object_store_bytes: int,
    what: str = "runtime.ray_address",
) -> bool:
    """Connect to Ray at ``address`` (None: a local instance); True when this call made the
    connection (and `RayActors.close` should end it)."""
    if ray.is_initialized():
        log.info("ray backend: using the Ray connection this process already has")
        return False
    if address is None:
        init_local_ray(num_cpus, object_store_bytes)
        return True
    if address != "auto":
        _probe(address, what=what)
    if on_loopback(address) and not _loopback_mode():
        raise ConnectionError(
            f"{what} = {address!r} is a loopback address, but Ray was "
            "imported without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and would look for the "
            "cluster at this machine's network address: set it before importing ray"
        )
    try:
        with _clean_working_dir() as runtime_env:
            ray.init(address=address, logging_level=logging.WARNING, runtime_env=runtime_env)
    except ConnectionError as e:
        raise ConnectionError(
            f"{what} = {address!r}: {e} (a cluster started by `ray start` "
            "uses token authentication when ~/.ray/auth_token exists: then set "
            "RAY_AUTH_MODE=token here too; or leave ray_address unset for a local Ray instance)"
        ) from None
    return True


@contextlib.contextmanager
def _clean_working_dir() -> Iterator[dict[str, Any] | None]:
    """Ray puts the driver's working directory (and its script's) first on every worker's
    import path. When that directory holds rlpar's source tree (e.g. the driver runs from a
    checkout), the workers would import it instead of the installed package and fail; then
    start them in an empty working directory instead (a Ray ``runtime_env``). The workers also
    get the folders of the user's modules (`_user_module_folders`)."""
    folders = _user_module_folders()
    installed = Path(__file__).resolve().parents[2]  # this module is rlpar/runtime/ray/connect.py
    dirs = {Path.cwd(), Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None}
    if not any(d and (d / "rlpar").is_dir() and (d / "rlpar").resolve() != installed for d in dirs):
        yield folders or None
        return
    log.info(
        "ray backend: the workers start in an empty working_dir, because the working directory "
        "holds rlpar's source tree (which Ray would import there instead of the installed one)"
    )
    with tempfile.TemporaryDirectory(prefix="rlpar-ray-") as empty:
        yield {"working_dir": empty, **folders}


def _user_module_folders() -> dict[str, Any]:
    """A ``runtime_env`` entry that adds the folders rlpar searches for the user's modules
    (`rlpar.runtime.env_setup.import_folders`: an experiment file's ``plugin_path``) to each
    worker's import path when it starts, so that it unpickles a plug-in agent and runs
    ``env.setup`` as the driver does. They are this machine's folders: on a cluster of several
    machines, install the modules on every node."""
    folders = import_folders()
    if not folders:
        return {}

    def add_folders() -> None:  # a local function: Ray pickles it by value
        add_import_folders(folders)

    return {"worker_process_setup_hook": add_folders}


def init_local_ray(num_cpus: int, object_store_bytes: int = 100 << 20) -> Any:
    """Start a Ray instance on this machine, as backend "ray" does when ``ray_address`` is
    None: on 127.0.0.1 only, no dashboard, no usage statistics. Returns the ``ray`` module
    (``ray.shutdown()`` ends the instance); a Runner built meanwhile uses this instance."""
    ray = import_ray(local=True)
    if not _loopback_mode():
        log.warning(
            "ray backend: the local Ray instance listens on every interface, not only on "
            "127.0.0.1: Ray was imported without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (set it "
            "before importing ray, or let rlpar import it)"
        )
    with _clean_working_dir() as runtime_env:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=object_store_bytes,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
        )
    return ray


def _loopback_mode() -> bool:
    return os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"


def _probe(address: str, timeout_s: float = 3.0, what: str = "runtime.ray_address") -> None:
    """Fail fast, with the address in the message, where ``ray.init`` would retry for minutes:
    nothing listens there, or what does is not a gRPC (HTTP/2) server like Ray's GCS."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    where = f"{what} = {address!r}"
    hint = "(start a cluster with `ray start --head`; `ray status` prints its address)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            # HTTP/2 client preface and an empty SETTINGS frame; a server answers with SETTINGS.
            sock.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            )
            head = sock.recv(9)
    except OSError as e:
        raise ConnectionError(f"{where}: no Ray cluster answers there ({e}) {hint}") from None
    if len(head) < 9 or head[3] != 0x04:
        raise ConnectionError(f"{where}: what answers there is not a Ray cluster {hint}")


def check_cpus(ray: Any, processes: int, threads: int) -> None:
    """Each actor process reserves one CPU per actor thread, all on one node."""
    cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]]
    if max(cpus, default=0) < threads:
        raise ValueError(
            f"runtime.ray_actor_threads: an actor process reserves one CPU per actor thread "
            f"({threads}) on one node, and the largest node of the Ray cluster has "
            f"{max(cpus, default=0):g}"
        )
    if sum(int(c // threads) for c in cpus) < processes:
        raise ValueError(
            f"runtime.num_actors: {processes} actor processes of {threads} thread(s) need "
            f"{processes * threads} CPUs (one per actor thread) and the Ray cluster's nodes "
            f"have {', '.join(f'{c:g}' for c in cpus)}: add nodes, or lower num_actors"
        )
