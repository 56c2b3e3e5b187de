"""The GPU table: sourced, dense (not sparse) figures, found by the names drivers report."""

import re
from urllib.parse import urlparse

import pytest

from kvsweep.errors import ConfigError
from kvsweep.gpu_datasheet import GPUS, detect, gpu_by_key

TERA, GB = 1e12, 1e9
# The bf16 tensor figures the vendors print with 2:4 sparsity (the asterisked column); the table's are half.
SPARSE_BF16_TFLOPS = {
    "a100-40gb": 624,
    "a100-80gb": 624,
    "h100-sxm": 1978.9,  # the datasheet rounds it to 1,979
    "h100-pcie": 1513,
    "h100-nvl": 1671,
    "h200-sxm": 1978.9,
    "l4": 242,
    "a10": 250,
}
# The FP32 (CUDA core, non-tensor) and sparse TF32 rows of the same datasheets: a float32 matmul runs at the first
# while TF32 is off (PyTorch's default), at half the second with it on.
FP32_TFLOPS = {
    "a100-80gb": 19.5,
    "h100-sxm": 67,
    "h100-pcie": 51,
    "h100-nvl": 60,
    "l40s": 91.6,
    "l4": 30.3,
    "a10": 31.2,
}
SPARSE_TF32_TFLOPS = {"a100-80gb": 312, "h100-sxm": 989, "h100-pcie": 756, "l40s": 366, "l4": 120, "a10": 125}
# Datasheet memory bandwidth, GB/s, as the vendors print it.
BANDWIDTH_GBPS = {
    "a100-40gb": 1555,
    "a100-80gb": 2039,
    "h100-sxm": 3350,
    "h100-pcie": 2000,
    "h200-sxm": 4800,
    "l40s": 864,
    "l4": 300,
    "a10g": 600,
}


def test_the_table_has_the_gpus_people_use():
    keys = {gpu.key for gpu in GPUS}
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "l40s", "l4", "a10g"} <= keys
    assert len(keys) == len(GPUS)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda gpu: gpu.key)
def test_every_entry_cites_its_vendor_and_a_date(gpu):
    host = urlparse(gpu.source).hostname or ""
    assert gpu.source.startswith("https://") and (host == "nvidia.com" or host.endswith(".nvidia.com")), gpu.source
    year, month = map(int, re.fullmatch(r"(\d{4})-(\d{2})", gpu.published).groups())
    assert 2020 <= year <= 2026 and 1 <= month <= 12
    assert not gpu.approximate or "http" in gpu.note  # an approximate figure says where it comes from


@pytest.mark.parametrize("key", SPARSE_BF16_TFLOPS)
def test_peak_flops_are_dense_half_the_sparse_datasheet_figure(key):
    assert gpu_by_key(key).bf16_flops == pytest.approx(SPARSE_BF16_TFLOPS[key] * TERA / 2, rel=1e-3)


def test_the_l40s_and_a10g_figures():
    assert gpu_by_key("l40s").bf16_flops == pytest.approx(362.05 * TERA)  # the page's dense column (733 sparse)
    a10g = gpu_by_key("a10g")
    assert a10g.approximate and a10g.bf16_flops < gpu_by_key("a10").bf16_flops  # half-rate tensor cores


@pytest.mark.parametrize("key", BANDWIDTH_GBPS)
def test_memory_bandwidth_is_the_datasheets(key):
    assert gpu_by_key(key).memory_bandwidth == pytest.approx(BANDWIDTH_GBPS[key] * GB)


def test_the_sxm_parts_outrun_their_pcie_siblings():
    assert gpu_by_key("h100-sxm").memory_bandwidth > gpu_by_key("h100-pcie").memory_bandwidth
    assert gpu_by_key("h100-sxm").bf16_flops > gpu_by_key("h100-pcie").bf16_flops
    assert gpu_by_key("h200-sxm").memory_bandwidth > gpu_by_key("h100-sxm").memory_bandwidth
    assert gpu_by_key("a100-80gb").memory_bandwidth > gpu_by_key("a100-40gb").memory_bandwidth


