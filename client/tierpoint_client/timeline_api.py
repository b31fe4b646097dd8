"""The requests of a run's timeline (docs/api.md, "A run's timeline"): roll back, list the
branches, fork a job, give a checkpoint a health verdict, ask for its lineage. A part of `Api`,
kept apart because it is one concept of the API with its own shapes (`timeline.py`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tierpoint_client.models import Checkpoint
from tierpoint_client.timeline import (
    Branches,
    CheckpointRef,
    Fork,
    Lineage,
    Rollback,
    Verdict,
    value_json,
)
from tierpoint_client.transport import Transport


def job_path(job: str) -> str:
    return quote(job, safe="")


class TimelineApi:
    """Thread-safe as `Api` is: every call opens its own HTTP request."""

    _http: Transport

    def rollback(
        self, job: str, step: int, *, from_branch: int | None = None, reason: str | None = None
    ) -> Rollback:
        """Go back to `step` of the job's timeline: a new branch starts from it, and the steps
        after it (superseded, still listed and restorable by branch) can be saved again.
        `from_branch`: the branch the caller loaded from; if another rollback changed it since,
        ConflictError `rollback_conflict` names the winner. The same rollback again answers the
        branch it made (`created` false)."""
        body: dict[str, Any] = {"step": int(step)}
        if from_branch is not None:
            body["from_branch"] = int(from_branch)
        if reason is not None:
            body["reason"] = reason
        resp = self._http.request("POST", f"/v1/jobs/{job_path(job)}/rollback", body=body)
        return Rollback.from_json(resp.body)

    def branches(self, job: str) -> Branches:
        """The job's branches and which one is current (NotFoundError `job_not_found` for a job
        that never registered a checkpoint nor was forked)."""
        resp = self._http.request("GET", f"/v1/jobs/{job_path(job)}/branches")
        return Branches.from_json(resp.body)

    def fork(self, job: str, parent: CheckpointRef) -> Fork:
        """Start `job` from another job's checkpoint (`parent.branch` 1 names the step as that
        job's timeline sees it). The new job's first load reads the parent's copy where it is;
        its first checkpoint records the parent as its parent."""
        ref: dict[str, Any] = {"job": parent.job, "step": int(parent.step)}
        if parent.branch != 1:
            ref["branch"] = parent.branch
        resp = self._http.request("POST", f"/v1/jobs/{job_path(job)}/fork", body={"parent": ref})
        return Fork.from_json(resp.body)

    def give_verdict(
        self,
        job: str,
        step: int,
        verdict: Verdict,
        *,
        metric: str | None = None,
        value: float | None = None,
        at_step: int | None = None,
        detail: str | None = None,
        branch: int | None = None,
    ) -> Checkpoint:
        """Mark a checkpoint good, suspect or bad, with the evidence (what was measured, its
        value, NaN and Inf included, at which training step). `bad` quarantines it: no `latest`
        offers it again. Bad is final (ConflictError `verdict_conflict` for another verdict
        after it); the same verdict again changes nothing. Returns the checkpoint."""
        body: dict[str, Any] = {"verdict": verdict}
        if metric is not None:
            body["metric"] = metric
        if value is not None:
            body["value"] = value_json(value)
        if at_step is not None:
            body["at_step"] = int(at_step)
        if detail is not None:
            body["detail"] = detail
        resp = self._http.request(
            "PUT",
            f"/v1/jobs/{job_path(job)}/checkpoints/{int(step)}/verdict",
            body=body,
            query={"branch": branch},
        )
        return Checkpoint.from_json(resp.body)

    def lineage(
        self, job: str, step: int, *, branch: int | None = None, limit: int | None = None
    ) -> Lineage:
        """The checkpoint's ancestors (parent first, up to the root, across branches and jobs)
        and its descendants (breadth first, at most `limit`)."""
        resp = self._http.request(
            "GET",
            f"/v1/jobs/{job_path(job)}/checkpoints/{int(step)}/lineage",
            query={"branch": branch, "limit": limit},
        )
        return Lineage.from_json(resp.body)
