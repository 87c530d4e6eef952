"""The flags of one evaluation, from the model probe, the per-sample gradient check and what each attack broke
(:class:`robustest.evaluate.flags.Flag`; docs/EVAL.md lists every flag, its threshold and its remedy)."""

from __future__ import annotations

from typing import Any

import torch

from robustest.attacks import get as get_attack
from robustest.evaluate.checks import GRAD_NONFINITE, GRAD_ZERO, SATURATED_MARGIN, ModelProbe
from robustest.evaluate.flags import Flag
from robustest.evaluate.plans import PlanStep
from robustest.evaluate.runner import Tally

__all__ = ["GRADIENT_FREE_SHARE", "collect_flags"]

#: a gradient-free attack (or a transfer) breaking at least this share of the samples it attacked (and 2 or more)
#: after the gradient attacks makes the evaluation unreliable
GRADIENT_FREE_SHARE = 0.01


def _indices(index: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in index[mask].tolist())


def _model_flags(probe: ModelProbe, *, randomised_acted: bool, forwards: int) -> list[Flag]:
    flags = []
    if probe.randomised:
        what = (f"{probe.forwards} forward passes of the same {probe.num_images} images differ (normalised outputs "
                f"up to {probe.max_output_diff:.3g} apart, {probe.prediction_changes} changed class)")
        if randomised_acted:
            flags.append(Flag("randomised", "warning", f"{what}: evaluated with the rand version (EOT), each point "
                              f"judged by the majority of {forwards} forwards",
                              "none needed; for a stronger test raise forwards= or write an adaptive attack"))
        else:
            flags.append(Flag("randomised", "unreliable", f"{what}, but the attacks did not average over the "
                              "randomness", "evaluate with version 'rand' or 'auto'"))
    if probe.dynamic:
        parts = []
        if probe.changed_state:
            parts.append(f"the forward pass changed {', '.join(probe.changed_state[:5])}")
        if probe.autograd_calls:
            parts.append(f"the forward pass called autograd {probe.autograd_calls} times")
        flags.append(Flag("dynamic-defence", "unreliable", "; ".join(parts) + ": attacks aimed at a fixed model may "
                          "not apply", "write an adaptive attack for the defence, or evaluate the model without it"))
    if probe.probability_output:
        flags.append(Flag("probability-output", "warning", "the outputs are probabilities (in [0, 1], rows summing "
                          "to 1): the attacks used their logarithm as logits", "return logits from the model"))
    if not probe.gradient_path:
        flags.append(Flag("no-gradient-path", "unreliable", f"the output has no gradient path to the input "
                          f"({probe.gradient_error}): only gradient-free attacks ran",
                          "give a differentiable approximation of the non-differentiable part (bpda=, --bpda) or a "
                          "surrogate model (surrogate=, --surrogate)"))
    return flags


def _gradient_flags(parts: dict[str, Any], plan: list[PlanStep]) -> list[Flag]:
    index, grad, robust = parts["index"], parts["grad"], parts["code"] == -1
    flags = []
    for code, name, what in ((GRAD_ZERO, "zero-gradient", "exactly zero"),
                             (GRAD_NONFINITE, "non-finite-gradient", "NaN or infinite")):
        bad = grad == code
        n_bad = int(bad.sum())
        if not n_bad:
            continue
        left = bad & robust
        if bool(left.any()):
            flags.append(Flag(name, "unreliable", f"the input gradient is {what} for {n_bad} samples, "
                              f"{int(left.sum())} of which no attack broke", "give a differentiable approximation "
                              "(bpda=, --bpda) or a surrogate model (surrogate=, --surrogate)", _indices(index, left)))
        else:
            flags.append(Flag(name, "info", f"the input gradient is {what} for {n_bad} samples, all broken",
                              "none needed", _indices(index, bad)))
    sat = (parts["margin"] > SATURATED_MARGIN) & robust
    # an attack whose loss ignores the scale of the logits (its record says) sees through saturated cross-entropy
    scale_free = any(get_attack(s.attack).scale_free and s.only == "all" for s in plan)  # not a probe of a few
    if bool(sat.any()) and not scale_free:  # with a scale-invariant attack on every survivor it does not matter
        flags.append(Flag("saturated-logits", "unreliable",
                          f"{int(sat.sum())} robust samples have logit margins above {SATURATED_MARGIN:g}, where "
                          "float32 cross-entropy gradients underflow, and no scale-invariant attack ran on them",
                          "add apgd-dlr or apgd-t, or divide the logits by a temperature", _indices(index, sat)))
    return flags


