"""The setting that gave a data config its directory, so that advice about missing files names what the user set."""

from omegaconf import OmegaConf


def dir_setting(data) -> str:
    """``data.dir`` when the data config's directory was given, ``paths.data_dir`` when it is the default under it."""
    if OmegaConf.is_config(data) and "dir" in data and OmegaConf.is_interpolation(data, "dir"):
        raw = str(OmegaConf.to_container(data, resolve=False)["dir"])
        if "paths.data_dir" in raw:
            return "paths.data_dir"
    return "data.dir"


def dir_advice(data, what: str) -> str:
    """How to point the data config at the directory holding ``what``, naming the setting that gave its directory."""
    if dir_setting(data) == "paths.data_dir":
        raw = OmegaConf.to_container(data, resolve=False)["dir"]
        return (
            f"the directory {data.get('dir')} is {raw}, under paths.data_dir (HEADPRUNE_DATA_DIR): set paths.data_dir to "
            f"the directory of your data copies, or data.dir=<directory with {what}>"
        )
    return f"point data.dir at the directory with {what} (data.dir={data.get('dir')} now)"
