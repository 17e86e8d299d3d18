"""Errors as the OpenAI API returns them: an HTTP status and `{"error": {...}}`."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The shape of every error the server sends (also the OpenAPI document's)."""

    error: ErrorObject


class ApiError(Exception):
    """A request the server answers with an error; `body()` is the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the field's name in the API
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        error = ErrorObject(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=error).model_dump()


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type="server_error")


def unavailable(message: str, retry_after: int | None = None) -> ApiError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return ApiError(503, message, type="server_error", code="unavailable", headers=headers)
