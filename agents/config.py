"""Agent configuration: command-line flags over FAULTLINE_AGENT_* variables over a TOML file over defaults."""

from __future__ import annotations

import math
import os
import signal
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agents.procs import DEFAULT_JOB_ENV

ENV_PREFIX = "FAULTLINE_AGENT_"
DEFAULT_SAMPLE_INTERVAL = 1.0
DEFAULT_SHIP_INTERVAL = 5.0
NVML_XID_MODES = ("auto", "on", "off")
NVML_FABRIC_MODES = ("auto", "off")
# The location labels an operator may give a node (node_labels): the heartbeat's HostFacts fields of the same names.
LOCATION_LABELS = ("rack", "switch", "power_domain")
CLOUD_EVENT_MODES = ("off", "auto", "aws", "gcp", "azure")  # agents/cloud_events.py MODES
# `interval`, the agent's first setting, meant "seconds between batches" (one GPU scrape per batch): it is
# the ship interval now, and the sample interval follows it down below one second.
_ALIASES = {"interval": "ship_interval"}


class ConfigError(Exception):
    """A configuration the agent cannot run with; the message says what to change."""


def _default_spool_root() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "faultline-agent"


@dataclass
class AgentConfig:
    server: str | None = None
    token: str | None = None
    # Instead of a token: an enrolment token (scope enrol) exchanged once for this node's own agent token,
    # which is kept in token_file and read from there on every later start (agents/enrol.py).
    enrol_token: str | None = None
    token_file: Path | None = None  # default with an enrolment token: <spool dir's parent>/<node name>.token
    node_name: str = field(default_factory=socket.gethostname)
    # GPU counters are read every sample_interval (each sample keeps its own time) and shipped every
    # ship_interval: one request per node per ship tick. None: min(1 s, ship_interval).
    sample_interval: float | None = None
    ship_interval: float = DEFAULT_SHIP_INTERVAL
    dcgm_url: str | None = None
    nvml_xid: str = (
        "auto"  # NVML Xid events: "auto" (when no kernel log is followed and NVML reads the GPUs), "on", "off"
    )
    # With dcgm-exporter: the GPUs' NVLink fabric info (GB200 NVL72 domains) from NVML beside it, "auto" or "off".
    nvml_fabric: str = "auto"
    kmsg: str = "auto"  # "auto" (/dev/kmsg when readable), "none", "journald", a device or a file
    logs: list[str] = field(default_factory=list)
    watch_pid: int | None = None
    # Look for training processes (off: dcgm-exporter and logs only, as a DaemonSet without hostPID sees nothing).
    processes: bool = True
    job_env: list[str] = field(default_factory=lambda: list(DEFAULT_JOB_ENV))
    step_patterns: list[str] = field(default_factory=list)  # extra regexes, tried before the defaults
    process_interval: float = 5.0
    stack_timeout: float = 10.0
    spool_dir: Path | None = None  # default: ~/.local/state/faultline-agent/<node name>
    spool_max_mb: float = 256.0
    spool_max_batches: int = 100_000
    from_start: bool = False
    dry_run: bool = False
    once: bool = False
    log_level: str = "info"
    # Where the kernel's files are read: /sys and /proc, or the host's as mounted into a container (tests: fake trees).
    sysfs_root: Path = field(default_factory=lambda: Path("/sys"))
    procfs_root: Path = field(default_factory=lambda: Path("/proc"))
    volumes: list[str] = field(default_factory=list)  # checkpoint and log folders whose free space is shipped
    # Where the machine sits, as the operator knows it: "rack=r12,switch=leaf-7,power_domain=pdu-3"
    # (FAULTLINE_AGENT_NODE_LABELS); and the shared storage mounts its jobs read (default: the volumes). Sent in
    # the heartbeat, kept as the node's labels: several nodes failing together behind one of them is a shared cause.
    node_labels: list[str] = field(default_factory=list)
    storage_mounts: list[str] = field(default_factory=list)
    # Cloud scheduled events (agents/cloud_events.py): "off", "auto" (probe AWS, GCP and Azure once, 1 s each, in a
    # thread of its own) or one provider; polled every cloud_events_interval s. cloud_metadata_url replaces the
    # provider's metadata address (a proxy; tests).
    cloud_events: str = "off"
    cloud_events_interval: float = 60.0
    cloud_metadata_url: str | None = None
    # A `checkpoint` directive (planned maintenance ahead) is written to this JSON file for the training side to read
    # (default <spool dir's parent>/<node name>.checkpoint.json); with checkpoint_signal (e.g. SIGUSR1) the job's
    # processes on this node are also sent that signal (only for jobs that handle it: the default action kills).
    checkpoint_file: Path | None = None
    checkpoint_signal: str | None = None
    # Evidence bundles (agents/bundle.py), on the service's `bundle` directive: at most this long and this large
    # (the directive's own bounds, when smaller, win), with this many seconds of the agent's last batches.
    bundle_timeout: float = 60.0
    bundle_max_mb: float = 20.0
    bundle_history_s: float = 300.0

    @property
    def location(self) -> dict[str, str]:
        """The node_labels setting as a mapping (check() has refused anything else)."""
        return dict(item.split("=", 1) for item in self.node_labels)

    @property
    def mounts(self) -> list[str]:
        """The storage mounts the heartbeat names: the setting, else the watched volumes."""
        return [os.path.abspath(m) for m in (self.storage_mounts or self.volumes)]

    @property
    def interval(self) -> float:
        """The old name of the ship interval."""
        return self.ship_interval

    @property
    def spool_path(self) -> Path:
        return self.spool_dir or _default_spool_root() / self.node_name

    @property
    def checkpoint_path(self) -> Path:
        """Where a checkpoint request (planned maintenance) is written for the training side."""
        return self.checkpoint_file or self.spool_path.parent / f"{self.node_name}.checkpoint.json"

    @property
    def token_path(self) -> Path:
        """Where an enrolled agent keeps its own token."""
        return self.token_file or self.spool_path.parent / f"{self.node_name}.token"

    def check(self) -> None:
        if not self.dry_run:
            missing = [name for name in ("server", "token") if not getattr(self, name)]
            if self.enrol_token or self.token_file:
                missing = [name for name in missing if name != "token"]  # obtained at start (agents/enrol.py)
            if missing:
                flags = " and ".join(f"--{name}" for name in missing)
                envs = " / ".join(ENV_PREFIX + name.upper() for name in missing)
                also = " (or --enrol-token / --token-file)" if "token" in missing else ""
                raise ConfigError(f"{flags} required{also} (or {envs}, or the config file), unless --dry-run")
            if not self.server.startswith(("http://", "https://")):  # type: ignore[union-attr]
                raise ConfigError(f"--server must be an http(s) URL, not {self.server!r}")
        self._check_intervals()
        if not self.node_name:
            raise ConfigError("--node-name must not be empty")
        if self.cloud_events not in CLOUD_EVENT_MODES:
            modes = ", ".join(CLOUD_EVENT_MODES)
            raise ConfigError(f"--cloud-events must be one of {modes}, not {self.cloud_events!r}")
        if not (math.isfinite(self.cloud_events_interval) and self.cloud_events_interval > 0):
            raise ConfigError("cloud_events_interval must be a number of seconds > 0")
        if self.checkpoint_signal is not None and not hasattr(signal, self.checkpoint_signal.upper()):
            raise ConfigError(f"--checkpoint-signal must name a signal such as SIGUSR1, not {self.checkpoint_signal!r}")
        for item in self.node_labels:
            key, _, value = item.partition("=")
            if key not in LOCATION_LABELS or not value.strip() or len(value) > 128:
                raise ConfigError(
                    f"node_labels: {item!r} must be key=value with key one of {', '.join(LOCATION_LABELS)} and a "
                    "value of 1-128 characters (e.g. rack=r12,switch=leaf-7,power_domain=pdu-3)"
                )
        if self.nvml_xid not in NVML_XID_MODES:
            raise ConfigError(f"--nvml-xid must be one of {', '.join(NVML_XID_MODES)}, not {self.nvml_xid!r}")
        if self.nvml_fabric not in NVML_FABRIC_MODES:
            raise ConfigError(f"--nvml-fabric must be one of {', '.join(NVML_FABRIC_MODES)}, not {self.nvml_fabric!r}")

    def _check_intervals(self) -> None:
        _positive("--ship-interval (or --interval)", self.ship_interval)
        if self.sample_interval is None:
            self.sample_interval = min(DEFAULT_SAMPLE_INTERVAL, self.ship_interval)
        _positive("--sample-interval", self.sample_interval)
        if self.sample_interval > self.ship_interval:
            raise ConfigError(
                f"--sample-interval ({self.sample_interval:g} s) must not be longer than --ship-interval "
                f"({self.ship_interval:g} s): every batch carries the samples taken since the one before"
            )
        if self.process_interval <= 0 or self.stack_timeout <= 0:
            raise ConfigError("process_interval and stack_timeout must be positive")
        bundle = (self.bundle_timeout, self.bundle_max_mb, self.bundle_history_s)
        if not all(math.isfinite(v) and v > 0 for v in bundle):
            raise ConfigError("bundle_timeout, bundle_max_mb and bundle_history_s must be positive")


