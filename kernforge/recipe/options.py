"""Conversion and parsing options, and the ConversationRequest that conversion returns."""
import enum
from collections.abc import Sequence

from .conversation import Conversation
from .encoding_v4 import DeepseekV4Encoding
from .encoding_v41 import DeepseekV41Encoding
from .errors import ConversionError, InvalidArgumentError
from .tokens import DEFAULT_SPECIAL_TOKENS, SpecialTokens

DEFAULT_MAX_TOKENS_UPPER_BOUND = 393216


class ModelVersion(enum.Enum):
    """The model a request targets; it selects the prompt encoding."""

    DeepseekV4Pro = "deepseek-v4-pro"
    DeepseekV41Flash = "deepseek-v4.1-flash"

    def encoding(self, special_tokens: SpecialTokens = DEFAULT_SPECIAL_TOKENS):
        cls = DeepseekV4Encoding if self is ModelVersion.DeepseekV4Pro else DeepseekV41Encoding
        return cls(special_tokens)


class ReasoningContentBehavior(enum.Enum):
    """What to do when thinking-mode history lacks reasoning that must be passed back."""

    FillEmpty = "fill_empty"
    Reject = "reject"


class WebSearchBehavior(enum.Enum):
    """Web search is a server tool this layer cannot run: drop it or reject it."""

    Drop = "drop"
    Reject = "reject"


class ThinkingInitialStage(enum.Enum):
    """Where parsing starts in thinking mode."""

    ReasoningStart = "reasoning_start"
    ReasoningContinuation = "reasoning_continuation"
    ContentContinuation = "content_continuation"

    def starts_in_reasoning(self) -> bool:
        return self is not ThinkingInitialStage.ContentContinuation


DEFAULT_MODEL_VERSIONS = {"DeepSeek-V4-Pro": ModelVersion.DeepseekV4Pro,
                          "DeepSeek-V4.1-Flash": ModelVersion.DeepseekV41Flash}


class ConversionOptions:
    """Options for request conversion; `with_*` methods return changed copies."""

    __slots__ = ("default_thinking_mode", "reasoning_content_behavior", "responses_web_search",
                 "messages_web_search", "thinking_max_tokens_upper_bound",
                 "non_thinking_max_tokens_upper_bound", "special_tokens", "model_versions_by_name")

    def __init__(self, *, default_thinking_mode: bool = True,
                 reasoning_content_behavior: ReasoningContentBehavior = ReasoningContentBehavior.FillEmpty,
                 responses_web_search: WebSearchBehavior = WebSearchBehavior.Drop,
                 messages_web_search: WebSearchBehavior = WebSearchBehavior.Reject,
                 thinking_max_tokens_upper_bound: int = DEFAULT_MAX_TOKENS_UPPER_BOUND,
                 non_thinking_max_tokens_upper_bound: int = DEFAULT_MAX_TOKENS_UPPER_BOUND,
                 special_tokens: SpecialTokens = DEFAULT_SPECIAL_TOKENS,
                 model_versions_by_name: dict | None = None):
        for name, bound in (("thinking_max_tokens_upper_bound", thinking_max_tokens_upper_bound),
                            ("non_thinking_max_tokens_upper_bound", non_thinking_max_tokens_upper_bound)):
            if not isinstance(bound, int) or bound < 1:
                raise InvalidArgumentError(f"{name} must be a positive int, got {bound!r}")
        self.default_thinking_mode = bool(default_thinking_mode)
        self.reasoning_content_behavior = ReasoningContentBehavior(reasoning_content_behavior)
        self.responses_web_search = WebSearchBehavior(responses_web_search)
        self.messages_web_search = WebSearchBehavior(messages_web_search)
        self.thinking_max_tokens_upper_bound = thinking_max_tokens_upper_bound
        self.non_thinking_max_tokens_upper_bound = non_thinking_max_tokens_upper_bound
        self.special_tokens = special_tokens
        self.model_versions_by_name = dict(model_versions_by_name or DEFAULT_MODEL_VERSIONS)

    def _copy(self, **changes):
        kw = {k: getattr(self, k) for k in self.__slots__}
        kw.update(changes)
        return ConversionOptions(**kw)

    def with_default_thinking_mode(self, value: bool):
        return self._copy(default_thinking_mode=value)

    def with_reasoning_content_behavior(self, value):
        return self._copy(reasoning_content_behavior=value)

    def with_responses_web_search(self, value):
        return self._copy(responses_web_search=value)

    def with_messages_web_search(self, value):
        return self._copy(messages_web_search=value)

    def with_special_tokens(self, value: SpecialTokens):
        return self._copy(special_tokens=value)

    def with_thinking_max_tokens_upper_bound(self, value: int):
        return self._copy(thinking_max_tokens_upper_bound=value)

    def with_non_thinking_max_tokens_upper_bound(self, value: int):
        return self._copy(non_thinking_max_tokens_upper_bound=value)

    def with_model_alias(self, model: str, model_version: ModelVersion):
        """Accept `model` as another name of `model_version`."""
        table = dict(self.model_versions_by_name)
        table[model] = ModelVersion(model_version)
        return self._copy(model_versions_by_name=table)

    def with_model_versions_by_name(self, table: dict):
        return self._copy(model_versions_by_name={k: ModelVersion(v) for k, v in table.items()})

    def resolve_model(self, model: str) -> ModelVersion:
        try:
            return self.model_versions_by_name[model]
        except KeyError:
            names = ", ".join(self.model_versions_by_name)
            raise ConversionError(f"The supported API model names are {names}, but you passed {model}.",
                                  param="model") from None


