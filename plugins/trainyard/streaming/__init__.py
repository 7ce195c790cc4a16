"""Stream scoring: records in, the served champion's scores out (Redis Streams or Kafka).

* :mod:`~trainyard.streaming.engines`: one interface, two back-ends (Redis Streams, Kafka).
* :mod:`~trainyard.streaming.records`: records checked against the dataset's contract.
* :mod:`~trainyard.streaming.scorer`: the scorer (``python -m trainyard score-stream``),
  its local supervised process and its lifecycle.
* :mod:`~trainyard.streaming.redis_server`: the embedded default's Redis server.
"""
