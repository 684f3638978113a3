"""What every result records about the machine that made it (dsh.core.provenance)."""

from pathlib import Path

import pytest


def test_provenance_records_the_cpus_vector_flags(monkeypatch, tmp_path):
    """Results record the vector flags that decide the float rounding of a CPU run (an AVX2 and an AVX-512 host train
    the same seed to different weights): read from /proc/cpuinfo, only the listed ones, in their order."""
    from dsh.core import provenance

    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse2 avx2 fma avx f16c avx512f\n")
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(info if str(self) == "/proc/cpuinfo" else self,
                                                                      *a, **k))
    assert provenance.cpu_flags() == ["avx", "avx2", "fma", "f16c", "avx512f"]
    assert provenance.hardware()["cpu_flags"] == ["avx", "avx2", "fma", "f16c", "avx512f"]


@pytest.mark.parametrize("text, want", [
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
     "stepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n",
     {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1}),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n"
     "CPU part\t: 0xd0c\nCPU revision\t: 1\n", {"implementer": 0x41, "architecture": 8, "variant": 1, "part": 0xd0c,
                                                   "revision": 1}),
    ("processor : 0\nflags : avx2\n", {}),
])
def test_provenance_records_the_first_cpus_identity(monkeypatch, tmp_path, text, want):
    """Results record the CPU's family and model (x86) or part (ARM), which a virtual machine's model name ("AMD
    EPYC") does not tell apart: the first processor's block only, numbers as ints."""
    from dsh.core import provenance

    info = tmp_path / "cpuinfo"
    info.write_text(text)
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(info if str(self) == "/proc/cpuinfo" else self,
                                                                      *a, **k))
    assert provenance.cpu_id() == want
    assert provenance.hardware()["cpu_id"] == want


@pytest.mark.slow   # a subprocess importing torch
def test_provenance_records_the_vector_instructions_torch_and_numpy_compute_with_which_two_variables_set():
    """The weights and numbers of a CPU run depend on the instructions torch's, NumPy's and OpenBLAS's kernels use (the
    committed laptop-wide runs, trained on an AVX2 host, are retrained and calibrated bit for bit on an AVX-512 host
    with ATEN_CPU_CAPABILITY=avx2, NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL" and OPENBLAS_CORETYPE=Haswell): every
    result records them, and the variables set them (a process started with them reports AVX2, no AVX-512 target and
    OpenBLAS's Haswell kernels on any x86 CPU with AVX2)."""
    import os
    import subprocess
    import sys

    import torch

    from dsh.core import provenance

    assert provenance.hardware()["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if "avx2" not in provenance.cpu_flags():
        pytest.skip("a CPU without AVX2 cannot be asked to compute as one that has it")
    code = ("from dsh.core import provenance; h = provenance.hardware(); "
            "print(h['torch_cpu_capability'], ' '.join(h['numpy_simd']), '|', ' '.join(set(h['openblas'].values())))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL",
                              "OPENBLAS_CORETYPE": "Haswell"})
    assert got.returncode == 0, got.stderr
    isa, blas = got.stdout.split("|")
    torch_isa, *numpy_isa = isa.split()
    assert torch_isa == "AVX2" and "X86_V4" not in numpy_isa and "AVX512_ICL" not in numpy_isa
    assert set(numpy_isa) <= set(provenance.numpy_simd())
    assert blas.split() == ["Haswell"] and provenance.hardware()["openblas"]         # NumPy's OpenBLAS is loaded
