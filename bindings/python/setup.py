"""Builds kvtier._kvtier by running CMake on the kvtier repository, then packages it with the
pure-Python part (pyproject.toml has the metadata). Offline: it needs only the Debian packages that
scripts/install-deps.sh installs.

Environment:
  KVTIER_BUILD_DIR   an already configured kvtier build tree (e.g. build/): build the kvtier_python
                     target there instead of configuring a new tree. It must have been configured for
                     this interpreter (-DKVTIER_PYTHON_EXECUTABLE, default /usr/bin/python3).
  KVTIER_SOURCE_DIR  the repository root (default: two levels above this file).
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default 2).
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        source_dir = Path(os.environ.get("KVTIER_SOURCE_DIR", HERE.parents[1])).resolve()
        if not (source_dir / "bindings" / "python" / "src" / "module.cc").exists():
            raise RuntimeError(f"kvtier sources not found at {source_dir}; set KVTIER_SOURCE_DIR")
        build_dir = os.environ.get("KVTIER_BUILD_DIR")
        if build_dir:
            build_dir = Path(build_dir).resolve()
        else:
            build_dir = source_dir / "build-python"  # matches .gitignore's /build*/
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(
                ["cmake", "-S", str(source_dir), "-B", str(build_dir), *generator,
                 "-DCMAKE_BUILD_TYPE=Release",
                 "-DKVTIER_BUILD_TESTS=OFF", "-DKVTIER_BUILD_BENCH=OFF", "-DKVTIER_BUILD_PYTHON=ON",
                 "-DKVTIER_WITH_CUDA=OFF", f"-DKVTIER_PYTHON_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "kvtier_python", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = glob.glob(str(build_dir / "bindings" / "python" / "kvtier" / f"_kvtier{suffix}"))
        if not built:
            raise RuntimeError(f"no _kvtier{suffix} in {build_dir}/bindings/python/kvtier: was that tree "
                               f"configured for {sys.executable}?")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(ext_modules=[CMakeExtension("kvtier._kvtier")], cmdclass={"build_ext": CMakeBuild})
