"""Test generation by fuzzing: FOL-guided (RobOT) and coverage-guided (DeepHunter-style), with batched
image mutations.

- :func:`fol_fuzz` -> :class:`FuzzResult`
- :func:`coverage_fuzz` -> :class:`CoverageFuzzResult`
- :mod:`robustest.fuzzing.mutations`: batched affine and pixel-value mutations with DeepHunter's validity rule
- :mod:`robustest.fuzzing.generate`: what ``robustest generate`` runs: tests from an attack or a fuzzer, their FOL
  against their seeds, figures, examples and report
"""

from robustest.fuzzing import mutations
from robustest.fuzzing.coverage import CoverageFuzzResult, coverage_fuzz
from robustest.fuzzing.fol import FOL_VARIANTS, FuzzResult, fol_fuzz

__all__ = ["FOL_VARIANTS", "CoverageFuzzResult", "FuzzResult", "coverage_fuzz", "fol_fuzz", "mutations"]
