"""One retrofitted model shared by threads (a threaded server's one model): every forward's own
state (captured carrier presences, gate columns, the stream a gate reads) is per call
(:class:`oretrofit._surgery.per_call.PerCall`), so concurrent calls with inputs of different
lengths raise nothing and return exactly what the same calls return one after another."""

from __future__ import annotations

import copy
import pickle
import threading

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from oretrofit import retrofit
from oretrofit._surgery.per_call import PerCall, PerCallState
from oretrofit.hosts.transformers.measures import load_minilm

THREADS, CALLS = 4, 20


def _inputs(vocab: int) -> list[torch.Tensor]:
    """Token ids of mixed lengths (3 to 14 tokens), one list per thread."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, vocab, (1, 3 + (i * 5 + c) % 12), generator=g)
            for i in range(THREADS) for c in range(CALLS)]


def _threaded(forward, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor | None], list]:
    """``forward`` of every input, ``THREADS`` threads taking every ``THREADS``-th input."""
    out: list[torch.Tensor | None] = [None] * len(inputs)
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        try:
            start.wait()
            for j in range(i, len(inputs), THREADS):
                out[j] = forward(inputs[j])
        except BaseException as exc:                   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out, errors


def _shared_by_threads_as_serial(model: torch.nn.Module, output: str, vocab: int) -> None:
    inputs = _inputs(vocab)
    with torch.no_grad():
        def forward(ids: torch.Tensor) -> torch.Tensor:
            return getattr(model(input_ids=ids), output)

        serial = [forward(ids) for ids in inputs]
        threaded, errors = _threaded(forward, inputs)
    assert not errors, errors[:3]
    differing = [j for j, (a, b) in enumerate(zip(serial, threaded)) if not torch.equal(a, b)]
    assert not differing, f"{len(differing)} of {len(inputs)} results differ from serial"


def test_a_retrofitted_minilm_shared_by_threads_returns_the_serial_results():
    model, _ = load_minilm()
    retrofit(model, "full-o")
    _shared_by_threads_as_serial(model, "last_hidden_state", model.config.vocab_size)


def test_a_retrofitted_llama_shared_by_threads_returns_the_serial_results():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    retrofit(model, "full-o")
    _shared_by_threads_as_serial(model, "logits", 100)


class _Holder(PerCallState):
    value = PerCall()


def test_a_per_call_value_is_the_setting_threads_own_and_never_copied():
    holder = _Holder()
    holder.value = 1
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(holder.value))
    thread.start()
    thread.join()
    assert seen == [None] and holder.value == 1
    assert copy.deepcopy(holder).value is None
    assert pickle.loads(pickle.dumps(holder)).value is None


def test_a_per_call_value_written_before_a_graph_break_is_read_after_it():
    """A compiled call that breaks its graph between a hook's write and the read (the user's own
    code may break it anywhere) reads its own thread's value in the frame after the break."""
    holder = _Holder()

    def call(x: torch.Tensor) -> torch.Tensor:
        holder.value = x.sum()
        torch._dynamo.graph_break()
        return x * holder.value

    compiled = torch.compile(call, backend="eager")
    try:
        out, errors = _threaded(compiled, [torch.full((2 + i % 3,), float(i)) for i in range(8)])
    finally:
        torch._dynamo.reset()
    assert not errors, errors[:3]
    assert [o.tolist() for o in out] == [[i * i * (2 + i % 3)] * (2 + i % 3) for i in range(8)]
