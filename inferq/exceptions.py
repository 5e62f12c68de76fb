"""inferq's exceptions: one root, a subclass per thing that can go wrong."""

from __future__ import annotations


class InferqError(Exception):
    """Something went wrong in inferq."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__ or type(self).__name__)

    @property
    def message(self) -> str:
        return str(self.args[0])


class NotFound(InferqError):
    """No such object."""


class ModelNotFound(NotFound):
    """No worker has ever registered a model of that name."""

    code = "model_not_found"
    param = "model"


class InvalidRequest(InferqError):
    """The request is invalid."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.param = param
        self.code = code


class InvalidState(InferqError):
    """The object is not in a state that allows this."""


class JobFailed(InferqError):
    """The request ran and failed; `code` says why (the job keeps its error)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class StoreUnavailable(InferqError):
    """The database could not be reached; try again shortly."""


class SchemaOutdated(InferqError):
    """The database schema is not the one this code needs: run `inferq migrate`."""


class BrokerUnavailable(InferqError):
    """Redis could not be reached; try again shortly."""


class ModelUnavailable(InferqError):
    """A registered model's tokenizer cannot be loaded here."""


class JobsReturned(InferqError):
    """The worker is shutting down and gave these jobs back to the queue unfinished."""


class EngineError(InferqError):
    """The inference engine failed."""


class PreflightFailed(InferqError):
    """This host cannot run the configured engine; the message says which setting to change."""


class EngineStartFailed(EngineError):
    """vLLM's engine did not start."""


class RequestRejected(EngineError):
    """The engine refused one request; the others are unaffected."""


class Unauthorized(InferqError):
    """A valid API key is required: send `Authorization: Bearer <key>`."""


class Forbidden(InferqError):
    """This API key may not do that."""


class TooLarge(InferqError):
    """The request body is too large."""


class RetryLater(InferqError):
    """Too much at once; try again after `retry_after_s` seconds."""

    def __init__(self, message: str, *, retry_after_s: int, code: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.code = code


class QuotaExceeded(RetryLater):
    """This API key's quota is used up for now; try again after `retry_after_s` seconds."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s, code="insufficient_quota")
