"""A single-node SLURM cluster on this machine for the tests: munged, slurmctld and slurmd started from a
slurm.conf in a temporary folder, and stopped by pid (never by name). Needs root and Debian's slurm-wlm + munge."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REQUEUE_SETTLE_S = 2.5  # see Cluster.release_requeued

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")


def missing_reason() -> str | None:
    """Why this machine cannot run the cluster (a skip reason), or None when it can."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"SLURM is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge, as .ci/run does"
    if os.geteuid() != 0:
        return "the test SLURM cluster needs root (munged as the munge user, slurmd as root)"
    return None


def _free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """This machine as slurmd sees it (CPUs, sockets, memory), from `slurmd -C`."""
    out = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0]


def _sbin(name: str) -> str:
    """Path of a SLURM or munge program (daemons live in /usr/sbin, not always on PATH)."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
    """A running single-node cluster; `env` is the environment the clients (sbatch, squeue) need."""

    def __init__(self, root: Path):
        self.root = root
        self.pending_since: dict[str, float] = {}  # requeued job id -> when release_requeued first saw it waiting
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        """slurm.conf: state, spool and logs in the folder; one node with this machine's CPUs."""
        r = self.root
        lines = [
            "ClusterName=runnertest", f"SlurmctldHost={self.host}", "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={r}/munge/munge.socket",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=2",
            "ReturnToService=2", "SlurmdParameters=config_overrides", "JobRequeue=1",
            "KillWait=20", "MinJobAge=600", "InactiveLimit=0", "MessageTimeout=10",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            f"{_node_line()} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        """munged (as the munge user), slurmctld and slurmd in the foreground; wait until the node is idle."""
        munge = self.root / "munge"
        munge.mkdir()
        munge.chmod(0o755)  # munged wants its socket folder searchable by all (the key stays 0600)
        shutil.copy("/etc/munge/munge.key", munge / "munge.key")
        shutil.chown(munge, "munge", "munge")
        shutil.chown(munge / "munge.key", "munge", "munge")
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        self.write_conf()
        self._spawn([_sbin("munged"), "-F", f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
                     f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                     f"--seed-file={munge}/munged.seed"], user="munge")
        self._wait(lambda: (munge / "munge.socket").exists(), 20, "munged did not create its socket")
        self._spawn([_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn([_sbin("slurmd"), "-D", "-f", str(self.conf)])
        self._wait(self.node_idle, 60, "the SLURM node did not become idle")

    def _spawn(self, argv: list[str], user: str | None = None) -> None:
        """Start one daemon in its own session (so a stray signal to the tests' group does not reach it)."""
        log = open(self.root / f"{Path(argv[0]).name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True, user=user, group=user))
        log.close()

    def _wait(self, ok, seconds: float, what: str) -> None:
        """Poll ok() until it holds; raise with the daemons' logs' tails when it does not in time."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{what}: {p.args[0]} exited {p.returncode}\n{self.logs()}")
            if ok():
                return
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {seconds:.0f} s\n{self.logs()}")

    def logs(self) -> str:
        """The last lines of every daemon log, for a failure message."""
        parts = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, check=check, timeout=60)

    def node_idle(self) -> bool:
        """True when the node takes jobs."""
        out = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
        return out.startswith("idle")

    def release_requeued(self) -> list[str]:
        """Start requeued jobs soon: SLURM holds a requeued job until a BeginTime a while ahead.

        A job is released only REQUEUE_SETTLE_S after it was first seen waiting: slurmd revokes the job's
        credential when it kills the old instance, with one-second resolution, and refuses a launch whose
        credential is from the same second ("Job credential revoked"; the job then ends, failed, never to run
        again). Seen once under load, when the requeued task was allocated 0.3 s after its requeue.
        """
        out = self.run("squeue", "-h", "-t", "PD", "-r", "-o", "%i %r", check=False).stdout.split("\n")
        waiting = [line.split()[0] for line in out if line.strip().endswith("BeginTime")]
        now = time.monotonic()
        ids = [job for job in waiting if now - self.pending_since.setdefault(job, now) >= REQUEUE_SETTLE_S]
        for job in ids:
            self.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
            del self.pending_since[job]
        return ids

    def cancel_all(self, seconds: float = 60) -> None:
        """Cancel every job and wait until none is left, so that no training process outlives a test."""
        self.run("scancel", "--full", "-u", "root", check=False)
        self._wait(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), seconds,
                   "jobs still listed after scancel")

    def stop(self) -> None:
        """Stop exactly the daemons this cluster started, newest first, by pid."""
        for p in reversed(self.procs):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def start_cluster(parent: Path | None = None) -> Cluster:
    """A started cluster in a new folder (world-readable, so the munge user can reach its socket folder)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir=parent))
    root.chmod(0o755)
    cluster = Cluster(root)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    """The session's SLURM cluster (skips where SLURM is missing); every job cancelled, every daemon stopped."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        try:
            cluster.cancel_all()
        finally:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
