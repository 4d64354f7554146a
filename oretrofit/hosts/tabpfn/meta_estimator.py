"""``Retrofitted``: an sklearn meta-estimator whose arm, τ and ε are parameters.

``Retrofitted(TabPFNRegressor(model_path=...), arm="full-o", tau=1e-8)`` is an ordinary
sklearn estimator: ``get_params`` / ``set_params`` reach ``arm``, ``tau``, ``eps`` and the
wrapped estimator's own parameters (``estimator__n_estimators``), so ``GridSearchCV`` tunes
them; its repr is sklearn's. ``fit`` retrofits a copy of the wrapped estimator's model (the
checkpoint its ``model_path`` names) and fits a clone of the estimator running it; the wrapped
estimator itself is never changed. Needs scikit-learn and the host's package (``tabpfn``).
"""

from __future__ import annotations

from typing import Any

from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from ..._surgery.registry import Retrofit, RetrofitError

__all__ = ["Retrofitted"]


def _retrofit_estimator(estimator: Any, arm: str, tau: float | None, eps: float | None
                        ) -> tuple[Any, Retrofit | None]:
    """The host's retrofitted copy of ``estimator``: one function per estimator family."""
    if type(estimator).__module__.split(".")[0] == "tabpfn":
        from .estimators import retrofit_estimator
        return retrofit_estimator(estimator, arm, tau, eps)
    raise RetrofitError(f"Retrofitted wraps tabpfn's TabPFNRegressor / TabPFNClassifier; got "
                        f"{type(estimator).__module__}.{type(estimator).__name__}")


class Retrofitted(MetaEstimatorMixin, BaseEstimator):
    """The wrapped estimator, its model retrofitted with ``arm`` at ``tau`` and ``eps``.

    Args:
        estimator: an unfitted estimator of a supported family (tabpfn's ``TabPFNRegressor``
            or ``TabPFNClassifier`` whose ``model_path`` names a checkpoint, or ``"auto"``).
        arm: ``full-o``, ``oa`` or ``base`` (the unpatched estimator: the baseline a search
            compares against).
        tau, eps: presence scale and OAttention ε (None: the host's defaults, those of
            :func:`oretrofit.tabpfn.make_regressor`); ``base`` takes neither.
    Attributes:
        estimator_: the fitted clone of ``estimator``, running the retrofitted model.
        retrofit_: its :class:`~oretrofit.Retrofit` (None for ``base``).
    """

    def __init__(self, estimator: Any, arm: str = "full-o", tau: float | None = None,
                 eps: float | None = None) -> None:
        self.estimator = estimator
        self.arm = arm
        self.tau = tau
        self.eps = eps

    def fit(self, X: Any, y: Any, **fit_params: Any) -> "Retrofitted":
        """Retrofit a copy of the estimator's model and fit a clone of the estimator on it."""
        self.estimator_, self.retrofit_ = _retrofit_estimator(
            clone(self.estimator), self.arm, self.tau, self.eps)
        self.estimator_.fit(X, y, **fit_params)
        if hasattr(self.estimator_, "classes_"):
            self.classes_ = self.estimator_.classes_
        return self

    def predict(self, X: Any, **kwargs: Any) -> Any:
        check_is_fitted(self, "estimator_")
        return self.estimator_.predict(X, **kwargs)

    @available_if(lambda self: hasattr(self.estimator, "predict_proba"))
    def predict_proba(self, X: Any, **kwargs: Any) -> Any:
        check_is_fitted(self, "estimator_")
        return self.estimator_.predict_proba(X, **kwargs)

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """The wrapped estimator's score (R² for a regressor, accuracy for a classifier)."""
        check_is_fitted(self, "estimator_")
        return self.estimator_.score(X, y, sample_weight=sample_weight)

    @property
    def _estimator_type(self) -> str | None:       # what is_regressor reads before sklearn 1.6
        return getattr(self.estimator, "_estimator_type", None)

    def __sklearn_tags__(self) -> Any:
        """The wrapped estimator's type and task tags (sklearn 1.6+): ``is_regressor`` /
        ``is_classifier`` (and so the folds ``cross_val_score`` cuts) follow it."""
        from sklearn.utils import get_tags
        tags = super().__sklearn_tags__()
        wrapped = get_tags(self.estimator)
        tags.estimator_type = wrapped.estimator_type
        tags.classifier_tags, tags.regressor_tags = (wrapped.classifier_tags,
                                                     wrapped.regressor_tags)
        tags.target_tags, tags.input_tags = wrapped.target_tags, wrapped.input_tags
        return tags
