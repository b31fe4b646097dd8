"""A real S3 beside moto: Ceph's RADOS Gateway (Debian's `radosgw`, Ceph 16.2 Pacific) on a
one-monitor, one-OSD cluster kept in memory (memstore), all on 127.0.0.1 and no cephx, started
from an empty directory in a few seconds and stopped by pid, gateway first (it blocks on
shutdown once the OSD and monitor are gone).

RGW is a production S3 implementation, and it differs from moto where tierpoint cares: it
stores no `x-amz-checksum-*` (so a copy is verified by reading it back), answers
CompleteMultipartUpload with an empty ETag, checks Content-MD5 and SigV4 signatures (moto does
neither) and refuses storage classes it was not configured with."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from apps.devstack.services import free_port
from tests.helpers.debian_tools import require
from tests.helpers.s3_endpoints import S3Endpoint
from tierpoint.storage.s3.credentials import env_names

START_TIMEOUT = 120.0  # seconds; a quiet machine needs 3-5
STOP_GRACE = 10.0
# A hang guard for one ceph command: its monitor answers in seconds on a quiet machine, and took
# over a minute to create an OSD while a full test run loaded both cores.
CEPH_TIMEOUT = 180

# Paxos batches map changes for 1 s by default, and RGW creates its pools one by one at start
# and on the first bucket and object: ~2 s each. These make the start take seconds, not tens.
CONF = """\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_v2},v1:127.0.0.1:{mon_v1}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
run dir = {dir}/run
admin socket = {dir}/run/$name.asok
log file = {dir}/log/$name.log
log to stderr = false
err to stderr = false
keyring = {dir}/keyring
mon data = {dir}/mon/$name
osd data = {dir}/osd/$name
osd objectstore = memstore
memstore device bytes = 4294967296
osd memory target = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
mon data avail warn = 2
mon data avail crit = 1
paxos propose interval = 0.05
paxos min wait = 0.01
osd op num shards = 2
osd op num threads per shard = 2

[client.rgw]
# radosgw's built-in defaults are cephx and a 'secure' monitor connection: without these it
# never opens its port on a cluster without cephx.
auth client required = none
ms mon client mode = crc
rgw frontends = beast endpoint=127.0.0.1:{port}
rgw data = {dir}/rgw
rgw thread pool size = 64
rgw gc obj min wait = 60
rgw gc processor period = 60
"""


class RGWStartError(RuntimeError):
    pass


@dataclass
class CephRGW:
    """One gateway and its cluster under `root` (an empty directory of its own)."""

    root: Path
    access_key_id: str = "tierpoint-rgw"
    secret_access_key: str = "tierpoint-rgw-secret-key"
    region: str = "us-east-1"
    port: int = 0
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return dict(os.environ, CEPH_CONF=str(self.root / "ceph.conf"))

    def _run(self, *args: str) -> str:
        out = subprocess.run(
            args, env=self._env(), capture_output=True, text=True, timeout=CEPH_TIMEOUT, check=False
        )
        if out.returncode != 0:
            raise RGWStartError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out.stdout

    def _daemon(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            args, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self._procs.append((name, proc))

    def _wait(self, what: str, ready: object) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():  # type: ignore[operator]
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise RGWStartError(f"{name} exited ({proc.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise RGWStartError(f"no {what} within {START_TIMEOUT:.0f} s (logs: {self.root})")
            time.sleep(0.1)

    def start(self) -> str:
        tools = require("radosgw", "ceph-mon", "ceph-osd")
        try:
            self._start(tools)
        except BaseException:
            self.stop()
            raise
        return self.endpoint_url

    def _start(self, tools: dict[str, str]) -> None:
        for sub in ("run", "log", "mon", "osd/osd.0", "rgw"):
            # memstore's mkfs asserts unless the OSD's data directory exists first.
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        mon_v2, mon_v1 = free_port(), free_port()
        fsid = str(uuid.uuid4())
        conf = CONF.format(fsid=fsid, mon_v2=mon_v2, mon_v1=mon_v1, dir=self.root, port=self.port)
        (self.root / "ceph.conf").write_text(conf)
        monmap, keyring = str(self.root / "monmap"), str(self.root / "keyring")
        addr = f"[v2:127.0.0.1:{mon_v2},v1:127.0.0.1:{mon_v1}]"
        self._run("monmaptool", "--create", "--fsid", fsid, "--addv", "a", addr, monmap)
        self._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.")
        self._run(tools["ceph-mon"], "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self._daemon("mon", tools["ceph-mon"], "-i", "a", "-f")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run(
            "ceph", "--connect-timeout", str(CEPH_TIMEOUT), "osd", "new", osd_uuid
        ).strip()
        # The OSD boots only with the uuid the monitor registered for its id.
        self._run(tools["ceph-osd"], "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._daemon("osd", tools["ceph-osd"], "-i", osd_id, "-f")
        self._wait("OSD up", self._osd_up)
        self._daemon("radosgw", tools["radosgw"], "-n", "client.rgw", "-f")
        self._wait("gateway answering HTTP", self._answers)
        self._run(
            "radosgw-admin",
            "user",
            "create",
            "--uid=tierpoint",
            "--display-name=tierpoint",
            f"--access-key={self.access_key_id}",
            f"--secret={self.secret_access_key}",
        )

    def _osd_up(self) -> bool:
        out = subprocess.run(
            ["ceph", "osd", "stat", "-f", "json"],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return out.returncode == 0 and json.loads(out.stdout or "{}").get("num_up_osds") == 1

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint_url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer: the gateway serves
        except OSError:
            return False

    def stop(self) -> None:
        """Each daemon by its pid, newest first (gateway, OSD, monitor): SIGTERM, then SIGKILL
        after STOP_GRACE seconds."""
        while self._procs:
            _, proc = self._procs.pop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in self._procs]


# The environment prefix of the gateway's keys: tiers on it name it (`credentials_env`), so the
# test process holds two S3 endpoints' keys at once (moto's in the AWS chain), as a worker
# writing to two object stores does. An external gateway is given the same way:
# TIERPOINT_TEST_RGW_ENDPOINT_URL, TIERPOINT_TEST_RGW_ACCESS_KEY_ID and ..._SECRET_ACCESS_KEY.
RGW_ENV = "TIERPOINT_TEST_RGW"


@contextlib.contextmanager
def rgw_endpoint(root: Path) -> Iterator[S3Endpoint]:
    """The session's gateway: the one given by the environment, else one started under `root`
    and stopped by pid afterwards."""
    url = os.environ.get(f"{RGW_ENV}_ENDPOINT_URL")
    gateway: CephRGW | None = None
    if url:
        key = os.environ[f"{RGW_ENV}_ACCESS_KEY_ID"]
        secret = os.environ[f"{RGW_ENV}_SECRET_ACCESS_KEY"]
        region = os.environ.get(f"{RGW_ENV}_REGION", "us-east-1")
    else:
        gateway = CephRGW(root)
        url = gateway.start()
        key, secret, region = gateway.access_key_id, gateway.secret_access_key, gateway.region
    saved = {n: os.environ.get(n) for n in env_names(RGW_ENV)[:2]}
    os.environ.update(dict(zip(env_names(RGW_ENV)[:2], (key, secret), strict=True)))
    try:
        yield S3Endpoint("rgw", url, key, secret, region, credentials_env=RGW_ENV)
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        if gateway is not None:
            gateway.stop()
