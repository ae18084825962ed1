"""The record file beside a saved pruned model's weights, and the check that each site's weights are those it recorded."""

import hashlib
import json
from pathlib import Path

import torch

RECORD_FILE = "headprune_pruning.json"


def site_digest(site, tensors: list[torch.Tensor]) -> str:
    """SHA-256 of a site's kept unit ids and these weights (as float32)."""
    digest = hashlib.sha256(json.dumps(site.unit_ids).encode())
    for tensor in tensors:
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_digests(sites: list, digests: dict | None, digest, what: str, noun: str, path: Path) -> None:
    """Compare each site's weights digest with the one saved (directories without digests pass)."""
    for site in sites if digests else ():
        name = f"{site.group}.{site.layer}"
        if name in digests and digests[name] != digest(site):
            raise ValueError(
                f"the pruning record in {path} does not match its weights: {what} {name} (kept {noun}s {site.unit_ids}) has "
                f"another SHA-256 than when it was saved; the record names other {noun}s than were pruned, or the weights "
                f"changed after saving. Restore {RECORD_FILE} and config.json."
            )
