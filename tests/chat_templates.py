"""Chat templates of tool-calling models, written out for the tiny test tokenizers.

`QWEN25_TOOLS` renders tools, tool calls and tool results as Qwen2.5's template does (ChatML, a
`# Tools` system block, `<tool_call>` blocks, results as `<tool_response>` in a user turn).
`QWEN3_DROP_THINK` is the same with Qwen3's history rule: an assistant message before the last
user message loses its `<think>...</think>` part, so the prompt of a later call is not the
earlier prompt followed by the earlier completion.
"""

_HEAD = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)

_TAIL = (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _messages(assistant_content: str) -> str:
    return (
        "{%- for message in messages %}"
        "{%- if message.role == 'system' and loop.first %}"
        "{%- elif message.role == 'user' or message.role == 'system' %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}"
        + assistant_content
        + "{%- if not message.tool_calls %}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>assistant' }}{%- if content %}{{- '\\n' + content }}{%- endif %}"
        "{%- for call in message.tool_calls %}"
        "{%- set call = call.function if call.function is defined else call %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) "
        "+ '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- elif message.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
    )


QWEN25_TOOLS = _HEAD + _messages("{%- set content = message.content %}") + _TAIL

# Qwen3: the index of the last user message; assistant messages before it keep only what follows `</think>`.
QWEN3_DROP_THINK = (
    _HEAD
    + "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    + _messages(
        "{%- set content = message.content %}"
        "{%- if loop.index0 < ns.last_user and '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
        "{%- endif %}"
    )
    + _TAIL
)
