"""Training objectives behind a registry: one file per objective, each an :class:`Objective` (name, method-specific
options with their defaults, one ``step``). The hardening methods are read by :func:`robustest.train.harden`, its
settings, the ``harden`` verb and RobOT's hardening strategies; :func:`robustest.train.fit` looks up
``cross-entropy`` and :func:`robustest.weakrobust.enhance` ``augmix-jsd-adv`` (registered by
:mod:`robustest.weakrobust`, whose AugMix it needs); these two are no harden methods (``harden_method=False``).

==================  ======================================================================================
``pgd-at``          Madry et al. (2018): k-step L-inf PGD from a uniform random start; ``mix * CE(x) + (1 - mix)
                    * CE(x_adv)`` (:mod:`.pgd_at`).
``trades``          Zhang et al. (2019): ``CE(f(x), y) + beta * KL(p(x) || p(x_adv))`` (:mod:`.trades`).
``fosc``            Wang et al. (2019), dynamic AT: PGD stops per sample at FOSC <= c_t (:mod:`.fosc`).
``fol-budget``      PGD stops per sample at FOL <= ``fol_threshold`` or misclassification (:mod:`.fol_budget`).
``fast-at``         Wong et al. (2020): one FGSM step of 1.25 eps from a random start (:mod:`.fast_at`).
``n-fgsm``          de Jorge et al. (2022): one FGSM step of eps from a U(-2 eps, 2 eps) start, not clipped to the
                    ball (:mod:`.n_fgsm`).
``grad-align``      Andriushchenko & Flammarion (2020): FGSM + ``lambda * (1 - cos(grad_x, grad_{x+eta}))``
                    (:mod:`.grad_align`).
``gaussian-noise``  Cohen et al. (2019): ``CE(x + sigma * e)``, e ~ N(0, I), not clipped (``sigma``, default
                    0.25): a base model for randomised smoothing (:mod:`robustest.certify.smoothing`); no attack
                    (:mod:`.gaussian_noise`).
``ibp``             Gowal et al. (2018): ``kappa * CE(z(x), y) + (1 - kappa) * CE(-m_ibp, y)``, m the IBP lower
                    bounds of the margins at a radius ramped from 0 to ``eps_train`` after a clean warm-up,
                    kappa 1 -> ``kappa_end`` along the ramp (:mod:`.ibp`).
``crown-ibp``       Zhang et al. (2020): as ibp with ``beta * m_crown_ibp + (1 - beta) * m_ibp``, beta 1 ->
                    ``beta_end`` and kappa 1 -> 0 along the ramp (:mod:`.crown_ibp`).
==================  ======================================================================================

=================  =======================================================================================
``cross-entropy``  fit's loss: CE (optional label smoothing) under the run's autocast (:mod:`.cross_entropy`).
``augmix-jsd-adv`` enhance's loss: ``CE(x) + jsd_weight * JSD(x, aug1, aug2) + adv_weight * CE(x_adv)``
                   (:mod:`robustest.weakrobust.enhance_objective`).
=================  =======================================================================================

A new method is one file defining an :class:`Objective` and one :func:`register` call (or ``with
registered(obj):`` for a temporary one); its options become keywords of ``harden`` and flags of the verb. A loop's
objective is replaced the same way (``with registered(obj, replace=True):`` under its name).
"""

from __future__ import annotations

from robustest.train.objectives import (
    cross_entropy,
    crown_ibp,
    fast_at,
    fol_budget,
    fosc,
    gaussian_noise,
    grad_align,
    ibp,
    n_fgsm,
    pgd_at,
    trades,
)
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.registry import (
    canonical,
    get,
    names,
    option_owners,
    register,
    registered,
    unregister,
)

__all__ = ["Objective", "StepContext", "StepOutput", "canonical", "get", "names", "option_owners",
           "register", "registered", "unregister"]

for _module in (pgd_at, trades, fosc, fol_budget, fast_at, n_fgsm, grad_align, gaussian_noise, ibp, crown_ibp,
                cross_entropy):
    register(_module.OBJECTIVE)
