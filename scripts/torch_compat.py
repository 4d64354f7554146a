#!/usr/bin/env python3
"""Run the attention kernels' and the operators' tests on torch releases: results/torch-compat.md.

Each release runs in its own layered environment; the receipt (``.md`` + ``.json``) is the table
the declared torch range rests on.

The fused OAttention route calls private aten ops (``oretrofit/_kernels/lse.py``) whose
signatures may change between torch releases. Per release ``X`` the environment ``VENVS/torch-X``
is the main environment (the interpreter running this script: oretrofit's other dependencies)
with ``torch==X`` installed on top, and what that release pins (:func:`release_envs.layered_venv`,
as the Makefile's ``layered`` macro); a release the main environment already has installs
nothing. There, on an export of the committed HEAD:

1. ``import torch`` must give ``X`` (a local build of it, ``X+cpu``, counts);
2. the route :func:`oretrofit._kernels.routes.route_for` chooses, per device and compute
   dtype of :data:`ROUTES`, is recorded (``--routes``, one JSON line); the CPU ones must be the
   kernel (:data:`KERNEL_ROUTES`), not the augmented-copy fallback a failing kernel check selects;
   CUDA is ``not run`` on a machine without a GPU;
3. :data:`TESTS` must pass (the kernels against their contract, the operators, the components,
   the patching and a few hosts).

Usage, with the main environment's python (``.venv/bin/python``):
``python scripts/torch_compat.py [--venvs DIR] [--releases 2.13.0,2.14.1] [--out FILE]``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.version import Version
from release_envs import (export_head, head_commit, layer_packages, layered_venv,
                          markdown_table, provenance_lines, pytest_failures, pytest_summary,
                          receipt_command, same_release, sweep_parser)

ROOT = Path(__file__).resolve().parent.parent
# the kernel routes and the operators, and hosts that run them (a few minutes a release)
TESTS = ["tests/_operators/test_attention.py", "tests/_kernels/test_lse.py",
         "tests/_operators/test_attention_modules.py", "tests/_operators/test_presence.py", "tests/_operators/test_components.py",
         "tests/_operators/test_transformer.py", "tests/_surgery/test_patching.py", "tests/hosts/test_torch_nn.py",
         "tests/hosts/transformers/test_llama.py", "tests/hosts/tabpfn/test_v3.py"]
# the oldest release the range admits and the newest this machine's package index has
RELEASES = ["2.13.0", "2.14.1"]
# (device type, compute dtype) pairs route_for has a kernel route for
ROUTES = (("cpu", "float32"), ("cpu", "float64"), ("cuda", "float32"))
KERNEL_ROUTES = {"cpu": "cpu-flash", "cuda": "cuda-efficient"}
FALLBACK = "augmented-copy"
# the packages of the main environment the tests import besides torch (the receipt's provenance)
UNDERNEATH = ("numpy", "transformers", "tabpfn")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def routes() -> dict:
    """Step 2, inside one environment: torch's version and CUDA build, the GPU (or None), and per
    ``device dtype`` of :data:`ROUTES` the backend's name, :data:`FALLBACK` with the reason, or
    ``not run (no GPU)``."""
    import warnings

    import torch

    from oretrofit._kernels.routes import describe
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    found: dict[str, str] = {}
    for device, dtype in ROUTES:
        if device == "cuda" and gpu is None:
            found[f"{device} {dtype}"] = "not run (no GPU)"
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            name = describe(torch.device(device), getattr(torch, dtype), 16)
        reason = str(caught[0].message) if caught else "no kernel ops in this torch"
        found[f"{device} {dtype}"] = name if name != FALLBACK else f"{FALLBACK} ({reason})"
    return {"torch": torch.__version__, "cuda_build": torch.version.cuda, "gpu": gpu,
            "routes": found}


def route_failures(found: dict[str, str]) -> list[str]:
    """``route DEVICE DTYPE: CELL`` for each route of :data:`ROUTES` that is not its device's
    kernel (nor, off the CPU, not run for want of the device); empty when all are."""
    def ok(device: str, cell: str) -> bool:
        return cell == KERNEL_ROUTES[device] or (device != "cpu" and cell.startswith("not run"))
    return [f"route {device} {dtype}: {found.get(f'{device} {dtype}', 'not probed')}"
            for device, dtype in ROUTES if not ok(device, found.get(f"{device} {dtype}", ""))]


def run_release(venv: Path, release: str, source: Path) -> dict:
    """Steps 1 to 3 for one release (its layer built first when missing); ``ok`` only when all
    three hold."""
    start = time.monotonic()
    try:
        layered_venv(venv, "torch", release)
    except RuntimeError as err:
        return {"release": release, "ok": False, "tests": "install failed",
                "failures": [str(err).splitlines()[-1]], "routes": {}, "torch": "-",
                "layer": [], "wall_s": 0}
    python = str(venv / "bin" / "python")
    env = {**ENV, "PYTHONPATH": str(source)}        # the export's code, not the editable checkout
    probe = subprocess.run([python, str(source / "scripts" / "torch_compat.py"), "--routes"],
                           cwd=source, env=env, capture_output=True, text=True)
    try:
        found = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = {"torch": "?", "routes": {},
                 "error": (probe.stderr.strip().splitlines() or ["no output"])[-1]}
    tests = subprocess.run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                            *TESTS], cwd=source, env=env, capture_output=True, text=True)
    failures = [*([f"route probe: {found['error']}"] if "error" in found else []),
                *([] if same_release(found["torch"], release)
                  else [f"import torch gives {found['torch']}, not {release}"]),
                *route_failures(found["routes"]), *pytest_failures(tests.stdout)]
    ok = tests.returncode == 0 and not failures
    return {"release": release, "ok": ok, "tests": pytest_summary(tests.stdout),
            "failures": failures, "routes": found["routes"], "torch": found["torch"],
            "cuda_build": found.get("cuda_build"), "gpu": found.get("gpu"),
            "layer": layer_packages(venv), "wall_s": round(time.monotonic() - start)}


def layer_text(layer: list[str]) -> str:
    """The layer's packages as the table shows them: CUDA runtime packages (``nvidia-*``,
    ``cuda-*``) counted, the others named; ``none`` for an empty layer."""
    cuda = [package for package in layer if package.startswith(("nvidia-", "cuda-"))]
    named = [package for package in layer if package not in cuda]
    return ", ".join([*named, *([f"{len(cuda)} CUDA runtime packages"] if cuda else [])]) or "none"


def machine_line(rows: list[dict]) -> str:
    """The machine's kind: architecture, CPU count and the GPU the releases saw (or none)."""
    gpus = sorted({row["gpu"] for row in rows if row.get("gpu")})
    return (f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, GPU: "
            f"{', '.join(gpus) or 'none (CUDA routes not run)'}")


