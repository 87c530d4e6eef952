"""The corruption registry's data: names and their order, groups, descriptions, and the two published
parameter tables (CIFAR-10-C and ImageNet-C), one entry per severity 1-5."""

from __future__ import annotations

TABLES = ("cifar", "imagenet")
SMALL_IMAGE_MAX = 64  # images with max(H, W) <= this use the CIFAR table by default

_ORDER = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
    "speckle_noise", "gaussian_blur", "spatter", "saturate",
)
_GROUPS = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
    "common": _ORDER[:15],
    "held-out": _ORDER[15:],
    "validation": _ORDER[15:],
}

_DESCRIPTIONS = {
    "gaussian_noise": "additive Gaussian noise, x + N(0, c^2) per pixel and channel",
    "shot_noise": "Poisson (photon) noise, Poisson(x * c) / c",
    "impulse_noise": "salt-and-pepper noise: a fraction c of pixel values set to 0 or 1",
    "defocus_blur": "convolution with an anti-aliased disk of radius c",
    "glass_blur": "Gaussian blur, local pixel shuffling, Gaussian blur (frosted glass)",
    "motion_blur": "line blur of ImageMagick's motion-blur kernel at a random angle in [-45, 45] degrees",
    "zoom_blur": "mean of the image and centre zooms of it by the factors 1 ... z",
    "snow": "motion-blurred snow flakes plus a whitened (grey-brightened) image",
    "frost": "blend with a frost texture (procedural substitute for the original photographs)",
    "fog": "additive plasma-fractal (diamond-square) haze",
    "brightness": "V channel of HSV increased by c",
    "contrast": "(x - mean) * c + mean per image and channel",
    "elastic_transform": "random affine warp followed by a smoothed random displacement field",
    "pixelate": "box downsampling by a factor c and box upsampling back (Pillow BOX filter)",
    "jpeg_compression": "JPEG encode/decode at quality c (baseline libjpeg with its defaults, batched)",
    "speckle_noise": "multiplicative Gaussian noise, x + x * N(0, c^2)",
    "gaussian_blur": "Gaussian blur with standard deviation c",
    "spatter": "water drops (severities 1-3 CIFAR / 1-3 ImageNet) or mud splashes (4-5)",
    "saturate": "S channel of HSV scaled by c0 and shifted by c1",
}

# ------------------------------------------------------------------------------------------ parameter tables
_CIFAR: dict[str, list] = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],
    "speckle_noise": [0.06, 0.1, 0.12, 0.16, 0.2],
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1.0],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    "zoom_blur": [(1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)],
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    "spatter": [(0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)],
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
    "jpeg_compression": [80, 65, 58, 50, 40],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    # (alpha, sigma, affine) as fractions of the reference size 32 (IMSIZE in make_cifar_c.py)
    "elastic_transform": [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                          (0.1, 0.03, 0.03)],
}
_IMAGENET: dict[str, list] = {
    "gaussian_noise": [0.08, 0.12, 0.18, 0.26, 0.38],
    "shot_noise": [60, 25, 12, 5, 3],
    "impulse_noise": [0.03, 0.06, 0.09, 0.17, 0.27],
    "speckle_noise": [0.15, 0.2, 0.35, 0.45, 0.6],
    "gaussian_blur": [1, 2, 3, 4, 6],
    "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
    "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    "motion_blur": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
    "zoom_blur": [(1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02), (1, 1.31, 0.03)],
    "fog": [(1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)],
    "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
    "snow": [(0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7), (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
             (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65), (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)],
    "spatter": [(0.65, 0.3, 4, 0.69, 0.6, 0), (0.65, 0.3, 3, 0.68, 0.6, 0), (0.65, 0.3, 2, 0.68, 0.5, 0),
                (0.65, 0.3, 1, 0.65, 1.5, 1), (0.67, 0.4, 1, 0.65, 1.5, 1)],
    "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
    "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
    "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
    "jpeg_compression": [25, 18, 15, 10, 7],
    "pixelate": [0.6, 0.5, 0.4, 0.3, 0.25],
    # (alpha, sigma, affine) as fractions of 244 for a 224-px image (make_imagenet_c.py)
    "elastic_transform": [(2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02), (0.07, 0.01, 0.02),
                          (0.12, 0.01, 0.02)],
}
_TABLE_DATA = {"cifar": _CIFAR, "imagenet": _IMAGENET}
