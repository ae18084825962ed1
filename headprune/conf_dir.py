"""Where the Hydra configs live: headprune/conf inside an installed wheel, else conf/ at the top of the source tree."""

from pathlib import Path

from omegaconf import OmegaConf


def config_dir() -> str:
    """The Hydra config directory (the one holding config.yaml)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"no Hydra config (config.yaml) in {package / 'conf'} or {package.parent / 'conf'}: reinstall headprune")


def project_dir() -> str:
    """The directory of the project: the one holding conf/ in a source tree (the package's parent in a wheel)."""
    return str(Path(config_dir()).parent if Path(config_dir()).parent.name != "headprune" else Path(config_dir()).parents[1])


OmegaConf.register_new_resolver("headprune_project", project_dir, replace=True)  # ${headprune_project:} in the configs
