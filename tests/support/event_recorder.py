"""A processing observer that records what processing reports, for the crash-safety tests."""

from __future__ import annotations

from mf_celldump.processing.observer import ProcessingObserver


class EventRecorder(ProcessingObserver):
    """Records what processing reports: "file" per file, then each step's stages."""

    def __init__(self, on_event=None):
        self.events = []
        self.on_event = on_event

    def _add(self, event):
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def on_file(self):
        self._add("file")

    def on_stage(self, rank, step, stage):
        self._add(stage)
