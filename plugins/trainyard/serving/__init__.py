"""CPU serving: deploy a version to a TF-Serving-compatible server, and that server.

:mod:`~trainyard.serving.deploy` publishes, waits, smoke-tests and rolls back (and runs the
laptop's server as a process); :mod:`~trainyard.serving.client` speaks TF Serving's REST
API; :mod:`~trainyard.serving.server` is the laptop's stand-in for TF Serving. Where a
model is served is resolved once per runner: :func:`trainyard.settings.serving_endpoint`.
"""
