import sys

from persistent_engine import versions


def test_software_versions_name_what_is_installed():
    v = versions.software_versions(driver=False)
    import torch
    assert v["torch"] == versions.package_version("torch") and v["torch"].split("+")[0] in torch.__version__
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    assert v["driver"] is None
    assert versions.package_version("no-such-package-tkcc") is None


def test_driver_is_none_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(versions.shutil, "which", lambda name: None)
    assert versions.driver_version() is None
