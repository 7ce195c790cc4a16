"""Known start-up noise of TensorFlow and Great Expectations, kept out of task logs.

TensorFlow prints its CUDA probing and CPU-feature notes before ``absl`` reads
``TF_CPP_MIN_LOG_LEVEL`` (so the variable cannot silence them), one of them at ERROR level
on every machine without a GPU; Great Expectations logs ~200 INFO lines about its own
decorators when imported. None of it says anything about the run. The step CLI lowers those
libraries' Python loggers to WARNING, and the two places that stream a child's output into
the task log (the step runner and the training launcher) drop the known TensorFlow lines.
``TRAINYARD_VERBOSE=1`` keeps everything.
"""

from __future__ import annotations

import logging
import re

VERBOSE_ENV = "TRAINYARD_VERBOSE"
#: Python loggers that are lowered to WARNING (their INFO is about themselves).
NOISY_LOGGERS = ("great_expectations", "absl", "h5py", "matplotlib")
_TF_NOISE = re.compile(
    r"cudart_stub\.cc:\d+\] Could not find cuda drivers"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cuda_executor\.cc:\d+\] .*(NUMA|cuInit)"
    r"|cpu_feature_guard\.cc:\d+\]"
    r"|^To enable the following instructions: .* rebuild TensorFlow"
    r"|All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|oneDNN custom operations are on"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|INFO tensorflow: Collective all_reduce tensors: "
)


def verbose() -> bool:
    """Whether the user asked for every line (``TRAINYARD_VERBOSE=1``)."""
    from trainyard.settings import get_settings

    return get_settings().verbose


def is_noise(line: str) -> bool:
    """Whether a child's output line is known TensorFlow start-up noise (never when verbose)."""
    return not verbose() and _TF_NOISE.search(line) is not None


def quiet_libraries() -> None:
    """Lower the :data:`NOISY_LOGGERS` to WARNING (unless verbose)."""
    if verbose():
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
