"""The router's OpenAPI document, with the request bodies its routes parse by hand (for clients, fuzzers)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"


def document_request_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """Make `app.openapi()` describe the JSON body of each `POST path` as its pydantic model's schema.

    The routes read the raw body themselves (size limit first, then parsing, then the OpenAI error shape),
    so FastAPI cannot see the models; this puts them back into the document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        _, defs = models_json_schema([(m, "validation") for m in bodies.values()], ref_template=REF)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        for path, model in bodies.items():
            doc["paths"][path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
            }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
