"""The report of a harden run (OUT/report.html): the recipe, the validation and the kept epoch, robustness before
and after with the number of test images of each figure, the epochs, and a chart of the validation curve against
training compute with the kept epoch marked."""

from __future__ import annotations

from typing import Any

from robustest.report import HtmlReport
from robustest.train.early_stopping import CO_GAP, CO_LONG_FACTOR, CO_LONG_GAP, CO_LONG_SIZE, val_key

__all__ = ["GUARD_REASONS", "guard_reason", "harden_report", "summary_figures"]


#: what each rule of the catastrophic-overfitting guard saw (robustest.train.early_stopping: collapsed, masked,
#: overstated)
GUARD_REASONS = {
    "collapsed": "the validation robust accuracy collapse",
    "masked": f"the training attack's accuracy at least {CO_GAP} above the validation robust accuracy (the model "
              "resists only its own single-step attack: a collapse that robustness never rose before)",
    "overstated": f"APGD-CE with {CO_LONG_FACTOR} times the validation's iterations breaking at least "
                  f"{CO_LONG_GAP * 100:.0f} % more of up to {CO_LONG_SIZE} validation images (the short validation "
                  "attack no longer sees what the training hides: a slow failure)",
}


def _guard_of(epochs: list[dict[str, Any]], epoch: int) -> str:
    """The guard rule that fired at ``epoch`` (1-based) of the per-epoch records."""
    return str(epochs[epoch - 1].get("guard", "collapsed")) if 0 < epoch <= len(epochs) else "collapsed"


def guard_reason(res: Any) -> str:
    """What the catastrophic-overfitting guard saw when it stopped the run ``res`` (a HardenResult)."""
    return GUARD_REASONS[_guard_of(res.epochs, res.guard_epoch)].split(" (")[0]


def summary_figures(r: dict[str, Any]) -> dict[str, Any]:
    """One model's figures of the before/after table, each column naming the number of test images it was measured
    on (clean accuracy and certificates: the first --test-limit images; the attacks: the first --whitebox-limit);
    a figure not measured is None."""
    n, wb = r["num_eval"], r["num_whitebox"]
    return {f"clean accuracy ({n} images)": r["clean_accuracy"],
            f"white-box accuracy ({wb} images)": r["whitebox_accuracy"],
            f"PGD accuracy ({wb} images)": r["whitebox_pgd_accuracy"],
            f"APGD-CE accuracy ({wb} images)": r["whitebox_apgd_accuracy"],
            f"AutoAttack accuracy ({wb} images)": r.get("autoattack_accuracy"),
            f"certified accuracy ({n} images)": r.get("certified_accuracy")}


def harden_report(results: dict[str, Any]) -> HtmlReport:
    """The HTML report (written by the caller, as every verb's) of the harden results document ``results``
    (results.json's content)."""
    from robustest.report import format_value

    s = results["settings"]
    n_ep = len(results["epochs"])
    how = "from random weights" if s.get("from_scratch") else "fine-tuning"
    rep = HtmlReport.from_results(results, f"robustest harden: {s['method']} on {s['dataset']}")
    warm = f", eps warm-up over {s['eps_warmup']:.0%} of the steps" if s.get("eps_warmup") else ""
    cpu = results.get("training_cpu_s")
    rep.paragraph(f"{s['method']} at eps {s['eps']:g} (L-inf){warm}, {how}, {n_ep} epoch{'s' if n_ep != 1 else ''} "
                  f"of {s['epochs']}, {s['steps']} attack step(s) of {s['alpha']:.4g}, {s['optimizer']} "
                  f"{s['lr']:g} ({s.get('schedule') or 'constant'} schedule), on {results['data']['num_fit']} images "
                  f"of {s['dataset']}; {results['compute']['passes']:.4g} forward+backward passes in all"
                  + ("." if cpu is None else
                     f", {format_value(cpu, 'cpu_s')} CPU-seconds of training "
                     f"({format_value(results['timings']['harden_s'], 'harden_s')} s wall-clock)."))
    kept, guard = results.get("kept_epoch"), results.get("guard_epoch")
    vattack = s.get("val_attack", "pgd")
    vcol, vkey = f"validation {vattack.upper()}", val_key(vattack)
    if results["data"].get("num_val"):
        rep.paragraph(f"Validation: {results['data']['num_val']} held-out training images, {vattack.upper()}-"
                      f"{s['val_steps']} after every epoch. The model written (model.pt) is epoch {kept}'s "
                      f"({s['keep']} {f'{vcol} accuracy' if s['keep'] == 'best' else 'epoch'})."
                      + (f" Training stopped at epoch {guard}: the catastrophic-overfitting guard saw "
                         f"{GUARD_REASONS[_guard_of(results['epochs'], guard)]}." if guard is not None else ""))
    rep.heading("Robustness before and after")
    models = (("before", results["before"]), (f"after (epoch {kept}, model.pt)", results["after"]),
              ("last epoch (last.pt)", results.get("last")))
    rows = [{"model": name, **summary_figures(r)} for name, r in models if r is not None]
    rep.table(rows, [c for c in rows[0] if c == "model" or any(r[c] is not None for r in rows)],
              caption="Each column names the number of test images its figure was measured on.")
    rep.heading("Epochs")
    cum = 0.0
    erows = []
    for e in results["epochs"]:
        cum += e["compute"]["passes"]
        erows.append({"epoch": e["epoch"], "loss": e["loss"], "adv. accuracy (train)": e["adv_accuracy"],
                      "eps": e.get("eps"), "lr": e.get("lr"),
                      "attack evals / image": e["attack_evals_mean"], "stopped early": e["stopped_early"],
                      "passes": e["compute"]["passes"], "cumulative passes": cum,
                      "fosc c_t": e.get("fosc_c"), "validation clean": e.get("val_clean_accuracy"),
                      vcol: e.get(vkey), "seconds": e["seconds"]})
    rep.table(erows, kinds={"adv. accuracy (train)": "fraction", "validation clean": "fraction", vcol: "fraction"})
    if erows:
        _epoch_chart(rep, erows, kept, vcol)
    return rep


def _epoch_chart(rep: Any, erows: list[dict[str, Any]], kept: int | None, vcol: str) -> None:
    """Accuracy after every epoch against cumulative compute, the kept epoch (model.pt) ringed and labelled, also
    after one epoch: the held-out validation images' robust (column ``vcol``) and clean accuracy, or, without
    validation, the training batches' adversarial accuracy."""
    from robustest.report import save_lines

    val = erows[0][vcol] is not None
    xs = [r["cumulative passes"] for r in erows]
    if val:
        series = {f"{vcol} accuracy": (xs, [r[vcol] for r in erows]),
                  "validation clean accuracy": (xs, [r["validation clean"] for r in erows])}
    else:
        series = {"adversarial accuracy (training batches)": (xs, [r["adv. accuracy (train)"] for r in erows])}
    k = next((r for r in erows if r["epoch"] == kept), None)
    marks = {} if k is None else {
        f"kept: epoch {kept}": (k["cumulative passes"], k[vcol if val else "adv. accuracy (train)"])}
    title = "held-out validation images" if val else "training batches (no validation split)"
    what = "validation robustness and clean accuracy" if val else "adversarial accuracy of the training batches"
    rep.image(save_lines(series, None, title=f"{title} after every epoch", xlabel="cumulative forward+backward passes",
                         ylabel="accuracy", marks=marks),
              f"{what} against training compute, the kept epoch marked"
              + (f" (ringed: epoch {kept}, model.pt)" if kept is not None else ""))
