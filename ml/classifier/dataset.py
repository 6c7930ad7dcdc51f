"""The labeled lines and their generated variants: the model should learn the words, not the hosts and numbers.

The shipped TSV holds several hundred base lines: real lines, taken verbatim from the public corpus of failure logs
(tests/fixtures/logs), and lines written from real failure messages. Each row names its source (the corpus file or
"written") and its thread (the GitHub issue or document the corpus file quotes, "written" for written lines), so an
evaluation can hold out whole threads. At train time every base line gets `n_variants` copies with fresh hosts,
IPs, ranks, pids, PCI ids, numbers, paths and log prefixes; all copies of one base line share a group so a grouped
split keeps them on one side.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ml.normalize import normalize

# The classifier's categories: a subset of ml.findings.CATEGORIES ("unknown" = benign or unreadable).
CATEGORIES: tuple[str, ...] = ("gpu_hardware", "network", "user_code", "oom", "storage", "nan", "unknown")
DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "labeled_lines.tsv"
WRITTEN = "written"  # source and thread of the lines written from knowledge rather than taken from the corpus


@dataclass(frozen=True, slots=True)
class LabeledLine:
    """One base line of the shipped data: its category, text, the file it came from and that file's thread.

    Lines from one thread (one GitHub issue quoted by one or more corpus files) describe one incident, so an honest
    evaluation keeps a thread's lines on one side of a split.
    """

    category: str
    line: str
    source: str
    thread: str = WRITTEN

    @property
    def real(self) -> bool:
        """Whether the line comes from the corpus of real logs (not written)."""
        return self.source != WRITTEN


@dataclass(frozen=True, slots=True)
class Dataset:
    """Training texts (raw, not yet normalized), their labels, the base-line group of each and the index of the
    base line (in the rows given to `build`) each text was made from, -1 for a generated noise line."""

    texts: list[str]
    labels: list[str]
    groups: list[int]
    origin: list[int] = field(default_factory=list)


def load_labeled(path: str | Path | None = None) -> list[LabeledLine]:
    """Read the labeled TSV (category, line, source[, thread]); '#' lines are comments, the first other a header.

    Three-column files (before threads were recorded) still load: a corpus line's thread is then its source file,
    which keeps each file on one side of a thread split but cannot join two files that quote one thread.
    """
    rows: list[LabeledLine] = []
    header_seen = False
    for number, raw in enumerate(Path(path or DATA_PATH).read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip() or raw.startswith("#"):
            continue
        if not header_seen:
            header_seen = True
            continue
        parts = raw.split("\t")
        if len(parts) not in (3, 4) or parts[0] not in CATEGORIES or not parts[1].strip() or not parts[2].strip():
            raise ValueError(f"line {number}: expected 'category<TAB>line<TAB>source<TAB>thread' with a known category")
        thread = parts[3].strip() if len(parts) == 4 else parts[2]
        if not thread or (parts[2] == WRITTEN) != (thread == WRITTEN):
            raise ValueError(f"line {number}: the thread is 'written' exactly when the source is")
        rows.append(LabeledLine(parts[0], parts[1], parts[2], thread))
    return rows


# A corpus file names its thread in a `# thread: owner/repo#N` header line; older files only cite a `# source:` URL.
_THREAD_HEADER = re.compile(r"^#\s*thread:\s*(\S+)", re.M)
_SOURCE_HEADER = re.compile(r"^#\s*source:\s*(.*)$", re.M)
_GITHUB_ISSUE = re.compile(r"https?://github\.com/([\w.-]+/[\w.-]+)/(?:issues|pull|discussions)/(\d+)")
_GITHUB_DOC = re.compile(r"https?://github\.com/([\w.-]+/[\w.-]+?)/?\s+([\w./-]+\.\w+)")


def thread_of_header(text: str) -> str | None:
    """The thread a corpus file quotes: its `# thread:` header, else one derived from its `# source:` URL.

    An issue or pull request is `owner/repo#N`; a document in a repository is `owner/repo:path`; None when the
    header names neither (the caller falls back to the file name).
    """
    header = text.split("\n---\n", 1)[0]
    if found := _THREAD_HEADER.search(header):
        return found.group(1)
    source = _SOURCE_HEADER.search(header)
    if source is None:
        return None
    if issue := _GITHUB_ISSUE.search(source.group(1)):
        return f"{issue.group(1)}#{issue.group(2)}"
    if doc := _GITHUB_DOC.search(source.group(1)):
        return f"{doc.group(1)}:{doc.group(2)}"
    return None


def corpus_thread(path: str | Path) -> str:
    """The thread of one corpus file (tests/fixtures/logs/*.txt), or its file name when the header names none."""
    file = Path(path)
    return thread_of_header(file.read_text(encoding="utf-8")) or file.name


def corpus_body(path: str | Path) -> list[str]:
    """The log lines of one corpus file: everything after the header's `---` line."""
    text = Path(path).read_text(encoding="utf-8")
    _, sep, body = text.partition("\n---\n")
    return body.splitlines() if sep else []


def data_sha256(path: str | Path | None = None) -> str:
    """The SHA-256 of the labeled data file, recorded in the artifact so a model names its data."""
    return hashlib.sha256(Path(path or DATA_PATH).read_bytes()).hexdigest()


# ---- random replacements -------------------------------------------------------------------------------------

_HOST_STEMS = ("node", "gpu-node", "worker", "dgx", "compute", "cn", "h100", "a100", "trn", "gpu", "hpc")
_DIRS = (
    "/opt/conda/lib/python3.10/site-packages/torch/",
    "/usr/local/lib/python3.11/dist-packages/",
    "/home/alice/venvs/train/lib/python3.10/site-packages/",
    "/mnt/lustre/proj/llm/",
    "/scratch/bob/runs/exp17/",
    "/data/shards/",
    "/checkpoints/job-2231/",
    "/workspace/megatron/",
    "/tmp/",
)
_LOGGER_FILES = ("api.py", "train.py", "distributed_c10d.py")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _host(rng: random.Random) -> str:
    """A cluster-style host name."""
    stem = rng.choice(_HOST_STEMS)
    if rng.random() < 0.2:
        return f"ip-10-{rng.randint(0, 255)}-{rng.randint(0, 255)}-{rng.randint(1, 254)}"
    return f"{stem}{rng.choice(('-', '', '-'))}{rng.randint(0, 4096):0{rng.choice((1, 2, 3, 4))}d}"


def _ip(rng: random.Random) -> str:
    """A private IPv4 address."""
    first = rng.choice((10, 172, 192))
    return f"{first}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def _hex(rng: random.Random, width: int) -> str:
    """`width` random lowercase hex digits."""
    return "".join(rng.choice("0123456789abcdef") for _ in range(max(1, width)))


def _pci(rng: random.Random, match: re.Match[str]) -> str:
    """A PCI bus id shaped like the one it replaces (domain width, function suffix, case)."""
    text = match.group(0)
    domain = text.split(":", 1)[0]
    new = f"{'0' * len(domain)}:{_hex(rng, 2)}:{_hex(rng, 2)}"
    if "." in text:
        new += f".{rng.randint(0, 7)}"
    return new.upper() if text.isupper() else new


def _number(rng: random.Random, text: str) -> str:
    """A number of about the same size and the same decimal format."""
    whole, _, frac = text.partition(".")
    digits = max(1, len(whole) + rng.choice((-1, 0, 0, 1)))
    value = str(rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1))
    return f"{value}.{''.join(rng.choice(string.digits) for _ in frac)}" if frac else value


# Pass 1: identifiers. Each alternative is a named group; its replacement builder gets the match.
_IDS = re.compile(
    r"(?P<nccl>^\s*[\w.-]+:\d+:\d+ \[\d+\])"
    r"|(?P<uuid>\bGPU-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b)"
    r"|(?P<pci>(?:(?<![0-9a-fA-F:])|(?<=PCI:))[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?\b)"
    r"|(?P<ip>(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]))"
    r"|(?P<hex>\b0x[0-9a-fA-F]+\b)"
    r"|(?P<dir>(?<![\w/<>.])(?:/[\w.@+~-]+)+/)"
    r"|(?P<host>\b(?:node|gpu-node|worker|dgx|compute|cn|h100|a100|hostname|ip)(?:-[\w]*)?-?\d+(?:-\d+)*\b)",
    re.IGNORECASE,
)
# Pass 2: numbers, except the codes whose digits carry meaning (Xid, errno, IB status, signals, exit codes)
# and the PCI ids and IPs pass 1 wrote.
_NUMS = re.compile(
    r"(?P<keep>\bS?Xid\b(?:\s*\([^)\n]*\))?\s*[:=]?\s*\d+|\b(?:Errno|errno|status|vendor err|with error|error"
    r"|signal|Signal|exitcode|exit code|Exit Code|SIG\w+)\s*[=:]?\s*-?\d+|\bcuda:\d|\bsm_\d+"
    r"|(?<![0-9a-fA-F:])[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?\b"
    r"|(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]))"
    r"|(?P<num>(?<![\w.])\d+(?:\.\d+)?(?![\w]))"
)


def _perturb_ids(text: str, rng: random.Random) -> str:
    """Swap hosts, pids, PCI ids, IPs, hex values and directories for fresh random ones."""

    def repl(m: re.Match[str]) -> str:
        kind = m.lastgroup
        if kind == "nccl":
            lead = m.group(0)[: len(m.group(0)) - len(m.group(0).lstrip())]
            return f"{lead}{_host(rng)}:{rng.randint(100, 99999)}:{rng.randint(100, 99999)} [{rng.randint(0, 7)}]"
        if kind == "uuid":
            return f"GPU-{_hex(rng, 8)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 12)}"
        if kind == "pci":
            return _pci(rng, m)
        if kind == "ip":
            return _ip(rng)
        if kind == "hex":
            return "0x" + _hex(rng, len(m.group(0)) - 2 + rng.choice((-1, 0, 1)))
        if kind == "dir":
            return rng.choice(_DIRS) if rng.random() < 0.7 else m.group(0)
        return _host(rng)

    return _IDS.sub(repl, text)


def _perturb_numbers(text: str, rng: random.Random) -> str:
    """Replace free-standing numbers; meaningful codes stay."""
    return _NUMS.sub(lambda m: m.group(0) if m.lastgroup == "keep" else _number(rng, m.group(0)), text)


def _prefix(rng: random.Random) -> str:
    """A log prefix of the kinds launchers, loggers and the kernel put before a line."""
    rank = rng.randint(0, 511)
    ts = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    ts += f":{rng.randint(0, 59):02d},{rng.randint(0, 999):03d}"
    makers: list[Callable[[], str]] = [
        lambda: f"[rank{rank}]: ",
        lambda: f"{rank}: ",
        lambda: f"[default{rank % 8}]:",
        lambda: f"{ts} ",
        lambda: f"{ts} {rng.choice(('ERROR', 'WARNING', 'INFO', 'CRITICAL'))} ",
        lambda: f"[{ts}] [{rng.choice(('ERROR', 'WARN', 'INFO'))}] ",
        lambda: (
            f"{rng.choice('EWIF')}{rng.randint(101, 1231):04d} {ts[11:19]}.{rng.randint(0, 999999):06d} "
            f"{rng.randint(100, 99999)} {rng.choice(_LOGGER_FILES)}:{rng.randint(1, 999)}] "
        ),
        lambda: f"[{rng.randint(1, 999999):>6}.{rng.randint(0, 999999):06d}] ",
        lambda: f"{rng.choice(_MONTHS)} {rng.randint(1, 28):>2} {ts[11:19]} {_host(rng)} kernel: ",
        lambda: f"[{_host(rng)}] ",
    ]
    return rng.choice(makers)()


def make_variant(line: str, rng: random.Random) -> str:
    """One variant of a base line: new identifiers and numbers, maybe a log prefix, maybe cut short."""
    text = _perturb_numbers(_perturb_ids(line, rng), rng)
    if rng.random() < 0.5:
        text = _prefix(rng) + text
    if len(text) > 80 and rng.random() < 0.1:
        text = text[: int(len(text) * rng.uniform(0.6, 0.9))]  # quoted logs are often cut mid-line
    return text


# ---- benign nonsense, so that text unlike any fault reads as "unknown" ------------------------------------------

_BENIGN_WORDS = tuple(
    " ".join(
        (
            "the value item list batch sample config option reading writing done start stop ready loaded using set",
            "with for from into over queue cache buffer table record field entry update service request response",
            "client server user session report summary total count rate time window local remote default current",
            "next previous new old",
        )
    ).split(" ")
)


def noise_line(rng: random.Random) -> str:
    """A line of random letters, tokens or benign words: no fault vocabulary at all."""
    kind = rng.randrange(3)
    n = rng.randint(2, 12)
    if kind == 0:
        words = ("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 10))) for _ in range(n))
    elif kind == 1:
        alphabet = string.ascii_letters + string.digits + "-_/:.=#"
        words = ("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(n))
    else:
        words = (rng.choice(_BENIGN_WORDS) for _ in range(n))
    return " ".join(words)


def build(rows: Sequence[LabeledLine], *, n_variants: int = 20, seed: int = 0, noise_fraction: float = 0.05) -> Dataset:
    """Every base line plus `n_variants` variants, grouped by the base line's normalized text; then noise lines.

    Base lines that normalize to the same text share a group: they are one example, not two.
    """
    rng = random.Random(seed)
    group_of: dict[str, int] = {}
    texts: list[str] = []
    labels: list[str] = []
    groups: list[int] = []
    origin: list[int] = []
    for index, row in enumerate(rows):
        group = group_of.setdefault(normalize(row.line), len(group_of))
        for text in [row.line, *(make_variant(row.line, rng) for _ in range(n_variants))]:
            texts.append(text)
            labels.append(row.category)
            groups.append(group)
            origin.append(index)
    next_group = len(group_of)
    for _ in range(int(len(texts) * noise_fraction)):
        texts.append(noise_line(rng))
        labels.append("unknown")
        groups.append(next_group)  # each noise line its own group
        origin.append(-1)
        next_group += 1
    return Dataset(texts, labels, groups, origin)
