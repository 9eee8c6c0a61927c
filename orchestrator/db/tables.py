"""The Core `Table` handles of the models, for the hand-written statements of the write path."""

from __future__ import annotations

from orchestrator.db.models import ApiKey, Attachment, Event, Message, RelayCursor, StepAttempt, Task

tasks_t = Task.__table__
attempts_t = StepAttempt.__table__
messages_t = Message.__table__
events_t = Event.__table__  # the task's history: outbox events, step outcomes, messages
attachments_t = Attachment.__table__
api_keys_t = ApiKey.__table__
relay_cursors_t = RelayCursor.__table__
