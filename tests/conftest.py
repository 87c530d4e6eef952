"""Shared fixtures: small, cheap data and models in the robustest contract.

Keep fixtures generic (any test module may use them) and cheap (the machine has two cores). Session-scoped
objects are never handed out directly when a test could mutate them: fixtures return copies.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

# Tests use tiny tensors: one intra-op thread is as fast and avoids oversubscribing the shared cores (with two
# threads per process, busy machines spend most CPU time spinning). Override with ROBUSTEST_TEST_THREADS.
torch.set_num_threads(int(os.environ.get("ROBUSTEST_TEST_THREADS", "1")))

SHARED_DATA = Path(os.environ.get("ROBUSTEST_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MNIST_NPZ = SHARED_DATA / "mnist.npz"


@pytest.fixture(scope="session")
def _digits_train_session() -> TensorDataset:
    from robustest import data

    return data.load("digits", split="train")


@pytest.fixture(scope="session")
def _digits_test_session() -> TensorDataset:
    from robustest import data

    return data.load("digits", split="test")


@pytest.fixture
def digits_train(_digits_train_session: TensorDataset) -> TensorDataset:
    """The digits train split (1437 x 1 x 8 x 8 float32 in [0, 1], int64 labels); tensors are copies."""
    return TensorDataset(*(t.clone() for t in _digits_train_session.tensors))


@pytest.fixture
def digits_test(_digits_test_session: TensorDataset) -> TensorDataset:
    """The digits test split (360 x 1 x 8 x 8); tensors are copies."""
    return TensorDataset(*(t.clone() for t in _digits_test_session.tensors))


@pytest.fixture
def digits_model() -> torch.nn.Module:
    """A fresh, untrained ``digits_cnn`` for 1 x 8 x 8 inputs (seeded), in eval mode."""
    from robustest import models

    torch.manual_seed(0)
    return models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8).eval()


@pytest.fixture(scope="session")
def _trained_digits_session(_digits_train_session: TensorDataset) -> torch.nn.Module:
    from robustest import models
    from robustest.train import Recipe, fit

    torch.manual_seed(0)
    model = models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8)
    fit(model, _digits_train_session, epochs=2, batch_size=32, recipe=Recipe(lr=3e-3), seed=0, progress=False)
    return model.eval()


@pytest.fixture(scope="session")
def mlp_digits_checkpoint(tmp_path_factory: pytest.TempPathFactory, _digits_train_session: TensorDataset) -> str:
    """Path of a checkpoint of an ``mlp`` trained 6 epochs on the first 300 digits (trained with one thread)."""
    from robustest import models
    from robustest.models.checkpoints import save_checkpoint
    from robustest.train import fit

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, y = _digits_train_session.tensors
        torch.manual_seed(0)
        model = models.create("mlp", num_classes=10, in_channels=1, input_size=8)
        fit(model, (x[:300], y[:300]), epochs=6, seed=0, progress=False)
        path = tmp_path_factory.mktemp("mlp_model") / "model.pt"
        save_checkpoint(path, model)
    finally:
        torch.set_num_threads(threads)
    return str(path)


@pytest.fixture
def trained_digits_model(_trained_digits_session: torch.nn.Module) -> torch.nn.Module:
    """A ``digits_cnn`` trained for two epochs on digits (about 94 % test accuracy); a deep copy per test."""
    return copy.deepcopy(_trained_digits_session).eval()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op torch thread while the test runs (the machine's two cores are shared: more threads
    oversubscribe them), the previous count restored after. Modules use it with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_images() -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): 12 random 1 x 8 x 8 images in [0, 1] with int64 labels 0..9 (seeded)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(12, 1, 8, 8, generator=gen)
    y = torch.arange(12) % 10
    return x, y


@pytest.fixture
def mnist_root() -> Path:
    """Folder holding the real ``mnist.npz``; the test is skipped when the file is absent."""
    if not MNIST_NPZ.is_file():
        pytest.skip(f"real MNIST not found at {MNIST_NPZ}")
    return SHARED_DATA


@pytest.fixture
def no_data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset ROBUSTEST_DATA so loaders see only what the test passes."""
    monkeypatch.delenv("ROBUSTEST_DATA", raising=False)


SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"
# argparse/runtime keys that are never settings of a run
NOT_SETTINGS = ("func", "verb", "verb_parsers", "out", "quiet", "no_progress", "debug", "resume", "progress",
                "verbose", "config", "threads")


def check_results(out: str | os.PathLike[str], verb: str, schema: str | None = None) -> dict:
    """Read OUT/results.json and check the results contract: the header (format naming ``verb``, version,
    settings without runtime keys, timings in seconds with total_s, world_size) and, when the ``jsonschema``
    package is installed (the test extras install it), docs/schemas/<schema or verb>.schema.json. Returns the
    document."""
    import json

    doc = json.loads((Path(out) / "results.json").read_text())
    assert doc["format"] == f"robustest-{verb}-results" and doc["version"] == 1 and doc["world_size"] == 1
    assert isinstance(doc["settings"], dict) and not set(doc["settings"]) & set(NOT_SETTINGS), doc["settings"]
    assert all(v is not None for v in doc["settings"].values()), "unset options are not settings"
    assert doc["timings"]["total_s"] >= 0 and all(isinstance(v, (int, float)) for v in doc["timings"].values())
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - the test extras install it
        return doc
    spec = json.loads((SCHEMAS / f"{schema or verb}.schema.json").read_text())
    errors = sorted(jsonschema.Draft202012Validator(spec).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    return doc


@pytest.fixture
def results_contract():
    """:func:`check_results`: ``results_contract(out_dir, verb)`` validates a verb's results.json."""
    return check_results


class _Exploding(torch.nn.Module):
    """A linear model over 1 x 8 x 8 images whose logits are all infinite: every loss on it is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)) * float("inf")


@pytest.fixture
def exploding_model() -> torch.nn.Module:
    """A fresh model whose training loss is never finite (for the divergence checks of fit, harden, enhance)."""
    return _Exploding()
