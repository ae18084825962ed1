"""A per-layer view of a model config: a few fields of its own, everything else read live from the shared config."""


class LayerConfig:
    """The shared config with ``fields`` of one layer's own."""

    def __init__(self, shared, **fields):
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name):
        if name in ("_shared", "_fields"):  # not set yet (copy and pickle build the object without __init__)
            raise AttributeError(name)
        return self._fields[name] if name in self._fields else getattr(self._shared, name)

    def __setattr__(self, name, value):
        if name in self._fields:
            self._fields[name] = value
        else:
            setattr(self._shared, name, value)


def with_layer_fields(config, **fields):
    """``config`` viewed with ``fields`` of this layer's own (an existing view gets its fields updated)."""
    if isinstance(config, LayerConfig):
        config._fields.update(fields)
        return config
    return LayerConfig(config, **fields)