def _underneath_line() -> str:
    """The main environment's releases of :data:`UNDERNEATH` (the same in every layer)."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "absent"
    return ("- underneath every layer (the main environment): "
            + ", ".join(f"{name} {version(name)}" for name in UNDERNEATH))


def render(rows: list[dict], command: str, commit: str) -> str:
    """The compat table with its provenance."""
    labels = [f"{device} {dtype}" for device, dtype in ROUTES]
    lines = [
        "# torch release compatibility: the attention kernel routes and the operators",
        "",
        "Written by `scripts/torch_compat.py`; do not edit by hand; rerun with the command below "
        "(the main environment's python). One layered virtual environment per release: the main "
        "environment (oretrofit's other dependencies) underneath, `torch==X` and the packages "
        "that release pins installed on top (column *layer*; a `+cu…` torch is a CUDA build, "
        "run on the CPU where there is no GPU). A release passes when `import "
        "torch` gives it, `route_for` (`oretrofit/_kernels/routes.py`) chooses the kernel "
        f"route for every device and dtype of a *route* column (`{KERNEL_ROUTES['cpu']}`, "
        f"`{KERNEL_ROUTES['cuda']}`: its private aten ops exist and pass their check against "
        f"the contract; `{FALLBACK}`: the fallback, with the reason; a CUDA route is `not run` "
        f"without a GPU), and the tests pass ({', '.join(f'`{t}`' for t in TESTS)}). "
        "The declared `torch` range in `pyproject.toml` admits the minors of the passing "
        "releases (`tests/test_metadata.py` checks it).",
        "",
        *provenance_lines(command, commit),
        machine_line(rows),
        _underneath_line(),
        "",
        *markdown_table(
            ["torch", "outcome", "tests", *(f"route {label}" for label in labels),
             "first failure (all in the .json)", "layer", "wall s"],
            [[row["torch"] if row["torch"] != "-" else row["release"],
              "pass" if row["ok"] else "FAIL", row["tests"],
              *(row["routes"].get(label, "-") for label in labels),
              (row["failures"] or ["-"])[0][:160], layer_text(row["layer"]), row["wall_s"]]
             for row in rows]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = sweep_parser(__doc__.splitlines()[0], "torch", RELEASES,
                          ROOT / "results" / "torch-compat.md")
    parser.add_argument("--routes", action="store_true",
                        help="in-environment step: print the chosen routes as one JSON line")
    args = parser.parse_args()
    if args.routes:
        print(json.dumps(routes()))
        return
    args.venvs.mkdir(parents=True, exist_ok=True)
    source = export_head(ROOT, Path(tempfile.mkdtemp(prefix="torch-compat-")))
    commit = head_commit(ROOT)
    # where the environments lived is this machine's business, not the receipt's
    command = receipt_command("scripts/torch_compat.py", sys.argv[1:], {args.venvs: "VENVS"})
    rows = []
    for release in sorted(args.releases.split(","), key=Version):
        rows.append(run_release(args.venvs / f"torch-{release}", release, source))
        print(f"{release}: {'pass' if rows[-1]['ok'] else 'FAIL'} ({rows[-1]['tests']}, "
              f"{rows[-1]['wall_s']} s)", flush=True)
        args.out.write_text(render(rows, command, commit))
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    shutil.rmtree(source, ignore_errors=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


if __name__ == "__main__":
    main()
