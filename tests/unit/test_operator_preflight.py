"""The preflight rule: a missing model claim blocks, a GPU shortfall is reported per pool and never blocks."""

from tandem.operator.status.preflight import Facts, NodeGpus, check, node_gpus
from tandem.spec import InferenceServiceSpec

POOLS = ["prefill", "decode", "router"]


def spec(**fields) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, **fields}
    )


PVC = {"model": {"source": {"pvc": {"claimName": "models"}}, "servedName": "m"}}
EIGHT = (NodeGpus("a", {"pool": "h100"}, 8), NodeGpus("b", {}, 4), NodeGpus("cpu", {}, 0))


def test_missing_or_lost_claim_blocks_and_a_bound_or_pending_one_does_not():
    missing = check(spec(**PVC), POOLS, Facts(claims={"models": None}, nodes=EIGHT))
    assert (
        missing.blocked and missing.blocked[0] == "ModelSourceNotFound" and '"models"' in missing.blocked[1]
    )
    assert check(spec(**PVC), POOLS, Facts(claims={"models": "Lost"})).blocked[0] == "ModelSourceLost"
    for phase in ("Bound", "Pending"):  # Pending: WaitForFirstConsumer binds once a pod asks
        assert not check(spec(**PVC), POOLS, Facts(claims={"models": phase}, nodes=EIGHT)).any


def test_unreadable_facts_report_nothing():
    assert not check(spec(**PVC, decode={"resources": {"gpus": 64}}), POOLS, Facts(claims={}, nodes=None)).any


def test_more_gpus_than_the_largest_node_is_reported_on_that_pool_only():
    found = check(spec(decode={"resources": {"gpus": 8}}), POOLS, Facts(nodes=EIGHT))
    assert not found.any  # 8 fit on node a
    found = check(spec(decode={"resources": {"gpus": 16}}), POOLS, Facts(nodes=EIGHT))
    assert found.blocked is None and list(found.pools) == ["decode"]
    ((reason, message),) = found.pools["decode"]
    assert reason == "InsufficientGPUs" and "16 nvidia.com/gpu" in message and "has 8 (a)" in message


def test_node_selector_narrows_the_nodes():
    found = check(
        spec(prefill={"resources": {"gpus": 4}, "nodeSelector": {"pool": "l4"}}), POOLS, Facts(nodes=EIGHT)
    )
    ((reason, message),) = found.pools["prefill"]
    assert reason == "NoGPUNodes" and "nodeSelector pool=l4" in message
    assert not check(
        spec(prefill={"resources": {"gpus": 8}, "nodeSelector": {"pool": "h100"}}), POOLS, Facts(nodes=EIGHT)
    ).any


def test_no_gpu_node_at_all_is_reported_not_blocked_and_gpu_free_pools_are_not_checked():
    found = check(spec(), POOLS, Facts(nodes=(NodeGpus("cpu", {}, 0),)))
    assert found.blocked is None and set(found.pools) == {"prefill", "decode"}  # the router asks for no GPU
    assert all(p[0][0] == "NoGPUNodes" for p in found.pools.values())
    assert not check(
        spec(
            router={"resources": {"gpus": 0}},
            prefill={"resources": {"gpus": 0}},
            decode={"resources": {"gpus": 0}},
        ),
        POOLS,
        Facts(nodes=()),
    ).any


def test_colocated_pool_is_sized_by_decode():
    found = check(
        spec(mode="colocated", decode={"resources": {"gpus": 16}}),
        ["colocated", "router"],
        Facts(nodes=EIGHT),
    )
    assert list(found.pools) == ["colocated"]


def test_node_gpus_reads_allocatable():
    node = {
        "metadata": {"name": "n", "labels": {"x": "y"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    assert node_gpus(node) == NodeGpus("n", {"x": "y"}, 8)
    assert node_gpus({"metadata": {"name": "m"}, "status": {"allocatable": {"cpu": "4"}}}).gpus == 0
