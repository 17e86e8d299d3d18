"""The OpenAPI document of `tr serve` (/openapi.json, read by /docs, client generators and API
fuzzers). The routes parse their bodies themselves (off the event loop, with OpenAI-shaped
errors), so FastAPI cannot see the request models: they are added here from schema.py, the one
source of the bodies' rules, with the error shape every refusal uses."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from .errors import ErrorResponse
from .schema import ChatCompletionRequest, CompletionRequest

REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest)

_ERROR_STATUSES = {
    400: "The request is malformed or asks for what tr does not do (the message says which field).",
    401: "An API key is set and the request did not send it.",
    404: "No such model or route.",
    408: "The request body stopped arriving.",
    413: "The request body is over the size limit.",
    429: "The queue is full; retry after the Retry-After header's seconds.",
    503: "The server is shutting down.",
}
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": text} for status, text in _ERROR_STATUSES.items()
}


def request_body(model: type[BaseModel]) -> dict:
    """A route's `openapi_extra`: its JSON body is `model`."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def use_document(app: FastAPI, description: str) -> None:
    """Serve the document built from the routes, with the request models among its schemas."""

    def document() -> dict:
        if app.openapi_schema is None:
            built = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
            for path in built["paths"].values():  # every error is an ErrorResponse: no FastAPI 422s here
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = built.setdefault("components", {}).setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for model in REQUEST_MODELS:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = built
        return app.openapi_schema

    app.openapi = document  # FastAPI's documented way to extend the generated document
