"""Certified robustness: sound lower bounds beside the attacks' upper bounds.

Bound propagation (``ibp``, ``crown``) proves, per sample, that no point of an L-inf or L2 ball changes the
prediction; randomised smoothing (``smooth_predict``, ``smooth_certify``) certifies an L2 radius for the smoothed
classifier of any model. Inputs follow the data contract: N x C x H x W float in [0, 1], int64 labels.
"""

from __future__ import annotations

from robustest.certify.certificate import Certificate
from robustest.certify.graph import SUPPORTED
from robustest.certify.smoothing import (
    ABSTAIN,
    SmoothCertificate,
    certified_accuracy,
    smooth_certify,
    smooth_predict,
)
from robustest.certify.verify import METHODS, check_certifiable, crown, ibp, margin_bounds, margin_spec

__all__ = ["ABSTAIN", "METHODS", "SUPPORTED", "Certificate", "SmoothCertificate", "certified_accuracy",
           "check_certifiable", "crown", "ibp", "margin_bounds", "margin_spec", "smooth_certify", "smooth_predict"]
