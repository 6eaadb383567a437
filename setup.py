"""Builds the C library for the Python package (pyproject.toml has the rest).

`pip install .` from the repository's root: the library is configured and built in a folder
of the build's own (out of the source tree, as the aarch64 cross build is), then its shared
object is copied into the package as flashattn/_lib/libflashattn.so, which flashattn loads by
its path: no `make install`, no LD_LIBRARY_PATH. Where the source tree is configured already
(an in-tree ./configure), that build is used. FLASHATTN_CONFIGURE_ARGS adds options to
configure (--enable-cuda, say); the README's build packages are what it needs.
"""
import glob
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))


def run(cmd, cwd):
    print("flashattn build:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def build_library(build_temp: str) -> str:
    """Builds libflashattn.la; returns the path of its shared object."""
    jobs = str(os.cpu_count() or 2)
    if os.path.exists(os.path.join(ROOT, "config.status")):
        build = ROOT  # configured in the tree: a VPATH build would be refused
    else:
        if not os.path.exists(os.path.join(ROOT, "configure")):
            run(["autoreconf", "-fi"], ROOT)
        build = os.path.join(os.path.abspath(build_temp), "libflashattn")
        os.makedirs(build, exist_ok=True)
        if not os.path.exists(os.path.join(build, "Makefile")):
            extra = shlex.split(os.environ.get("FLASHATTN_CONFIGURE_ARGS", ""))
            run([os.path.join(ROOT, "configure"), "--disable-static"] + extra, build)
    run(["make", "-j" + jobs, "libflashattn.la"], build)
    found = sorted(glob.glob(os.path.join(build, ".libs", "libflashattn.so.*.*.*")))
    if not found:
        raise RuntimeError(f"flashattn build: no libflashattn.so.X.Y.Z in {build}/.libs")
    return found[-1]


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = build_library(self.get_finalized_command("build").build_temp)
        dest = os.path.join(self.build_lib, "flashattn", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, "libflashattn.so"))


class BinaryDistribution(Distribution):
    """The wheel carries a shared object: a platform wheel, not a pure-Python one."""

    def has_ext_modules(self):
        return True


class AnyPythonWheel(bdist_wheel):
    """... for any Python 3: the package reaches the library through ctypes, not the CPython
    ABI (py3-none-<platform>)."""

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": AnyPythonWheel},
      distclass=BinaryDistribution)
