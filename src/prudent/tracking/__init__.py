"""Experiment trackers (TensorBoard, MLflow, Weights & Biases) that also see prudent's run:
its metrics, config, events and end (see docs/trackers.md).

``settings`` (the ``tracking:`` section), ``base`` (:class:`~prudent.tracking.base.TrackerSink`,
a tracker's contract), ``dispatch`` (the tracking thread), ``component`` (the run's plug),
one module per tracker. Nothing is imported here: a tracker's library loads only when it is
configured.
"""
