"""Kernel log parser: NVIDIA Xid / SXid / NVRM lines, PCIe AER errors, the OOM killer, the fabric manager's
start-up failures (syslog files and journals carry them next to the kernel's lines), and a network adapter's own
fatal errors (mlx5's health poller).

Accepts every way the kernel log reaches the agent (raw /dev/kmsg records, dmesg, journald, syslog files, bare
lines: agents/parsers/kernel_prefixes.py reads their prefixes). Lines about anything else are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agents.events import Event
from agents.parsers import LineParser, as_utc, clip, match_window
from agents.parsers.kernel_prefixes import KMSG, KMSG_DICT, KMSG_ESCAPE, strip_prefix
from agents.parsers.xid import lookup

SOURCE = "kmsg"

# -- messages --------------------------------------------------------------------------------------

_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?"
_XID = re.compile(r"NVRM: Xid \(([^)]{0,80})\): (\d{1,5}),\s*(.*)")
_XID_ATTR_PCI = re.compile(rf"(?:PCI:)?({_PCI})")
_XID_ATTR_MIG = re.compile(r"GPU-I:(\d+)(?: GPU-CI:(\d+))?")
# "pid=1234, name=python, msg", "pid='<unknown>', name=<unknown>, msg", "pid=1234, msg"
_XID_PID = re.compile(r"pid=('?<unknown>'?|\d+),\s*(?:name=([^,]{0,64}),\s*)?")
_XID_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_XID_LINK = re.compile(r"\b[Ll]ink\s*(-?\d{1,3})\b")
_XID_CODES = re.compile(r"\(\s*(0x[0-9a-fA-F]+(?:[,\s]+0x[0-9a-fA-F]+)*)\s*\)")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
# NVLink5 (Xid 144-150): "NETIR_LINK_EVT  Fatal   XC0 i0 Link 14 (0x0215c5c6 0x00000000 ...)"
_NVLINK5 = re.compile(r"([A-Z][A-Z0-9_]*(?:/[A-Z0-9_]+)?)\s+(Nonfatal|Non-fatal|Fatal)\b")
# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_XID154 = re.compile(r"to (0x[0-9a-fA-F]+) \(([^)]*)\)")
_FELL_START = re.compile(rf"NVRM: The NVIDIA GPU ({_PCI})")
_PCI_ID = re.compile(r"PCI ID: ([0-9a-fA-F]{4}:[0-9a-fA-F]{4})")
_NVRM_PCI = re.compile(rf"\b({_PCI})\b")
_NVRM_BAD = re.compile(r"(?i)fail|error|timeout|timed out|unable|not responding|cannot|invalid|lost")
# GPU index the driver prefixes its GSP messages with ("GPU6 _kgspBootGspRm: ..."): its own numbering, which need
# not be nvidia-smi's, so it is kept apart from the PCI address.
_NVRM_GPU = re.compile(r"GPU(\d{1,3}) ")
# NVRM lines that say a GPU failed, as (form, pattern, severity); the first match names the form. The GSP forms
# are today's GPUs' (Turing on, GSP firmware): a GSP that stops answering RPCs needs a GPU reset, one that cannot
# boot needs the machine reset; the heartbeat alone is often noise (stuck at 0 on some desktops), so not critical.
_NVRM_FAILURES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("fallen_off_bus", re.compile(r"fallen off the bus"), "critical"),
    ("gsp_reset_required", re.compile(r"GPU marked for reset|NV_ERR_RESET_REQUIRED"), "critical"),
    ("gsp_rpc_timeout", re.compile(r"\bGSP Timeout\b|rpcRecvPoll timedout"), "critical"),
    ("gsp_heartbeat", re.compile(r"[Hh]eartbeat timed out"), "error"),
    (
        "gsp_boot_failed",
        re.compile(r"WPR2 already up|Cannot initialize GSP firmware|likely in a bad state and may need to be reset"),
        "critical",
    ),
    ("init_failed", re.compile(r"RmInitAdapter failed|rm_init_adapter failed"), "critical"),
    # The driver's NVLink code (knvlink*) failing to bring a link up or read its state: "knvlinkDiscoverPostRxDetLinks_
    # GH100: Getting peer0's postRxDetLinkMask failed!" (leptonai/gpud#1271).
    ("nvlink_failed", re.compile(r"\bknvlink\w*:.*\b(?:[Ff]ail(?:ed|ure)?|timed out|[Tt]imeout)\b"), "error"),
)
_SXID = re.compile(rf"(nvidia-nvswitch\d*): SXid \((?:PCI:)?({_PCI})\): (\d{{1,6}}),\s*(.*)")
_SXID_DETAIL = re.compile(r"(?:Data \{|Severity \d)")

# mlx5's health poller (drivers/net/ethernet/mellanox/mlx5/core/health.c): the adapter's firmware raised a fatal
# error, or stopped answering, and the driver resets it or leaves it in an error state. The adapter failed: not a
# link that flapped. "mlx5_core 0000:81:00.0: poll_health:806:(pid 0): Fatal error 1 detected".
_MLX5 = re.compile(r"\bmlx5_core (\S+?):? (?:(\w+):\d+:\(pid \d+\): )?(.*)")
_MLX5_FATAL = re.compile(
    r"Fatal error (\d+) detected|health compromised|handling bad device|health recovery flow aborted"
)
# Its port module events (mlx5/core/events.c): a cable or transceiver the adapter found at fault, and the port it
# sits in disabled: "mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High
# Temperature". Plugged and unplugged ("Port module event: module 0, Cable plugged") are not errors.
_MLX5_MODULE = re.compile(r"Port module event\[error\]: module (\d+), ([^,]+), (.+)")

# The kernel's OOM killer: "oom-kill:constraint=CONSTRAINT_NONE,...,task=python,pid=698405,uid=1000", then
# "Out of memory: Killed process 698405 (python) total-vm:..kB, anon-rss:12918388kB, ..." (cgroup limits say
# "Memory cgroup out of memory: Killed process ..."). One kill, one event.
_OOM_KILL = re.compile(r"oom-kill:(?:constraint=(\w+))?.*?\btask=([^,]*),pid=(\d+)")
# Kernels before 4.19 say it in two lines of their own: "Out of memory: Kill process 25635 (python) score 974 or
# sacrifice child", then "Killed process 25635 (python) total-vm:...kB, anon-rss:...kB" (NervanaSystems/deepspeech#48).
_OOM_KILLED = re.compile(r"(?:(Memory cgroup out of memory|Out of memory): )?Killed process (\d+) \(([^)]*)\)")
_OOM_KILL_OLD = re.compile(r"(Memory cgroup out of memory|Out of memory): Kill process (\d+) \(([^)]*)\)")
_OOM_RSS = re.compile(r"anon-rss:(\d+)kB")

# The host's memory controllers (EDAC): "EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (...)",
# "EDAC skx MC0: 2 CE memory read error on ..." (ovro-lwa/lwa-issues#117). An uncorrected error (UE) is the DIMM's.
_EDAC = re.compile(r"EDAC (?:\w+ )?MC(\d+): (\d+) (UE|CE) (.*?)(?: on (\S+))?(?: \(|$)")
# The fabric manager (NVSwitch systems) and its start script. Without NVSwitches it exits with
# NV_WARN_NOTHING_TO_DO, which is harmless (leptonai/gpud #1206); the exits that follow are that exit's echo.
_FM = re.compile(r"(?i)fabric ?manager")
_FM_NOTHING = "NV_WARN_NOTHING_TO_DO"
_FM_CANNOT = re.compile(r"(?i)cannot be started|cannot start|failed to start|not been loaded|not loaded")
_FM_EXITED = re.compile(r"(?i)\bfail|exited|error")

# PCIe AER. Each message line is "<driver> <bdf>: [AER: ]body".
_AER_LINE = re.compile(rf"(\S+) ({_PCI}): (?:AER: )?(.*)")
_AER_HEADER = re.compile(
    r"(?:Multiple )?(Corrected|Correctable|Uncorrected|Uncorrectable)(?: \((Fatal|Non-Fatal)\))? "
    r"error(?: message)? received(?: from)?:? (\S+)"
)
_AER_BUS = re.compile(r"PCIe Bus Error: severity=([^,]+), type=([^,]+)(?:, \(([^)]*)\))?")
_AER_STATUS = re.compile(r"device \[([0-9a-fA-F]{4}:[0-9a-fA-F]{4})\] error status/mask=([0-9a-fA-F]+)/([0-9a-fA-F]+)")
_AER_BIT = re.compile(r"\[\s*(\d{1,2})\]\s*([A-Za-z][\w ]*?)\s*(?:\(First\))?\s*$")
_AER_SEVERITY = {
    "corrected": "warning",
    "uncorrected_nonfatal": "error",
    "uncorrected_fatal": "critical",
}


def _aer_severity(word: str, fatal: str | None) -> str:
    word = word.lower()
    if word.startswith("correct"):
        return "corrected"
    if fatal is None:
        fatal = "Fatal" if "(fatal)" in word else "Non-Fatal" if "non-fatal" in word else None
    return "uncorrected_fatal" if fatal == "Fatal" else "uncorrected_nonfatal"


@dataclass(slots=True)
class _Block:
    """A multi-line message being collected: its first line's time and its raw lines."""

    ts: datetime
    lines: list[str]
    fields: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # the messages without prefixes


