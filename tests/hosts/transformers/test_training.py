"""Training mode on the transformers host: attention-weight dropout and one LoRA fine-tune step.

The O attention function applies dropout to the same ``(B, H, Nq, Nk)`` weight tensor as the
host's attention (eager's ``dropout(softmax(s))``, and SDPA's math kernel, which is what CPU runs
with dropout > 0), so under one seed both draw one mask: at τ, ε → 0 a retrofitted model in
``train()`` mode gives the base model's outputs and gradients, dropout on or off.

Tolerance: τ = ε = 1e-12 moves a weight by ~1e-12 relative, far below fp32 rounding, so what is
left is the rounding of two summation orders (the reference path against SDPA), ~1e-7 relative per
op. The gradients are compared per LoRA tensor as max|Δ| / max|g_base| ≤ 1e-4, with a different
seed as the counter-check: another dropout mask moves them by ≥ 1e-2, a hundred times more.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any, Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.bert.modeling_bert import eager_attention_forward  # noqa: E402

from oretrofit import retrofit, retrofitted  # noqa: E402
from oretrofit.hosts.transformers.interface_route import o_attention_function  # noqa: E402
from oretrofit.hosts.transformers.report import (EPS, PROMPTS, SENTENCES, load_minilm,  # noqa: E402
                                                 load_smollm2, null_insertion)

TAU_ZERO = 1e-12
RELATIVE = 1e-4
Loss = Callable[[nn.Module], Tensor]


def set_dropout(model: nn.Module, attention: float, other: float) -> None:
    """Attention-weight dropout ``attention`` (Llama's ``attention_dropout``, BERT's
    ``attention.self.dropout``); every other ``nn.Dropout`` (hidden, LoRA) ``other``."""
    for name, module in model.named_modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = attention
        elif isinstance(module, nn.Dropout):
            module.p = attention if name.endswith("attention.self.dropout") else other


def lora_gradients(model: nn.Module, loss: Loss, seed: int) -> dict[str, Tensor]:
    """The trainable (LoRA) parameters' gradients of ``loss`` after ``torch.manual_seed(seed)``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss(model).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def worst_relative(grads: dict[str, Tensor], reference: dict[str, Tensor]) -> float:
    """max over tensors of max|Δ| / max|g_reference|."""
    return max(((grads[n] - g).abs().max() / g.abs().max()).item() for n, g in reference.items())


def tiny(kind: str) -> nn.Module:
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64)
    if kind == "bert":
        return BertModel(BertConfig(vocab_size=120, attention_probs_dropout_prob=0.3,
                                    hidden_dropout_prob=0.1, **common))
    return LlamaForCausalLM(LlamaConfig(vocab_size=120, num_key_value_heads=2,
                                        attention_dropout=0.3, **common))


def hidden(model: nn.Module, ids: Tensor) -> Tensor:
    return model(ids, output_hidden_states=True).hidden_states[-1]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["bert", "llama"])
@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_train_mode_dropout_draws_the_host_mask_under_one_seed(kind: str, arm: str,
                                                               implementation: str) -> None:
    torch.manual_seed(0)
    model = tiny(kind).train()
    model.config._attn_implementation_internal = implementation
    ids = torch.randint(0, 120, (2, 9))
    torch.manual_seed(1)
    reference = hidden(model, ids)
    with retrofitted(model, arm, TAU_ZERO, eps=EPS):
        torch.manual_seed(1)
        same = hidden(model, ids)
        torch.manual_seed(2)
        other = hidden(model, ids)
        model.eval()
        evaluated = []
        for seed in (3, 4):
            torch.manual_seed(seed)
            evaluated.append(hidden(model, ids))
    assert (same - reference).abs().max() <= 1e-5
    assert (other - reference).abs().max() >= 1e-2          # the mask acts and follows the seed
    assert torch.equal(*evaluated)                           # eval(): no dropout, as the host
    assert (evaluated[0] - hidden(model, ids)).abs().max() <= 1e-5


