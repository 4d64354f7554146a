"""``Retrofitted``: an sklearn meta-estimator whose arm, τ and ε are parameters, for every family.

``Retrofitted(TabPFNRegressor(model_path=...), arm="full-o", tau=1e-8)`` is an ordinary
sklearn estimator: ``get_params`` / ``set_params`` reach ``arm``, ``tau``, ``eps`` and the
wrapped estimator's own parameters (``estimator__n_estimators``), so ``GridSearchCV`` tunes
them; its repr is sklearn's. ``fit`` fits a retrofitted copy of a clone of the wrapped
estimator; the wrapped estimator itself is never changed. Needs scikit-learn.

Each family (``oretrofit.tabpfn``, ``oretrofit.tabicl``, ``oretrofit.tabdpt``, …) exports the
subclass :func:`for_family` makes in its host folder (``hosts/<family>/meta_estimator.py``),
naming what is the family's own:

* ``vendor_module``: the module its vendor estimators come from (a prefix of
  ``type(estimator).__module__``: ``"tabpfn"``, ``"autogluon.tabular.models.mitra"``) and
  ``wraps``, their names for the refusal of another family's estimator;
* ``retrofit_estimator(estimator, arm, tau, eps) -> (estimator, Retrofit | None)``: given an
  unfitted clone of the wrapped estimator (it may change it or build another), the estimator
  that runs its model retrofitted with ``arm`` (τ and ε None: the family's defaults), and its
  Retrofit (None for ``base``: the vendor's estimator unpatched). ``arm``, ``tau`` and ``eps``
  have been checked (:func:`oretrofit._surgery.registry.check_arm`).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from .registry import Retrofit, RetrofitError, check_arm

__all__ = ["Retrofitted", "for_family"]


class Retrofitted(MetaEstimatorMixin, BaseEstimator):
    """The wrapped estimator, its model retrofitted with ``arm`` at ``tau`` and ``eps``.

    Args:
        estimator: an unfitted estimator of the subclass's family (see its ``wraps``).
        arm: ``full-o``, ``oa`` or ``base`` (the unpatched estimator: the baseline a search
            compares against).
        tau, eps: presence scale and OAttention ε (None: the family's defaults, those of its
            ``make_regressor`` / ``make_classifier``); ``base`` takes neither.
    Attributes:
        estimator_: the fitted estimator running the retrofitted model.
        retrofit_: its :class:`~oretrofit.Retrofit` (None for ``base``).
    """

    vendor_module: ClassVar[str] = ""
    wraps: ClassVar[str] = ""
    retrofit_estimator: ClassVar[Callable[[Any, str, float | None, float | None],
                                          tuple[Any, Retrofit | None]]]

    def __init__(self, estimator: Any, arm: str = "full-o", tau: float | None = None,
                 eps: float | None = None) -> None:
        self.estimator = estimator
        self.arm = arm
        self.tau = tau
        self.eps = eps

    def fit(self, X: Any, y: Any, **fit_params: Any) -> "Retrofitted":
        """Retrofit a clone of the estimator (:attr:`retrofit_estimator`) and fit it."""
        module = type(self.estimator).__module__
        if not self.vendor_module or not f"{module}.".startswith(f"{self.vendor_module}."):
            raise RetrofitError(f"this Retrofitted wraps {self.wraps}; got "
                                f"{module}.{type(self.estimator).__name__} (each family's "
                                "Retrofitted is in its module: oretrofit.tabpfn, "
                                "oretrofit.tabicl, oretrofit.tabdpt, oretrofit.mitra)")
        check_arm(self.arm, tau=self.tau, eps=self.eps)
        self.estimator_, self.retrofit_ = type(self).retrofit_estimator(
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


def for_family(module: str, vendor_module: str, wraps: str,
               retrofit_estimator: Callable[[Any, str, float | None, float | None],
                                            tuple[Any, Retrofit | None]]) -> type[Retrofitted]:
    """The :class:`Retrofitted` of one family, a class named ``Retrofitted`` defined in
    ``module`` (assign it to that name there, so that pickle finds it)."""
    doc = (f"Retrofitted over {wraps} (:class:`oretrofit._surgery.meta_estimator.Retrofitted`; "
           "τ and ε None are the family's make_regressor / make_classifier defaults).")
    return type("Retrofitted", (Retrofitted,), {
        "__module__": module, "__qualname__": "Retrofitted", "__doc__": doc,
        "vendor_module": vendor_module, "wraps": wraps,
        "retrofit_estimator": staticmethod(retrofit_estimator)})
