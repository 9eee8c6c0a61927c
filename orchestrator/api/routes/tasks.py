"""`/v1/tasks`: submit, get, list, cancel. Every query is scoped by the caller's tenant."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Response
from pydantic import BeforeValidator, StringConstraints
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError

from orchestrator.api.deps import DbDep, SettingsDep, TenantDep
from orchestrator.api.errors import ProblemError, problem_responses
from orchestrator.api.schemas import TaskDetail, TaskPage, TaskSummary, TranscriptMessage
from orchestrator.api.views import new_task_row, task_detail, task_summary
from orchestrator.db.tables import tasks_t
from orchestrator.metrics import TASKS_SUBMITTED
from orchestrator.tasks.control import request_cancel
from orchestrator.tasks.queries import get_task, list_attempts, list_messages, list_steps, task_goals
from orchestrator.tasks.schemas import ID_PATTERN, TaskCreate, check_text
from orchestrator.tasks.submission import InvalidSubmission, check_allowed_tools, submit_task
from orchestrator.tracing import current_traceparent, task_span, valid_traceparent

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

StatusName = Literal[
    "PENDING", "PREPROCESSING", "READY", "RUNNING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"
]
META_FILTER_PATTERN = r"^[^=]{1,128}=.{0,1024}$"
_META_FILTER = re.compile(r"^([^=]{1,128})=(.{0,1024})$", re.S)
_ID = re.compile(ID_PATTERN)
TaskId = Annotated[str, Path(pattern=ID_PATTERN, description="the task id")]


@router.post(
    "",
    status_code=201,
    response_model=TaskSummary,
    summary="Submit a task",
    responses={
        200: {
            "model": TaskSummary,
            "description": "The task this Idempotency-Key created before (same body)",
        },
        **problem_responses(400, 401, 404, 409, 413, 422),
    },
)
def create_task(
    body: TaskCreate,
    tenant: TenantDep,
    engine: DbDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="same key + same body = same task",
        ),
    ] = None,
    traceparent: Annotated[str | None, Header(description="W3C trace context")] = None,
) -> TaskSummary:
    # The submission is a span of the caller's trace (an invalid traceparent is ignored, W3C), and
    # the task's own trace context is this span: every later span of the task hangs below it.
    with task_span(valid_traceparent(traceparent), "task.submit", {"dayzero.tenant": tenant}) as span:
        tp = current_traceparent() or valid_traceparent(traceparent)
        for attempt in range(2):
            try:
                inserted: dict[str, dict[str, Any]] = {}
                check_allowed_tools(body, settings.known_tools())
                with engine.begin() as conn:
                    task_id, created = submit_task(
                        conn,
                        body,
                        tenant,
                        settings.budgets,
                        settings.blob_dir,
                        idempotency_key=idempotency_key,
                        traceparent=tp,
                        inserted=inserted,
                    )
                    row = (
                        new_task_row(inserted[task_id])
                        if task_id in inserted
                        else get_task(conn, task_id, tenant)
                    )
                break
            except InvalidSubmission as exc:
                title = {404: "Not Found", 409: "Conflict"}.get(exc.status, "Unprocessable Content")
                raise ProblemError(
                    exc.status, title, exc.detail, type_=exc.reason.replace("_", "-")
                ) from None
            except IntegrityError:
                # A concurrent request with the same Idempotency-Key won the insert: the retry finds it.
                if attempt == 1 or idempotency_key is None:
                    raise
        span.set_attribute("dayzero.task_id", task_id)
    TASKS_SUBMITTED.labels("rest", "created" if created else "replayed").inc()
    response.status_code = 201 if created else 200
    if created:
        response.headers["Location"] = f"/v1/tasks/{task_id}"
    return task_summary(row, body.goal)


# Cursor = "<created_at as µs since the epoch>_<task id>": every string the documented pattern
# admits is a valid position, so a schema-valid cursor is never rejected.
CURSOR_PATTERN = r"^[0-9]{1,16}_[A-Za-z0-9._:-]{1,64}$"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _encode_cursor(created_at: dt.datetime, task_id: str) -> str:
    return f"{(created_at - _EPOCH) // dt.timedelta(microseconds=1)}_{task_id}"


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    micros, _, task_id = cursor.partition("_")
    return _EPOCH + dt.timedelta(microseconds=int(micros)), task_id


def _iso_datetime(value: object) -> object:
    # Only ISO 8601 text: pydantic would also take numbers (as Unix times), which the schema does not say.
    # Converted to UTC here, so an instant outside the representable range (year 1 at +14:00,
    # year 9999 at -14:00) is a 422 like any other bad value, not an OverflowError later.
    if isinstance(value, str):
        try:
            return _utc(dt.datetime.fromisoformat(value))
        except (ValueError, OverflowError):
            pass
    raise ValueError("expected an ISO 8601 date-time within years 1-9999 in UTC")


IsoDateTime = Annotated[dt.datetime, BeforeValidator(_iso_datetime)]


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


@router.get(
    "",
    response_model=TaskPage,
    summary="List tasks, newest first",
    responses=problem_responses(401, 422),
)
def list_tasks(
    tenant: TenantDep,
    engine: DbDep,
    status: Annotated[list[StatusName] | None, Query(description="any of these states")] = None,
    created_after: Annotated[IsoDateTime | None, Query(description="inclusive; naive = UTC")] = None,
    created_before: Annotated[IsoDateTime | None, Query(description="exclusive; naive = UTC")] = None,
    metadata: Annotated[
        list[Annotated[str, StringConstraints(pattern=META_FILTER_PATTERN, max_length=1200)]] | None,
        Query(description="`key=value`, repeatable; all must match (values compared as strings)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None, Query(pattern=CURSOR_PATTERN, description="`next_cursor` of the previous page")
    ] = None,
) -> TaskPage:
    q = select(tasks_t).where(tasks_t.c.tenant == tenant)
    if status:
        q = q.where(tasks_t.c.status.in_(status))
    if (after := _utc(created_after)) is not None:
        q = q.where(tasks_t.c.created_at >= after)
    if (before := _utc(created_before)) is not None:
        q = q.where(tasks_t.c.created_at < before)
    for item in metadata or ():
        m = _META_FILTER.match(item)
        try:
            check_text(item, "metadata")
        except ValueError:
            m = None
        if m is None:
            raise ProblemError(
                422,
                "Unprocessable Content",
                f"metadata filter {item!r} is not key=value",
                type_="validation-error",
            )
        q = q.where(tasks_t.c.metadata[m.group(1)].as_string() == m.group(2))
    if cursor:
        c_at, c_id = _decode_cursor(cursor)
        q = q.where(or_(tasks_t.c.created_at < c_at, and_(tasks_t.c.created_at == c_at, tasks_t.c.id < c_id)))
    q = q.order_by(tasks_t.c.created_at.desc(), tasks_t.c.id.desc()).limit(limit + 1)
    with engine.connect() as conn:
        rows = list(conn.execute(q))
        more = len(rows) > limit
        rows = rows[:limit]
        goals = task_goals(conn, [r.id for r in rows])
    nxt = _encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
    return TaskPage(items=[task_summary(r, goals.get(r.id)) for r in rows], next_cursor=nxt)


@router.get(
    "/{task_id}",
    response_model=TaskDetail,
    summary="A task with its steps and their attempts",
    responses=problem_responses(401, 404, 422),
)
def get_one(task_id: TaskId, tenant: TenantDep, engine: DbDep) -> TaskDetail:
    with engine.connect() as conn:
        row = get_task(conn, task_id, tenant)
        goal = task_goals(conn, [task_id]).get(task_id)
        steps = list_steps(conn, task_id)
        attempts = list_attempts(conn, task_id)
    return task_detail(row, goal, steps, attempts)


@router.get(
    "/{task_id}/messages",
    response_model=list[TranscriptMessage],
    summary="A task's transcript so far: its goal, each model turn, each tool result, the answer",
    responses=problem_responses(401, 404, 422),
)
def messages(task_id: TaskId, tenant: TenantDep, engine: DbDep) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        get_task(conn, task_id, tenant)  # another tenant's task is a 404
        return list_messages(conn, task_id)


@router.post(
    "/{task_id}/cancel",
    status_code=202,
    response_model=TaskSummary,
    summary="Cancel a task (now if no runner holds it, else by its runner, interrupting the step in flight)",
    responses=problem_responses(401, 404, 409, 422),
)
def cancel(task_id: TaskId, tenant: TenantDep, engine: DbDep) -> Any:
    with engine.begin() as conn:
        request_cancel(conn, task_id, tenant)
        row = get_task(conn, task_id, tenant)
        goal = task_goals(conn, [task_id]).get(task_id)
    return task_summary(row, goal)
