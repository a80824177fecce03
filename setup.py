"""pooch-ext: profiling-based out-of-core training (PoocH) for Chainer 7."""
from setuptools import setup

PACKAGES = [
    "pooch_ext",
    "pooch_ext.commands",
    "pooch_ext.models",
    "pooch_ext.policies",
    "pooch_ext.hooks",
]

setup(
    name="pooch-ext",
    version="0.1.0",
    description="Profiling-based out-of-core hybrid training (keep / swap / recompute) for Chainer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=PACKAGES,
    # hooks/ lives at the top level of the repository (it is the part that touches
    # Chainer and CuPy at run time) but installs as pooch_ext.hooks.
    package_dir={"pooch_ext.hooks": "hooks"},
    install_requires=[
        "chainer==7.8.1",
        "numpy>=1.26",
        "pandas>=2.0",
        "matplotlib>=3.7",
        "tqdm>=4.60",
        "scipy>=1.10",
    ],
    extras_require={
        "test": ["pytest>=7"],
        "cuda12": ["cupy-cuda12x>=13"],
        "cuda13": ["cupy-cuda13x>=14"],
    },
    entry_points={"console_scripts": ["pooch-ext=pooch_ext.cli:main"]},
)
