"""A retrofitted folder survives an upgrade: saved under one admitted transformers release, it
loads retrofitted under another, giving the logits it gave where it was saved; a folder whose
sites differ from its spec's is refused naming the site.

``saved/`` holds one folder per release the CI's transformers environments run (the main one and
the oldest admitted release's, ``make test-transformers-oldest``), each written there by
``scripts/saved_retrofits.py``. This file runs in both, so each environment loads a folder saved
under the other release as well as its own."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, LlamaForCausalLM  # noqa: E402

import oretrofit  # noqa: E402
from oretrofit import Retrofit, RetrofitError  # noqa: E402
from oretrofit.hosts.transformers.pretrained import SPEC_FILE  # noqa: E402
from oretrofit.hosts.transformers.releases import admits  # noqa: E402

SAVED = Path(__file__).resolve().parent / "saved"
FOLDERS = sorted(SAVED.iterdir())


def _release(folder: Path) -> str:
    return json.loads((folder / SPEC_FILE).read_text())["host_versions"]["transformers"]


def test_the_saved_folders_come_from_two_admitted_releases():
    releases = [_release(folder) for folder in FOLDERS]
    assert [f"transformers-{r}" for r in releases] == [f.name for f in FOLDERS]
    assert len(set(releases)) == 2 and all(map(admits, releases))


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_a_folder_saved_under_an_admitted_release_loads_retrofitted_under_this_one(folder):
    saved = json.loads((folder / SPEC_FILE).read_text())
    expected = json.loads((folder / "logits.json").read_text())
    model = oretrofit.from_pretrained(folder)
    handle = Retrofit.of(model)
    assert handle is not None
    spec = handle.spec()
    assert spec["host_versions"]["transformers"] == transformers.__version__   # provenance
    assert spec["sites"] == saved["sites"] and spec["site_modules"] == saved["site_modules"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(expected["input_ids"])).logits
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=0, atol=1e-5)


def test_a_folder_whose_sites_differ_from_its_spec_is_refused_naming_the_site(tmp_path):
    """The spec of a saved folder beside the weights of a model whose MLP is wider: every site
    is there, of its kind and class, but the FFN site's weights changed shape."""
    folder = FOLDERS[0]
    config = AutoConfig.from_pretrained(folder)
    config.intermediate_size = 48
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    shutil.copy(folder / SPEC_FILE, tmp_path / SPEC_FILE)
    with pytest.raises(RetrofitError, match=r"its site 'model\.layers\.0\.mlp' has the weight "
                                            r"model\.layers\.0\.mlp\.gate_proj\.weight of shape "
                                            r"32x16 in the spec, of shape 48x16 here"):
        oretrofit.from_pretrained(tmp_path)
