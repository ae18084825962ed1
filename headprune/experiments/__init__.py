"""One file per experiment; each exposes ``run(cfg)`` and is named by ``run:`` in conf/experiment/."""