def _gradient_free_flag(parts: dict[str, Any], plan: list[PlanStep], tally: Tally) -> list[Flag]:
    grad_steps = [k for k, s in enumerate(plan) if s.needs_gradient and tally.attacked[s.name]]
    free = [k for k, s in enumerate(plan) if s.gradient_free and tally.attacked[s.name]
            and grad_steps and k > grad_steps[0]]
    broke = sum(tally.breaks[plan[k].name] for k in free)
    if not broke:
        return []
    attacked = max(tally.attacked[plan[k].name] for k in free)
    share = broke / max(attacked, 1)
    mask = torch.zeros_like(parts["code"], dtype=torch.bool)
    for k in free:
        mask |= parts["code"] == k
    names = ", ".join(plan[k].name for k in free if tally.breaks[plan[k].name])
    if broke < 2 or share < GRADIENT_FREE_SHARE:  # an occasional Square break: in the per-attack table, no flag
        return []
    return [Flag("gradient-free-breaks", "unreliable",
                 f"{names} broke {broke} of the {attacked} samples the gradient attacks left robust "
                 f"({100 * share:.1f}%): the gradient attacks missed them (masked gradients or too weak an attack), "
                 "so the figure may still be too high",
                 "run an adaptive attack (bpda=, a surrogate, more Square queries) or accept the flag",
                 _indices(parts["index"], mask))]


def _incomplete_flag(parts: dict[str, Any], plan: list[PlanStep], tally: Tally) -> list[Flag]:
    """The longer APGD-CE run on the survivors whose loss was still rising broke 2 or more, and at least
    GRADIENT_FREE_SHARE, of them: the figure includes those breaks (acted on), a ``warning``."""
    longer = [k for k, s in enumerate(plan) if s.only == "incomplete" and tally.attacked[s.name]]
    if not longer:
        return []
    name = plan[longer[0]].name
    broke, attacked = tally.breaks[name], tally.attacked[name]
    if broke < 2 or broke < GRADIENT_FREE_SHARE * attacked:
        return []
    return [Flag("incomplete-optimisation", "warning",
                 f"APGD-CE's loss was still rising at its last steps on {attacked} surviving samples; {name} (300 "
                 f"steps) broke {broke} of them, counted in the figure", "for a stronger test, a custom plan with "
                 "more steps and restarts, e.g. [('apgd-ce', {'steps': 1000, 'restarts': 5}), 'apgd-t']",
                 _indices(parts["index"], parts["code"] == longer[0]))]


def collect_flags(probe: ModelProbe, parts: dict[str, Any], tally: Tally, plan: list[PlanStep], *,
                  randomised_acted: bool, forwards: int) -> list[Flag]:
    """Every flag of an evaluation: the model's (probe), the per-sample gradient ones, gradient-free breaks and
    unstable predictions, in that order."""
    flags = _model_flags(probe, randomised_acted=randomised_acted, forwards=forwards)
    if probe.gradient_path:
        flags += _gradient_flags(parts, plan)
    flags += _gradient_free_flag(parts, plan, tally)
    flags += _incomplete_flag(parts, plan, tally)
    shaky = parts["unstable"]
    if shaky is not None and bool(shaky.any()):
        if forwards > 1:
            flags.append(Flag("unstable-predictions", "info", f"the {forwards} forwards disagreed on the class of "
                              f"{int(shaky.sum())} judged images (clean or adversarial); each was judged by the "
                              "majority", "none needed", _indices(parts["index"], shaky)))
        else:  # the probe found the model deterministic, yet a second forward changed a verdict
            flags.append(Flag("unstable-predictions", "unreliable", f"a second forward pass changed the class of "
                              f"{int(shaky.sum())} adversarial images judged on one forward: the model is random or "
                              "input-dependent where the probe did not look", "evaluate with forwards= > 1 (the "
                              "majority decides) or version 'rand'", _indices(parts["index"], shaky)))
    return flags