def test_the_attention_function_drops_as_eager_only_in_train_mode() -> None:
    """eager's ``dropout(w, p=dropout, training=module.training)``, called directly on one
    retrofitted BERT attention module with the same q, k, v and seed as the host's eager function."""
    torch.manual_seed(0)
    model = tiny("bert").eval()
    with retrofitted(model, "oa", TAU_ZERO, eps=EPS):
        model(torch.randint(0, 120, (1, 5)))                     # captures the carriers' presences
        attention = model.encoder.layer[0].attention.self
        q, k, v = torch.randn(3, 1, 4, 5, 8).unbind(0)

        def call(function: Callable, seed: int) -> Tensor:
            torch.manual_seed(seed)
            return function(attention, q, k, v, None, scaling=8 ** -0.5, dropout=0.5)[0]

        for training in (False, True):
            attention.train(training)
            eager = call(eager_attention_forward, 1)
            assert (call(o_attention_function, 1) - eager).abs().max() <= 1e-6
            seed_free = torch.equal(call(o_attention_function, 2), call(o_attention_function, 1))
            assert seed_free is not training                    # a mask is drawn only in train()


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_train_mode_null_carriers_stay_exact_zero(kind: str) -> None:
    torch.manual_seed(0)
    model = tiny(kind)
    ids = torch.randint(0, 120, (1, 7))
    with retrofitted(model, "full-o", 1e-6), torch.no_grad():
        for seed in range(3):
            torch.manual_seed(seed)
            assert null_insertion(model.train(), ids, at=3)["inserted_max_abs"] == 0.0


def with_lora(model: nn.Module, targets: list[str]) -> nn.Module:
    """LoRA (r = 4) on the attention projections ``targets``; A and B both random so that every
    LoRA parameter has a non-zero gradient."""
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.1,
                        init_lora_weights=False)
    return get_peft_model(model, config).train()


def minilm_loss(tokenizer: Any) -> Loss:
    batch = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()

    def loss(model: nn.Module) -> Tensor:
        return model(**batch).last_hidden_state[real].pow(2).mean()
    return loss


def smollm2_loss(tokenizer: Any) -> Loss:
    ids = tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]
    return lambda model: model(input_ids=ids, labels=ids).loss


def load(name: str) -> tuple[nn.Module, list[str], Loss]:
    """The real model, its attention projections for LoRA, and a loss on a short input."""
    if name == "minilm":
        model, tokenizer = load_minilm()
        return model, ["query", "value"], minilm_loss(tokenizer)
    model, tokenizer = load_smollm2()
    return model, ["q_proj", "v_proj"], smollm2_loss(tokenizer)


@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_lora_fine_tune_step_in_train_mode_has_the_base_gradients(name: str) -> None:
    """Retrofit (full-o, τ → 0), then LoRA, then train(): the LoRA gradients with every dropout
    off, with dropout 0.1 (attention weights, hidden states, LoRA input) under one seed and under
    another, and one SGD step; then the same gradients after revert(), i.e. of the unpatched
    model (its own SDPA attention) with the same LoRA weights."""
    model, targets, loss = load(name)
    r = retrofit(model, "full-o", TAU_ZERO, eps=EPS)
    model = with_lora(model, targets)
    cases = {"off": (0.0, 0), "on": (0.1, 0), "on, other seed": (0.1, 1)}

    def gradients() -> dict[str, dict[str, Tensor]]:
        out = {}
        for case, (p, seed) in cases.items():
            set_dropout(model, attention=p, other=p)
            out[case] = lora_gradients(model, loss, seed)
        return out

    assert model.config._attn_implementation == "oretrofit"
    o = gradients()
    sgd_step_runs(model, loss)
    r.revert()
    assert model.config._attn_implementation == "sdpa"
    base = gradients()
    assert len(o["on"]) == 4 * model.config.num_hidden_layers          # A and B of q and v
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in o["on"].values())
    for case in cases:
        assert worst_relative(o[case], base[case]) <= RELATIVE, case
    assert worst_relative(o["on, other seed"], base["on"]) >= 100 * RELATIVE


def sgd_step_runs(model: nn.Module, loss: Loss) -> None:
    """One SGD step with dropout 0.1 changes the (dropout-free) loss and keeps it finite; the
    LoRA weights are restored afterwards."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    optimizer = torch.optim.SGD(trainable, lr=1e-2)
    set_dropout(model, attention=0.0, other=0.0)
    start = loss(model).item()
    set_dropout(model, attention=0.1, other=0.1)
    optimizer.zero_grad()
    loss(model).backward()
    optimizer.step()
    set_dropout(model, attention=0.0, other=0.0)
    after = loss(model).item()
    assert torch.isfinite(torch.tensor([start, after])).all() and after != start
    with torch.no_grad():
        for p, b in zip(trainable, before):
            p.copy_(b)
