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
