#!/usr/bin/env python3
"""Census of the transformers host over every architecture of the installed transformers.

Every model type of ``CONFIG_MAPPING_NAMES`` is built by ``AutoModel`` from its default config
shrunk to tiny sizes (:mod:`transformers_census_build`), every parameter jittered by
N(0, 0.05²) as the zoo does (seed 0), and retrofitted with both arms; the contracts are measured
independently of what the host claims (:mod:`oretrofit.hosts.transformers.contracts`):

* τ→0 agreement (τ = 1e-12, ε = 1e-30): max relative difference of every hidden state ≤ 1e-4,
  for ``oa`` and ``full-o``; ``revert()`` bit-identical; ``state_dict`` keys unchanged. ε goes
  to 0 with τ (the host is the joint limit): OAttention's denominator ``ε + Σ_j p_j e^{s_ij}``
  is not shift-invariant, so a row whose scores are all far below ``log ε`` (a causal first
  token with a negative self-score: SmolLM2, Dory's scaled queries) is damped at ε = 1e-12; every
  path works in log space, so ε = 1e-30 costs nothing;
* strict load: the retrofitted model's ``state_dict`` loads strictly into the reverted model and
  the original one into the retrofitted model;
* null insertion under ``full-o`` (τ = 1e-6): 2 zero carriers inserted at the carrier boundary
  stay exactly 0 and move no old hidden state by more than 1e-4 (middle where positions allow,
  else at the end).

Statuses: ``passes`` (both arms accepted, every contract holds), ``refused`` (a ``RetrofitError``,
its message kept verbatim), ``silent wrong`` (a retrofit accepted and a contract failed: the
worst outcome), ``error`` (an exception other than a refusal under the retrofit), ``unchecked``
(the census' inputs do not run the unpatched model, or the null insertion cannot be set up),
``timeout`` / ``crash`` (the worker hung or died) and ``not buildable`` (no AutoModel class, or
no tiny model builds from the default config: excluded from the shares).

Each built architecture also records whether it has softmax attention at all
(``softmax_attention``, and the ``attention_classes`` found as the host detects attention:
:func:`transformers_census_build.attention_classes`), so the docs give the share over the text
and vision encoders and decoders both whole and over those with attention.

Each model type runs in a worker subprocess that answers one JSON line per type; a type that
hangs or kills its worker is recorded and the worker restarted, and the receipt is rewritten
after every type, so an interrupted census resumes where it stopped (types already in the receipt
are skipped unless ``--fresh``).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \\
        python scripts/transformers_census.py [--fresh] [--jobs 2] [--timeout 240] [--only a,b]

writes ``results/transformers-census.json`` and ``results/transformers-census.md``
(``transformers_census_report.census_markdown``, which ``scripts/transformers_docs.py`` renders
from the receipt).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECEIPT = ROOT / "results" / "transformers-census.json"
SEED, TAU_AGREEMENT, EPS_AGREEMENT, TAU_NULL, TOLERANCE = 0, 1e-12, 1e-30, 1e-6, 1e-4
ARMS = ("oa", "full-o")


def check_one(model_type: str) -> dict[str, Any]:
    """Build ``model_type`` tiny and measure every contract under both arms."""
    from oretrofit._surgery.host import RetrofitError
    from oretrofit._surgery.registry import retrofitted
    from oretrofit.hosts.transformers.contracts import agreement, null_insertion, strict_load
    from transformers_census_build import attention_classes, build, category
    record: dict[str, Any] = {"model_type": model_type, "category": category(model_type)}
    built = build(model_type, SEED)
    if isinstance(built, str):
        return {**record, "status": "unchecked" if built.built else "not buildable",
                "reason": str(built), **(_attention(built.attention) if built.built else {})}
    model, inputs, shrink = built
    record.update({"class": type(model).__name__, "shrink": shrink,
                   **_attention(attention_classes(model))})
    checks: dict[str, Any] = {}
    record["checks"] = checks
    try:
        for arm in ARMS:
            checks[arm] = result = agreement(model, inputs, arm, TAU_AGREEMENT, EPS_AGREEMENT)
            result["ok"] = bool(result["relative_max_diff"] <= TOLERANCE
                                and result["revert_bit_identical"]
                                and result["state_dict_keys_unchanged"])
        checks["strict_load"] = {"ok": strict_load(model, "full-o")}
    except RetrofitError as error:
        return {**record, "status": "refused", "reason": str(error)}
    except Exception as error:                              # noqa: BLE001 - recorded
        return {**record, "status": "error", "reason": f"under the retrofit: {error!r}"}
    try:
        with retrofitted(model, "full-o", TAU_NULL):
            null = null_insertion(model, inputs)
    except Exception as error:                              # noqa: BLE001 - recorded
        return {**record, "status": "unchecked",
                "reason": f"null insertion could not be set up: {error!r}"}
    null["ok"] = bool(null["inserted_max_abs"] == 0 and null["old_max_delta"] <= TOLERANCE)
    checks["null_insertion"] = null
    failed = [name for name, check in checks.items() if not check["ok"]]
    return {**record, "status": "silent wrong" if failed else "passes",
            "reason": f"accepted, but fails: {', '.join(failed)}" if failed else ""}


def _attention(classes: list[str]) -> dict[str, Any]:
    """The record's attention fact: whether the built model has softmax attention, and where."""
    return {"softmax_attention": bool(classes), "attention_classes": classes}


