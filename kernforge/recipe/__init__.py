"""kernforge.recipe: the protocol layer for DeepSeek V4 and V4.1.

Chat Completions, Responses and Anthropic Messages requests convert into one
`Conversation`; `DeepseekV4Encoding` / `DeepseekV41Encoding` render it; the
`StreamProcessor` parses raw model output back into each API's events. The
public names mirror deepseek-recipe, so switching is a one-import change.
"""
from .anthropic_out import MessagesChunkGenerator, MessagesResponse, MessagesStreamEvent
from .chat_out import ChatCompletionChunk, ChatCompletionChunkGenerator, ChatCompletionResponse
from .conversation import (AssistantMessage, BytesImageSource, Conversation, DataUrlImageSource,
                           DeveloperMessage, ImageSource, LatestReminderMessage, Message, SystemMessage,
                           ToolCall, ToolDefinition, ToolMessage, UrlImageSource, UserMessage)
from .encoding_v4 import DeepseekV4Encoding
from .encoding_v41 import DeepseekV41Encoding
from .errors import (ConversionError, ImageError, InvalidArgumentError, InvalidTypeError, RecipeError,
                     StreamStateError, UnsupportedFeatureError)
from .options import (ConversationRequest, ConversionOptions, InferenceOptions, ModelVersion,
                      OutputConstraint, ParsingOptions, ReasoningContentBehavior,
                      ThinkingInitialStage, WebSearchBehavior)
from .parser import OutputParser, ParsedOutput, ParsedToolCall, ParseIssue, parse_output
from .rendering import RenderedPrompt
from .requests import ChatCompletionRequest, MessagesRequest, ResponsesRequest
from .responses_out import ResponsesChunkGenerator, ResponsesResponse, ResponsesStreamEvent
from .stream import InferenceChunk, InferenceFinishReason, PromptUsage, StreamProcessor
from .tokens import SpecialToken, SpecialTokens

__all__ = [
    "AssistantMessage", "BytesImageSource", "ChatCompletionChunk", "ChatCompletionChunkGenerator",
    "ChatCompletionRequest", "ChatCompletionResponse", "Conversation", "ConversationRequest",
    "ConversionError", "ConversionOptions", "DataUrlImageSource", "DeepseekV41Encoding",
    "DeepseekV4Encoding", "DeveloperMessage", "ImageError", "ImageSource", "InferenceChunk",
    "InvalidArgumentError", "InvalidTypeError",
    "InferenceFinishReason", "InferenceOptions", "LatestReminderMessage", "Message",
    "MessagesChunkGenerator", "MessagesRequest", "MessagesResponse", "MessagesStreamEvent",
    "ModelVersion", "OutputConstraint", "OutputParser", "ParsedOutput", "ParsedToolCall", "ParseIssue", "ParsingOptions", "PromptUsage",
    "ReasoningContentBehavior", "RecipeError", "RenderedPrompt", "ResponsesChunkGenerator",
    "ResponsesRequest", "ResponsesResponse", "ResponsesStreamEvent", "SpecialToken", "SpecialTokens",
    "StreamProcessor", "StreamStateError", "SystemMessage", "ThinkingInitialStage", "ToolCall",
    "ToolDefinition", "ToolMessage", "UnsupportedFeatureError", "UrlImageSource", "UserMessage",
    "WebSearchBehavior", "parse_output",
]