class OutputConstraint:
    """What constrained decoding would enforce: kind json/regex/tool_call/tool_call_required.

    `schema` is compact JSON (or the regex); it may be built on first read, since
    only backends that apply constrained decoding need it.
    """

    __slots__ = ("kind", "_schema", "_build")

    def __init__(self, kind: str, schema: str | None = None, *, build=None):
        if (schema is None) == (build is None):
            raise InvalidArgumentError("give exactly one of schema and build")
        self.kind, self._schema, self._build = kind, schema, build

    @property
    def schema(self) -> str:
        if self._schema is None:
            self._schema = self._build()
            self._build = None
        return self._schema

    def __repr__(self):
        return f"OutputConstraint({self.kind!r}, {self.schema[:40]!r})"


class InferenceOptions:
    """Sampling settings resolved from the request.

    In thinking mode the model samples at temperature 1.0 and top_p 1.0 whatever
    the request says; the requested values stay visible in `requested_temperature`
    and `requested_top_p` instead of vanishing.
    """

    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "output_constraint",
                 "requested_temperature", "requested_top_p", "logprobs", "top_logprobs")

    def __init__(self, *, max_tokens=None, temperature=1.0, top_p=1.0, seed=None,
                 output_constraint=None, requested_temperature=None, requested_top_p=None):
        self.max_tokens, self.temperature, self.top_p, self.seed = max_tokens, temperature, top_p, seed
        self.output_constraint = output_constraint
        self.requested_temperature, self.requested_top_p = requested_temperature, requested_top_p
        self.logprobs, self.top_logprobs = False, None


class ParsingOptions:
    """How to parse model output for one request."""

    __slots__ = ("parse_tool_calls", "starts_in_tool_calls", "parse_json_output",
                 "thinking_initial_stage", "_stop", "special_tokens")

    def __init__(self, *, parse_tool_calls: bool = True, starts_in_tool_calls: bool = False,
                 parse_json_output: bool = False,
                 thinking_initial_stage: ThinkingInitialStage | None = None,
                 stop_sequences: Sequence[str] | None = None,
                 special_tokens: SpecialTokens | None = None):
        self.parse_tool_calls = bool(parse_tool_calls)
        self.starts_in_tool_calls = bool(starts_in_tool_calls)
        self.parse_json_output = bool(parse_json_output)
        self.thinking_initial_stage = thinking_initial_stage
        self.stop_sequences = stop_sequences or []
        self.special_tokens = special_tokens or DEFAULT_SPECIAL_TOKENS

    @property
    def stop_sequences(self) -> list[str]:
        return list(self._stop)

    @stop_sequences.setter
    def stop_sequences(self, value):
        value = [value] if isinstance(value, str) else list(value)
        if value and any(not isinstance(s, str) or not s for s in value):
            raise InvalidArgumentError("stop sequences must be non-empty strings")
        self._stop = value


class ConversationRequest:
    """A converted request: conversation, model version, inference and parsing options."""

    __slots__ = ("conversation", "model_version", "inference_options", "parsing_options", "stream",
                 "model", "echo", "namespace_tool_map")

    def __init__(self, conversation: Conversation, model_version: ModelVersion, *,
                 inference_options: InferenceOptions | None = None,
                 parsing_options: ParsingOptions | None = None, stream: bool = False,
                 model: str = "", echo=None, namespace_tool_map=None):
        self.conversation = conversation
        self.model_version = model_version if type(model_version) is ModelVersion else ModelVersion(model_version)
        self.inference_options = inference_options or InferenceOptions()
        self.parsing_options = parsing_options or ParsingOptions()
        self.stream = stream
        self.model = model
        self.echo = echo
        self.namespace_tool_map = namespace_tool_map or {}

    def encoding(self):
        return self.model_version.encoding()

    def resolve_max_tokens(self, prompt_tokens: int, context_limit: int) -> int:
        """The max_tokens to send: requested, else a mode default, capped by the context left."""
        requested = self.inference_options.max_tokens
        if requested is not None:
            if prompt_tokens + requested > context_limit:
                raise ConversionError(
                    f"prompt ({prompt_tokens} tokens) plus max_tokens ({requested}) exceeds the "
                    f"context limit ({context_limit})", param="max_tokens")
            return requested
        if prompt_tokens > context_limit:
            raise ConversionError(f"prompt ({prompt_tokens} tokens) exceeds the context limit "
                                  f"({context_limit})", param="messages")
        conv = self.conversation
        if not conv.thinking_mode:
            default = 8192
        elif conv.reasoning_effort == "max":
            default = 131072
        else:
            default = 65536
        return max(1, min(default, context_limit - prompt_tokens))
