"""What the client scripts share (standard library only): a JSON row per check, and every job run, one failing job one failed row."""

import importlib.util
import json


def row(job: dict, client: str, check: str, passed, detail: str) -> dict:
    """One check of one export: passed True, False, or None (said, not judged)."""
    return {"client": client, "file": job["name"], "check": check, "passed": None if passed is None else bool(passed), "detail": detail}


def run_jobs(path: str, client: str, run_job) -> None:
    """Every job of the JSON list at ``path`` through ``run_job(job, client)``, printed as one JSON line of rows."""
    if importlib.util.find_spec("headprune") is not None:
        raise AssertionError(f"headprune is importable beside {client}: the checks would not be independent")
    rows = []
    for job in json.loads(open(path, encoding="utf-8").read()):
        try:
            rows += run_job(job, client)
        except Exception as err:  # one export failing is one failed row, the others still run
            rows.append(row(job, client, "loads", False, f"{type(err).__name__}: {err}"[:300]))
    print(json.dumps(rows))