def _positive(name: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds > 0):  # NaN compares false to everything
        raise ConfigError(f"{name} must be a number of seconds > 0, not {seconds:g}")


_LISTS = {"logs", "job_env", "step_patterns", "volumes", "node_labels", "storage_mounts"}
_NAMES = {f.name for f in fields(AgentConfig)}
_KNOWN = _NAMES | set(_ALIASES)
SETTINGS = frozenset(_KNOWN)  # every setting name a file, FAULTLINE_AGENT_<NAME> or a flag may give


def _coerce(name: str, value: Any) -> Any:
    kind = {f.name: f.type for f in fields(AgentConfig)}[name]
    if name in _LISTS:
        if isinstance(value, str):
            return [part for part in value.split(",") if part]
        return list(value)
    if value is None:
        return None
    if "float" in str(kind):
        return float(value)
    if "int" in str(kind):
        return int(value)
    if "bool" in str(kind):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    if "Path" in str(kind):
        return Path(value)
    return str(value)


def _resolve_aliases(values: dict[str, Any], *, where: str, spell: Callable[[str], str]) -> dict[str, Any]:
    """Old setting names to new ones within one source, so each source still overrides the next as a whole."""
    out = dict(values)
    for old, new in _ALIASES.items():
        if old in out:
            if new in out:
                raise ConfigError(f"{where}: {spell(old)} is the old name of {spell(new)}; give only one of them")
            out[new] = out.pop(old)
    return out


