"""The Hydra entry point ``headprune``: compose the config and run the chosen experiment."""

import os
import sys
import traceback
import warnings
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf, open_dict

from headprune.conf_dir import config_dir
from headprune.core.checks import ConfigError, ConfigWarning, DataError, boolean
from headprune.results.run_claim import claim_run_dir, results_stamp, settle_run_record, write_run_record
from headprune.settings.renamed import renamed_hint
from headprune.validation import validate

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


CONFIG_DIR = config_dir()
INPUT_ERRORS = (ConfigError, DataError, FileNotFoundError)  # what the user gave is wrong: one message, no traceback
USAGE_ERROR = 2  # exit status of an input failure (1: a failure of headprune itself)
_started: list[bool] = []  # set once Hydra composed the config and called the task function


def verbose() -> bool:
    """Tracebacks of input failures too (``--verbose`` or ``HYDRA_FULL_ERROR=1``)."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def input_failure(err: BaseException) -> None:
    """Print an input failure as one message to stderr (after its traceback with ``--verbose``) and exit with status 2."""
    if verbose():
        traceback.print_exc()
    print(f"headprune: error: {err}", file=sys.stderr, flush=True)
    if not verbose():
        print("(run with --verbose for the traceback)", file=sys.stderr, flush=True)
    raise SystemExit(USAGE_ERROR)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run_app(cfg: DictConfig):
    """Check the config, run ``cfg.run`` (set by the experiment file) and return its optimized metric, if any."""
    _started.append(True)
    try:
        validate(cfg)
        with claimed_run_dir(cfg):
            result = get_method(cfg.run)(cfg)
    except INPUT_ERRORS as err:
        input_failure(err)
    return result.get("objective") if isinstance(result, dict) else result


@contextmanager
def claimed_run_dir(cfg):
    """Run in ``paths.output_dir`` only when it holds no other finished run (``overwrite=true`` replaces one); ``.hydra/`` written here."""
    if any(os.environ.get(name, "0") != "0" for name in ("LOCAL_RANK", "RANK", "SLURM_PROCID")):  # another rank of a distributed run
        yield
        return
    hydra_cfg = HydraConfig.get()
    out = Path(cfg.paths.output_dir)
    settings = OmegaConf.to_container(cfg, resolve=True)
    reuses_stages = bool(getattr(import_module(cfg.run.rsplit(".", 1)[0]), "REUSES_STAGES", False))
    replacing = claim_run_dir(
        out, str(hydra_cfg.runtime.choices.get("experiment")), settings, boolean(cfg.get("overwrite"), "overwrite"), reuses_stages
    )
    record = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }
    before = results_stamp(out)
    write_run_record(out, record, replacing)
    try:
        yield
    finally:
        settle_run_record(out, before)


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """A ConfigWarning as one line about the setting (no source line); others as Python formats them."""
    if issubclass(category, ConfigWarning):
        return f"headprune: warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)


_python_format = warnings.formatwarning


def check_sweep(argv: list[str]) -> None:
    """Check every job of a multirun (``-m``) before the first one starts: one bad value runs nothing, naming the job's overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not {"-m", "--multirun"} & set(argv):
        return
    given = [a for a in argv if not a.startswith("-") and "=" in a and not a.lstrip("+~").startswith("hydra")]  # Hydra's own left out
    try:
        jobs = [job for batch in BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(given), None) for job in batch]
    except HydraException:
        return  # a command line Hydra's grammar refuses: Hydra says why when it parses it
    for number, overrides in enumerate(jobs if len(jobs) > 1 else []):
        try:
            with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
                cfg = compose("config", overrides=overrides)
        except HydraException:
            return  # a config that does not compose: Hydra reports it, naming the override
        with open_dict(cfg):
            cfg.paths.output_dir = f"<sweep dir>/{number}"  # a job's own directory: nothing to resume there yet
        try:
            validate(cfg)
        except INPUT_ERRORS as err:
            raise type(err)(f"sweep job {number} ({' '.join(overrides)}): {err}; no job was run") from err


def check_output_dirs(argv: list[str]) -> None:
    """``hydra.run.dir`` / ``hydra.sweep.dir`` given on the command line: a directory, or a path to create under one (not a file)."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        value = value.strip("'\"")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or not value or "${" in value:
            continue
        path = Path(value).expanduser()
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise ConfigError(
                f"{key}={value}: {blocker} is a file, not a directory: the run writes its results in {key}; give a new "
                "directory (or a run's own directory to resume it)"
            )


def main():
    """``headprune [--verbose] [hydra options] key=value ...``: run ``run_app``; a config that does not compose exits with status 2."""
    warnings.formatwarning = _format_warning
    if "--verbose" in sys.argv[1:]:
        sys.argv.remove("--verbose")
        os.environ["HYDRA_FULL_ERROR"] = "1"
    _started.clear()
    try:
        check_output_dirs(sys.argv[1:])
        check_sweep(sys.argv[1:])
        return run_app()
    except INPUT_ERRORS as err:  # a sweep's bad job, or a refused output directory
        input_failure(err)
    except SystemExit as done:
        if done.code not in (0, None, USAGE_ERROR) and not _started:  # Hydra printed why the config does not compose
            print(grammar_hint(sys.argv[1:]) + renamed_hints(sys.argv[1:]), end="", file=sys.stderr, flush=True)
            raise SystemExit(USAGE_ERROR) from None
        raise


def grammar_hint(argv: list[str]) -> str:
    """A line for overrides whose value holds '=' (e.g. speed.mask_step=speedup=1.3): Hydra's grammar needs it quoted."""
    bad = [a for a in argv if a.count("=") > 1 and "'" not in a and '"' not in a and "{" not in a]
    return "".join(f"headprune: hint: quote a value that holds '=': \"{a.split('=', 1)[0]}='{a.split('=', 1)[1]}'\"\n" for a in bad)


def renamed_hints(argv: list[str]) -> str:
    """A line for each override of a renamed setting (prune.min_heads_per_layer=1), naming the new key."""
    return "".join(f"headprune: hint: {hint}\n" for hint in map(renamed_hint, argv) if hint)


if __name__ == "__main__":
    main()
