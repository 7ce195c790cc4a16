"""Stream scoring: records in, the served champion's scores out (Redis Streams or Kafka).

* :mod:`~trainyard.streaming.engines`: one interface, two back-ends (Redis Streams, Kafka).
* :mod:`~trainyard.streaming.redis_client`: redis-py clients whose every call has a deadline.
* :mod:`~trainyard.streaming.records`: records checked against the dataset's contract.
* :mod:`~trainyard.streaming.model_endpoint`: the served model, ``:predict`` on its version.
* :mod:`~trainyard.streaming.scorer`: the scoring loop (read, check, score, commit).
* :mod:`~trainyard.streaming.score_stream`: ``python -m trainyard score-stream``.
* :mod:`~trainyard.streaming.supervisor`: restarts a scorer that dies or hangs.
* :mod:`~trainyard.streaming.local_scorer`: a pipeline's detached scorer and its pid file.
* :mod:`~trainyard.streaming.redis_server`: the embedded default's Redis server.
"""
