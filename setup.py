"""Build configuration beyond pyproject.toml: ship the repository's
``fixtures/`` folder inside the wheel as ``torchgradlint/fixtures`` (package
data), so ``torchgradlint harness`` runs the bundled fixtures after a plain
``pip install "torchgradlint[harness]"``. Everything else lives in
pyproject.toml; ``fixtures/`` stays at the repository root, where the harness
finds it in a source checkout or an editable install.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "torchgradlint.fixtures"],
    package_dir={"": "src", "torchgradlint.fixtures": "fixtures"},
    package_data={"torchgradlint": ["py.typed"], "torchgradlint.fixtures": ["*/*.py", "*.md"]},
)
