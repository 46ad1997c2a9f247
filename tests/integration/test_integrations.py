"""The integrations against the real libraries: a Lightning fit and a Hugging Face Trainer run with
gpufeed's callbacks, TensorBoard scalars read back, and the Prometheus exporter scraped over HTTP
(on 127.0.0.1) while ``gpufeed diagnose`` runs a real command."""
from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpufeed import cli
from gpufeed.record.reader import load_run
from tests.synthetic import RankSpec, Scenario, write_ddp_run, write_run
from tests import needs
from tests.integration.test_cli import WORKLOADS, gpufeed


class SlowData(Dataset):
    """Samples that take 2 ms each to read (``sleep_s``): an input-bound loader with num_workers=0."""

    def __init__(self, n: int = 240, as_dict: bool = False, sleep_s: float = 0.002) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.as_dict = as_dict
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        if self.as_dict:
            return {"input_ids": (self.x[i].abs() * 10).long() % 30, "labels": self.y[i]}
        return self.x[i], self.y[i]


def test_lightning_callback(tmp_path, caplog):
    pl = needs.library("lightning.pytorch")
    from gpufeed.integrations.lightning import GpufeedCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 2)

        def training_step(self, batch, _index):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = GpufeedCallback(out=tmp_path / "run")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=pl.loggers.CSVLogger(tmp_path),
                         callbacks=[callback], enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        # 64 ms of reading a batch against a few ms of Lightning's step: waiting for data dominates.
        trainer.fit(Tiny(), DataLoader(SlowData(sleep_s=0.008), batch_size=8))
    d = callback.diagnosis
    assert d is not None and d.bottleneck == "input" and d.metrics.steps == 20   # 30 batches, 10 warm-up
    assert (tmp_path / "run" / "meta.json").exists()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "gpufeed: bottleneck input" in logged and f"{d.findings[0].id}:" in logged and "Fix:" in logged
    metrics = next(tmp_path.glob("lightning_logs/*/metrics.csv")).read_text()
    assert "gpufeed/data_wait_share" in metrics and "gpufeed/samples_per_s" in metrics


def test_transformers_trainer_callback(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")      # nothing may come from the hub
    transformers = needs.library("transformers")
    from gpufeed.integrations.transformers import GpufeedTrainerCallback

    # A tiny model built from a config: no download.
    config = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=30, per_device_train_batch_size=8,
                                          report_to=[], use_cpu=True, save_strategy="no", logging_steps=1000,
                                          disable_tqdm=True, dataloader_num_workers=0)
    callback = GpufeedTrainerCallback(out=tmp_path / "run")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=SlowData(as_dict=True), callbacks=[callback])
    with caplog.at_level(logging.INFO, logger="transformers"):
        trainer.train()
    d = callback.diagnosis
    assert d is not None and d.metrics.steps == 20
    assert d.metrics.data_wait_share is not None and d.metrics.data_wait_share > 0.05
    assert any("gpufeed/data_wait_share" in entry for entry in trainer.state.log_history)
    assert "gpufeed: bottleneck" in "\n".join(r.getMessage() for r in caplog.records)


