"""Start the demo classifier from the trained demo regressor's weights.

TabPFN v3's classifier and regressor share every weight but three: the two target encoders
(the regressor's ``nn.Linear(1, E)`` of the standardised target, the classifier's embedding
table ``nn.Embedding(C, E)`` of the class index, in the column stage and the ICL stage) and the
read-out (the regressor's MLP to bucket logits, the classifier's many-class decoder: attention
of the test rows over the train rows, whose one-hot classes are the values). Every shared
tensor is copied; the class embeddings are the regressor's encoder at target values,

    e_c = W·s_c + b,   s_c = 4·r(c) − 2,   r the base-2 radical inverse (0, ½, ¼, ¾, ⅛, …),

so class c enters the network as a standardised target the regressor has learned to read, and
the classes a task uses first (0 and 1 in every task) lie far apart; the decoder keeps its
fresh initialisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["ENCODERS", "class_values", "regressor_weights", "warm_start"]

# the target encoders: regressor Linear(1, E) -> classifier Embedding(C, E)
ENCODERS = ("col_y_encoder", "icl_y_encoder")


def class_values(n_classes: int) -> torch.Tensor:
    """(n_classes,) s_c = 4·r(c) − 2 with r the base-2 radical inverse of c."""
    def radical_inverse(c: int) -> float:
        value, scale = 0.0, 0.5
        while c:
            value, c, scale = value + scale * (c & 1), c >> 1, scale / 2
        return value
    return torch.tensor([4.0 * radical_inverse(c) - 2.0 for c in range(n_classes)])


def warm_start(classifier: torch.nn.Module, regressor_state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Load a v3 regressor's weights into a v3 classifier of the same architecture, in place
    (see the module docstring); return what was copied, derived and left at its initialisation."""
    target = classifier.state_dict()
    copied = {k: v for k, v in regressor_state.items() if k in target and target[k].shape == v.shape}
    derived = {}
    for encoder in ENCODERS:
        weight, bias = regressor_state[f"{encoder}.weight"], regressor_state[f"{encoder}.bias"]  # (E, 1), (E,)
        table = target[f"{encoder}.embedding.weight"]                                        # (C, E)
        if weight.shape != (table.shape[1], 1):
            raise ValueError(f"the regressor's {encoder} maps to {weight.shape[0]} dimensions and the "
                             f"classifier's to {table.shape[1]}; warm-start from a regressor of the same size")
        derived[f"{encoder}.embedding.weight"] = class_values(table.shape[0])[:, None] * weight[:, 0] + bias
    fresh = sorted(set(target) - set(copied) - set(derived))
    missing = sorted(k for k in target if k not in copied and not k.startswith(("many_class_decoder.", *ENCODERS)))
    if missing:
        raise ValueError(f"the regressor lacks the classifier's {', '.join(missing)}; warm-start from a "
                         "regressor of the same architecture")
    classifier.load_state_dict({**target, **copied, **derived})
    return {"copied": len(copied), "derived": sorted(derived), "fresh": fresh}


def regressor_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of a tabpfn-format v3 regressor checkpoint, loaded weights-only."""
    checkpoint = torch.load(Path(path), map_location="cpu", weights_only=True)
    if checkpoint.get("config", {}).get("max_num_classes", -1) >= 2:
        raise ValueError(f"{path} is a classifier checkpoint; warm-start from a v3 regressor (the demo regressor)")
    return checkpoint["state_dict"]
