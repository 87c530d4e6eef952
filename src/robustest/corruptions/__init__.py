"""The 19 common corruptions of the -C benchmarks (Hendrycks & Dietterich 2019), batched in PyTorch.

``corrupt(x, name, severity, seed=0)`` takes images ``x`` of shape N x C x H x W (C = 1 or 3; floating point
with values in [0, 1], or uint8 levels 0..255) and returns the corrupted batch with the same shape, dtype
and device (uint8 in, uint8 out: the corrupted levels rounded). Every
corruption runs as batched tensor operations on ``x``'s device (CPU or CUDA; on the CPU the multi-pass
ones go through cache-sized chunks of the batch), ``jpeg_compression`` included: it is a batched
re-implementation of baseline libjpeg (the codec behind Pillow) with its default settings, in libjpeg's
integer arithmetic, so its output equals Pillow's JPEG round trip bit for bit (on the CPU, images above
96 x 96 pixels go through Pillow itself, which is faster at that size and gives the same output).

Parameter tables
    Two tables are built in: ``"cifar"`` (Hendrycks' ``make_cifar_c.py``, CIFAR-10-C) and ``"imagenet"``
    (``make_imagenet_c.py``, ImageNet-C, also used by the ``imagecorruptions`` package). By default images
    with ``max(H, W) <= 64`` use the CIFAR table and larger ones the ImageNet table; ``table=`` forces one.
    Parameters are used as published; where the reference hard-codes the image size (elastic transform:
    32 or 244 px; fog: the plasma map size; glass blur's loop bounds; frost's crop) the actual size is used.

Randomness
    All random draws come from one ``torch.Generator`` on ``x``'s device, seeded from ``(seed, name)``;
    the global RNGs are never touched. Same seed, same device, same batch: bit-identical output.
    Each image of a batch gets its own slice of the random stream (independent noise); the severity does
    not enter the seed, so the five severities of one image share their random field and differ only by
    the parameters (common random numbers). An image's draws depend on its position in the batch and
    on the batch size, so the same images in another batching get other (equally distributed) noise; on
    the CPU the chunking of large batches (:data:`CPU_CHUNK_VALUES`) and of large draws
    (:data:`DRAW_CHUNK`: fixed, independently seeded chunks drawn on several threads, the same output for
    any thread count and order of the chunks) is part of that, so a change of those constants between
    versions changes the draws, not their distribution. CPU and CUDA runs of one seed differ (shot noise on
    the CPU also uses its own exact sampler for 8-bit inputs).

Grayscale (C = 1)
    Channel-independent operations apply unchanged. Colour-only operations work on a luminance form:
    ``saturate`` replicates the channel to RGB, applies the HSV change and converts the result back to
    luminance (Y = 0.299 R + 0.587 G + 0.114 B); ``frost``'s texture and ``spatter``'s water/mud colour
    are converted to luminance the same way; ``snow``'s grey-level brightening uses the image itself as its
    grey version; ``brightness`` reduces to ``x + c`` (V of a grey pixel is its value).

Deviations from the reference code (see docs/CORRUPTIONS.md for the full list)
    * frost: the original blends photographs of frost (``frost1.png`` ... ``frost5.jpg``). robustest uses
      five procedural textures generated once from a fixed seed (fractal noise plus needle-like streaks),
      each matched to the per-channel mean and standard deviation of one original photograph. The
      statistics match; the spatial pattern differs, so frost results are not comparable one to one.
    * glass_blur: the reference swaps pixels in a sequential raster loop. robustest performs the same
      local swaps in conflict-free parallel groups (positions 2 * max_delta apart never touch the same
      pixel), so a pixel can be carried along at most (2 * max_delta)^2 times per iteration instead of
      along an arbitrarily long chain; displacement statistics are close but not identical.
    * motion_blur (and snow's streaks) use the line kernel of ImageMagick's MotionBlurImage (as ported by
      ``imagecorruptions``) applied as shift-and-add with edge replication, per image at its own angle.
    * spatter: Canny edges, a truncated exact Euclidean distance transform (OpenCV uses a 5x5 chamfer
      approximation), histogram equalisation and the reference's filters, all batched in torch.
    * outputs are not quantised to uint8 (except where the reference quantises an intermediate result).

Interoperability
    :func:`corrupt_image` is a drop-in for imagecorruptions' ``corrupt`` (one H x W x C uint8 NumPy image in
    and out); :class:`Corruption` and :class:`RandomCorruption` are ``nn.Module`` forms for training
    pipelines and DataLoader transforms.

Package layout
    ``spec`` the record of a corruption (:class:`CorruptionSpec`: function, description, the two parameter
    tables, family, benchmark number) and the registry with :func:`register` / :func:`unregister` /
    :func:`registered` to add one from outside; ``registry`` the names, groups, parameters and
    :func:`corrupt`; ``filters`` the linear filtering engine (padding, 2-D and
    separable correlation, banded and dense operators, Gaussian, motion-blur and zoom kernels);
    ``sampling`` the seeded, chunked random draws; one module per family: ``noise``, ``blur``, ``weather``,
    ``digital``, ``jpeg``, ``spatter``; ``interop`` (corrupt_image) and ``modules`` (the nn.Module forms).
"""

from __future__ import annotations

from robustest.corruptions.filters import DENSE_MAX_PIXELS
from robustest.corruptions.interop import corrupt_image, get_corruption_names
from robustest.corruptions.modules import Corruption, RandomCorruption
from robustest.corruptions.registry import (
    CPU_CHUNK_VALUES,
    corrupt,
    default_table,
    describe,
    names,
    parameters,
    published,
    resolve_names,
    spec_of,
)
from robustest.corruptions.sampling import DRAW_CHUNK
from robustest.corruptions.spec import (
    CORRUPTIONS,
    FAMILIES,
    SMALL_IMAGE_MAX,
    TABLES,
    CorruptionSpec,
    register,
    registered,
    unregister,
)

__all__ = [
    "CORRUPTIONS",
    "CPU_CHUNK_VALUES",
    "DENSE_MAX_PIXELS",
    "DRAW_CHUNK",
    "SMALL_IMAGE_MAX",
    "TABLES",
    "Corruption",
    "CorruptionSpec",
    "FAMILIES",
    "RandomCorruption",
    "corrupt",
    "corrupt_image",
    "default_table",
    "describe",
    "get_corruption_names",
    "names",
    "parameters",
    "published",
    "register",
    "registered",
    "resolve_names",
    "spec_of",
    "unregister",
]