def test_tensorboard_scalars(tmp_path):
    needs.library("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from gpufeed.integrations.tensorboard import write_scalars

    run = write_ddp_run(tmp_path / "run", [RankSpec(wait_s=0.0005, compute_s=0.005, gpu_util=[90.0]),
                                           RankSpec(wait_s=0.020, compute_s=0.005, gpu_util=[20.0])])
    n = write_scalars(load_run(run), tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"gpufeed/rank0/data_wait_share", "gpufeed/rank1/samples_per_s", "gpufeed/gpu0/util_pct",
            "gpufeed/gpu1/util_pct"} <= tags
    wait = events.Scalars("gpufeed/rank1/data_wait_share")
    assert len(wait) == 10 and wait[0].step == 10
    assert wait[-1].value == pytest.approx(0.8, abs=0.02)          # 20 ms of a 25 ms step
    assert events.Scalars("gpufeed/gpu1/util_pct")[0].value == pytest.approx(20.0)
    assert n == sum(len(events.Scalars(t)) for t in tags)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_exporter_serves_a_record(tmp_path):
    needs.library("prometheus_client")
    from gpufeed.integrations.prometheus import serve

    run = write_run(tmp_path / "run", Scenario(wait_s=0.004, compute_s=0.004))
    server = serve(run, _free_port())
    try:
        assert server.server_address[0] == "127.0.0.1"   # this host only, unless told otherwise
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    assert 'gpufeed_steps_total{host="test",pid="1000",rank="",run="run"} 200.0' in text
    share = next(line for line in text.splitlines() if line.startswith("gpufeed_data_wait_share{"))
    assert float(share.split()[-1]) == pytest.approx(0.5, abs=0.01)
    server = serve(run, _free_port(), addr="127.0.0.2")   # told otherwise
    try:
        assert server.server_address[0] == "127.0.0.2"
    finally:
        server.shutdown()


def test_diagnose_prometheus_while_the_command_runs(tmp_path):
    needs.library("prometheus_client")
    port = _free_port()
    # The command runs until the test has scraped it (no race with its end on a slow machine), then
    # Ctrl-C ends it as a user would.
    proc = subprocess.Popen([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp_path / "run"),
                             "--prometheus", str(port), "--", sys.executable, str(WORKLOADS / "storage_bound.py"),
                             "--epochs", "10000"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    scraped = ""
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and "gpufeed_steps_total{" not in scraped:
            time.sleep(0.5)
            try:
                scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass  # not serving yet, or between two reads
        assert proc.poll() is None, "the command ended before it was scraped"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == cli.EXIT_INTERRUPTED, out + err
    assert "gpufeed_steps_total{" in scraped and "gpufeed_data_wait_share{" in scraped
    with pytest.raises(OSError):  # the exporter ended with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_prometheus_port_in_use_is_refused_before_the_command_starts(tmp_path):
    needs.library("prometheus_client")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = gpufeed(["diagnose", "--out", str(tmp_path / "run"), "--prometheus", str(port), "--",
                          sys.executable, "-c", "open('started', 'w')"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_USAGE
    assert f"cannot serve Prometheus metrics on 127.0.0.1:{port}" in result.stderr
    assert not (tmp_path / "started").exists()


def test_analyze_writes_tensorboard_scalars(tmp_path, capsys):
    needs.library("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = write_ddp_run(tmp_path / "run", [RankSpec(wait_s=0.0005, compute_s=0.005),
                                           RankSpec(wait_s=0.020, compute_s=0.005)])
    assert cli.main(["analyze", str(run), "--tensorboard", str(tmp_path / "tb")]) == cli.EXIT_OK
    written = int(capsys.readouterr().out.split(" TensorBoard scalars written")[0].split()[-1])
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"gpufeed/rank0/data_wait_share", "gpufeed/rank1/data_wait_share"} <= tags
    assert written == sum(len(events.Scalars(t)) for t in tags)
    # Rank 1: 20 ms of its 25 ms step in next(loader); rank 0: 0.5 ms of a step as long as rank 1's
    # (it waits for rank 1 in the all-reduce). A point every 10 of the 100 steps, after the warm-up.
    assert [e.value for e in events.Scalars("gpufeed/rank1/data_wait_share")] == pytest.approx([0.8] * 10, abs=0.02)
    assert [e.value for e in events.Scalars("gpufeed/rank0/data_wait_share")] == pytest.approx([0.02] * 10, abs=0.005)


LIGHTNING_FIT = WORKLOADS / "lightning_fit.py"


def test_callbacks_stand_aside_under_diagnose(tmp_path):
    """A Lightning fit with the callback, under gpufeed diagnose: diagnose measures, the callback
    starts nothing, writes nothing and says so."""
    needs.library("lightning")
    out = tmp_path / "diag.json"
    result = gpufeed(["diagnose", "--warmup", "5", "--out", str(tmp_path / "run"), "--json", str(out), "--",
                      sys.executable, str(LIGHTNING_FIT), "--out", str(tmp_path / "callback"), "--steps", "30"],
                     cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    assert "gpufeed diagnose is measuring this run" in result.stdout + result.stderr
    assert not (tmp_path / "callback").exists(), "the callback started a second measurement"
    diag = json.loads(out.read_text())
    assert diag["metrics"]["steps"] == 25 and diag["bottleneck"] == "input"   # 30 batches, 5 warm-up


def test_transformers_training_that_raises_still_leaves_a_finished_record(tmp_path):
    """The HF Trainer calls no callback when training raises: the record is finished at exit,
    in a real process that ends with the error."""
    needs.library("transformers")
    result = subprocess.run([sys.executable, str(WORKLOADS / "hf_trainer_fails.py"), "--out", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1 and "OSError: unreadable sample" in result.stderr, result.stderr[-3000:]
    record = load_run(tmp_path / "run")
    assert record.meta.end_reason == "failed" and "did not reach its end" in record.meta.message
    assert record.meta.t_end is not None
    assert sum(len(it.steps) for it in record.iterators) == 2   # two batches arrived, the third raised