def load(flags: dict[str, Any], *, config_file: Path | None, environ: dict[str, str] | None = None) -> AgentConfig:
    """Merge the sources; `flags` holds only what was given on the command line."""
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    path = config_file or (Path(environ[ENV_PREFIX + "CONFIG"]) if environ.get(ENV_PREFIX + "CONFIG") else None)
    if path is not None:
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        table = table.get("agent", table)  # a bare file, or an [agent] table in a shared one
        from_file: dict[str, Any] = {}
        for key, value in table.items():
            name = key.replace("-", "_")
            if name not in _KNOWN:
                raise ConfigError(f"{path}: unknown setting {key!r} (known: {', '.join(sorted(_KNOWN))})")
            from_file[name] = value
        merged.update(_resolve_aliases(from_file, where=str(path), spell=repr))
    from_env = {name: environ[ENV_PREFIX + name.upper()] for name in _KNOWN if ENV_PREFIX + name.upper() in environ}
    merged.update(_resolve_aliases(from_env, where="environment", spell=lambda name: ENV_PREFIX + name.upper()))
    given = {k: v for k, v in flags.items() if v is not None and (v != [] or k not in _LISTS)}
    merged.update(_resolve_aliases(given, where="flags", spell=lambda name: "--" + name.replace("_", "-")))
    try:
        config = AgentConfig(**{name: _coerce(name, value) for name, value in merged.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad setting: {exc}") from None
    config.check()
    return config
