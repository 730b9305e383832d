from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import Executable

from san_common.jobs import registry
from san_common.models import AsyncJob

P = TypeVar("P")
R = TypeVar("R")
H = TypeVar("H", bound=type)

# The attribute `handles` sets on the class it marks (in the class's own namespace, so a
# subclass of a handler is not one by inheritance).
_MARK = "__san_handles__"


@dataclass(frozen=True)
class Write:
    """A job's results as one SQL statement and its parameters. `statement` is the same
    object for every job of the type (a module constant with bind parameters): the runtime
    runs the writes of a completion batch that share it as one executemany."""

    statement: Executable
    params: Mapping[str, Any]


class JobHandler(Protocol[P, R]):
    """One job type's work, split so the runtime can place the transactions:

    - `load` reads what the job needs (short transaction) and returns the payload `P`. A
      handler whose job row (the claim returns it) is all it needs keeps this class's
      `load`: the runtime then opens no transaction for it and `run` gets None;
    - `run` makes the external call(s) with **no** transaction open, returning `R`;
    - `store` writes the results in the transaction that marks the job COMPLETED. A
      handler whose results are one statement returns it from `write` instead and keeps
      this class's `store`: the jobs completing together then share one executemany
      instead of a round trip each.

    Raise `PermanentJobError` / `TransientJobError` (san_common.errors) to steer retries;
    any other exception from `run` fails the job with its cause chain. A failure may carry
    a `checkpoint` (a JSON object): the runtime keeps it on the job, and the next try finds
    it in `job.checkpoint` (card analysis keeps a successful chat answer this way).

    Handlers never write the job's status, nor the mirrored status of its target row: the
    runtime does, from the job type's registry entry (san_common.jobs.registry).
    """

    job_type: ClassVar[str]

    async def load(self, session: AsyncSession, job: AsyncJob) -> P:
        # Not abstract: a handler without a load of its own must still be instantiable.
        raise TypeError(f"{type(self).__name__} has no load; the runtime does not call it")

    async def run(self, job: AsyncJob, payload: P) -> R: ...

    def write(self, job: AsyncJob, result: R) -> Write:
        raise TypeError(f"{type(self).__name__} has neither store nor write")

    async def store(self, session: AsyncSession, job: AsyncJob, result: R) -> None:
        write = self.write(job, result)
        # Core, not the ORM session: an ORM UPDATE would synchronise the session's objects.
        connection = await session.connection()
        await connection.execute(write.statement, write.params)


def needs_load(handler: JobHandler[Any, Any]) -> bool:
    """Whether `handler` reads anything beyond its job row (its class overrides `load`)."""
    return getattr(type(handler), "load", JobHandler.load) is not JobHandler.load


def writes_one_statement(handler: JobHandler[Any, Any]) -> bool:
    """Whether `handler`'s results are its `write` (its class keeps this class's `store`)."""
    return getattr(type(handler), "store", JobHandler.store) is JobHandler.store


def handles(job_type: str) -> Callable[[H], H]:
    """Marks a handler class as the one that runs `job_type` (and sets its `job_type`);
    the worker that consumes the type finds it with `collect`."""

    def mark(cls: H) -> H:
        cls.job_type = str(job_type)  # type: ignore[attr-defined]  # a JobHandler's
        setattr(cls, _MARK, str(job_type))
        return cls

    return mark


def collect(module: str, *, consumer: str, **resources: object) -> dict[str, JobHandler[Any, Any]]:
    """One instance of every class marked `@handles` in `module` (a package: in each of its
    modules), keyed by job type. Each is built from the `resources` its constructor names
    (`ai`, `github`, …); a class that names a resource given as None is left out (a test
    harness without GitHub access serves the other types). Every type collected must be
    `consumer`'s in the registry, and have one handler."""
    handlers: dict[str, JobHandler[Any, Any]] = {}
    for cls in _marked(importlib.import_module(module)):
        job_type = cls.__dict__[_MARK]
        if registry.spec_for(job_type).consumer != consumer:
            raise ValueError(
                f"{cls.__qualname__} runs {job_type}, which {consumer} does not consume"
            )
        if job_type in handlers:
            raise ValueError(f"{job_type} has two handlers in {module}")
        needed = {name: resources[name] for name in _parameters(cls)}
        if all(value is not None for value in needed.values()):
            handlers[job_type] = cls(**needed)
    return handlers


def _parameters(cls: type) -> list[str]:
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(cls).parameters.values() if p.kind in named]


def _marked(package: ModuleType) -> Iterator[type]:
    modules = [package]
    if hasattr(package, "__path__"):
        prefix = package.__name__ + "."
        modules += [
            importlib.import_module(m.name) for m in pkgutil.iter_modules(package.__path__, prefix)
        ]
    for module in modules:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and _MARK in value.__dict__
            ):
                yield value
