"""The one error offloading raises: its message is the sentence the user reads."""


class OffloadError(RuntimeError):
    """Offloading cannot start or go on; the message says why, in one sentence."""
