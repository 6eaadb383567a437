"""Builds the C library for the Python package (pyproject.toml has the rest).

`pip install .` from the repository's root (or from its sdist): the library is configured and
built in a folder of the build's own (out of the source tree, as the aarch64 cross build is),
then its shared object, stripped, is copied into the package as flashattn/_lib/libflashattn.so,
which flashattn loads by its path: no `make install`, no LD_LIBRARY_PATH. It links the system's
OpenBLAS, SLEEF and libgomp (the README's build packages; at run time Debian's libopenblas0,
libsleef3 and libgomp1). Where the source tree is configured already (an in-tree ./configure),
that build is used. FLASHATTN_CONFIGURE_ARGS adds options to configure (--enable-cuda, say); a
change of them reconfigures.
"""
import os
import re
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
    args = os.environ.get("FLASHATTN_CONFIGURE_ARGS", "")
    if os.path.exists(os.path.join(ROOT, "config.status")):
        build = ROOT  # configured in the tree: a VPATH build would be refused
        if args:
            print("flashattn build: the source tree is configured in place; "
                  f"FLASHATTN_CONFIGURE_ARGS={args!r} is not applied (reconfigure it, or "
                  "`make distclean` first)", flush=True)
    else:
        if not os.path.exists(os.path.join(ROOT, "configure")):
            run(["autoreconf", "-fi"], ROOT)
        build = os.path.join(os.path.abspath(build_temp), "libflashattn")
        os.makedirs(build, exist_ok=True)
        stamp = os.path.join(build, "flashattn-configure-args")
        old = open(stamp).read() if os.path.exists(stamp) else None
        if not os.path.exists(os.path.join(build, "Makefile")) or old != args:
            run([os.path.join(ROOT, "configure"), "--disable-static"] + shlex.split(args),
                build)
            with open(stamp, "w") as f:
                f.write(args)
    run(["make", "-j" + jobs, "libflashattn.la"], build)
    lib = os.path.realpath(os.path.join(build, ".libs", "libflashattn.so"))
    if not os.path.exists(lib):
        raise RuntimeError(f"flashattn build: no libflashattn.so in {build}/.libs")
    return lib


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = build_library(self.get_finalized_command("build").build_temp)
        # an editable install (pip install -e) imports the package from the source tree
        pkg = (os.path.join(ROOT, "python") if getattr(self, "editable_mode", False)
               else self.build_lib)
        dest = os.path.join(pkg, "flashattn", "_lib")
        os.makedirs(dest, exist_ok=True)
        target = os.path.join(dest, "libflashattn.so")
        shutil.copyfile(lib, target)
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-unneeded", target], check=False)


def version() -> str:
    """FA_VERSION_MAJOR.MINOR.PATCH of include/flashattn.h: one version for both."""
    text = open(os.path.join(ROOT, "include", "flashattn.h")).read()
    parts = [re.search(rf"#define FA_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class BinaryDistribution(Distribution):
    """The wheel carries a shared object: a platform wheel, not a pure-Python one."""

    def has_ext_modules(self):
        return True


class AnyPythonWheel(bdist_wheel):
    """... for any Python 3: the package reaches the library through ctypes, not the CPython
    ABI (py3-none-<platform>)."""

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(version=version(), cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": AnyPythonWheel},
      distclass=BinaryDistribution)
