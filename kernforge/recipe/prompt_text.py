"""Fixed prompt texts of the V4 family: tool instructions, effort lines, format lines.

They are data of the model's training format and must match byte for byte.
In the tool prompt, `{D}` stands for the DSML token and `{B}`/`{I}`/`{P}` for the
block/invoke/parameter words; `<think>`/`</think>` are special tokens.
"""

TOOL_PROMPT_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. "
    "You can invoke tools by writing a \"<{D}{B}>\" block like the following:\n\n"
    "<{D}{B}>\n"
    "<{D}{I} name=\"$TOOL_NAME\">\n"
    "<{D}{P} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{D}{P}>\n"
    "...\n"
    "</{D}{I}>\n"
    "<{D}{I} name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</{D}{I}>\n"
    "</{D}{B}>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. "
    "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format "
    "and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOL_PROMPT_TAIL = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas "
    "to invoke tool calls.\n"
)

V4_EFFORT = {
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
        "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
        "edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, "
        "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
        "unchecked.\n\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
        "exhaustively decompose the problem into its most fundamental components, trace every causal "
        "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple "
        "angles and are certain that no assumption remains unchecked and no error remains "
        "undiscovered.\n\n"
    ),
}
V4_EFFORT["xhigh"] = V4_EFFORT["high"]
V4_EFFORT["low"] = ""

V41_EFFORT_BUDGET = {"low": 50, "high": 75, "xhigh": 75, "max": 100}
V41_EFFORT_LINE = ("Reasoning Effort: {n} (range 1-100, the higher the value, "
                   "the more thorough the reasoning)\n\n")

SCHEMA_FORMAT = "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
V4_JSON_OBJECT_FORMAT = ("\n\nYou are a helpful assistant designed to output JSON.\n"
                         "## Response Format:\n\nReply with JSON object ONLY.")
