"""Readers of the on-disk formats, bounded and safe.

Every reader looks at a file's header before it reads the data: an array whose declared size exceeds
:func:`robustest.core.reading.max_array_bytes` is refused before anything is allocated, ``limit`` keeps only the
first rows and is applied before decoding (only those bytes are read or decompressed), and a file shorter
than its header promises is reported as truncated. Nothing here unpickles arbitrary objects: npz/npy files are
read with ``allow_pickle=False`` semantics (object arrays refused) and CIFAR batches through a restricted
unpickler that can build only plain containers and bounded numpy arrays.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np

from robustest.core.errors import DataError
from robustest.core.inputs import check_image_size
from robustest.core.reading import max_array_bytes

__all__ = ["npz_headers", "open_npy", "read_idx", "read_npz", "read_npz_images", "restricted_unpickle"]

_NPY_MAGIC = b"\x93NUMPY"


def _check_image_shape(shape: tuple[int, ...], source: str) -> None:
    """Images (N x ... of 3 or 4 dimensions) too large for any model are refused from the header, before the array
    is read (:func:`robustest.core.inputs.check_image_size`)."""
    if len(shape) < 3:
        return
    image = (1, *shape[1:]) if len(shape) == 3 else tuple(shape[1:])
    if len(shape) == 4 and shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):  # channels last
        image = (shape[3], shape[1], shape[2])
    check_image_size(image, source=source, fix="resize them to the size the model was built for", error=DataError)


def _check_size(nbytes: int, source: str, what: str = "array") -> None:
    cap = max_array_bytes()
    if nbytes > cap:
        raise DataError(f"{source}: the {what} declares {nbytes / 2**30:.3g} GiB, more than the {cap / 2**30:.3g} GiB "
                        "a reader may allocate: use --limit, or raise ROBUSTEST_MAX_ARRAY_BYTES if it is genuine")


# --------------------------------------------------------------------------------------------- npy / npz
def _npy_header(fh: IO[bytes], source: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        raise DataError(f"{source}: not a readable .npy array ({' '.join(str(exc).split())[:100]}); "
                        "the file is truncated or corrupt") from exc
    if dtype.hasobject:
        raise DataError(f"{source}: holds pickled Python objects, which are refused; store plain arrays")
    if any(int(d) < 0 for d in shape):
        raise DataError(f"{source}: negative dimension in shape {shape}")
    return tuple(int(d) for d in shape), bool(fortran), dtype


def _rows(shape: tuple[int, ...], limit: int | None) -> int:
    n = shape[0] if shape else 1
    return n if limit is None else min(n, int(limit))


def _read_array(fh: IO[bytes], source: str, limit: int | None) -> np.ndarray:
    shape, fortran, dtype = _npy_header(fh, source)
    rows = _rows(shape, limit)
    if fortran and rows != (shape[0] if shape else 1) and len(shape) > 1:
        raise DataError(f"{source}: a Fortran-ordered array cannot be read in part: store it in C order")
    out_shape = (rows, *shape[1:]) if shape else ()
    count = int(np.prod(out_shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    _check_size(nbytes, source)
    raw = fh.read(nbytes)
    if len(raw) < nbytes:
        raise DataError(f"{source}: truncated: the header declares shape {shape} ({nbytes} bytes for the rows read) "
                        f"but only {len(raw)} bytes follow")
    arr = np.frombuffer(raw, dtype=dtype, count=count)
    if fortran:
        return arr.reshape(out_shape[::-1]).T
    return arr.reshape(out_shape)


def read_npz(path: str | os.PathLike[str], names: list[str] | None = None, *, limit: int | None = None
             ) -> dict[str, np.ndarray]:
    """Read arrays of an npz file (all, or those in ``names``), only the first ``limit`` rows of each.

    Each member's header is read first: object arrays are refused and a declared size above
    :func:`robustest.core.reading.max_array_bytes` is refused before decompression (a deflate bomb cannot expand).
    """
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head == _NPY_MAGIC:
        raise DataError(f"{path}: is a single .npy array, not an npz archive of named arrays: pass an .npz with "
                        "x/y arrays (np.savez(path, x=images, y=labels))")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable npz file ({type(exc).__name__}); the file is truncated or corrupt "
                        "(or of another format)") from exc
    out: dict[str, np.ndarray] = {}
    with zf:
        members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        if not members:
            raise DataError(f"{path}: the zip archive holds no .npy arrays; not an npz file")
        for key in (names if names is not None else list(members)):
            if key not in members:
                continue
            try:
                with zf.open(members[key]) as member:
                    out[key] = _read_array(member, f"{path}[{key}]", limit)
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
                raise DataError(f"{path}[{key}]: cannot be read ({type(exc).__name__}); the file is truncated or "
                                "corrupt") from exc
    return out


def npz_headers(path: str | os.PathLike[str], names: list[str]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of the arrays ``names`` of an npz file, from their .npy headers alone: only the first
    bytes of each member are decompressed. Object arrays are refused."""
    path = Path(path)
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
            for key in names:
                if key not in members:
                    raise DataError(f"{path}: npz has no array {key!r} (it has {', '.join(sorted(members))})")
                with zf.open(members[key]) as member:
                    shape, _, dtype = _npy_header(member, f"{path}[{key}]")
                out[key] = (shape, dtype)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable npz file ({type(exc).__name__}); the file is truncated or corrupt "
                        "(or of another format)") from exc
    return out


