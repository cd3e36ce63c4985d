"""A stand-in for PulsarAdmin's reads in unit tests of logic that decides from admin answers: each path answers
from a dict (an exception there is raised), a path not in it is NotFound, and every read is recorded."""

from __future__ import annotations

from typing import Any

from pulsar_migration.admin import NotFound


class AnsweringAdmin:
    name = "cluster-b"

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.params: dict[str, dict[str, str] | None] = {}

    def topic_path(self, topic: str) -> str:
        return "/persistent/" + topic.split("://", 1)[1]

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        self.calls.append(path)
        self.params[path] = params
        if path not in self.answers:
            raise NotFound(path)
        answer = self.answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer
