"""Robustness measurement: clean accuracy, accuracy on a fixed adversarial test set, white-box robust
accuracy of the current model, and accuracy under common corruptions.

Every function takes a model and data in the robustest contract (images in [0, 1], int64 labels), runs
batched on the model's device and returns plain numbers or dataclasses that serialise to JSON.
"""

from __future__ import annotations
