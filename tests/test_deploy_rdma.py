"""deploy/rdma: the Network Operator, Multus and SR-IOV manifests, and the jobs that use them.

``tests/test_manifests.py`` validates every file against its CRD; here a typo in the
NicClusterPolicy or the SriovNetworkNodePolicy must fail with the path and a suggestion,
and the files must agree with each other: the resource a Pod requests is the one the
device plugin or the SR-IOV policy advertises, the network it names exists, and every
worker has what RDMA needs in a container (IPC_LOCK, a memory-backed /dev/shm, the
device). YAML and JSON only: well under a second.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddtk.manifests import validate

RDMA = Path(__file__).resolve().parents[1] / "deploy" / "rdma"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((RDMA / name).read_text()) if d]


def _one(name: str) -> dict[str, Any]:
    (doc,) = _docs(name)
    return doc


@pytest.fixture
def policy() -> dict[str, Any]:
    return _one("10-nicclusterpolicy.yaml")


@pytest.fixture
def sriov_policy() -> dict[str, Any]:
    return next(d for d in _docs("30-sriov.yaml") if d["kind"] == "SriovNetworkNodePolicy")


def _workers() -> list[tuple[str, dict[str, Any]]]:
    """``(file, worker replica spec)`` of every MPIJob here."""
    return [(p.name, d["spec"]["mpiReplicaSpecs"]["Worker"])
            for p in sorted(RDMA.glob("*.yaml")) for d in _docs(p.name) if d["kind"] == "MPIJob"]  # fmt: skip


def test_the_folder_holds_each_kind_and_every_file_is_valid() -> None:
    kinds = {d["kind"] for p in RDMA.glob("*.yaml") for d in _docs(p.name)}
    assert kinds == {"NicClusterPolicy", "NetworkAttachmentDefinition", "SriovNetworkNodePolicy",
                     "SriovNetwork", "MPIJob"}  # fmt: skip
    for path in sorted(RDMA.glob("*.yaml")):
        assert validate(path) == [], path.name
    assert len(_workers()) == 2


def test_a_typo_in_the_nicclusterpolicy_fails(policy: dict[str, Any]) -> None:
    typo = copy.deepcopy(policy)
    typo["spec"]["rdmaSharedDevicePlugins"] = typo["spec"].pop("rdmaSharedDevicePlugin")
    assert validate(typo) == [
        "spec.rdmaSharedDevicePlugins: unknown field (did you mean 'rdmaSharedDevicePlugin'?)"
    ]
    deep = copy.deepcopy(policy)
    drain = deep["spec"]["ofedDriver"]["upgradePolicy"]["drain"]
    drain["timeoutSecond"] = drain.pop("timeoutSeconds")
    assert validate(deep) == [
        "spec.ofedDriver.upgradePolicy.drain.timeoutSecond: unknown field (did you mean 'timeoutSeconds'?)"
    ]
    no_image = copy.deepcopy(policy)
    del no_image["spec"]["rdmaSharedDevicePlugin"]["image"]
    assert validate(no_image) == ["spec.rdmaSharedDevicePlugin.image: required field missing"]


def test_a_typo_in_the_sriov_policy_fails(sriov_policy: dict[str, Any]) -> None:
    typo = copy.deepcopy(sriov_policy)
    typo["spec"]["numVf"] = typo["spec"].pop("numVfs")
    assert validate(typo) == [
        "spec.numVf: unknown field (did you mean 'numVfs'?)",
        "spec.numVfs: required field missing",
    ]
    wrong = copy.deepcopy(sriov_policy)
    wrong["spec"]["deviceType"] = "netdev"
    wrong["spec"]["numVfs"] = "8"
    errors = validate(wrong)
    assert (
        errors[0]
        == "spec.deviceType: expected one of 'netdevice', 'vfio-pci', got 'netdev' (did you mean 'netdevice'?)"
    )
    assert errors[1].startswith("spec.numVfs: expected integer, got string '8' (remove the quotes")
    assert len(errors) == 2


def test_pods_request_what_the_device_plugin_and_the_sriov_policy_advertise(
    policy: dict[str, Any], sriov_policy: dict[str, Any]
) -> None:
    (shared,) = json.loads(policy["spec"]["rdmaSharedDevicePlugin"]["config"])["configList"]
    advertised = {
        f"rdma/{shared['resourceName']}",
        f"nvidia.com/{sriov_policy['spec']['resourceName']}",
    }
    sriov_net = next(d for d in _docs("30-sriov.yaml") if d["kind"] == "SriovNetwork")
    assert sriov_net["spec"]["resourceName"] == sriov_policy["spec"]["resourceName"]
    nad = _one("20-rdma-network.yaml")
    cni = json.loads(nad["spec"]["config"])
    assert cni["name"] == nad["metadata"]["name"] and cni["type"] == "macvlan"
    assert cni["master"] in shared["selectors"]["ifNames"], (
        "macvlan must sit on a port the plugin selects"
    )
    assert cni["mtu"] == 9000 == sriov_policy["spec"]["mtu"], "jumbo frames: RDMA MTU 4096 on RoCE"
    networks = {nad["metadata"]["name"]: nad["metadata"]["namespace"],
                sriov_net["metadata"]["name"]: sriov_net["spec"]["networkNamespace"]}  # fmt: skip
    readme = (RDMA / "README.md").read_text()
    for name in advertised | set(networks):
        assert name in readme, name
    for where, worker in _workers():
        pod = worker["template"]
        assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] in networks, where
        (container,) = pod["spec"]["containers"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert limits == requests, where
        assert [r for r in limits if "/" in r and r != "nvidia.com/gpu"] == [
            "rdma/rdma_shared_device_a"
        ], where
        assert "rdma/rdma_shared_device_a" in advertised


def test_every_worker_has_what_rdma_needs_in_a_container() -> None:
    for where, worker in _workers():
        spec = worker["template"]["spec"]
        (container,) = spec["containers"]
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"], where
        shm = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
        volume = next(v for v in spec["volumes"] if v["name"] == shm)
        assert volume["emptyDir"]["medium"] == "Memory", where


def test_each_job_starts_one_rank_per_gpu_and_names_its_hcas_exactly() -> None:
    for path in sorted(RDMA.glob("*mpijob.yaml")):
        job = _one(path.name)
        specs = job["spec"]["mpiReplicaSpecs"]
        (worker,) = specs["Worker"]["template"]["spec"]["containers"]
        gpus = int(worker["resources"]["limits"]["nvidia.com/gpu"])
        assert job["spec"]["slotsPerWorker"] == gpus, path.name
        (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
        argv = [str(a) for a in launcher["command"]]
        assert argv[argv.index("-np") + 1] == str(specs["Worker"]["replicas"] * gpus), path.name
        env = {e["name"]: e["value"] for e in launcher["env"]}
        assert env["NCCL_IB_HCA"].startswith("="), "without '=' mlx5_1 also matches mlx5_10"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_DEBUG"] == "INFO", path.name
