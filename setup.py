"""Build backend glue: setuptools drives CMake (see CMakeLists.txt).

The CMake build tree lives in build/cmake so rebuilds are incremental
(and ccache-accelerated when available).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("TORCH_NEURONX_BUILD_DIR", ROOT / "build" / "cmake"))
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("TORCH_NEURONX_BUILD_TYPE", "Release")
        subprocess.check_call(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja" if shutil.which("ninja") else "Unix Makefiles",
             f"-DCMAKE_BUILD_TYPE={cfg}", f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        # ccache hits across clones in different folders.
        env = {**os.environ, "CCACHE_BASEDIR": str(ROOT), "CCACHE_NOHASHDIR": "1"}
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs], env=env)
        # One CMake build makes every extension; each is copied by its module name.
        built = next(build_dir.glob(ext.name.rsplit(".", 1)[-1] + ".*.so"))
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Replace by rename: processes that have the old library mapped keep it.
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, dest)


setup(ext_modules=[CMakeExtension("torch_neuronx._C"), CMakeExtension("neuron_tools._rtinfo")],
      cmdclass={"build_ext": CMakeBuild})
