"""The report of an eval run (OUT/report.html) and its per-sample rows (OUT/samples.csv): the verdict of the gate,
the flags, certified <= robust <= clean accuracy as one bar, the robustness curve, the accuracy after each attack,
the adversarial examples and the common corruptions."""

from __future__ import annotations

from typing import Any

from robustest.core.errors import EXIT_GATE
from robustest.evaluate.certification import Bracket
from robustest.evaluate.ensemble import EvalResult

__all__ = ["eval_report", "sample_rows"]


def sample_rows(result: EvalResult, brk: Bracket | None) -> list[dict[str, Any]]:
    """samples.csv's rows (one per sample): the evaluation's; with a bracket, its label and the lower margin."""
    rows = result.rows()
    if brk is not None:
        margins = brk.lower_margin.tolist() if brk.lower_margin is not None else [None] * len(rows)
        for row, label, m in zip(rows, brk.labels, margins):
            row.update(bracket=label, lower_margin=m)
    return rows


def eval_report(result: EvalResult, doc: dict[str, Any], brk: Bracket | None = None, data: Any = None) -> Any:
    """The HTML report (a :class:`robustest.report.HtmlReport`, written by the caller) of an eval run: the verdict of
    the gate, the flags, the bracket, the robustness curve, the accuracy after each attack, the adversarial
    examples and the corruptions; ``doc`` is the results document written (results.json's content), ``data`` the
    evaluated images (for the undecided samples of the bracket)."""
    from robustest import report

    radii = f"eps={result.eps:g}" if not result.curve else "eps=" + ",".join(f"{c['eps']:g}" for c in result.curve)
    rep = report.HtmlReport.from_results(doc, f"robustest eval: {doc['data']['dataset']}, {result.norm} {radii}")
    rep.paragraph(f"{result.num_samples} images, version {result.version}: clean accuracy "
                  f"{100 * result.clean_accuracy:.2f}%, robust accuracy {100 * result.robust_accuracy:.2f}%. Each "
                  "attack runs only on the images every earlier attack left correctly classified; the accuracy "
                  "after an attack is cumulative.")
    rep.heading("Verdict")
    gate = doc.get("gate")
    if gate is None and brk is not None and not brk.sound:
        rep.verdict("fail", f"No --fail-under gate, but the exit status is {EXIT_GATE}: a sample both certified and "
                            "broken is a soundness error (see below).")
    elif gate is None:
        rep.verdict("not-gated", "No gate: --fail-under was not given, so the exit status is 0 whatever the robust "
                                 "accuracy.")
    else:
        verb = "passed" if gate["passed"] else "FAILED"
        rel = "at least" if gate["accuracy_passed"] else "below"
        why = ""
        if gate["blocking_flags"]:
            why = f"; the evaluation is flagged unreliable ({', '.join(gate['blocking_flags'])})"
        rep.verdict("pass" if gate["passed"] else "fail",
                    f"The gate {verb}: robust accuracy {result.robust_accuracy:.4f} is {rel} --fail-under "
                    f"{gate['fail_under']:.4f}{why} (exit status {0 if gate['passed'] else EXIT_GATE}).")
    rep.heading("Checks")
    if not result.flags:
        rep.paragraph("No flag: the model is deterministic, returns logits, has usable input gradients, and no "
                      "gradient-free attack broke what the gradient attacks left robust.")
    else:
        rep.paragraph("What the checks found (an unreliable flag means the robust accuracy may be far too high; "
                      "docs/EVAL.md explains each flag):")
        rep.table([{"flag": f.name, "severity": f.severity, "samples": len(f.samples)} for f in result.flags])
        for f in result.flags:
            rep.paragraph(f"{f.severity.upper()} {f.name}: {f.message}. Remedy: {f.remedy}.")
    if brk is not None:
        _bracket_section(rep, result, brk, data)
    if result.curve:
        rep.heading("Robustness curve")
        rep.paragraph("Each radius was attacked only on the images that survived the smaller one; the tables below "
                      f"are those of the largest radius, eps={result.eps:g}.")
        xs = [c["eps"] for c in result.curve]
        rep.image(report.save_lines({"robust accuracy": (xs, [c["robust_accuracy"] for c in result.curve])}, None,
                                    title="robust accuracy against the radius", xlabel=f"{result.norm} eps",
                                    ylabel="robust accuracy"), "robust accuracy against eps")
        rep.table([{"eps": c["eps"], "robust accuracy": c["robust_accuracy"], "attacked": c["attacked"],
                    "broke": c["broke"], "plan": c["plan"], "reliable": c["reliable"],
                    "flags": ", ".join(f"{f['name']} ({f['severity']})" for f in c["flags"]) or "-"}
                   for c in result.curve])
    rows = [{"attack": "clean", "accuracy": result.clean_accuracy, "broke": None, "attacked": None, "seconds":
             result.timings.get("clean_s")}]
    rows += [{"attack": k, "accuracy": v, "broke": result.breaks[k], "attacked": result.attacked[k],
              "share of breaks": doc["share_of_breaks"][k], "seconds": result.timings.get(f"{k}_s")}
             for k, v in result.attacks.items()]
    rep.heading("Accuracy after each attack").table(rows)
    rep.image(report.save_bars({"accuracy": {r["attack"]: r["accuracy"] for r in rows}}, None,
                               title="cumulative accuracy", ylabel="accuracy"), "accuracy after each attack")
    broken = (~result.robust & result.clean_correct).nonzero().flatten()
    if broken.numel() and result.adv is not None:
        norms = (result.linf if result.norm == "linf" else result.l2)[broken]
        rep.heading("Adversarial examples")
        name = {"linf": "L-inf", "l2": "L2"}.get(result.norm, result.norm)
        rep.histogram(norms, f"{name} norms of the perturbations of the {broken.numel()} broken images",
                      title=f"{result.norm} norm of the perturbations", xlabel=result.norm)
        import torch

        pick = broken[:16].tolist()  # result tensors are in data order, aligned with adv
        caps = [f"{int(result.y[i])}->{int(result.adv_pred[i])} ({result.broken_by[i]})" for i in pick]
        grid = torch.stack([result.adv[i] for i in pick])
        rep.image(report.save_image_grid(grid, None, captions=caps, ncols=8),
                  "adversarial images: label->prediction (attack)")
    if result.corruption is not None:
        c = result.corruption
        rep.heading("Common corruptions")
        rep.paragraph(f"mean corruption accuracy {100 * c['mean_corruption_accuracy']:.2f}%, mean corruption error "
                      f"{100 * c['mean_corruption_error']:.2f}%"
                      + ("" if c["mce"] is None else f", mCE {100 * c['mce']:.2f}% and relative mCE "
                         f"{100 * c['relative_mce']:.2f}% of the baseline's"))
        rep.table([{"corruption": name, **per} for name, per in c["accuracy"].items()])
    return rep  # the settings and timings tables follow (HtmlReport.from_results)


