"""Seeded sections of torch's global generator on threads side by side take turns."""

from __future__ import annotations

import importlib.metadata
import inspect
import threading

import pytest
import torch

from oretrofit.hosts.tabpfn.rng_forks import serialized_rng_forks

_ORIGINAL = torch.random.fork_rng


def _two_threads(timeout: float | None = 0.3) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two threads each seeding the global generator in a fork and drawing twice, what tabpfn's
    SVD step does, ordered where nothing stops them so that the second thread seeds between the
    first one's two draws (each wait at most ``timeout``: under the guard the second thread
    cannot enter its fork until the first has left its own). Both threads' draws, and the
    caller's generator state afterwards."""
    first_drew, second_seeded, first_done = (threading.Event() for _ in range(3))
    draws: list[torch.Tensor] = [torch.empty(0), torch.empty(0)]

    def first() -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            one = torch.rand(4)
            first_drew.set()
            second_seeded.wait(timeout=timeout)
            draws[0] = torch.cat([one, torch.rand(4)])
        first_done.set()

    def second() -> None:
        first_drew.wait(timeout=timeout)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(2)
            second_seeded.set()
            first_done.wait(timeout=timeout)
            draws[1] = torch.rand(8)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return draws, torch.get_rng_state()


def _alone(seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.rand(8)


def test_seeded_sections_get_their_own_draws_and_the_callers_state_is_kept() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with serialized_rng_forks():
        draws, after = _two_threads()
    assert torch.equal(draws[0], _alone(1)) and torch.equal(draws[1], _alone(2))
    assert torch.equal(after, before)


def test_without_the_guard_the_threads_draw_each_others_numbers() -> None:
    # what the guard prevents: the second thread's seed lands between the first one's draws
    draws, _ = _two_threads(timeout=None)
    assert not (torch.equal(draws[0], _alone(1)) and torch.equal(draws[1], _alone(2)))


def test_installed_once_for_nested_entries_and_removed_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with serialized_rng_forks():
            patched = torch.random.fork_rng
            assert patched is not _ORIGINAL
            with serialized_rng_forks():
                assert torch.random.fork_rng is patched
            assert torch.random.fork_rng is patched
            raise RuntimeError("boom")
    assert torch.random.fork_rng is _ORIGINAL


def test_tabpfns_randomized_svd_on_threads_equals_it_alone() -> None:
    import tabpfn.preprocessing.torch.torch_svd as svd_module
    from packaging.version import Version

    # over a million cells: tabpfn takes its randomized path (torch.svd_lowrank, global generator)
    matrices = [torch.randn(1100, 1000, generator=torch.Generator().manual_seed(k))
                for k in range(4)]
    seeded = "fork_rng" in inspect.getsource(svd_module.TorchTruncatedSVD.fit)
    # the premise of rng_forks' doc: tabpfn seeds that draw in a fork from 9.0.0 on
    assert seeded == (Version(importlib.metadata.version("tabpfn")) >= Version("9.0.0"))
    if not seeded:
        svd = svd_module.TorchTruncatedSVD(n_components=8)
        # tabpfn 8.x draws the projection unseeded: its own result depends on the generator
        torch.manual_seed(1)
        first = svd.fit(matrices[0])["components"]
        torch.manual_seed(2)
        assert not torch.equal(first, svd.fit(matrices[0])["components"])
        return
    svd = svd_module.TorchTruncatedSVD(n_components=8, random_state=0)
    alone = [svd.fit(x)["components"] for x in matrices]
    together: list[torch.Tensor] = [torch.empty(0)] * len(matrices)

    def run(k: int) -> None:
        together[k] = svd.fit(matrices[k])["components"]

    with serialized_rng_forks():
        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(matrices))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for a, b in zip(alone, together):
        assert torch.equal(a, b)
