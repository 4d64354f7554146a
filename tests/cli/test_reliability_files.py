"""Reliability, round 4, model folders: a folder naming Python code of its own is refused and
its code never runs (not even with ``y`` piped to stdin); corrupt weights and special files are
named with the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oretrofit.hosts.transformers.models import load_model

_CODE = """from pathlib import Path
Path({marker!r}).write_text("the folder's code ran")
from transformers import PretrainedConfig, PreTrainedModel
class EvilConfig(PretrainedConfig):
    model_type = "evil"
class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def _bert(folder: Path) -> Path:
    from transformers import BertConfig, BertModel
    config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    BertModel(config).save_pretrained(folder)
    return folder


def test_a_folder_naming_its_own_code_is_refused_and_the_code_never_runs(tmp_path):
    folder, marker = tmp_path / "evil", tmp_path / "ran.txt"
    folder.mkdir()
    (folder / "evil.py").write_text(_CODE.format(marker=str(marker)))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-m", "oretrofit.cli.app", "check", str(folder)],
                            input="y\ny\ny\n", capture_output=True, text=True, env=env,
                            timeout=300, check=False)
    assert not marker.exists()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"error: {folder / 'config.json'} names Python code of its own (auto_map: "
            "evil.EvilConfig, evil.EvilModel); oretrofit never runs a model folder's code "
            "(trust_remote_code is off): save the model with a class transformers ships"
            ) in " ".join(result.stderr.split())
    assert "[y/N]" not in result.stdout + result.stderr


def test_the_loaders_never_let_transformers_run_a_folders_code(tmp_path, monkeypatch):
    """Whatever calls ``from_pretrained`` passes ``trust_remote_code=False``."""
    from transformers import AutoModel
    folder = _bert(tmp_path / "bert")
    seen = {}
    original = AutoModel.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        seen.update(kwargs)
        return original(cls, path, *args, **kwargs)
    monkeypatch.setattr(AutoModel, "from_pretrained", classmethod(spy))
    load_model(str(folder))
    assert seen["trust_remote_code"] is False and seen["local_files_only"] is True


def test_corrupt_safetensors_weights_are_named_with_the_fix(tmp_path):
    folder = _bert(tmp_path / "bert")
    weights = folder / "model.safetensors"
    weights.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match=rf"the safetensors weights in {folder} are corrupt "
                                         r"\(.*\); re-save the model with model.save_pretrained"):
        load_model(str(folder))


def test_random_bytes_as_weights_are_called_corrupt_not_code(tmp_path):
    folder = _bert(tmp_path / "bert")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match=rf"the weights in {folder} are corrupt: not a torch "
                                         r"checkpoint .*re-save or re-download") as refused:
        load_model(str(folder))
    assert "Python objects" not in str(refused.value)


def test_a_fifo_in_a_model_folder_is_refused_without_waiting(tmp_path):
    folder = _bert(tmp_path / "bert")
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"the model folder .*bert holds model.safetensors "
                                         r"\(.*\), which is a named pipe \(FIFO\), not a regular "
                                         r"file"):
        load_model(str(folder))
