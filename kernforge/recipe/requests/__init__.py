"""Conversion-only re-exports, so `from .requests import ChatCompletionRequest` reads well."""
from .chat import ChatCompletionRequest
from .messages import MessagesRequest
from .responses import ResponsesRequest

__all__ = ["ChatCompletionRequest", "MessagesRequest", "ResponsesRequest"]