def read_npz_images(path: str | os.PathLike[str], kx: str, ky: str, *, limit: int | None = None,
                    source: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The image array ``kx`` and label array ``ky`` of an npz file, their first ``limit`` rows.

    Both .npy headers are read before any data: the images must be N x H x W or N x H x W x C / N x C x H x W
    numbers, the labels N or N x 1 numbers, one label per image, and the bytes they declare (with the
    conversion of images that are not uint8 or float32) must fit :func:`max_array_bytes`. Only then are the
    arrays decompressed, so a file that declares gigabytes is refused at the cost of reading its headers.
    """
    src = source or str(path)
    heads = npz_headers(path, [kx, ky])
    (xs, xd), (ys, yd) = heads[kx], heads[ky]
    if xd.kind not in "uif":
        raise DataError(f"{src}: images have dtype {xd}, not image data (use uint8 or float)")
    if yd.kind not in "uif":
        raise DataError(f"{src}: labels have dtype {yd}; they must be integer class indices")
    if len(xs) not in (3, 4) or 0 in xs[1:]:
        raise DataError(f"{src}: images must be N x H x W, N x H x W x C or N x C x H x W, got shape {xs}")
    if len(ys) not in (1, 2) or (len(ys) == 2 and ys[1] != 1):
        raise DataError(f"{src}: labels must be a 1-D array of class indices, got shape {ys} (one-hot?)")
    if xs[0] != ys[0]:
        raise DataError(f"{src}: {xs[0]} images but {ys[0]} labels")
    _check_image_shape(xs, src)
    rows = _rows(xs, limit)
    pixels = int(np.prod(xs[1:], dtype=np.int64))
    x_bytes = rows * pixels * xd.itemsize
    converted = 0 if xd in (np.dtype(np.uint8), np.dtype(np.float32)) else rows * pixels * (4 if xd.kind == "f" else 1)
    _check_size(x_bytes + converted + rows * int(np.prod(ys[1:], dtype=np.int64)) * max(yd.itemsize, 8), src,
                "image and label data")
    arrays = read_npz(path, [kx, ky], limit=limit)
    return arrays[kx], arrays[ky]


def npz_names(path: str | os.PathLike[str]) -> list[str]:
    """Names of the arrays in an npz file (no data read)."""
    path = Path(path)
    with open(path, "rb") as fh:
        if fh.read(6) == _NPY_MAGIC:
            raise DataError(f"{path}: is a single .npy array, not an npz archive of named arrays: pass an .npz with "
                            "x/y arrays (np.savez(path, x=images, y=labels))")
    try:
        with zipfile.ZipFile(path) as zf:
            return sorted(n[:-4] for n in zf.namelist() if n.endswith(".npy"))
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable npz file ({type(exc).__name__}); the file is truncated or corrupt "
                        "(or of another format)") from exc


def open_npy(path: str | os.PathLike[str], *, mmap: bool = True, limit: int | None = None) -> np.ndarray:
    """Open a ``.npy`` file memory-mapped (read-only; nothing is read until used), checking its header and
    that the file holds every byte the header declares. ``limit`` keeps the first rows (a view)."""
    path = Path(path)
    src = str(path)
    with open(path, "rb") as fh:
        if fh.read(6) != _NPY_MAGIC:
            raise DataError(f"{path}: not a .npy array file (bad magic): pass a file written by np.save")
        fh.seek(0)
        shape, fortran, dtype = _npy_header(fh, src)
        offset = fh.tell()
    _check_image_shape(shape, src)
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise DataError(f"{path}: truncated: the header declares shape {shape} ({need} bytes) but the file has {size}")
    if not mmap:
        with open(path, "rb") as fh:
            return _read_array(fh, src, limit)
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return np.zeros(shape, dtype=dtype)
    arr = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    return arr[: _rows(shape, limit)] if limit is not None else arr


# --------------------------------------------------------------------------------------------- IDX files
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _open_maybe_gz(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def read_idx(path: str | os.PathLike[str], expected_ndim: int | None = None, *, limit: int | None = None
             ) -> np.ndarray:
    """Read an IDX file (plain or .gz) into a NumPy array, checking magic number and length.

    Only the header and the first ``limit`` records are read (and decompressed).
    """
    path = Path(path)
    try:
        with _open_maybe_gz(path) as fh:
            raw = fh.read(4)
            if len(raw) < 4:
                raise DataError(f"{path}: only {len(raw)} bytes, not an IDX file (truncated?)")
            zero, code, ndim = raw[0:2], raw[2], raw[3]
            if zero != b"\x00\x00" or code not in _IDX_DTYPES or ndim == 0:
                raise DataError(f"{path}: bad IDX magic number 0x{raw[:4].hex()}; not an IDX file")
            if expected_ndim is not None and ndim != expected_ndim:
                raise DataError(f"{path}: IDX file has {ndim} dimensions, expected {expected_ndim} "
                                "(images 3, labels 1)")
            dims_raw = fh.read(4 * ndim)
            if len(dims_raw) < 4 * ndim:
                raise DataError(f"{path}: truncated IDX header")
            dims = struct.unpack(f">{ndim}I", dims_raw)
            _check_image_shape(dims, str(path))
            dtype = np.dtype(_IDX_DTYPES[code])
            rows = dims[0] if limit is None else min(dims[0], int(limit))
            per_row = int(np.prod(dims[1:], dtype=np.int64)) if ndim > 1 else 1
            need = rows * per_row * dtype.itemsize
            _check_size(need, str(path))
            body = fh.read(need)
            if len(body) < need:
                total = dims[0] * per_row * dtype.itemsize
                raise DataError(f"{path}: IDX file truncated: expected {4 + 4 * ndim + total} bytes for shape {dims}, "
                                f"found fewer")
            if limit is None and fh.read(1):
                raise DataError(f"{path}: IDX file has trailing bytes after the {dims} array: not a valid IDX file")
    except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({type(exc).__name__}: {exc}); the file is truncated or corrupt") from exc
    return np.frombuffer(body, dtype=dtype).reshape((rows, *dims[1:]))


# ------------------------------------------------------------------------------------- restricted pickles
_MAX_PICKLE_ARRAY = 1 << 30  # no CIFAR batch holds an array of more than 1 GiB (a real one holds 30 MB)


def _bounded(n_items: int, itemsize: int, source: str) -> None:
    nbytes = int(n_items) * int(itemsize)
    if nbytes > min(_MAX_PICKLE_ARRAY, max_array_bytes()):
        raise pickle.UnpicklingError(f"refused to load an array of {nbytes} bytes (a CIFAR batch holds about 30 MB)")


def _safe_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"refused to load an array of type {getattr(subtype, '__name__', subtype)}")
    shp = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shp) > 8 or any(not isinstance(d, int) or d < 0 for d in shp):
        raise pickle.UnpicklingError(f"refused to load an array of shape {shape!r}")
    dt = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    _bounded(int(np.prod(shp, dtype=np.int64)), dt.itemsize, "pickle")
    return np.ndarray.__new__(np.ndarray, shp, dt)


def _safe_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    if not isinstance(spec, str) or len(spec) > 8:
        raise pickle.UnpicklingError(f"refused to load dtype {spec!r}")
    dt = np.dtype(spec)
    if dt.hasobject or dt.subdtype is not None or dt.fields is not None:
        raise pickle.UnpicklingError(f"refused to load dtype {spec!r}")
    return dt


def _safe_frombuffer(buf: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise pickle.UnpicklingError("refused to load an object array")
    shp = tuple(shape)
    _bounded(int(np.prod(shp, dtype=np.int64)), dt.itemsize, "pickle")
    return np.frombuffer(buf, dtype=dt).reshape(shp, order=order)


def _safe_encode(text: Any, encoding: str = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise pickle.UnpicklingError("refused to load a codec call")
    return text.encode(encoding)


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR batches: only plain containers, bytes and bounded numpy arrays can be built."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
        ("numpy.core.numeric", "_frombuffer"): _safe_frombuffer,
        ("numpy._core.numeric", "_frombuffer"): _safe_frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _safe_dtype,
        ("_codecs", "encode"): _safe_encode,
    }

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        fn = self._ALLOWED.get((module, name))
        if fn is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}")
        return fn


def restricted_unpickle(raw: bytes, source: str) -> object:
    """Unpickle ``raw`` allowing only containers, bytes/str, numbers and bounded numpy arrays."""
    try:
        return _RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        if not str(exc).startswith("refused to load"):  # a damaged stream, not a refused global
            raise DataError(f"{source}: not a readable pickle ({exc}); truncated or corrupt") from exc
        raise DataError(f"{source}: {exc}; only plain data (dicts, lists, bytes, numpy arrays) is accepted") from exc
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError) as exc:
        raise DataError(f"{source}: not a readable pickle ({type(exc).__name__}); truncated or corrupt") from exc


def read_maybe_gz(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` (decompressed when it ends in .gz), at most ``max_bytes``."""
    cap = max_bytes if max_bytes is not None else max_array_bytes()
    try:
        with _open_maybe_gz(path) as fh:
            raw = fh.read(cap + 1)
    except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({type(exc).__name__}: {exc}); the file is truncated or corrupt") from exc
    if len(raw) > cap:
        raise DataError(f"{path}: larger than the {cap} bytes this format may hold: not a file of this kind")
    return raw