#: the bracket's bar: label -> (share key, colour)
_BAR = {"certified": ("certified", "#2da44e"), "undecided": ("undecided", "#bf8700"),
        "broken by an attack": ("broken_by_attack", "#cf222e"), "misclassified clean": ("misclassified", "#6e7781"),
        "UNSOUND (certified and broken)": ("unsound", "#8250df")}


def _bracket_section(rep, result, brk, data) -> None:
    """Certified, robust and clean accuracy as one stacked bar, the counts, and the undecided samples."""
    import torch

    from robustest import report
    from robustest.core.batching import take

    shares, counts = brk.shares(), brk.counts()
    rep.heading("Certified, robust and clean accuracy")
    rep.paragraph(f"{brk.method.upper()} certificate on the same {brk.num_samples} images: certified "
                  f"{brk.certified_accuracy:.3f} <= robust {brk.robust_accuracy:.3f} <= clean "
                  f"{brk.clean_accuracy:.3f}. "
                  "Certified: no point of the ball changes the prediction (proved). Broken: misclassified clean, or "
                  "an attack's point inside the ball and [0, 1] that the model misclassifies (checked again here). "
                  "Undecided: neither; the true robust accuracy lies between the certified share and the robust "
                  "accuracy.")
    if not brk.sound:
        rep.paragraph(f"SOUNDNESS ERROR: {counts['unsound']} samples are both certified and broken "
                      f"({', '.join(str(i) for i in _unsound_indices(brk))}): the certificate or the evaluation is "
                      "wrong, and neither figure can be trusted.")
    if brk.unverified:
        rep.note(f"{brk.unverified} samples the attacks broke did not pass the check (the point left the ball or "
                 "[0, 1], or the model judged it differently again): they count as undecided here.")
    parts = {label: shares[key] for label, (key, _) in _BAR.items() if key != "unsound" or counts["unsound"]}
    colours = [c for label, (_, c) in _BAR.items() if label in parts]
    rep.image(report.save_stacked_bar(parts, None, title="certified | undecided | broken | misclassified",
                                      xlabel="share of the samples", colors=colours),
              "certified accuracy = the green part; robust accuracy = green + amber; clean accuracy = everything but "
              "the grey part")
    rep.table([counts])
    undecided = torch.tensor([lab == "undecided" for lab in brk.labels], dtype=torch.bool)
    pick = torch.nonzero(undecided).flatten()[:16]
    if pick.numel() and data is not None:
        x, _ = take(data, brk.index[pick])
        margins = brk.lower_margin[pick].tolist() if brk.lower_margin is not None else [None] * len(pick)
        caps = [f"{int(result.y[i])} m={m:.2g}" if m is not None else f"{int(result.y[i])}"
                for i, m in zip(pick.tolist(), margins)]
        rep.heading("Undecided samples", level=3)
        rep.image(report.save_image_grid(x, None, captions=caps, ncols=8),
                  "neither certified nor broken: label and the certificate's lower margin bound (m)")


def _unsound_indices(brk, limit: int = 10) -> list[int]:
    """The first ``limit`` data indices of the unsound samples."""
    return [int(i) for i in brk.index[brk.unsound][:limit].tolist()]
