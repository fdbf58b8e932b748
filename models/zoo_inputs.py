"""Helpers to read zoo manifests, build deterministic model inputs and walk
a graph's nodes (subgraphs included).

numpy only (no torch, no onnx import), so the converter's tests and the zoo
scripts (which run in another virtual environment) can all import it:

    from models.zoo_inputs import load_manifest, make_inputs
    for entry in load_manifest("models/zoo/manifest.json"):
        feeds = make_inputs(entry, seed=0)
        path = entry["path"]  # absolute path of the .onnx file

Manifest input spec keys (one dict per graph input):
  name   graph input name
  shape  concrete shape to feed (dynamic dims already resolved); [] = scalar
  dtype  numpy dtype name ("float32", "int64", "bool", ...)
  low, high
         float: uniform in [low, high); integer: integers in [low, high)
  value  (optional) constant fill value; overrides low/high
  arange (optional) integer start: position ids start, start+1, ... along
         the last axis (the same in every row); overrides value and low/high
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import numpy as np

__all__ = ["MODELS_DIR", "ZOO_DIR", "iter_nodes", "load_manifest", "make_inputs", "manifest_paths"]

MODELS_DIR = os.path.dirname(os.path.abspath(__file__))
ZOO_DIR = os.path.join(MODELS_DIR, "zoo")


def manifest_paths(include_cache: bool = True) -> list[str]:
    """Existing manifest files: the committed zoo first, then the caches."""
    candidates = [os.path.join(ZOO_DIR, "manifest.json")]
    if include_cache:
        candidates += [
            os.path.join(MODELS_DIR, "cache", "pypi", "manifest.json"),
            os.path.join(MODELS_DIR, "cache", "full", "manifest.json"),
        ]
    return [p for p in candidates if os.path.isfile(p)]


def load_manifest(path: str) -> list[dict[str, Any]]:
    """Return the manifest's model entries.

    Each entry is the manifest dict plus "path": the absolute path of the
    model file (resolved relative to the manifest's directory).
    """
    path = os.path.abspath(path)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    base = os.path.dirname(path)
    entries = []
    for entry in data.get("models", []):
        e = dict(entry)
        e["path"] = os.path.join(base, e["file"])
        entries.append(e)
    return entries


def _input_seed(seed: int, model_name: str, input_name: str) -> int:
    # Stable across processes and Python versions (unlike hash()).
    key = f"{model_name}/{input_name}".encode()
    return (zlib.crc32(key) ^ (seed * 0x9E3779B1)) & 0xFFFFFFFF


def make_input(spec: dict[str, Any], seed: int = 0, model_name: str = "") -> np.ndarray:
    """One input array from a manifest input spec."""
    dtype = np.dtype(spec["dtype"])
    shape = tuple(int(d) for d in spec["shape"])
    if spec.get("arange") is not None:
        start = int(spec["arange"])
        return np.broadcast_to(np.arange(start, start + shape[-1]), shape).astype(dtype)
    if "value" in spec and spec["value"] is not None:
        return np.full(shape, spec["value"], dtype=dtype)
    rng = np.random.default_rng(_input_seed(seed, model_name, spec["name"]))
    low = spec.get("low", 0)
    high = spec.get("high", 1)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(low), int(high), size=shape, dtype=np.int64).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(float(low), float(high), size=shape).astype(dtype)
    raise ValueError(f"unsupported input dtype {dtype} for {spec['name']!r}")


def make_inputs(entry: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for one manifest entry: {input_name: array}. Deterministic in seed."""
    name = entry.get("name", "")
    return {spec["name"]: make_input(spec, seed, name) for spec in entry["inputs"]}


def iter_nodes(graph):
    """Every node of an onnx GraphProto, then, depth first, those of the
    subgraphs in its attributes (If branches, Loop and Scan bodies, ...)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from iter_nodes(attr.g)
            for g in attr.graphs:
                yield from iter_nodes(g)
