"""Where a DataLoader setting comes from (``measure/inside/knobs.py``): the script's argparse flag or a
Hydra key, read from the call's source, so the advice names the knob the user turns (issue 31, point 8)."""
from __future__ import annotations

import runpy
import textwrap

from gpufeed.analysis.rules.wording import change_in

SCRIPT = '''
import argparse, sys
from gpufeed.measure.inside.knobs import knob_sources

def DataLoader(dataset, **kwargs):          # stands in for torch's: returns what the probe would note
    return knob_sources(sys._getframe(1))

def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("-j", "--workers", default=1, type=int, help="number of data loading workers")
    p.add_argument("-b", "--batch-size", default=16, type=int)
    p.add_argument("--keep-workers", action="store_true", dest="persistent")
    args = p.parse_args(argv)
    fixed = 2
    return DataLoader([], batch_size=args.batch_size, shuffle=True,
                      num_workers=int(args.workers), persistent_workers=args.persistent, pin_memory=fixed > 1)
'''


def knobs_of(tmp_path, argv=()):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return runpy.run_path(str(path))["main"](list(argv))


def test_argparse_flags_are_found_for_the_settings_they_set(tmp_path):
    # num_workers=int(args.workers), as pytorch/examples' dcgan writes it: found through the int()
    found = knobs_of(tmp_path, ["-j", "3"])
    assert found["num_workers"] == {"kind": "argparse", "flags": ["-j", "--workers"], "store_true": False}
    assert found["batch_size"]["flags"] == ["-b", "--batch-size"]
    assert found["persistent_workers"] == {"kind": "argparse", "flags": ["--keep-workers"], "store_true": True}
    assert "pin_memory" not in found  # an expression, not the command line's


def test_the_advice_names_the_flag_beside_the_call(tmp_path):
    config = {"site": "train.py:17", "knobs": knobs_of(tmp_path)}
    text = change_in(config, num_workers=6, persistent_workers=True)
    assert text == ("DataLoader(..., num_workers=6, persistent_workers=True) at train.py:17; or pass `--workers 6` "
                    "(the script's -j/--workers sets num_workers) and `--keep-workers` (the script's --keep-workers "
                    "sets persistent_workers)")
    assert change_in({"site": "train.py:17"}, num_workers=6) == "DataLoader(..., num_workers=6) at train.py:17"


def test_a_hydra_key_is_named_as_an_override():
    config = {"site": "train.py:9", "knobs": {"num_workers": {"kind": "hydra", "key": "data.num_workers"}}}
    assert change_in(config, num_workers=4).endswith(
        "; or pass `data.num_workers=4` on the command line (the Hydra key that sets num_workers)")


def test_nothing_is_said_where_the_source_cannot_be_read():
    from gpufeed.measure.inside.knobs import knob_sources
    assert knob_sources(None) == {}


LIGHTNING = '''
import sys
import lightning as L
from gpufeed.measure.inside.knobs import knob_sources

def DataLoader(dataset, **kwargs):          # stands in for torch's, as above
    return knob_sources(sys._getframe(1))

class Data(L.LightningDataModule):
    def __init__(self, num_workers: int = 0, batch_size: int = 8, pin: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.workers = num_workers
        self.pin = pin is True

    def train_dataloader(self):
        return DataLoader([], batch_size=self.hparams.batch_size, num_workers=self.workers, pin_memory=self.pin)

def main():
    data = Data(num_workers=1)
    return data.train_dataloader()

FOUND = main()  # run as the program (run_name="__main__"), as python train.py runs it
'''


def test_a_lightning_datamodules_init_arguments_are_named(tmp_path):
    pytest = __import__("pytest")
    pytest.importorskip("lightning")
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LIGHTNING))
    found = runpy.run_path(str(path), run_name="__main__")["FOUND"]
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "data = Data(" in text)
    constructed = f"{path}:{line}"
    assert found["num_workers"] == {"kind": "lightning", "class": "Data", "group": "data", "argument": "num_workers",
                                    "constructed": constructed, "cli": None}
    assert found["batch_size"]["argument"] == "batch_size"  # self.hparams.batch_size, by save_hyperparameters()
    assert "pin_memory" not in found  # self.pin = pin is True: not the argument itself
    text = change_in({"site": "train.py:17", "knobs": found}, num_workers=4)
    assert text == (f"DataLoader(..., num_workers=4) at train.py:17; or pass `num_workers=4` to Data(...) at "
                    f"{constructed} (its num_workers argument sets num_workers)")


def test_a_lightning_cli_script_is_told_its_flag(tmp_path):
    pytest = __import__("pytest")
    pytest.importorskip("lightning")
    path = tmp_path / "train.py"
    # The script runs LightningCLI(model, Data): jsonargparse builds the DataModule, so its flag is the knob.
    path.write_text(textwrap.dedent(LIGHTNING) + "\nif False:\n    from lightning.pytorch.cli import LightningCLI\n"
                    "    LightningCLI(None, Data)\n")
    found = runpy.run_path(str(path), run_name="__main__")["FOUND"]
    assert found["num_workers"]["cli"] == "--data.num_workers"
    assert change_in({"site": "train.py:17", "knobs": found}, num_workers=4).endswith(
        "; or pass `--data.num_workers 4` (LightningCLI's flag for Data's num_workers, which sets num_workers)")
