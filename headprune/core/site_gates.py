"""What every gates object over hooked sites shares: a mask for a block of code, and gate probes for gradients.

A site is anything holding ``gate`` (the tensor its hook multiplies by), ``recording`` and ``probes`` (the per-token
gates recorded on each forward, whose gradients are the gate gradients): attention sites and FFN sites alike.
"""

from __future__ import annotations

from contextlib import contextmanager


class SiteGateMethods:
    """``masked`` and ``probing`` for a gates object with ``sites`` and ``set_mask``."""

    @contextmanager
    def masked(self, mask):
        """Run a block with ``mask`` set, restoring the previous gates afterwards."""
        previous = [site.gate for site in self.sites]
        self.set_mask(mask)
        try:
            yield self
        finally:
            for site, gate in zip(self.sites, previous):
                site.gate = gate

    @contextmanager
    def probing(self):
        """Record per-token gate probes on every forward, to read gate gradients after backward."""
        for site in self.sites:
            site.recording, site.probes = True, []
        try:
            yield self
        finally:
            for site in self.sites:
                site.recording, site.probes = False, []