def _worker() -> None:
    """Answer one JSON line on stdout per model type read from stdin."""
    import warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT / "scripts"))
    from transformers.utils import logging
    logging.set_verbosity_error()
    for line in sys.stdin:
        model_type = line.strip()
        try:
            record = check_one(model_type)
        except Exception as error:                          # noqa: BLE001 - recorded
            record = {"model_type": model_type, "status": "error", "reason": repr(error)}
        print(json.dumps(record, default=float), flush=True)


class Worker:
    """A worker subprocess and the lines it answers."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self._keep),
                         daemon=True).start()

    @staticmethod
    def _read(stream: Any, put: Any) -> None:
        for line in stream:
            put(line)
        put(None)

    def _keep(self, line: str | None) -> None:
        if line is not None:
            self.errors = (self.errors + [line])[-20:]

    def ask(self, model_type: str, timeout: float) -> dict[str, Any]:
        """The record of ``model_type``; ``timeout`` / ``crash`` (the worker is then gone)."""
        self.process.stdin.write(model_type + "\n")
        self.process.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            return {"model_type": model_type, "status": "timeout",
                    "reason": f"no answer within {timeout:.0f} s"}
        if line is None:
            self.stop()
            return {"model_type": model_type, "status": "crash",
                    "reason": "".join(self.errors)[-600:]}
        return json.loads(line)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return sorted(CONFIG_MAPPING_NAMES)


def _run(types: list[str], timeout: float, done: Any) -> None:
    """Ask a worker about each of ``types`` in turn, restarting it after a timeout or crash."""
    worker = None
    for model_type in types:
        worker = worker if worker is not None and worker.process.poll() is None else Worker()
        done(worker.ask(model_type, timeout))
    if worker is not None and worker.process.poll() is None:
        worker.stop()


def _scrub(text: str) -> str:
    """Drop machine-local paths from a message (``…/site-packages/x`` -> ``x``)."""
    import re
    text = text.replace(str(ROOT) + "/", "")
    return re.sub(r"(/[^\s'\"]*)?/(site|dist)-packages/", "", text)


def _header() -> dict[str, Any]:
    import torch
    import transformers
    return {"transformers": transformers.__version__, "torch": torch.__version__, "seed": SEED,
            "tau_agreement": TAU_AGREEMENT, "eps_agreement": EPS_AGREEMENT,
            "tau_null_insertion": TAU_NULL, "tolerance": TOLERANCE, "arms": list(ARMS),
            "date": dt.date.today().isoformat(),
            "command": "python scripts/transformers_census.py"}


def census(types: list[str], jobs: int, timeout: float, fresh: bool) -> dict[str, Any]:
    """Run the census (resuming ``RECEIPT`` unless ``fresh``), rewriting it after every type."""
    old = {} if fresh or not RECEIPT.exists() else json.loads(RECEIPT.read_text())
    receipt = {**_header(), "architectures": old.get("architectures", {})}
    todo = [t for t in types if t not in receipt["architectures"]]
    lock = threading.Lock()

    def done(record: dict[str, Any]) -> None:
        record["reason"] = _scrub(record.get("reason", ""))
        with lock:
            receipt["architectures"][record["model_type"]] = record
            receipt["architectures"] = dict(sorted(receipt["architectures"].items()))
            RECEIPT.write_text(json.dumps(receipt, indent=1, default=float) + "\n")
            print(f"{record['model_type']}: {record['status']}", flush=True)

    threads = [threading.Thread(target=_run, args=(todo[i::jobs], timeout, done))
               for i in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return receipt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fresh", action="store_true", help="ignore the existing receipt")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes in parallel")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per model type")
    parser.add_argument("--only", default="", help="comma-separated model types (re-measured)")
    args = parser.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    types = model_types()
    if args.only:
        types = args.only.split(",")
        if RECEIPT.exists():                       # re-measure them, keep the rest
            kept = json.loads(RECEIPT.read_text())
            for t in types:
                kept["architectures"].pop(t, None)
            RECEIPT.write_text(json.dumps(kept, indent=1) + "\n")
    census(types, args.jobs, args.timeout, args.fresh)
    sys.path.insert(0, str(ROOT / "scripts"))
    import transformers_docs
    transformers_docs.main(["census"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
