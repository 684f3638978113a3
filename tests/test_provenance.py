"""What every result records about the machine that made it (dsh.core.provenance)."""

from pathlib import Path


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
