"""Code that runs inside a training worker: tf.data input, models, the fit loop.

Importing this package imports no TensorFlow; ``trainyard.trainer.input`` and
``trainyard.trainer.worker``'s training path do.
"""

from __future__ import annotations
