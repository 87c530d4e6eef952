"""Models from files and back: safe checkpoints and every way a user hands over a model.

A model comes from one of four sources (:func:`load_model`):

* a robustest checkpoint: weights + a spec saying how to rebuild the model + metadata, one ``torch.save``
  of plain data read with ``torch.load(weights_only=True)`` (a whole pickled model is refused);
* a TorchScript archive (``torch.jit.load``; runs code from the file, so only with ``torchscript=True``);
* a ``torch.export`` program (``.pt2``, ``torch.export.load``; its module runs as exported);
* ``factory="pkg.module:function"`` with JSON-like ``factory_args`` and an optional state_dict file
  ``weights`` (read with ``weights_only=True``). This imports and runs the user's code, so it happens
  only when the caller names the factory.

Every loaded model carries ``model.robustest_source``, the spec that rebuilds it, so a fine-tuned copy
is saved by :func:`save_checkpoint` as plain weights plus that spec: ``{"kind": "zoo", "name": ...}``
(zoo models), ``{"kind": "factory", "factory": "pkg.mod:fn", "args": {...}}``, ``{"kind": "export",
"program": PATH, "sha256": ...}``; a TorchScript model is re-saved as a TorchScript archive. Any other
``nn.Module`` is saved with ``{"kind": "module", "class": "pkg.mod.Class"}``: its weights come back with
:func:`restore_weights` into a model of the same architecture (this is how runs resume), or with
``load_model(path, factory=...)``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_save, atomic_write_bytes
from robustest.core.devices import resolve_device
from robustest.core.errors import CheckpointError, ConfigError, user_error
from robustest.core.modelcall import set_mode
from robustest.core.reading import check_torch_file
from robustest.models.registry import from_spec

__all__ = [
    "CHECKPOINT_FORMAT",
    "file_kind",
    "load_checkpoint",
    "load_model",
    "load_state_dict_file",
    "restore_weights",
    "clone_model",
    "save_checkpoint",
    "save_weights",
    "source_of",
    "state_fingerprint",
]

CHECKPOINT_FORMAT = "robustest-checkpoint"
CHECKPOINT_VERSION = 2
_TS_METADATA = "robustest_metadata.json"


# ------------------------------------------------------------------------------------------- sources
def source_of(model: nn.Module) -> dict[str, Any]:
    """The spec that rebuilds ``model``: its ``robustest_source``, a zoo spec, or ``{"kind": "module"}``."""
    src = getattr(model, "robustest_source", None)
    if isinstance(src, dict) and src.get("kind"):
        return dict(src)
    spec = getattr(model, "robustest_spec", None)
    if isinstance(spec, dict) and "name" in spec:
        return {"kind": "zoo", **spec}
    if isinstance(model, torch.jit.ScriptModule):
        return {"kind": "torchscript"}
    cls = type(model)
    return {"kind": "module", "class": f"{cls.__module__}.{cls.__qualname__}"}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def state_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the model's state_dict (names, dtypes, shapes and values): equal exactly when the weights
    are equal, whatever file or path they came from."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        t = v.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        # reshape first: a 0-d tensor (batch norm's num_batches_tracked) cannot be viewed as bytes directly
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def file_kind(path: str | os.PathLike[str]) -> str:
    """``"torchscript"``, ``"export"`` (a ``torch.export`` .pt2 program), ``"torch"`` (a ``torch.save`` zip,
    e.g. a robustest checkpoint or a state_dict) or ``"other"``; only the zip directory is read."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return "other"
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return "other"
    if any(n.endswith("/archive_format") or "/models/" in n and n.endswith(".json") for n in names):
        return "export"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/data.pkl") for n in names):
        return "torch"
    return "other"


def _import_factory(factory: str) -> Any:
    if not isinstance(factory, str) or factory.count(":") != 1:
        raise ConfigError(f"--model {factory!r} must be 'package.module:function' (or a zoo name for train)")
    mod_name, fn_name = factory.split(":")
    if not mod_name or not fn_name:
        raise ConfigError(f"--model {factory!r} must be 'package.module:function'")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import {mod_name!r} for --model {factory}: {exc}; put its folder on PYTHONPATH "
                          "or run from the folder that holds it") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise ConfigError(f"importing {mod_name!r} for --model {factory} failed: {type(exc).__name__}: {exc}") from exc
    fn = module
    for part in fn_name.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"module {mod_name!r} has no {fn_name!r}: check --model {factory}")
    if not callable(fn):
        raise ConfigError(f"{factory} is not callable: --model names a function or class that builds the model")
    return fn


