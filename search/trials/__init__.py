"""What a trial records and which trials count: the metric, the storage, the workers sharing a study, and
the sweep's rows."""
