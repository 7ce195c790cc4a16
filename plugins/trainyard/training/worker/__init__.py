"""Code that runs inside a training worker: tf.data input, models, the fit loop.

Importing this package imports no TensorFlow; ``trainyard.training.worker.input`` and
``trainyard.training.worker.main``'s training path do.
"""

from __future__ import annotations
