"""Loaded at start-up by every Python process under ``gpufeed diagnose`` (its folder is put first
on PYTHONPATH). It arms the probe for when torch's DataLoader (or TensorFlow) is imported, then runs the
``sitecustomize`` it shadows, if there is one, so the user's environment behaves as before."""


def _arm_gpufeed() -> None:
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("gpufeed") is None:
        # The command runs another interpreter than gpufeed's: reach gpufeed at the end of the path,
        # so that nothing of the user's environment is shadowed.
        parent = os.environ.get("GPUFEED_PACKAGE_PARENT")
        if parent:
            sys.path.append(parent)
    try:
        from gpufeed.measure.inside.hook import call_after_import
        from gpufeed.arming import install_from_env
    except Exception as error:  # never break the user's program because gpufeed could not load
        sys.stderr.write(f"gpufeed: instrumentation not loaded in {sys.executable}: {error}\n")
        return
    call_after_import("torch.utils.data.dataloader", lambda _module: install_from_env())
    # TensorFlow scripts (nothing happens unless TensorFlow is imported): tf_probe.py.
    call_after_import("tensorflow", _tf_hook("install_from_env"))
    call_after_import("keras.src.backend.tensorflow.trainer", _tf_hook("patch_keras"))


def _tf_hook(name):
    def hook(module):
        try:
            from gpufeed.measure.inside import tf_probe
            getattr(tf_probe, name)(module)
        except Exception as error:  # never break the user's program
            import sys
            sys.stderr.write(f"gpufeed: TensorFlow instrumentation not loaded: {error}\n")
    return hook


def _run_shadowed_sitecustomize() -> None:
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_arm_gpufeed()
_run_shadowed_sitecustomize()
