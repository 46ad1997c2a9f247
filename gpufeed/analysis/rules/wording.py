"""How the findings say it: the sentences and evidence several rules share, and the DataLoader
change written where the user makes it (their own call with its file:line, or the knob of the
framework that builds the loader for them)."""
from __future__ import annotations

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.rules.facts import input_share, restart_share, steady_input_share
from gpufeed.units import fmt


def cores(n: int) -> str:
    return f"{n} core{'s' if n != 1 else ''}"


def tune_hint() -> str:
    return "(`gpufeed tune` measures it)"


def others_sentence(m: Metrics) -> str:
    """Say so when programs outside the command take a large part of the busy CPU."""
    if m.cpu_cores_command is None or m.cpu_cores_busy is None:
        return ""
    others = m.cpu_cores_busy - m.cpu_cores_command
    if others < th.OTHER_PROGRAMS_CORES:
        return ""
    return f" Other programs used {others:.1f} of the {cores(m.cpu_count)}; the command used {m.cpu_cores_command:.1f}."


def wait_sentence(m: Metrics) -> str:
    """"The training loop waited for data 30% of the time (p50 step ...)": the wait more workers, CPU
    or storage can buy back; what restarting the workers costs is said beside it (``restart_sentence``)."""
    who = "The GPU" if m.cuda_used else "The training loop"
    if m.focus_rank is not None:
        who += f" of rank {m.focus_rank}"
    step = (f"(p50 step {fmt(m.step_time_p50_ms, '.0f')} ms, of which {fmt(m.data_wait_p50_ms, '.0f')} ms in "
            "next(loader))")
    restart = restart_share(m)
    if restart is None or restart < th.SHARE_SAID_MIN:
        return f"{who} waited for data {fmt(input_share(m), '.0%')} of the time {step}"
    return (f"{who} waited for data {fmt(steady_input_share(m), '.0%')} of the time once its workers ran {step}; "
            f"starting them again each epoch cost {restart:.0%} more")


def restart_sentence(m: Metrics) -> str:
    """"1% in iter(loader) forking them, 2% waiting for each epoch's first batch, 11% in the steps slowed
    by the fork (copy-on-write)": where restarting the workers cost, each part measured in the window."""
    parts = [(m.startup_in_iter_share, "in iter(loader) forking them"),
             (m.restart_wait_share, "waiting for each epoch's first batch"),
             (None if m.cuda_used else m.fork_step_share, "in the steps slowed by the fork (copy-on-write)")]
    return ", ".join(f"{share:.0%} {what}" for share, what in parts if share is not None and share >= th.SHARE_SAID_MIN)


def wait_evidence(m: Metrics) -> dict:
    return {"input_share": input_share(m), "data_wait_share": m.data_wait_share,
            "startup_in_iter_share": m.startup_in_iter_share, "fork_step_share": m.fork_step_share,
            "step_time_p50_ms": m.step_time_p50_ms,
            "data_wait_p50_ms": m.data_wait_p50_ms, "compute_p50_ms": m.compute_p50_ms,
            "compute_per_batch_ms": m.compute_per_batch_ms,
            "samples_per_s": m.samples_per_s, "gpu_idle_share": m.gpu_idle_share}


# Hugging Face Trainer passes these TrainingArguments to the DataLoaders it builds.
HF_ARGUMENTS = {"num_workers": "dataloader_num_workers", "prefetch_factor": "dataloader_prefetch_factor",
                "persistent_workers": "dataloader_persistent_workers", "pin_memory": "dataloader_pin_memory"}
LIGHTNING_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")


def keras_wrapped(config: dict) -> bool:
    """Keras (torch backend) feeds a tf.data pipeline or a PyDataset through
    ``DataLoader(IterableDataset, batch_size=None)``: each DataLoader worker would yield it all again."""
    return config.get("framework") == "keras" and bool(config.get("iterable")) and config.get("batch_size") is None