def test_capacity_and_host_link():
    assert gpu_by_key("h200-sxm").memory_bytes == 141 * 10**9
    assert gpu_by_key("a100-40gb").memory_bytes == 40 * 10**9
    assert gpu_by_key("h100-sxm").host_link == 64 * GB  # PCIe Gen5 x16, one way (128 GB/s both)
    assert gpu_by_key("a100-80gb").host_link == 32 * GB  # PCIe Gen4 x16, one way (64 GB/s both)


@pytest.mark.parametrize(
    ("driver_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("A100-SXM4-40GB", "a100-40gb"),  # older drivers left the vendor out
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
    ],
)
def test_detect_reads_the_names_drivers_report(driver_name, key):
    gpu = detect(driver_name)
    assert gpu is not None and gpu.key == key


@pytest.mark.parametrize(
    "driver_name",
    [
        "NVIDIA L40",  # not the L40S, not the L4
        "NVIDIA GH200 480GB",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a slice of the GPU
        "NVIDIA H100 SXM5 64GB",  # a capacity the table has no entry for
        "NVIDIA A100 80GB",  # SXM or PCIe: the bandwidth differs, so neither
        "NVIDIA GeForce RTX 4090",
        "",
    ],
)
def test_detect_returns_none_for_parts_the_table_does_not_have(driver_name):
    assert detect(driver_name) is None


def test_keys_are_read_as_configs_write_them():
    assert gpu_by_key("H100-SXM") is gpu_by_key("h100-sxm")


def test_an_unknown_key_is_one_line_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError) as raised:
        gpu_by_key("h100-sxm5")
    message = str(raised.value)
    assert "\n" not in message
    assert "'h100-sxm5'" in message and "h100-sxm" in message and "a10g" in message
    assert isinstance(raised.value, ValueError)


def test_the_forecasts_gpu_is_planner_gpu_else_a_gpu_the_driver_or_the_nodes_report():
    from kvsweep.driver.software_survey import NodeReport, Survey
    from kvsweep.forecast.device_rates import choose_gpu
    from kvsweep.node_software import GPU, NO_GPU

    nodes = [
        NodeReport("a" * 16, "10.0.0.1", {GPU: "NVIDIA H100 80GB HBM3"}),
        NodeReport("b" * 16, "10.0.0.2", {GPU: NO_GPU}),  # a CPU head node
        NodeReport("c" * 16, "10.0.0.3", None, "did not answer"),
    ]
    names = Survey({}, nodes).gpu_names()
    assert names == ["NVIDIA H100 80GB HBM3"]
    assert choose_gpu("", names).key == "h100-sxm"
    assert choose_gpu("l4", names).key == "l4"  # planner.gpu wins
    with pytest.raises(ConfigError) as refused:
        choose_gpu("", [])
    assert len(str(refused.value).splitlines()) == 1 and "planner.gpu" in str(refused.value)


@pytest.mark.parametrize("key", FP32_TFLOPS)
def test_float32_runs_at_the_fp32_row_with_tf32_off_and_the_tensor_peak_is_for_16_bit_types(key):
    gpu = gpu_by_key(key)
    assert gpu.flops("float32") == pytest.approx(FP32_TFLOPS[key] * TERA)
    assert gpu.flops("bfloat16") == gpu.flops("float16") == gpu.bf16_flops
    if key in SPARSE_TF32_TFLOPS:
        assert gpu.tf32_flops == pytest.approx(SPARSE_TF32_TFLOPS[key] * TERA / 2, rel=2e-3)


def test_every_entry_has_its_float32_figures_below_its_tensor_ones():
    for gpu in GPUS:
        assert 0 < gpu.fp32_flops <= gpu.tf32_flops <= gpu.bf16_flops, gpu.key
