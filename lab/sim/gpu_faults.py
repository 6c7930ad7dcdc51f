"""The faults of the simulated GPUs, mixed into the cluster (lab/sim/model.py) on top of FaultInjection
(lab/sim/faults.py): a GPU off the bus, a hung GSP, ECC errors and their row remaps, faults only the counters show,
silent data corruption, a degraded PCIe or NVLink, thermal stragglers; each with its kernel and training log lines."""

from __future__ import annotations

from lab.sim import dcgm_fields as F
from lab.sim import logformat as fmt
from lab.sim.faults import FaultInjection, FaultRecord, comm_factor_for
from lab.sim.gpu import Gpu
from lab.sim.job import CHECKPOINT_PAUSE
from lab.sim.modes import CRASH_ECC, CULPRIT_SYNC
from lab.sim.realism import FORCED_CHECKPOINT_S
from lab.sim.scenarios import FLAP_OFF_S, FLAP_ON_S, FaultSpec

NVLINK_COMM_FACTOR = 1.8  # NVLink replays stretch the all-reduce
XID_INTO_CHECKPOINT_S = (3.0, 8.0)  # fault_in_checkpoint: the GPU drops off this far into the save
PCIE_DOWNGRADE_COMM_FACTOR = comm_factor_for(1.15)


class GpuFaults(FaultInjection):
    """Cluster's GPU faults (lab/sim/model.py mixes this in); the state is the cluster's, as FaultInjection's."""

    def _inject_gpu_lost(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        # The link degrades first (AER corrected errors, PCIe replays), then the GPU drops off the bus.
        g.pcie_flaky = True
        self._kern(n, *fmt.aer_corrected(f"0000:{g.bus - 1:02x}:00.0"))
        self._schedule(2.0, lambda: self._falls_off_bus(n, g))

    def _falls_off_bus(self, n: int, g: Gpu) -> None:
        """Xid 79: the GPU's series vanish, its rank blocks in a CUDA call, the others in the next collective."""
        g.lost, g.xid, g.pcie_flaky = True, 79, False
        self._kern(n, f"NVRM: GPU at {fmt.xid_bus(g.bus)}: {g.uuid}")
        self._kern(n, f"NVRM: GPU Board Serial Number: {g.serial}")
        self._kern(n, fmt.xid(g.bus, 79, "GPU has fallen off the bus."))
        self._kern(n, f"NVRM: GPU {fmt.pci_addr(g.bus)}: GPU has fallen off the bus.")
        self._kern(n, *fmt.fallen_off_bus(g.bus, F.PCI_DEVICE_ID))
        self._hang_job({self._rank(n, g.index): CULPRIT_SYNC}, self.config.watchdog_seconds)

    def _inject_gpu_reset(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Xid 119: the GPU's GSP stops answering RPCs; the driver needs the GPU reset, the rest of the node is fine."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        rank = self._rank(n, g.index)
        g.xid = 119
        self._kern(
            n,
            fmt.xid(
                g.bus,
                119,
                "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
                "(0x20801348 0x404).",
                pid=self._pid(rank),
                name="python",
            ),
        )
        self._train(n, fmt.traceback_cuda(rank, "unspecified launch failure"))
        self._set_mode(rank, CRASH_ECC)  # the rank process exits with its CUDA error
        self._hang_job({}, self.config.watchdog_seconds)

    def _inject_ecc_dbe(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.sbe_vol += self.rng.randrange(2, 9)
        g.sbe_agg += g.sbe_vol
        self._framebuffer_dbe(n, g)
        self._crash_rank_ecc(n, g)

        def remap() -> None:
            g.xid = 63
            g.unc_remap += 1
            row = self.rng.getrandbits(28)
            self._row_remapper(
                n, g, 63, f"Row Remapper: New row (0x{row:016x}) marked for remapping, reset gpu to activate."
            )

        self._schedule(0.6, remap)

    def _framebuffer_dbe(self, n: int, g: Gpu) -> None:
        """Xid 48: an uncorrectable double-bit error in the GPU's memory, counted."""
        g.dbe_vol += 1
        g.dbe_agg += 1
        g.xid = 48
        partition, sub = self.rng.randrange(8), self.rng.randrange(2)
        self._kern(
            n,
            fmt.xid(
                g.bus,
                48,
                "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
                f"partition {partition}, subpartition {sub}.",
            ),
        )

    def _row_remapper(self, n: int, g: Gpu, code: int, text: str) -> None:
        """The row remapper's Xid (63: a row marked; 64: no spare row left), in the GPU's rank's context."""
        self._kern(n, fmt.xid(g.bus, code, text, self._pid(self._rank(n, g.index)), "pt_main_thread"))

    def _crash_rank_ecc(self, n: int, g: Gpu) -> None:
        """The GPU's rank dies with CUDA's uncorrectable-ECC error; its node's torchrun tears down, peers wait."""
        rank = self._rank(n, g.index)
        self._train(n, fmt.traceback_ecc(rank))
        self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)
        self._schedule(1.0, lambda: self._teardown_node(n))

    def _inject_hbm_remap_failure(self, spec: FaultSpec, record: FaultRecord) -> None:
        """HBM3: an uncorrectable error in a row (Xid 48), and the remapper has no spare row left in its bank
        (Xid 64, DCGM_FI_DEV_ROW_REMAP_FAILURE=1): a reset cannot fix it, the GPU needs repair."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        self._framebuffer_dbe(n, g)
        self._crash_rank_ecc(n, g)

        def remap_fails() -> None:
            g.xid, g.remap_failure = 64, 1
            row = self.rng.getrandbits(28)
            self._row_remapper(
                n, g, 64, f"Row Remapper Error: (0x{row:016x}) - All reserved rows for bank are remapped"
            )

        self._schedule(0.5, remap_fails)

    def _inject_sram_ecc(self, spec: FaultSpec, record: FaultRecord) -> None:
        """GPU SRAM: an uncorrectable ECC error in an SM's SRAM, contained to the process (Xid 94, H100's form):
        the rank dies with CUDA's ECC error; a reset of the GPU clears it."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.dbe_vol += 1  # the volatile total counts SRAM errors too
        g.dbe_agg += 1
        g.xid = 94
        unit = self.rng.choice(("SM (0x1)", "SM (0x2)", "LTC (0x1)"))
        self._kern(
            n,
            fmt.xid(g.bus, 94, f"Contained: {unit}. RST: Yes, D-RST: No", self._pid(self._rank(n, g.index)), "python"),
        )
        self._crash_rank_ecc(n, g)

    def _inject_gsp_error(self, spec: FaultSpec, record: FaultRecord) -> None:
        """GSP: the GPU System Processor's task times out (Xid 120); the rank dies, a GPU reset recovers it."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        rank = self._rank(n, g.index)
        g.xid = 120
        pc = 0x5D00000 + self.rng.randrange(0x100000)
        self._kern(n, fmt.xid(g.bus, 120, f"GSP task timeout @ pc:0x{pc:x}, task: 1", self._pid(rank), "python"))
        self._train(n, fmt.traceback_cuda(rank, "unspecified launch failure"))
        self._set_mode(rank, CRASH_ECC)
        self._hang_job({}, self.config.watchdog_seconds)

    def _inject_sdc(self, spec: FaultSpec, record: FaultRecord) -> None:
        """Silent data corruption: one GPU computes wrong values with no error anywhere; the loss its node reports
        turns NaN or jumps on most steps, while the other nodes' stay ordinary."""
        self.gpus[spec.node][spec.gpu].corrupting = True  # type: ignore[index]

    def _inject_nvlink(self, spec: FaultSpec, record: FaultRecord) -> None:
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        g.nvlink_bad = True
        g.xid = 74
        self.job.comm_factor = NVLINK_COMM_FACTOR

        def xid74(remaining: int) -> None:
            link = self.rng.randrange(18)
            text = f"NVLink: fatal error detected on link {link}(0x0, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0)"
            self._kern(n, fmt.xid(g.bus, 74, text))
            if remaining > 0:
                self._schedule(15.0 + self.rng.random() * 15.0, lambda: xid74(remaining - 1))

        xid74(3)

    def _inject_pcie_downgrade(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        # Trained at half width, or at Gen3 speed: a marginal riser, a reseated board, a bad retimer.
        g.pcie_gen, g.pcie_width = self.rng.choice(((F.PCIE_MAX_GEN, 8), (3, F.PCIE_MAX_WIDTH)))
        self.job.comm_factor = PCIE_DOWNGRADE_COMM_FACTOR
        self._plan_step()

    def _inject_row_remap_pending(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        # Correctable errors in one row crossed the remap threshold: the row is recorded, the remap waits for
        # a GPU reset. No Xid line in this scenario: the counters are the only evidence.
        errors = self.rng.randint(3, 12)
        g.sbe_vol += errors
        g.sbe_agg += errors
        g.cor_remap += 1
        g.remap_pending = 1

    # Counter-only faults (issue 30): nothing in any log, no Xid; dcgm-exporter's counters are the evidence.
    def _inject_pcie_replay_climb(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].pcie_flaky = True  # type: ignore[index]  # replays climb, the GPU stays

    def _inject_nvlink_crc_climb(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].nvlink_bad = True  # type: ignore[index]  # CRC and replay counters climb
        self.job.comm_factor = NVLINK_COMM_FACTOR

    def _inject_row_remap_failure(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        g.unc_remap += 1  # an uncorrectable error's row remapped...

        def fail() -> None:  # ...then one the GPU has no spare row left for
            g.unc_remap += 1
            g.remap_failure = 1

        self._schedule(20.0 + self.rng.random() * 20.0, fail)

    def _inject_straggler(self, spec: FaultSpec, record: FaultRecord) -> None:
        self.gpus[spec.node][spec.gpu].thermal = True  # type: ignore[index]
        self._plan_step()  # the step in flight is already slower

    def _inject_fault_in_checkpoint(self, spec: FaultSpec, record: FaultRecord) -> None:
        """The job saves (its save interval came, or one is under way); a few seconds in, a GPU falls off the bus."""
        n, g = spec.node, self.gpus[spec.node][spec.gpu]  # type: ignore[index]
        assert n is not None
        if self.job.pause != CHECKPOINT_PAUSE:
            self._begin_checkpoint(self.rng.uniform(*FORCED_CHECKPOINT_S))
        into = self.rng.uniform(*XID_INTO_CHECKPOINT_S)
        self.job.pause_until = max(self.job.pause_until, self.t + into + 5.0)  # the save is still going then

        def falls() -> None:
            # The fault is the Xid: its time is when the GPU drops, not when the save began.
            record.injected_at, record.t = self._ts(), self.t
            self.faults_version += 1
            self._falls_off_bus(n, g)

        self._schedule(into, falls)

    def _inject_intermittent_straggler(self, spec: FaultSpec, record: FaultRecord) -> None:
        g = self.gpus[spec.node][spec.gpu]  # type: ignore[index]

        def throttle(on: bool) -> None:
            g.thermal = on
            self._plan_step()
            self._schedule(FLAP_ON_S if on else FLAP_OFF_S, lambda: throttle(not on))

        throttle(True)