class KernelLogParser(LineParser):
    """Turns kernel log lines into `xid`, `sxid`, `pcie_aer`, `nvrm`, `oom`, `fabric_manager`, `nic_fatal`,
    `nic_module_error` and `edac` events."""

    name = "kernel"

    def __init__(self, *, boot_time: datetime | None = None) -> None:
        super().__init__()
        self.boot_time = as_utc(boot_time) if boot_time is not None else None
        self._fell: _Block | None = None  # "The NVIDIA GPU ... has fallen off the bus" in progress
        self._aer: _Block | None = None  # an AER error and its detail lines
        self._oom: _Block | None = None  # an "oom-kill:" line waiting for its "Killed process" line
        self._sxid_head: tuple[str, str, int] | None = None  # (switch, pci, code) of the last SXid read

    def _flush(self, out: list[Event]) -> None:
        out += self._finish_fell()
        out += self._finish_aer()
        out += self._finish_oom()

    # -- prefix handling ---------------------------------------------------------------------------

    def _feed(self, raw: str, now: datetime) -> list[Event]:
        raw = raw.rstrip("\r\n")
        if not raw or KMSG_DICT.match(raw):
            return []
        text = match_window(raw)
        m = KMSG.match(text)
        if m:
            ts = self._since_boot(int(m.group(3)) / 1_000_000, now)
            message = text[m.end() :]
            if "\\x" in message:  # kmsg escapes newlines and control characters as \xNN
                message = KMSG_ESCAPE.sub(lambda e: chr(int(e.group(1), 16)), message)
            return self._parts(raw, message.split("\n"), ts, now)
        ts, message = strip_prefix(text.strip(), now, lambda seconds: self._since_boot(seconds, now))
        if "#012" in message:  # rsyslog writes a record's newlines as #012
            return self._parts(raw, message.split("#012"), ts, now)
        return self._message(raw, message, ts, now)

    def _parts(self, raw: str, parts: list[str], ts: datetime, now: datetime) -> list[Event]:
        """One record holding several lines: the first keeps the raw record as its line, the rest their text."""
        events: list[Event] = []
        for i, part in enumerate(parts):
            part = part.strip()
            events += self._message(raw if i == 0 else part, part, ts, now)
        return events

    def _since_boot(self, seconds: float, now: datetime) -> datetime:
        if self.boot_time is None:
            return now  # no boot time: when we read it is the best we know
        return self.boot_time + timedelta(seconds=seconds)

    # -- messages ----------------------------------------------------------------------------------

    def _message(self, raw: str, msg: str, ts: datetime, now: datetime) -> list[Event]:
        events: list[Event] = []
        if self._fell is not None:
            if self._continues_fell(msg):
                self._fell.lines.append(raw)
                self._fell.texts.append(msg)
                if "fallen off the bus" in msg or msg.rstrip().endswith("."):
                    return self._finish_fell()  # the driver's sentence is over
                return []
            events += self._finish_fell()
        if self._aer is not None:
            if self._continues_aer(raw, msg):
                return []
            events += self._finish_aer()
        if self._oom is not None:
            if self._continues_oom(raw, msg):
                return events + self._finish_oom()
            events += self._finish_oom()
        if "NVRM" in msg:
            events += self._nvrm(raw, msg, ts)
        elif "SXid" in msg:
            events += self._sxid(raw, msg, ts)
        elif "AER" in msg or "PCIe Bus Error" in msg:
            events += self._aer_start(raw, msg, ts)
        elif "oom-kill:" in msg or "Killed process" in msg or "Kill process" in msg:
            events += self._oom_start(raw, msg, ts)
        elif _FM_NOTHING in msg or "abric" in msg:
            events += self._fabric_manager(raw, msg, ts)
        elif "mlx5_core" in msg:
            events += self._mlx5(raw, msg, ts)
        elif "EDAC" in msg:
            events += self._edac(raw, msg, ts)
        return events

    def _edac(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        m = _EDAC.search(msg)
        if not m:
            return []
        uncorrected = m.group(3) == "UE"
        fields = {
            "mc": int(m.group(1)),
            "count": int(m.group(2)),
            "uncorrected": uncorrected,
            "error": m.group(4).strip(),
            "location": m.group(5),
        }
        severity = "error" if uncorrected else "warning"
        return [
            Event(
                ts=ts,
                source=SOURCE,
                kind="edac",
                line=clip(raw),
                severity=severity,
                fields=fields,
                critical=uncorrected,
            )
        ]

    def _nvrm(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        m = _XID.search(msg)
        if m:
            return [self._xid(raw, m, ts)]
        m = _FELL_START.search(msg)
        if m:
            self._fell = _Block(ts, [raw], {"pci": m.group(1).lower()}, [msg])
            if "fallen off the bus" in msg:  # the whole message on one line
                return self._finish_fell()
            return []
        message = msg[msg.index("NVRM") :].removeprefix("NVRM:").strip()
        fields: dict[str, Any] = {"message": message}
        pci = _NVRM_PCI.search(message)
        if pci:
            fields["pci"] = pci.group(1).lower()
        gpu = _NVRM_GPU.match(message)
        if gpu:
            fields["gpu_index"] = int(gpu.group(1))
        severity = "warning" if _NVRM_BAD.search(message) else "info"
        for form, pattern, form_severity in _NVRM_FAILURES:
            if pattern.search(message):
                # The service reads the form (ml/signatures/hardware.py); critical ones ship at once.
                fields["failure"] = form
                fields["gsp"] = form.startswith("gsp_")
                severity = form_severity
                break
        return [
            Event(
                ts=ts,
                source=SOURCE,
                kind="nvrm",
                line=clip(raw),
                severity=severity,
                fields=fields,
                critical=severity == "critical",
            )
        ]

    def _xid(self, raw: str, m: re.Match[str], ts: datetime) -> Event:
        attr, code, rest = m.group(1), int(m.group(2)), m.group(3).strip()
        fields: dict[str, Any] = {"xid": code, "pci": None, "pid": None, "process": None}
        pci = _XID_ATTR_PCI.search(attr)
        if pci:
            fields["pci"] = pci.group(1).lower()
        mig = _XID_ATTR_MIG.search(attr)
        if mig:
            fields["gpu_instance"] = int(mig.group(1))
            if mig.group(2) is not None:
                fields["compute_instance"] = int(mig.group(2))
        pid = _XID_PID.match(rest)
        if pid:
            fields["pid"] = int(pid.group(1)) if pid.group(1).isdigit() else None
            name = (pid.group(2) or "").strip().strip("'")
            fields["process"] = name if name and name != "<unknown>" else None
            rest = rest[pid.end() :]
        fields["message"] = rest
        info = lookup(code)
        fields["mnemonic"] = info.mnemonic
        fields["action"] = info.action
        severity = info.severity
        caused = _XID_CAUSED_BY.search(rest)
        if caused:
            fields["caused_by_xid"] = int(caused.group(1))
        link = _XID_LINK.search(rest)
        if link:
            fields["link"] = int(link.group(1))
        # NVLink Xids end in "(0x... 0x...)" register words; other messages use hex for addresses.
        codes = _XID_CODES.search(rest) if code == 74 or 144 <= code <= 150 else None
        if codes:
            fields["codes"] = [h.lower() for h in _HEX.findall(codes.group(1))]
        if 144 <= code <= 150:
            nl5 = _NVLINK5.search(rest)
            if nl5:
                fields["subcode_name"] = nl5.group(1)
                fields["fatal"] = nl5.group(2) == "Fatal"
                if not fields["fatal"]:
                    severity = "error"  # a non-fatal NVLink event (BER, say) is worth a look, not a drain
            if fields.get("codes"):
                # First word is the interrupt info; bits 20-25 are the subcode (NVIDIA Xid catalog, NVLink5).
                fields["intrinfo"] = fields["codes"][0]
                fields["subcode"] = (int(fields["codes"][0], 16) >> 20) & 0x3F
                if len(fields["codes"]) > 1:
                    fields["error_status"] = fields["codes"][1]
        elif code == 154:
            rec = _XID154.search(rest)
            if rec:
                fields["recovery_action"] = rec.group(2)
                # The driver is saying what the GPU now needs; anything but "None" means act.
                severity = "warning" if rec.group(2).strip().lower() == "none" else "critical"
        return Event(
            ts=ts,
            source=SOURCE,
            kind="xid",
            line=clip(raw),
            severity=severity,
            fields=fields,
            critical=severity == "critical",
        )

    def _continues_fell(self, msg: str) -> bool:
        assert self._fell is not None
        return (
            msg.startswith("NVRM:") and len(self._fell.lines) < 5 and "Xid" not in msg and not _FELL_START.search(msg)
        )

    def _finish_fell(self) -> list[Event]:
        block, self._fell = self._fell, None
        if block is None:
            return []
        text = " ".join(t.removeprefix("NVRM:").strip() for t in block.texts)
        fields = dict(block.fields)
        pci_id = _PCI_ID.search(text)
        if pci_id:
            fields["pci_id"] = pci_id.group(1).lower()
        line = clip("\n".join(block.lines))
        if "fallen off the bus" not in text:
            # Same opening, other news ("... is not supported by the NVIDIA 535 driver"): plain NVRM.
            fields["message"] = text
            severity = "warning" if _NVRM_BAD.search(text) else "info"
            return [Event(ts=block.ts, source=SOURCE, kind="nvrm", line=line, severity=severity, fields=fields)]
        info = lookup(79)
        # Newer drivers print only this message, no "Xid 79" line: it is the same event (NVSentinel #155).
        fields.update(
            {
                "xid": 79,
                "pid": None,
                "process": None,
                "message": text,
                "mnemonic": info.mnemonic,
                "action": info.action,
                "from_multiline": True,
            }
        )
        # The block names the function (0000:b3:00.0); Xid lines name the device (0000:b3:00): match them.
        fields["pci"] = fields["pci"].rsplit(".", 1)[0]
        return [
            Event(ts=block.ts, source=SOURCE, kind="xid", line=line, severity="critical", fields=fields, critical=True)
        ]

    def _sxid(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        m = _SXID.search(msg)
        if not m:
            return []
        rest = m.group(4).strip()
        head_key = (m.group(1), m.group(2).lower(), int(m.group(3)))
        if _SXID_DETAIL.match(rest):
            # "Severity N ..." / "Data {...}" lines after the header: decoded only by NVIDIA. Without the header
            # (a log that kept only the Data line) they are the only trace of the error: one event for them.
            if head_key == self._sxid_head:
                return []
            self._sxid_head = head_key
            fields = {"sxid": head_key[2], "pci": head_key[1], "switch": head_key[0], "fatal": None, "message": rest}
            return [Event(ts=ts, source=SOURCE, kind="sxid", line=clip(raw), severity="warning", fields=fields)]
        self._sxid_head = head_key
        head = rest.split(",", 1)
        fatal = head[0].strip().lower() == "fatal"
        fields: dict[str, Any] = {
            "sxid": int(m.group(3)),
            "pci": m.group(2).lower(),
            "switch": m.group(1),
            "fatal": fatal,
            "message": head[1].strip() if len(head) > 1 and head[0].strip().lower() in ("fatal", "non-fatal") else rest,
        }
        link = _XID_LINK.search(rest)
        if link:
            fields["link"] = int(link.group(1))
        severity = "critical" if fatal else "warning"
        return [
            Event(ts=ts, source=SOURCE, kind="sxid", line=clip(raw), severity=severity, fields=fields, critical=fatal)
        ]

    def _mlx5(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        """A network adapter's own fatal error (`nic_fatal`) or a port module's (`nic_module_error`: the cable or
        transceiver): critical, so the agent ships them at once; a link's up and down lines are the port watch's
        business (agents/port_watch.py)."""
        m = _MLX5.search(msg)
        if m is None:
            return []
        text = m.group(3).strip()
        fields: dict[str, Any] = {"device": m.group(1), "driver": "mlx5_core", "message": clip(text, 500)}
        if m.group(2):
            fields["function"] = m.group(2)
        if fatal := _MLX5_FATAL.search(text):
            kind = "nic_fatal"
            if fatal.group(1):
                fields["error"] = int(fatal.group(1))
        elif module := _MLX5_MODULE.search(text):
            kind = "nic_module_error"
            fields |= {"module": int(module.group(1)), "status": module.group(2), "problem": module.group(3)}
        else:
            return []
        return [
            Event(ts=ts, source=SOURCE, kind=kind, line=clip(raw), severity="critical", fields=fields, critical=True)
        ]

    # -- the OOM killer: "oom-kill:..." and "Out of memory: Killed process ...", one event ---------------------

    def _oom_start(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        kill = _OOM_KILL.search(msg)
        if kill:
            fields: dict[str, Any] = {"host": True, "process": kill.group(2).strip() or None, "pid": int(kill.group(3))}
            if kill.group(1):
                fields["constraint"] = kill.group(1)
            self._oom = _Block(ts, [raw], fields, [msg])
            return []  # its "Killed process" line comes next, with the memory it held
        old = _OOM_KILL_OLD.search(msg)
        if old:
            fields = {"host": True, "process": old.group(3).strip() or None, "pid": int(old.group(2))}
            if old.group(1).startswith("Memory cgroup"):
                fields["cgroup"] = True
            self._oom = _Block(ts, [raw], fields, [msg])
            return []
        killed = _OOM_KILLED.search(msg)
        if not killed:
            return []
        self._oom = _Block(ts, [], {"host": True, "pid": int(killed.group(2))})
        self._continues_oom(raw, msg)
        return self._finish_oom()

    def _continues_oom(self, raw: str, msg: str) -> bool:
        """Merge the "Killed process" line of the pending kill into it; False when the line is not that."""
        block = self._oom
        assert block is not None
        killed = _OOM_KILLED.search(msg)
        if not killed or int(killed.group(2)) != block.fields["pid"]:
            return False
        block.lines.append(raw)
        block.texts.append(msg)
        block.fields["process"] = killed.group(3).strip() or block.fields.get("process")
        if (killed.group(1) or "").startswith("Memory cgroup"):
            block.fields["cgroup"] = True  # a container's limit, not the whole machine's memory
        rss = _OOM_RSS.search(msg)
        if rss:
            block.fields["anon_rss_bytes"] = int(rss.group(1)) * 1024
        return True

    def _finish_oom(self) -> list[Event]:
        block, self._oom = self._oom, None
        if block is None:
            return []
        fields = block.fields
        fields["message"] = clip(block.texts[-1].strip(), 500)
        if fields.get("constraint") == "CONSTRAINT_MEMCG":
            fields["cgroup"] = True
        # The killed process lost its memory and its work: a training rank dies of it. Ship it at once.
        return [
            Event(
                ts=block.ts,
                source=SOURCE,
                kind="oom",
                line=clip("\n".join(block.lines)),
                severity="error",
                fields=fields,
                critical=True,
            )
        ]

    # -- the fabric manager ----------------------------------------------------------------------------

    def _fabric_manager(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        if _FM_NOTHING in msg:
            state, severity = "nothing_to_do", "info"  # no NVSwitch to manage: nothing is wrong
        elif not _FM.search(msg):
            return []
        elif _FM_CANNOT.search(msg):
            state, severity = "cannot_start", "error"
        elif _FM_EXITED.search(msg):
            state, severity = "exited", "warning"  # the reason is on another line (nothing to do, or not)
        else:
            return []
        fields = {"state": state, "message": clip(msg.strip(), 500)}
        return [Event(ts=ts, source=SOURCE, kind="fabric_manager", line=clip(raw), severity=severity, fields=fields)]

    # -- PCIe AER: a header ("AER: Corrected error received: <bdf>") and detail lines, one event ------

    def _aer_start(self, raw: str, msg: str, ts: datetime) -> list[Event]:
        m = _AER_LINE.match(msg)
        if not m:
            return []
        port, body = m.group(2).lower(), m.group(3)
        header = _AER_HEADER.search(body)
        if header:
            source = header.group(3).lower().rstrip(",")
            fields: dict[str, Any] = {
                "device": source if re.fullmatch(_PCI, source) else port,
                "port": port,
                "severity": _aer_severity(header.group(1), header.group(2)),
            }
            self._aer = _Block(ts, [raw], fields)
            return []
        bus = _AER_BUS.search(body)
        if bus:
            self._aer = _Block(ts, [raw], {"device": port, "port": port})
            self._aer_details(body)
            return []
        return []

    def _continues_aer(self, raw: str, msg: str) -> bool:
        block = self._aer
        assert block is not None
        m = _AER_LINE.match(msg)
        if not m or len(block.lines) >= 40:
            return False
        device = m.group(2).lower()
        if device not in (block.fields["device"], block.fields["port"]):
            return False
        body = m.group(3)
        if _AER_HEADER.search(body):
            return False  # the next error: its own event
        if not self._aer_details(body):
            return False
        block.lines.append(raw)
        return True

    def _aer_details(self, body: str) -> bool:
        """Merge one detail line into the pending AER block; False when it is not a detail line."""
        fields = self._aer.fields if self._aer is not None else {}
        bus = _AER_BUS.search(body)
        if bus:
            fields.setdefault("severity", _aer_severity(bus.group(1), None))
            fields["type"] = bus.group(2).strip()
            if bus.group(3):
                fields["agent"] = bus.group(3).strip()
            return True
        status = _AER_STATUS.search(body)
        if status:
            fields["vendor_device"] = status.group(1).lower()
            fields["status"] = status.group(2).lower()
            fields["mask"] = status.group(3).lower()
            return True
        bit = _AER_BIT.search(body)
        if bit and body.lstrip().startswith("["):
            fields.setdefault("errors", []).append(bit.group(2).strip())
            return True
        return body.lstrip().startswith(("aer_status:", "aer_layer=", "TLP Header:", "Error of this Agent"))

    def _finish_aer(self) -> list[Event]:
        block, self._aer = self._aer, None
        if block is None:
            return []
        fields = block.fields
        fields.setdefault("severity", "corrected")
        severity = _AER_SEVERITY[fields["severity"]]
        return [
            Event(
                ts=block.ts,
                source=SOURCE,
                kind="pcie_aer",
                line=clip("\n".join(block.lines)),
                severity=severity,
                fields=fields,
                critical=severity == "critical",
            )
        ]
