"""dcgm-exporter's formats seen in the field, from the real outputs in tests/fixtures/formats (each with its source
in a header): label sets old and new, Kubernetes and HPC job labels, blanks, fields a GPU lacks, DCP fields."""

from __future__ import annotations

import re

from agents.agent import _sample
from agents.gpu import parse_exporter
from tests import paths

FIXTURES = paths.FIXTURES / "formats"


def _page(name: str) -> str:
    return (FIXTURES / name).read_text().split("\n---\n", 1)[1]


def _render(field: str, value: str, **attributes: str) -> str:
    """One series as dcgm-exporter 4.x renders it: its own template (the fixture's first line) filled in, then
    the Kubernetes/HPC attributes the exporter appends in place of the template's `...`."""
    template = _page("dcgm_exporter_render_template_current.txt").splitlines()[0]
    mig = attributes.pop("mig", "")
    line = re.sub(r"\{\{if \$metric\.MigProfile\}\}(.*?)\{\{end\}\}", r"\1" if mig else "", template)
    line = re.sub(r"\{\{if \$metric\.Hostname \}\}(.*?)\{\{end\}\}", r"\1", line)
    values = {
        "$counter.FieldName": field, "$metric.GPU": "3", "$metric.UUID": "UUID",
        "$metric.GPUUUID": "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "$metric.GPUPCIBusID": "00000000:9B:00.0",
        "$metric.GPUDevice": "nvidia3", "$metric.GPUModelName": "NVIDIA H100 80GB HBM3", "$metric.MigProfile": mig,
        "$metric.GPUInstanceID": "1", "$metric.Hostname": "gpu-node-007",
    }  # fmt: skip
    line = re.sub(r"\{\{ (\S+) \}\}", lambda m: values[m.group(1)], line)
    extra = "".join(f',{k}="{v}"' for k, v in attributes.items())
    return line.replace(" ... } VALUE", extra + "} " + value)


def test_the_current_label_set_gives_the_inventory_and_kubernetes_workload() -> None:
    page = "\n".join(
        [
            _render("DCGM_FI_DEV_SM_CLOCK", "1980", container="trainer", namespace="ml", pod="llama-405b-worker-12"),
            _render("DCGM_FI_PROF_SM_ACTIVE", "0.93", container="trainer", namespace="ml", pod="llama-405b-worker-12"),
            _render("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775794", container="", namespace="", pod=""),
        ]
    )
    (gpu,) = parse_exporter(page)
    assert (gpu.gpu, gpu.uuid, gpu.pci_bus_id, gpu.model, gpu.hostname) == (
        3, "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "00000000:9B:00.0", "NVIDIA H100 80GB HBM3", "gpu-node-007"
    )  # fmt: skip
    # The workload labels name the job's pod; they are not part of the field names, and a DCP field is a field.
    assert gpu.workload == {"container": "trainer", "namespace": "ml", "pod": "llama-405b-worker-12"}
    assert gpu.fields == {
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,
        "DCGM_FI_PROF_SM_ACTIVE": 0.93,
        "DCGM_FI_DEV_MEMORY_TEMP": None,
    }
    assert _sample("t", gpu)["workload"] == gpu.workload


def test_blank_workload_labels_of_the_readme_sample_name_no_workload() -> None:
    """The README's own output: Kubernetes mode on a GPU no pod holds (empty labels), a blank (not supported)."""
    lines = [
        line for line in _page("dcgm_exporter_render_template_current.txt").splitlines() if line.startswith("DCGM")
    ]
    (gpu,) = parse_exporter("\n".join(lines))
    assert gpu.workload == {} and "workload" not in _sample("t", gpu)
    assert gpu.fields == {"DCGM_FI_DEV_SM_CLOCK": 139.0, "DCGM_FI_DEV_MEMORY_TEMP": None}


def test_hpc_job_labels_and_the_older_pod_label_names() -> None:
    page = "\n".join(
        [
            _render("DCGM_FI_DEV_GPU_UTIL", "97", hpc_job="812345"),
            _render("DCGM_FI_DEV_POWER_USAGE", "612.5", hpc_job="812345"),
        ]
    )
    (gpu,) = parse_exporter(page)
    assert gpu.workload == {"hpc_job": "812345"}
    assert gpu.fields == {"DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_DEV_POWER_USAGE": 612.5}  # no {hpc_job=...} suffix
    # dcgm-exporter 2.x named the Kubernetes labels pod_name, pod_namespace, container_name.
    (old,) = parse_exporter(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",pod_name="train-0",pod_namespace="ml",container_name="c"} 5'
    )
    assert old.workload == {"pod": "train-0", "namespace": "ml", "container": "c"}
    assert old.fields == {"DCGM_FI_DEV_GPU_UTIL": 5.0}


def test_fields_a_gpu_does_not_support_and_dcp_fields_absent() -> None:
    """The V100 page (issue 250): no DCP (DCGM_FI_PROF_*) fields, no NVLink or row-remap fields, the 3.x labels
    with `Hostname`: each GPU carries what it reports and nothing else."""
    gpus = parse_exporter(_page("dcgm_exporter_metrics_v100_issue250.txt"))
    assert [g.gpu for g in gpus] == [0, 1, 2, 3]
    for gpu in gpus:
        assert not any(f.startswith("DCGM_FI_PROF_") for f in gpu.fields)
        assert gpu.workload == {} and gpu.pci_bus_id is None and gpu.hostname == "r6i3n0"
    assert gpus[0].fields["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 0.0
    assert "DCGM_FI_DEV_POWER_MGMT_LIMIT" not in gpus[0].fields  # the page is cut: GPUs 0 and 1 lack it
    assert gpus[3].fields["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 300.0


def test_a_series_without_a_gpu_label_is_not_a_gpu() -> None:
    """DCGM issue 235: the Xid gauge as scraped, with err_code/err_msg and no `gpu` label: nothing to attribute."""
    assert parse_exporter(_page("dcgm_exporter_xid_errors_dcgm235.txt")) == []


def test_a_mig_instance_series_is_not_the_whole_gpu() -> None:
    (gpu,) = parse_exporter(
        "\n".join(
            [
                _render("DCGM_FI_DEV_GPU_UTIL", "40", pod="a-0", namespace="ml"),
                _render("DCGM_FI_DEV_GPU_UTIL", "99", mig="1g.10gb", pod="b-0", namespace="ml"),
            ]
        )
    )
    assert gpu.fields == {"DCGM_FI_DEV_GPU_UTIL": 40.0} and gpu.workload == {"pod": "a-0", "namespace": "ml"}
