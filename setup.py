"""Ship the top-level conf/ inside the package as ``headprune.conf``, where the installed CLI finds it."""
from pathlib import Path

from setuptools import find_packages, setup

CONF_DIRS = ["conf", *sorted(p.as_posix() for p in Path("conf").rglob("*") if p.is_dir() and p.name != "__pycache__")]
CONF_PACKAGES = ["headprune." + d.replace("/", ".") for d in CONF_DIRS]  # conf/model -> headprune.conf.model

setup(
    packages=find_packages(include=["headprune", "headprune.*"]) + CONF_PACKAGES,
    package_dir={"headprune.conf": "conf"},
    package_data={package: ["*.yaml"] for package in CONF_PACKAGES},
)