def _build_factory(factory: str, args: dict[str, Any] | None) -> nn.Module:
    if args is not None and not isinstance(args, dict):
        raise ConfigError(f"--model-args must be a JSON object of keyword arguments, got {type(args).__name__}")
    fn = _import_factory(factory)
    try:
        model = fn(**(args or {}))
    except TypeError as exc:
        raise ConfigError(f"{factory}(**{json.dumps(args or {})}) failed: {exc}: check --model-args") from exc
    except Exception as exc:  # noqa: BLE001 - the user's factory failed: its fix is in the user's code
        raise ConfigError(f"the model factory {factory} raised {user_error(exc)}: fix the factory (run it in Python "
                          "to see the traceback)") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{factory} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def load_state_dict_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A state_dict from ``path`` (``torch.load(weights_only=True)``): a bare state_dict, a robustest
    checkpoint, or a dict holding it under ``state_dict``/``model``/``model_state_dict``."""
    return _weights_file(Path(path))[0]


def _weights_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
    """(state_dict, spec, metadata) of a weights file: a robustest checkpoint (its spec says which model the
    weights belong to) or a bare or wrapped state_dict (spec None, no metadata)."""
    if not path.is_file():
        raise CheckpointError(f"weights file {str(path)!r} does not exist: pass a state_dict saved with torch.save")
    kind = file_kind(path)
    if kind in ("torchscript", "export"):
        what = "a TorchScript archive" if kind == "torchscript" else "a .pt2 program"
        raise CheckpointError(f"{path} is {what}, not weights: pass it as --checkpoint")
    payload = _safe_load(path, map_location="cpu")
    if isinstance(payload, dict) and payload.get("format") == CHECKPOINT_FORMAT:
        payload = _checked_checkpoint(path, payload)
        return payload["state_dict"], payload["spec"], dict(payload.get("metadata") or {})
    if isinstance(payload, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(payload.get(key), dict):
                payload = payload[key]
                break
    if not isinstance(payload, dict) or not payload or \
            not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in payload.items()):
        raise CheckpointError(f"{path} holds no state_dict (a mapping of parameter names to tensors): save one with "
                              "torch.save(model.state_dict(), path)")
    return payload, None, {}


def _load_weights(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    own = model.state_dict()
    bad = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state.items()
           if k in own and tuple(v.shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if bad or missing or unexpected:
        parts = []
        if bad:
            k, got, want = bad[0]
            parts.append(f"{len(bad)} of other shapes (e.g. {k!r}: {list(got)} in the file, {list(want)} in the model)")
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]!r})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]!r})")
        raise CheckpointError(f"the weights in {where} do not fit the model: {', '.join(parts)} parameters: "
                              "check that they belong to this architecture and its --model-args")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = " ".join(str(exc).split())
        raise CheckpointError(f"the weights in {where} do not fit the model: {first[:200]}") from exc


def _safe_load(path: Path, map_location: Any) -> Any:
    check_torch_file(path, "model file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure is a refused file
        text = str(exc)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        if "unsupported global" in text.lower():  # a pickled class or function; random bytes fail otherwise
            raise CheckpointError(
                f"{path} holds pickled Python objects (a whole saved model?), which are refused for safety: "
                "save model.state_dict() and load it with --model pkg.module:factory --weights FILE"
            ) from exc
        if "WeightsUnpickler error:" in text:  # keep torch's detail, drop its advice to disable safety
            first = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0]
        elif first.startswith("Weights only load failed"):
            first = "the safe loader refused its content"
        raise CheckpointError(f"{path} is not a robustest checkpoint (cannot be read: {first[:120]}); "
                              "the file is corrupt, truncated or of another format") from exc


def load_model(source: str | os.PathLike[str] | None = None, *, factory: str | None = None,
               factory_args: dict[str, Any] | None = None, weights: str | os.PathLike[str] | None = None,
               torchscript: bool = False, map_location: str | torch.device = "cpu") -> nn.Module:
    """Load a model from any source and return it in eval mode on ``map_location``.

    ``source``: a robustest checkpoint, a TorchScript archive (needs ``torchscript=True``: it runs code from
    the file) or a ``torch.export`` ``.pt2`` program. ``factory``: ``"pkg.module:function"`` building the
    model (imported from PYTHONPATH or the current folder) with ``factory_args``; its weights come from
    ``weights`` (a state_dict file) or from ``source`` (a checkpoint saved from that factory). The model's
    ``robustest_source`` says how to rebuild it; ``robustest_metadata`` holds stored metadata.
    """
    if isinstance(map_location, (str, torch.device)):  # an unusable device is a ConfigError, not a bad file
        resolve_device(None, map_location)
    if factory is None and source is None and weights is not None:  # the weights alone: the file names the model
        path = Path(weights)
        state, spec, meta = _weights_file(path)
        if spec is None:
            raise ConfigError(f"{path} holds bare weights, which do not say which model they belong to: name it, "
                              f"--model pkg.module:factory --weights {path.name}")
        if spec.get("kind") != "factory":  # a zoo model (or an export program's weights): none of your code runs
            model = _rebuild(path, spec, map_location)
            _load_weights(model, state, str(path))
            model.robustest_metadata = meta
            return set_mode(model.to(map_location), False)
        named = spec.get("factory") if isinstance(spec.get("factory"), str) else "pkg.module:factory"
        # a file never decides which code runs: the factory it names is imported only when the caller names it too
        raise ConfigError(f"{path} holds weights of a model built by {named!r}: name that code yourself, --model "
                          f"{named} --weights {path.name} (robustest never runs code a file names)")
    if factory is not None:
        if source is not None and weights is not None:
            raise ConfigError("give the weights once: --weights FILE (or --checkpoint FILE), not both")
        meta: dict[str, Any] = {}
        args = factory_args
        state = None
        file = source if source is not None else weights
        if file is not None:  # a robustest checkpoint of this factory also gives its arguments
            state, spec, meta = _weights_file(Path(file)) if source is None else _checkpoint_parts(Path(file))
            if args is None and spec and spec.get("kind") == "factory" and spec.get("factory") == factory:
                args = spec.get("args") or {}
        return _from_factory(factory, args, state, meta, None if file is None else str(file), map_location)
    if source is None:
        raise ConfigError("no model given: pass --checkpoint FILE or --model pkg.module:factory")
    if weights is not None:
        raise ConfigError("--weights applies to --model pkg.module:factory: a checkpoint carries its own weights")
    path = Path(source)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist: pass a model.pt from 'robustest train', a "
                              "TorchScript (--torchscript) or .pt2 file, or --model pkg.module:factory")
    kind = file_kind(path)
    if kind == "torchscript":
        if not torchscript:
            raise CheckpointError(f"{path} is a TorchScript archive: load it explicitly with torchscript=True "
                                  "(--torchscript), only if you trust its source")
        extra = {_TS_METADATA: ""}
        check_torch_file(path, "TorchScript archive")
        try:
            model = torch.jit.load(str(path), map_location=map_location, _extra_files=extra)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{path}: TorchScript archive cannot be loaded ({type(exc).__name__}); "
                                  "the file is corrupt or truncated") from exc
        try:
            meta = json.loads(extra[_TS_METADATA] or "{}")
        except (ValueError, TypeError):
            meta = {}
        model.robustest_source = {"kind": "torchscript"}  # type: ignore[attr-defined]
        model.robustest_metadata = meta if isinstance(meta, dict) else {}  # type: ignore[attr-defined]
        return set_mode(model, False)
    if kind == "export":
        return _load_export(path, map_location)
    payload = _read_checkpoint(path)
    model = _rebuild(path, payload["spec"], map_location)
    _load_weights(model, payload["state_dict"], str(path))
    model.robustest_metadata = dict(payload.get("metadata") or {})
    return set_mode(model.to(map_location), False)


def _checkpoint_parts(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    payload = _read_checkpoint(path)
    return payload["state_dict"], payload["spec"], dict(payload.get("metadata") or {})


def _from_factory(factory: str, args: dict[str, Any] | None, state: dict[str, torch.Tensor] | None,
                  meta: dict[str, Any], where: str | None, map_location: Any) -> nn.Module:
    """The model ``factory(**args)`` with the weights ``state`` (from the file ``where``), recording the spec that
    rebuilds it (saved with every checkpoint of it, so ``--weights FILE`` alone loads it again)."""
    model = _build_factory(factory, args)
    if state is not None:
        _load_weights(model, state, str(where))
    model.robustest_source = {"kind": "factory", "factory": factory, "args": dict(args or {})}
    model.robustest_metadata = meta
    return set_mode(model.to(map_location), False)


def _load_export(path: Path, map_location: Any, sha256: str | None = None) -> nn.Module:
    if sha256 is not None and _sha256(path) != sha256:
        raise CheckpointError(f"{path} changed since the checkpoint was saved from it (its SHA-256 differs): "
                              "restore the original .pt2 program")
    check_torch_file(path, "torch.export program")  # a member declaring gigabytes is refused before it is read
    try:
        program = torch.export.load(str(path))
        model = program.module()
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{path}: not a loadable torch.export program ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:120]}); the file is corrupt or from another "
                              "PyTorch version") from exc
    model.robustest_source = {"kind": "export", "program": str(path.resolve()),  # type: ignore[attr-defined]
                              "sha256": sha256 or _sha256(path)}
    model.robustest_metadata = {}  # type: ignore[attr-defined]
    return model.to(map_location)


def _read_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist: pass a model.pt from 'robustest train'")
    kind = file_kind(path)
    if kind in ("torchscript", "export"):
        raise CheckpointError(f"{path} is a {'TorchScript archive' if kind == 'torchscript' else '.pt2 program'}, "
                              "not a robustest checkpoint")
    return _checked_checkpoint(path, _safe_load(path, map_location="cpu"))


def _checked_checkpoint(path: Path, payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a robustest checkpoint (a bare state_dict or another format): "
                              "save one with save_checkpoint/'robustest train', or load a state_dict with "
                              "--model pkg.module:factory --weights FILE")
    if int(payload.get("version", 0)) > CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} was written by a newer robustest (format {payload['version']}): upgrade")
    spec = payload.get("spec")
    if not isinstance(spec, dict) or not ("name" in spec or "kind" in spec):
        raise CheckpointError(f"{path}: checkpoint has no model spec")
    state = payload.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: checkpoint holds no state_dict of tensors (corrupt checkpoint?)")
    return payload


def _rebuild(path: Path, spec: dict[str, Any], map_location: Any) -> nn.Module:
    kind = spec.get("kind", "zoo")
    if kind == "zoo":
        try:
            model = from_spec({k: v for k, v in spec.items() if k != "kind"})
        except (ConfigError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: cannot rebuild model: {exc}") from exc
        return model
    if kind == "export":
        program = spec.get("program")
        if not isinstance(program, str) or not Path(program).is_file():
            raise CheckpointError(f"{path} holds weights of the torch.export program {program!r}, which is not there: "
                                  "put the .pt2 file back or load the weights with --model pkg.module:factory")
        return _load_export(Path(program), map_location, spec.get("sha256"))
    if kind == "factory":
        raise CheckpointError(f"{path} holds weights of a model built by your {spec.get('factory')!r}: load them with "
                              f"--model {spec.get('factory')} --weights {path.name}, which imports and runs that "
                              "factory")
    if kind == "torchscript":
        raise CheckpointError(f"{path} holds weights of a TorchScript model: load the archive it came from with "
                              "--torchscript (or restore_weights in Python)")
    if kind == "module":
        raise CheckpointError(f"{path} holds weights of {spec.get('class')!r}, built outside robustest: rebuild it "
                              f"with --model pkg.module:factory --weights {path.name} (or restore_weights in Python)")
    raise CheckpointError(f"{path}: unknown model spec kind {kind!r}")


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu",
                    torchscript: bool = False) -> nn.Module:
    """Load a robustest checkpoint (or, with ``torchscript=True``, a TorchScript archive; or a .pt2 program)
    and return the rebuilt model in eval mode. See :func:`load_model`."""
    return load_model(path, torchscript=torchscript, map_location=map_location)


def restore_weights(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Load the weights of checkpoint ``path`` into ``model`` (same architecture) in place; returns it."""
    path = Path(path)
    if file_kind(path) == "torchscript":
        state = torch.jit.load(str(path), map_location="cpu").state_dict()
        meta: dict[str, Any] = {}
    else:
        payload = _read_checkpoint(path)
        state, meta = payload["state_dict"], dict(payload.get("metadata") or {})
    _load_weights(model, state, str(path))
    model.robustest_metadata = meta  # type: ignore[attr-defined]
    return model


