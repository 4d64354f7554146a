"""scripts/torch_compat.py, the torch release receipt: which routes pass, what its table shows."""

from __future__ import annotations

from types import ModuleType

import pytest

KERNELS = {"cpu float32": "cpu-flash", "cpu float64": "cpu-flash",
           "cuda float32": "not run (no GPU)"}


@pytest.fixture(scope="module")
def torch_compat(sweep_script) -> ModuleType:
    """scripts/torch_compat.py as a module."""
    return sweep_script("torch_compat")


def test_a_release_passes_only_on_the_cpu_kernel_routes(torch_compat):
    """A CPU route on the fallback, a CUDA route on it where a GPU ran, or a route not probed
    is a failure the table names."""
    assert torch_compat.route_failures(KERNELS) == []
    assert torch_compat.route_failures({**KERNELS, "cuda float32": "cuda-efficient"}) == []
    fallback = "augmented-copy (oretrofit: the cpu-flash attention kernel fails its check)"
    assert torch_compat.route_failures({**KERNELS, "cpu float64": fallback}) == [
        f"route cpu float64: {fallback}"]
    assert torch_compat.route_failures({**KERNELS, "cuda float32": fallback}) == [
        f"route cuda float32: {fallback}"]
    assert torch_compat.route_failures({**KERNELS, "cpu float32": "not run (no GPU)"}) == [
        "route cpu float32: not run (no GPU)"]
    assert torch_compat.route_failures({"cpu float32": "cpu-flash"}) == [
        "route cpu float64: not probed", "route cuda float32: not probed"]


def test_the_routes_of_the_torch_the_tests_run_on_are_the_kernels(torch_compat):
    """The in-environment probe on this interpreter's torch: the CPU kernel for both dtypes."""
    import torch

    found = torch_compat.routes()
    assert found["torch"] == torch.__version__
    assert {key: found["routes"][key] for key in ("cpu float32", "cpu float64")} == {
        "cpu float32": "cpu-flash", "cpu float64": "cpu-flash"}
    assert torch_compat.route_failures(found["routes"]) == []


def test_the_layer_column_counts_cuda_runtime_packages(torch_compat):
    layer = ["cuda-bindings 13.5.0", "nvidia-cublas 13.1.1.3", "torch 2.14.1", "triton 3.8.0"]
    assert torch_compat.layer_text(layer) == "torch 2.14.1, triton 3.8.0, 2 CUDA runtime packages"
    assert torch_compat.layer_text([]) == "none"


def test_the_table_shows_each_release_and_its_first_failure(torch_compat, tmp_path):
    rows = [{"release": "2.13.0", "ok": True, "tests": "595 passed", "failures": [],
             "routes": KERNELS, "torch": "2.13.0+cpu", "gpu": None, "layer": [], "wall_s": 130},
            {"release": "2.15.0", "ok": False, "tests": "install failed",
             "failures": ["ERROR: No matching distribution found for torch==2.15.0"],
             "routes": {}, "torch": "-", "gpu": None, "layer": [], "wall_s": 0}]
    command = torch_compat.receipt_command("scripts/torch_compat.py",
                                           ["--venvs", str(tmp_path)], {tmp_path: "VENVS"})
    text = torch_compat.render(rows, command, "abc1234")
    assert "- command: `python scripts/torch_compat.py --venvs VENVS`" in text
    assert "oretrofit commit: `abc1234`" in text and str(tmp_path) not in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0] == ("| torch | outcome | tests | route cpu float32 | route cpu float64 | "
                        "route cuda float32 | first failure (all in the .json) | layer | wall s |")
    assert table[2] == ("| 2.13.0+cpu | pass | 595 passed | cpu-flash | cpu-flash | "
                        "not run (no GPU) | - | none | 130 |")
    assert table[3].startswith("| 2.15.0 | FAIL | install failed | - | - | - | ERROR: No matching")
