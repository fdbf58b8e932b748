"""Text-like images built with numpy: dark glyph strokes in lines on a light,
slightly noisy page, normalised as the PP-OCR models expect (rapidocr's
preprocessing). Realistic inputs for a text detector's probability map and
a recognizer's softmax, where uniform noise would mean nothing."""

from __future__ import annotations

import numpy as np

# The detector's normalisation (ImageNet's mean and std on [0, 1] pixels).
DET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
DET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def text_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A ``height`` x ``width`` x 3 uint8 page: lines of glyphs (two or three
    bars each, some gaps for spaces), grey-level noise on the paper."""
    rng = np.random.default_rng(seed)
    page = np.full((height, width), 235.0) + rng.normal(0, 4, (height, width))
    line = max(height // 4, 12) if height > 64 else height * 2 // 3
    y = 8 if height > 64 else (height - line) // 2
    stroke = max(line // 8, 2)
    while y + line <= height - 4:
        x = 6
        while x < width - 10:
            glyph = int(rng.integers(line // 3, line * 2 // 3 + 1))
            if rng.random() < 0.15:  # a space
                x += glyph
                continue
            for _ in range(int(rng.integers(2, 4))):
                ink = rng.uniform(20, 60)
                if rng.random() < 0.5:
                    at = x + int(rng.integers(0, max(glyph - stroke, 1)))
                    page[y : y + line, at : at + stroke] = ink
                else:
                    at = y + int(rng.integers(0, max(line - stroke, 1)))
                    page[at : at + stroke, x : x + glyph] = ink
            x += glyph + stroke
        y += line + line // 2
    return np.repeat(np.clip(page, 0, 255)[:, :, None], 3, axis=2).astype(np.uint8)


def detector_input(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A 1x3xHxW page for a DB text detector (sides multiples of 32)."""
    x = text_image(height, width, seed).astype(np.float32) / 255.0
    return ((x - DET_MEAN) / DET_STD).transpose(2, 0, 1)[None].astype(np.float32)


def recognizer_input(width: int, seed: int = 0) -> np.ndarray:
    """A 1x3x48xW text line for a CTC recognizer, in [-1, 1]."""
    x = text_image(48, width, seed).astype(np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)
