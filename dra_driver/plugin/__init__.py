"""The kubelet plugin daemon: prepare/unprepare engine and its wiring."""