def clone_model(model: nn.Module) -> nn.Module:
    """An independent copy of ``model`` (weights, buffers, mode and robustest attributes) that trains on its own.
    TorchScript modules are copied through a TorchScript round trip: ``copy.deepcopy`` of one gives parameters
    an optimiser refuses."""
    import copy
    import io

    if isinstance(model, torch.jit.ScriptModule):
        buf = io.BytesIO()
        torch.jit.save(model, buf)
        buf.seek(0)
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        clone = torch.jit.load(buf, map_location=dev)
        clone.train(model.training)
    else:
        clone = copy.deepcopy(model)
    for attr in ("robustest_source", "robustest_spec", "robustest_metadata"):  # GraphModule copies drop them
        if hasattr(model, attr) and not hasattr(clone, attr):
            setattr(clone, attr, copy.deepcopy(getattr(model, attr)))
    return clone


def save_weights(path: str | os.PathLike[str], model: nn.Module, metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write ``model``'s weights with the spec of :func:`source_of` as a plain checkpoint (never a
    TorchScript archive): the state a long run keeps and :func:`restore_weights` reads back."""
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
               "spec": _plain_metadata(source_of(model), "spec"),
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
               "metadata": _plain_metadata(dict(metadata or {}))}
    return atomic_save(payload, path)


def save_checkpoint(path: str | os.PathLike[str], model: nn.Module, spec: dict[str, Any] | None = None,
                    metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write ``model`` to ``path``: weights + the spec that rebuilds it (:func:`source_of`, or
    ``spec``) + plain ``metadata``, as a file that loads with ``weights_only=True``. A TorchScript model
    is re-saved as a TorchScript archive (metadata in its extra files) instead.
    """
    meta = _plain_metadata(dict(metadata or {}))
    if spec is None and isinstance(model, torch.jit.ScriptModule):
        import io

        buf = io.BytesIO()
        torch.jit.save(model, buf, _extra_files={_TS_METADATA: json.dumps(json_safe(meta))})
        return atomic_write_bytes(path, buf.getvalue())
    spec = dict(spec) if spec is not None else source_of(model)
    if spec.get("kind") == "torchscript":
        raise ConfigError("a TorchScript model is saved as an archive: call save_checkpoint without spec")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "spec": _plain_metadata(spec, "spec"),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "metadata": meta,
    }
    return atomic_save(payload, path)


def json_safe(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _plain_metadata(obj: Any, where: str = "metadata") -> Any:
    """``obj`` as data that ``torch.load(weights_only=True)`` accepts: NumPy values become Python numbers or
    lists and paths strings; tensors and plain containers stay; anything else is a :class:`ConfigError`."""
    import numpy as np

    if obj is None or type(obj) in (bool, int, float, str, bytes) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.generic):
        return _plain_metadata(obj.item(), where)
    if isinstance(obj, np.ndarray):
        return _plain_metadata(obj.tolist(), where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    for plain in (bool, int, float, str):  # subclasses (e.g. enums) would pickle their class
        if isinstance(obj, plain):
            return plain(obj)
    if isinstance(obj, dict):
        return {_plain_metadata(k, where): _plain_metadata(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        vals = [_plain_metadata(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return vals if isinstance(obj, list) else tuple(vals)
    raise ConfigError(f"{where} holds a {type(obj).__name__}, which a safe checkpoint cannot store: "
                      "use numbers, strings, lists, dicts or tensors")