def change(ctx: Context, **settings) -> str:
    """The DataLoader change for the run's training loader (``change_in``)."""
    return change_in(ctx.training.config if ctx.training is not None else {}, **settings)


def change_in(config: dict, **settings) -> str:
    """The DataLoader change, written where the user makes it: their own ``DataLoader(...)`` call
    with its file:line, or the knob of the framework that builds the loader for them."""
    framework, site = config.get("framework"), config.get("site")
    user = (config.get("user_stack") or [None])[0]
    if keras_wrapped(config):
        return ("Keras builds this DataLoader around its own pipeline (tf.data or a PyDataset, as an IterableDataset "
                "with batch_size=None), so DataLoader workers would each yield the whole dataset again: speed up "
                "Keras's pipeline instead (PyDataset(workers=..., use_multiprocessing=True), or tf.data's "
                "map(num_parallel_calls=tf.data.AUTOTUNE) and prefetch(tf.data.AUTOTUNE))")
    if framework == "transformers":
        args = ", ".join(f"{HF_ARGUMENTS[k]}={v!r}" for k, v in settings.items() if k in HF_ARGUMENTS)
        return f"TrainingArguments({args}) (the Trainer builds the DataLoader{f'; trainer at {user}' if user else ''})"
    args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    return _plain_change(config, framework, site, user, args) + knob_sentence(config, settings)


def knob_sentence(config: dict, settings: dict) -> str:
    """" (or pass `--workers 6`: the script's -j/--workers sets num_workers)": the user's own knob, where
    the setting comes from the script's command line (argparse) or a Hydra/OmegaConf key."""
    said = []
    for name, value in settings.items():
        source = (config.get("knobs") or {}).get(name)
        if not source:
            continue
        if source.get("kind") == "argparse":
            flags = source.get("flags") or []
            flag = next((f for f in flags if f.startswith("--")), flags[0] if flags else None)
            if flag is None:
                continue
            if source.get("store_true"):
                if value is not True:
                    continue
                said.append(f"`{flag}`")
            else:
                said.append(f"`{flag} {value}`")
            said[-1] += f" (the script's {'/'.join(flags)} sets {name})"
        elif source.get("kind") == "hydra":
            said.append(f"`{source['key']}={value}` on the command line (the Hydra key that sets {name})")
        elif source.get("kind") == "lightning":
            said.append(_lightning_knob(source, name, value))
    return f"; or pass {' and '.join(said)}" if said else ""


def _lightning_knob(source: dict, name: str, value) -> str:
    """LightningCLI's flag for the DataModule's argument, else the argument where the DataModule is made."""
    cls, argument = source.get("class"), source.get("argument")
    if source.get("cli"):
        return f"`{source['cli']} {value}` (LightningCLI's flag for {cls}'s {argument}, which sets {name})"
    where = f" at {source['constructed']}" if source.get("constructed") else ""
    return f"`{argument}={value!r}` to {cls}(...){where} (its {argument} argument sets {name})"


def _plain_change(config: dict, framework: str | None, site: str | None, user: str | None, args: str) -> str:
    hook = config.get("user_function")
    in_hook = f" (in {hook}())" if hook in LIGHTNING_HOOKS else ""
    origin = config.get("origin_site")
    if origin is not None and origin != site:
        # A framework rebuilt the user's loader (Lightning, accelerate.prepare): change theirs.
        return f"DataLoader(..., {args}) at {origin}{in_hook}"
    if framework == "lightning" and user is not None:
        # Lightning wraps DataLoader.__init__ while its hooks run: the user's call is the first frame of theirs.
        return f"DataLoader(..., {args}) at {user}{in_hook}"
    if site is not None and user is not None and site != user:
        who = f"{framework or 'a library'} builds it"
        return f"DataLoader(..., {args}) in the code at {user} ({who}, at {site})"
    where = f" at {site}" if site else ""
    return f"DataLoader(..., {args}){where}{in_hook}"
