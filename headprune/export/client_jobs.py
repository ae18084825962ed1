"""The script a client venv runs (standard library only): every job through a client script's ``run_job``, a JSON row per check, one failing job one failed row."""

import importlib.util
import json
import sys


def run_jobs(script: str, path: str) -> None:
    """Every job of the JSON list at ``path`` through ``run_job(job)`` of ``script`` (loaded by its path: this folder is not
    on sys.path) as (check, passed, detail) rows, printed as one JSON line of rows."""
    spec = importlib.util.spec_from_file_location("client", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    client = module.client_name()
    if importlib.util.find_spec("headprune") is not None:
        raise AssertionError(f"headprune is importable beside {client}: the checks would not be independent")
    rows = []
    for job in json.loads(open(path, encoding="utf-8").read()):
        try:
            checks = module.run_job(job)
        except Exception as err:  # one export failing is one failed row, the others still run
            checks = [("loads", False, f"{type(err).__name__}: {err}"[:300])]
        for check, passed, detail in checks:
            passed = None if passed is None else bool(passed)  # True, False, or None (said, not judged)
            rows.append({"client": client, "file": job["name"], "check": check, "passed": passed, "detail": detail})
    print(json.dumps(rows))


if __name__ == "__main__":
    run_jobs(*sys.argv[1:3])
