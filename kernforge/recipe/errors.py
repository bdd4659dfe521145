"""Typed errors of the recipe layer.

Every rejection names the feature or field at fault, so that a client sees *why*
its request failed instead of getting a silently different prompt.
"""
import json


class RecipeError(Exception):
    """Base class of every error this package raises on purpose."""


class ConversionError(RecipeError):
    """A protocol request is invalid or cannot be converted.

    `status_code` and `body` carry the HTTP answer a server should send, in the
    OpenAI error shape, so an HTTP layer need not re-map messages.
    """

    status_code = 400

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def body(self) -> str:
        return json.dumps({"error": {"message": self.message, "type": "invalid_request_error",
                                     "param": self.param, "code": "invalid_request_error"}})


class UnsupportedFeatureError(ConversionError):
    """The request asks for a feature this layer cannot honour (for example `n>1`).

    Raised instead of ignoring the field: a dropped setting would give the client
    a different answer than it asked for.
    """

    def __init__(self, feature: str, detail: str = ""):
        self.feature = feature
        msg = f"unsupported feature: {feature}" + (f" ({detail})" if detail else "")
        super().__init__(msg, param=feature)


class InvalidArgumentError(RecipeError, ValueError):
    """A bad value given to the Python API directly (a `Conversation`, `ToolDefinition`,
    option or chunk built by the caller, not a request body).

    A `RecipeError`, so one `except RecipeError` catches everything this package raises
    on purpose, and a `ValueError`, so code written against the plain exception keeps
    working.  Request bodies never reach these checks unvalidated: their values are
    checked first and rejected as `ConversionError` (HTTP 400)."""


class InvalidTypeError(RecipeError, TypeError):
    """A value of the wrong type given to the Python API directly (also a `TypeError`)."""


class ImageError(RecipeError):
    """An image could not be decoded or preprocessed."""

    def __init__(self, kind: str, message: str, *, is_retryable: bool = False):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.is_retryable = is_retryable


class StreamStateError(RecipeError, RuntimeError):
    """A stream processor was used after it finished or was closed."""
