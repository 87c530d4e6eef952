"""The report of ``robustest certify`` (OUT/report.html): the certificate's meaning, certified against clean
accuracy, the lower margins (IBP, CROWN) or certified radii (randomised smoothing), and the images not certified."""

from __future__ import annotations

from typing import Any

import torch

from robustest import report
from robustest.evaluate.certification import CertifyResult
from robustest.report import HtmlReport

__all__ = ["certify_report"]


def certify_report(result: CertifyResult, doc: dict[str, Any], data: Any) -> HtmlReport:
    """The HTML report (written by the caller) of a certification ``result``: what the certificate proves, clean,
    (smoothed) and certified accuracy, the counts, the margins or radii, and the correctly classified images left
    uncertified; ``doc`` is the results document written, ``data`` the certified images."""

    rep = report.HtmlReport.from_results(doc, f"robustest certify: {doc['data']['dataset']}, {result.method}, "
                                              f"{result.norm} eps={result.eps:g}")
    n = result.num_samples
    if result.method == "smoothing":
        s = doc["smoothing"]
        rep.paragraph(f"{n} images. Randomised smoothing certifies the smoothed classifier (the model's majority vote "
                      f"under Gaussian noise of sigma {s['sigma']:g}), not the model itself: a sample is certified "
                      f"when the smoothed classifier predicts its label with a certified L2 radius of at least "
                      f"{result.eps:g} (probability at least {1 - s['alpha']:g}; {s['n']} noise samples).")
    else:
        rep.paragraph(f"{n} images. {result.method.upper()} proves, per sample, that no point of the {result.norm} "
                      f"ball of radius {result.eps:g} changes the model's prediction away from the label: the "
                      "certified accuracy is a lower bound of the robust accuracy any attack could measure.")
    rows = [{"measure": "clean accuracy", "value": result.clean_accuracy},
            {"measure": "certified accuracy", "value": result.certified_accuracy}]
    if result.method == "smoothing":
        rows.insert(1, {"measure": "smoothed accuracy", "value": doc["smoothing"]["smoothed_accuracy"]})
    rep.heading("Certified accuracy").table(rows, columns=["measure", "value"])
    rep.table([doc["counts"]])
    if result.lower_margin is not None:
        rep.histogram(result.lower_margin, "lower margin bounds", title="lower bound of the margin over the ball",
                      xlabel="min_j z_y - z_j (> 0: certified)")
    elif result.radius is not None:
        rep.histogram(result.radius[result.prediction == result.y], "certified radii",
                      title="certified L2 radius of the samples predicted correctly", xlabel="L2 radius")
    missed = torch.nonzero(result.clean_correct & ~result.certified).flatten()[:16]
    if missed.numel():
        from robustest.core.batching import take

        x, _ = take(data, result.index[missed])
        caps = [f"{int(result.y[i])}" for i in missed.tolist()]
        rep.heading("Not certified").image(report.save_image_grid(x, None, captions=caps, ncols=8),
                                           "correctly classified images the certificate does not cover: label")
    return rep
