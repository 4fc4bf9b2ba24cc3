"""The run store (runs, metrics, events) and what feeds it: the writer thread, the metrics
recorder, the repair of a damaged store."""
