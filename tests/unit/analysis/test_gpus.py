"""The GPUs the job uses, never an average over unrelated ones (issue 11, point 8)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from gpufeed.analysis import analyze
from gpufeed.analysis.gpus import NVML_PROCESS, TORCH_DEVICE, VISIBLE_DEVICES, visible_gpus
from gpufeed.measure.outside.nvml import Nvml
from gpufeed.present.terminal import render
from tests.synthetic import Scenario, write_run
from tests.integration.test_sampler import fake_nvml

UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000",
         "GPU-cccc3333-0000-0000-0000-000000000000"]
DEVICES = [{"index": i, "name": "NVIDIA H100", "uuid": u, "mig_uuids": []} for i, u in enumerate(UUIDS)]
# The job's GPU 0 saws 0-95%; GPU 1 idles, GPU 2 is pegged by someone else's job.
THREE_GPUS = Scenario(cuda=True, gpu_util_pattern=[90, 95, 92, 88], other_gpu_utils=[0.0, 100.0],
                      sampler_extra={"gpus": DEVICES})


def metrics(tmp_path, **change):
    import dataclasses
    return analyze(write_run(tmp_path / "run", dataclasses.replace(THREE_GPUS, **change)))


def test_nvml_process_match_picks_the_jobs_gpu(tmp_path):
    d = metrics(tmp_path)
    m = d.metrics
    assert (m.gpu_indices, m.gpu_match, m.gpu_names) == ([0], NVML_PROCESS, ["NVIDIA H100"])
    assert m.gpu_util_p50_pct == pytest.approx(91, abs=1.5)  # not (91 + 0 + 100) / 3
    out = Console(width=200, record=True)
    render(d, out)
    assert "GPU 0 (NVIDIA H100) · util" in out.export_text()


def test_without_nvml_processes_the_device_torch_used_decides(tmp_path):
    # In a container NVML lists host pids: no match. The probe saw torch use the GPU with this UUID.
    torch_uuid = UUIDS[0].removeprefix("GPU-")  # torch prints the UUID without NVML's prefix
    m = metrics(tmp_path, gpu_procs_listed=False, cuda_device={"index": 0, "uuid": torch_uuid, "name": "NVIDIA H100",
                                                               "visible": None, "order": None}).metrics
    assert (m.gpu_indices, m.gpu_match) == ([0], TORCH_DEVICE)
    assert m.gpu_util_p95_pct <= 95


def test_cuda_visible_devices_by_uuid_and_index(tmp_path):
    m = metrics(tmp_path, gpu_procs_listed=False,
                sampler_extra={"gpus": DEVICES, "cuda_visible_devices": "GPU-aaaa1111"}).metrics
    assert (m.gpu_indices, m.gpu_match) == ([0], VISIBLE_DEVICES)
    # torch's cuda:1 under CUDA_VISIBLE_DEVICES=2,0 is NVML's GPU 0 (one model: the orders agree).
    assert visible_gpus(DEVICES, "2,0", 1, None) == [0]
    assert visible_gpus(DEVICES, "2,0", None, None) == [2, 0]
    assert visible_gpus(DEVICES, "0,-1,2", None, None) == [0]     # CUDA stops at an invalid entry
    assert visible_gpus(DEVICES, None, None, None) == []           # nothing says which: none
    mixed = [dict(DEVICES[0], name="NVIDIA A10"), *DEVICES[1:]]
    assert visible_gpus(mixed, "1", None, None) == []              # fastest-first may differ from PCI order
    assert visible_gpus(mixed, "1", None, "PCI_BUS_ID") == [1]
    mig = [dict(DEVICES[0], mig_uuids=["MIG-dddd4444-0000"]), *DEVICES[1:]]
    assert visible_gpus(mig, "MIG-dddd4444", None, None) == [0]


def test_several_gpus_none_matched_is_na_not_an_average(tmp_path):
    d = metrics(tmp_path, gpu_procs_listed=False, cuda=False)
    m = d.metrics
    assert m.gpu_indices == [] and m.gpu_util_p50_pct is None
    assert "none of the host's 3 GPUs could be matched" in m.gpu_match
    out = Console(width=250, record=True)
    render(d, out)
    assert "GPU         N/A: none of the host's 3 GPUs" in out.export_text()


def test_nvml_devices_name_uuid_and_mig_instances():
    fake = fake_nvml()
    fake.nvmlDeviceGetUUID = lambda h: [b"GPU-aaaa", "GPU-bbbb", "MIG-cccc"][h if isinstance(h, int) else 2]
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda h: 1 if h == 1 else 0
    fake.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: SimpleNamespace(parent=h)
    assert Nvml(module=fake).devices() == [
        {"index": 0, "name": "NVIDIA H100", "uuid": "GPU-aaaa", "mig_uuids": []},
        {"index": 1, "name": "NVIDIA A10", "uuid": "GPU-bbbb", "mig_uuids": ["MIG-cccc"]},
    ]
    plain = fake_nvml()  # bindings without the UUID or MIG calls: N/A, never an error
    assert Nvml(module=plain).devices()[0] == {"index": 0, "name": "NVIDIA H100", "uuid": None, "mig_uuids": []}


def test_each_rank_reads_the_gpu_its_torch_reported(tmp_path):
    from gpufeed.record.reader import load_run
    from tests.synthetic import RankSpec, write_ddp_run

    run = write_ddp_run(tmp_path / "ddp", [RankSpec(gpu_util=[90.0]), RankSpec(gpu_util=[10.0])])
    # A container: NVML lists no pid of ours. Rank 0's torch used the GPU NVML numbers 1, rank 1's GPU 0
    # (CUDA_VISIBLE_DEVICES reversed them), which LOCAL_RANK alone would have swapped.
    lines = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for line in lines:
        for g in line["gpus"]:
            g["procs"] = {}
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = json.loads((run / "meta.json").read_text())
    meta["sampler"]["gpus"] = DEVICES[:2]
    (run / "meta.json").write_text(json.dumps(meta))
    for pid, uuid in ((1000, UUIDS[1]), (1001, UUIDS[0])):
        with open(run / "events" / f"{pid}.jsonl", "a") as f:
            f.write(json.dumps({"kind": "cuda_device", "pid": pid, "t": 1.0, "index": 0, "uuid": uuid[4:],
                                "visible": None, "order": None}) + "\n")
    record = load_run(run)
    from gpufeed.analysis.gpus import process_gpus
    assert process_gpus(record, 1000) == [1] and process_gpus(record, 1001) == [0]
    ranks = {r.rank: r for r in analyze(run).metrics.ranks}
    assert ranks[0].gpu_util_p50_pct == pytest.approx(10.0) and ranks[1].gpu_util_p50_pct == pytest.approx(90.0)


def test_cuda_used_but_no_gpu_matched_says_why(tmp_path):
    d = metrics(tmp_path, gpu_procs_listed=False)  # CUDA events, three GPUs, nothing names the job's
    out = Console(width=300, record=True)
    render(d, out)
    text = out.export_text()
    assert d.metrics.gpu_util_p50_pct is None
    assert "NVML figures N/A: none of the host's 3 GPUs could be matched" in text


def test_each_ranks_own_metrics_come_from_its_own_gpu_not_the_jobs_pooled(tmp_path):
    """Under DDP the focus rank's utilisation (and so its host-idle share) is its GPU's alone: rank 1
    waits for data on a GPU at 10% while rank 0's reads 90%; pooled, rank 1 would read ~50%."""
    from tests.synthetic import RankSpec, write_ddp_run

    run = write_ddp_run(tmp_path / "ddp", [RankSpec(gpu_util=[90.0]), RankSpec(gpu_util=[10.0], wait_s=0.004)],
                        synchronized=False)
    d = analyze(run)
    m = d.metrics
    assert m.focus_rank == 1
    assert m.gpu_indices == [1] and m.gpu_match == NVML_PROCESS
    assert m.gpu_util_p50_pct == pytest.approx(10.0)
    ranks = {r.rank: r for r in m.ranks}
    assert ranks[0].gpu_util_p50_pct == pytest.approx(90.0) and ranks[1].gpu_util_p50_pct == pytest.approx(10.0)
