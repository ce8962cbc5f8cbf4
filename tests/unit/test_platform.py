"""Platform detection over fake torch modules: odd builds give the right answer or a clear
error, never "cpu" on a GPU machine."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from opmux.kernels import config, platform
from opmux.kernels.platform import Platform, PlatformDetectionError, detect_from


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPMUX_DEVICE", raising=False)
    platform.reset()
    yield
    platform.reset()


def boom(message: str = "driver exploded") -> Callable[..., Any]:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return raiser


def fake_cuda(
    *,
    available: Any = True,
    count: Any = 1,
    current: Any = 0,
    capability: Any = (9, 0),
    name: str = "NVIDIA H200",
    gcn: str | None = None,
) -> SimpleNamespace:
    """A torch.cuda look-alike; pass a callable for any field to make that probe do it."""

    def call(value: Any) -> Callable[..., Any]:
        return value if callable(value) else (lambda *a: value)

    props = SimpleNamespace(name=name)
    if gcn is not None:
        props.gcnArchName = gcn
    return SimpleNamespace(
        is_available=call(available),
        device_count=call(count),
        current_device=call(current),
        get_device_capability=call(capability),
        get_device_properties=lambda i: props,
        get_device_name=lambda i: name,
    )


def fake_torch(
    *, cuda: Any = None, hip: str | None = None, cuda_version: str | None = None, **extra: Any
) -> Any:
    version = SimpleNamespace(cuda=cuda_version, hip=hip)
    torch = SimpleNamespace(
        __version__="2.13.0",
        version=version,
        cuda=cuda if cuda is not None else fake_cuda(available=False, count=0),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False)),
        _C=SimpleNamespace(),
    )
    for key, value in extra.items():
        setattr(torch, key, value)
    return torch


NO_DEV: Callable[[str], bool] = lambda path: False  # noqa: E731
ALL_DEV: Callable[[str], bool] = lambda path: True  # noqa: E731
NO_MODULE: Callable[[str], Any] = lambda name: None  # noqa: E731


def detect(torch: Any, env: dict[str, str] | None = None, **kw: Any) -> Platform:
    kw.setdefault("path_exists", NO_DEV)
    kw.setdefault("load_module", NO_MODULE)
    return detect_from(torch, env={} if env is None else env, **kw)


# -- the shapes ----------------------------------------------------------------------------------


def test_cpu_only_build() -> None:
    p = detect(fake_torch())
    assert p.device_type == "cpu"
    assert p.device_index is None and p.arch is None
    assert p.torch_version == "2.13.0"


def test_cuda_available() -> None:
    p = detect(fake_torch(cuda=fake_cuda(count=8, current=3), cuda_version="13.0"))
    assert (p.device_type, p.device_index, p.device_count) == ("cuda", 3, 8)
    assert (p.arch, p.capability, p.device_name) == ("sm_90", (9, 0), "NVIDIA H200")
    assert p.runtime_version == "13.0"
    assert p.notes == ()


def test_is_available_raises_but_device_count_answers() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=2), cuda_version="12.8")
    p = detect(torch)
    assert p.device_type == "cuda"
    assert p.device_count == 2
    assert any("is_available() raised RuntimeError" in n for n in p.notes)


def test_is_available_and_device_count_raise_private_count_answers() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), cuda_version="12.8")
    torch._C._cuda_getDeviceCount = lambda: 1
    assert detect(torch).device_type == "cuda"


def test_all_probes_raise_with_gpu_evidence_is_an_error() -> None:
    torch = fake_torch(
        cuda=fake_cuda(available=boom("CUDA driver too old"), count=boom()), cuda_version="13.0"
    )
    torch._C._cuda_getDeviceCount = boom()
    with pytest.raises(
        PlatformDetectionError, match=r"usable cuda device.*CUDA driver too old.*/dev/nvidia0"
    ) as info:
        detect(torch, path_exists=lambda p: p == "/dev/nvidia0")
    err = info.value
    assert err.device_type == "cuda"
    assert "OPMUX_DEVICE" in err.hint
    assert any("13.0" in e for e in err.evidence)
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.device_type, clone.evidence, clone.errors, clone.hint) == (
        err.device_type,
        err.evidence,
        err.errors,
        err.hint,
    )
    assert str(clone) == str(err)


def test_all_probes_raise_without_evidence_is_cpu_with_note() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), cuda_version="13.0")
    p = detect(torch, path_exists=NO_DEV)
    assert p.device_type == "cpu"
    assert any("no evidence of a cuda device" in n for n in p.notes)


def test_all_probes_raise_on_cpu_wheel_is_cpu() -> None:
    # torch.version.cuda unset: a device file alone is not evidence for this torch build.
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()))
    assert detect(torch, path_exists=ALL_DEV).device_type == "cpu"


@pytest.mark.parametrize("visible", ["", "-1", " "])
def test_cuda_visible_devices_hiding_all_is_not_evidence(visible: str) -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), cuda_version="13.0")
    p = detect(torch, env={"CUDA_VISIBLE_DEVICES": visible}, path_exists=ALL_DEV)
    assert p.device_type == "cpu"


def test_cuda_visible_devices_set_is_evidence() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), cuda_version="13.0")
    with pytest.raises(PlatformDetectionError, match="cuda"):
        detect(torch, env={"CUDA_VISIBLE_DEVICES": "0,1"}, path_exists=ALL_DEV)


def test_version_without_hip_attribute() -> None:
    torch = fake_torch(cuda=fake_cuda(capability=(8, 0)), cuda_version="12.1")
    torch.version = SimpleNamespace(cuda="12.1")  # old builds: no `hip` at all
    p = detect(torch)
    assert (p.device_type, p.arch) == ("cuda", "sm_80")
    assert any("no 'hip' attribute" in n for n in p.notes)


def test_torch_without_version_module() -> None:
    torch = fake_torch(cuda=fake_cuda())
    del torch.version
    p = detect(torch)
    assert p.device_type == "cuda"
    assert "torch.version is missing" in p.notes


def test_hip_build_gfx_with_features() -> None:
    cuda = fake_cuda(capability=(9, 4), name="AMD Instinct MI300X", gcn="gfx942:sramecc+:xnack-")
    p = detect(fake_torch(cuda=cuda, hip="6.3.42131"))
    assert (p.device_type, p.arch, p.capability) == ("hip", "gfx942", (9, 4))
    assert p.runtime_version == "6.3.42131"
    assert p.device_name == "AMD Instinct MI300X"


def test_hip_build_without_gcn_arch_name() -> None:
    p = detect(fake_torch(cuda=fake_cuda(capability=(9, 4)), hip="6.2"))
    assert p.device_type == "hip"
    assert p.arch is None  # never guessed from capability, nor reported as sm_94
    assert any("gcnArchName unavailable" in n for n in p.notes)


def test_hip_probes_raise_with_kfd_is_an_error() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), hip="6.2")
    with pytest.raises(PlatformDetectionError, match=r"hip.*/dev/kfd"):
        detect(torch, path_exists=lambda p: p == "/dev/kfd")


def test_npu_via_torch_npu_attribute() -> None:
    npu = fake_cuda(count=8, current=1, capability=boom("no capability on npu"), name="Ascend910B")
    p = detect(fake_torch(npu=npu))
    assert (p.device_type, p.device_index, p.device_count, p.device_name) == ("npu", 1, 8, "Ascend910B")
    assert p.arch is None and p.capability is None


def test_npu_registered_by_importing_torch_npu() -> None:
    torch = fake_torch()
    imported: list[str] = []

    def load(name: str) -> Any:
        imported.append(name)
        torch.npu = fake_cuda(name="Ascend910B")  # what `import torch_npu` does
        return SimpleNamespace()

    assert detect(torch, load_module=load).device_type == "npu"
    assert imported == ["torch_npu"]


def test_no_torch_npu_and_not_installed_is_cpu() -> None:
    torch = fake_torch()
    assert not hasattr(torch, "npu")
    p = detect(torch)
    assert p.device_type == "cpu"


def test_torch_npu_import_fails_on_ascend_host_is_an_error() -> None:
    with pytest.raises(PlatformDetectionError, match=r"npu.*import torch_npu raised.*/dev/davinci0"):
        detect(
            fake_torch(),
            load_module=boom("libascendcl.so not found"),
            path_exists=lambda p: p == "/dev/davinci0",
        )


def test_npu_present_but_unavailable() -> None:
    assert detect(fake_torch(npu=fake_cuda(available=False, count=0))).device_type == "cpu"


def test_xpu_present_but_unavailable() -> None:
    p = detect(fake_torch(xpu=fake_cuda(available=False, count=0)))
    assert p.device_type == "cpu"


def test_xpu_available() -> None:
    xpu = fake_cuda(capability=boom("not a tuple on xpu"), name="Intel(R) Data Center GPU Max 1550")
    torch = fake_torch(xpu=xpu)
    torch.version.xpu = "20250101"
    p = detect(torch)
    assert (p.device_type, p.device_index, p.runtime_version) == ("xpu", 0, "20250101")
    assert p.device_name == "Intel(R) Data Center GPU Max 1550"


def test_xpu_capability_dict_is_ignored() -> None:
    p = detect(fake_torch(xpu=fake_cuda(capability={"architecture": 13136561920})))
    assert p.device_type == "xpu" and p.capability is None


def test_mps() -> None:
    torch = fake_torch()
    torch.backends.mps.is_available = lambda: True
    p = detect(torch)
    assert (p.device_type, p.device_index) == ("mps", 0)


def test_mps_probe_raising_is_not_mps() -> None:
    torch = fake_torch()
    torch.backends.mps.is_available = boom()
    p = detect(torch)
    assert p.device_type == "cpu"
    assert any("mps.is_available() raised" in n for n in p.notes)


def test_capability_probe_raising() -> None:
    p = detect(fake_torch(cuda=fake_cuda(capability=boom("capability failed")), cuda_version="13.0"))
    assert p.device_type == "cuda"
    assert p.capability is None and p.arch is None
    assert any("get_device_capability(0) raised RuntimeError: capability failed" in n for n in p.notes)


def test_current_device_raising_defaults_to_zero() -> None:
    p = detect(fake_torch(cuda=fake_cuda(current=boom(), count=4), cuda_version="13.0"))
    assert (p.device_type, p.device_index, p.device_count) == ("cuda", 0, 4)
    assert any("current_device() raised" in n for n in p.notes)


def test_cuda_module_missing_entirely() -> None:
    torch = fake_torch()
    del torch.cuda
    assert detect(torch).device_type == "cpu"


def test_cuda_preferred_over_xpu() -> None:
    p = detect(fake_torch(cuda=fake_cuda(), cuda_version="13.0", xpu=fake_cuda()))
    assert p.device_type == "cuda"


# -- OPMUX_DEVICE --------------------------------------------------------------------------------


def test_opmux_device_forces_cpu_without_probing() -> None:
    torch = fake_torch(cuda=fake_cuda(available=boom(), count=boom()), cuda_version="13.0")
    p = detect(torch, env={"OPMUX_DEVICE": "cpu"}, path_exists=ALL_DEV)  # would otherwise raise
    assert p.device_type == "cpu"
    assert "device type forced by OPMUX_DEVICE=cpu" in p.notes


def test_opmux_device_forces_type_and_keeps_facts() -> None:
    p = detect(fake_torch(cuda=fake_cuda(), cuda_version="13.0"), env={"OPMUX_DEVICE": "cuda"})
    assert (p.device_type, p.arch) == ("cuda", "sm_90")


def test_opmux_device_cuda_on_hip_build_is_noted() -> None:
    cuda = fake_cuda(gcn="gfx942:sramecc+:xnack-")
    p = detect(fake_torch(cuda=cuda, hip="6.2"), env={"OPMUX_DEVICE": "cuda"})
    assert p.device_type == "cuda"
    assert "OPMUX_DEVICE=cuda overrides the detected hip" in p.notes


def test_torch_npu_import_fails_with_npus_hidden_is_cpu() -> None:
    p = detect(
        fake_torch(),
        env={"ASCEND_RT_VISIBLE_DEVICES": "-1"},
        load_module=boom("libascendcl.so not found"),
        path_exists=ALL_DEV,
    )
    assert p.device_type == "cpu"
    assert any("import torch_npu raised" in n for n in p.notes)


def test_opmux_device_mismatch_is_noted() -> None:
    p = detect(fake_torch(), env={"OPMUX_DEVICE": "xpu"})
    assert p.device_type == "xpu"
    assert any("no usable xpu device" in n for n in p.notes)


@pytest.mark.parametrize("value", ["gpu", "rocm", "cuda:0"])
def test_opmux_device_invalid(value: str) -> None:
    with pytest.raises(ValueError, match=rf"OPMUX_DEVICE='{value}'.*cpu, cuda, hip, xpu, npu, mps"):
        detect(fake_torch(), env={"OPMUX_DEVICE": value})


def test_opmux_device_from_config_scope() -> None:
    with config.scope(OPMUX_DEVICE="mps"):
        assert detect_from(fake_torch(), path_exists=NO_DEV, load_module=NO_MODULE).device_type == "mps"


# -- the cached wrapper --------------------------------------------------------------------------


def test_torch_missing_entirely(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes find_spec("torch") return None
    p = platform.detect()
    assert p.device_type == "cpu"
    assert any("torch is not installed" in n for n in p.notes)


def test_torch_import_failing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib, "import_module", boom("libcudart.so.13: cannot open"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    with pytest.raises(PlatformDetectionError, match=r"cannot be imported.*libcudart"):
        platform.detect()


def test_detect_is_cached_and_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    torch = fake_torch()

    def import_torch() -> Any:
        calls.append(1)
        return torch

    monkeypatch.setattr(platform, "_import_torch", import_torch)
    first = platform.detect()
    assert platform.detect() is first
    assert calls == [1]
    torch.cuda = fake_cuda()
    assert platform.detect() is first  # still cached
    platform.reset()
    assert platform.detect().device_type == "cuda"
    assert calls == [1, 1]


def test_detect_cache_follows_opmux_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "_import_torch", lambda: fake_torch(cuda=fake_cuda(), cuda_version="13.0"))
    assert platform.detect().device_type == "cuda"
    with config.scope(OPMUX_DEVICE="cpu"):
        assert platform.detect().device_type == "cpu"
    assert platform.detect().device_type == "cuda"


def test_detect_on_this_machine_imports_torch_lazily() -> None:
    pytest.importorskip("torch")
    p = platform.detect()
    assert p.device_type in platform.DEVICE_TYPES
    assert p.torch_version


# -- the value type ------------------------------------------------------------------------------


def test_describe_is_json_ready() -> None:
    import json

    p = detect(fake_torch(cuda=fake_cuda(capability=boom()), cuda_version="13.0"))
    d = p.describe()
    assert json.loads(json.dumps(d)) == d
    assert d["device_type"] == "cuda" and d["notes"]
    assert set(d) == {f for f in Platform.__dataclass_fields__}


def test_platform_rejects_unknown_device_type() -> None:
    with pytest.raises(ValueError, match=r"'gpu'.*cpu, cuda"):
        Platform("gpu")


def test_platform_is_frozen_and_hashable() -> None:
    p = Platform("cuda", device_index=0, arch="sm_90", capability=(9, 0))
    assert hash(p) == hash(Platform("cuda", device_index=0, arch="sm_90", capability=(9, 0)))
    with pytest.raises(AttributeError):
        p.device_type = "cpu"  # type: ignore[misc]
