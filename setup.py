"""Maps the top-level folders runtime/ and backends/ to sgdsl.runtime and sgdsl.backends.

pyproject.toml cannot express a package list that grows with sub-packages under a renamed
folder, so the list is computed here; everything else lives in pyproject.toml.
"""
from setuptools import find_packages, setup

ROOTS = {
    "sgdsl": "sgdsl",
    "sgdsl.runtime": "runtime",
    "sgdsl.backends": "backends",
    "sgdsl.templates": "templates",
}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"sgdsl.templates": ["*.jinja"]},
    include_package_data=True,
)
