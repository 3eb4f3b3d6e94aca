"""What a run records of its machine (mtad.core.machine, mtad.run.provenance.provenance)."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from mtad.core.machine import cpu_info, gpu_info

AVX2_ONLY = """processor\t: {i}
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
physical id\t: 0
core id\t\t: {i}
cpu cores\t: 2
flags\t\t: fpu sse4_2 fma f16c avx avx2 bmi2
"""
AMX_FLAGS = "fpu sse4_2 fma avx avx2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return str(path)


def test_cpu_info_of_an_avx2_only_machine(tmp_path):
    info = cpu_info(_write(tmp_path, "\n".join(AVX2_ONLY.format(i=i) for i in range(2))))
    assert info["model"] == "AMD EPYC 7B12" and info["vendor"] == "AuthenticAMD"
    assert "avx2" in info["isa"] and "avx512f" not in info["isa"] and not info["native_bf16"]
    assert info["logical_cpus"] == 2 and info["physical_cores"] == 2


def test_cpu_info_of_an_amx_machine(tmp_path):
    text = AVX2_ONLY.format(i=0).replace("fpu sse4_2 fma f16c avx avx2 bmi2", AMX_FLAGS)
    info = cpu_info(_write(tmp_path, text.replace("AuthenticAMD", "GenuineIntel")))
    assert {"amx_tile", "amx_bf16", "avx512_bf16"} <= set(info["isa"]) and info["native_bf16"]
    assert info["vendor"] == "GenuineIntel" and info["logical_cpus"] == 1


def test_cpu_info_without_cpuinfo(tmp_path):
    info = cpu_info(str(tmp_path / "absent"))
    assert info["isa"] == [] and not info["native_bf16"] and info["physical_cores"] is None
    assert info["logical_cpus"] >= 1


def test_cpu_info_of_this_machine():
    info = cpu_info()
    assert info["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["logical_cpus"] >= 1 and info["usable_cpus"] >= 1
    if Path("/proc/cpuinfo").is_file():
        assert info["model"] and info["vendor"]


def test_provenance_records_the_cpu():
    from mtad.run.provenance import provenance

    dev = provenance(seed=1)["device"]
    assert dev["cpu_info"]["isa"] == cpu_info()["isa"]
    assert dev["cpu_info"]["torch_capability"]
    assert ("gpu" in dev) == torch.cuda.is_available()


def test_gpu_info_with_cuda(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 1024**3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    info = gpu_info()
    assert info["count"] == 2 and info["devices"][1]["name"] == props.name
    assert info["devices"][0]["compute_capability"] == "9.0" and info["devices"][0]["memory_gib"] == 80.0
    assert "driver" in info and "cuda" in info
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_info() is None
