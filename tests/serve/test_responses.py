"""`POST /v1/responses` over loopback with the real `openai` client: string and item input, a function call round,
tools, streaming, and what the route refuses (the tool policy served on loopback)."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

import api_agents
import lookup_agent
from ragen2.serve.chat import prompt_text
from ragen2.serve.responses import request_messages, request_tools
from test_limits import EXACT, prompt_length, user_messages

ASK = {"model": "policy", "instructions": api_agents.INSTRUCTIONS, "tools": api_agents.RESPONSES_TOOLS}


def chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt ids the chat route renders for `messages` with lookup_agent's tool."""
    return tokenizer.encode(prompt_text(tokenizer, messages, lookup_agent.TOOLS), add_special_tokens=False)


def items_of(response: Response) -> list[dict]:
    """A response's output items without their fresh ids (nor the empty `parsed` fields the client's stream helper
    adds), and its status and usage: what two replies sampled alike share."""
    items = [{k: v for k, v in item.to_dict(exclude_none=True).items() if k not in ("id", "call_id")}
             for item in response.output]
    return [items, response.status, response.usage.to_dict()]


def test_items_become_the_chat_messages_they_stand_for():
    """Known answer: a reply's text and the calls after it are one assistant message; outputs are tool messages;
    text parts are joined; instructions come first; the tools take chat's shape."""
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"key": "a"}'}
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": "What is a?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me ", "annotations": []},
                     {"type": "output_text", "text": "look.", "annotations": []}]},
        {**call, "id": "fc_1", "status": "completed"},
        {**call, "call_id": "call_2", "arguments": ""},
        {"type": "function_call_output", "call_id": "call_1", "output": "7"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "3"}]},
        {**call, "call_id": "call_3"},
    ]
    chat_call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}}
    assert request_messages({"instructions": "Answer.", "input": items}) == [
        {"role": "system", "content": "Answer."},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "What is a?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", **chat_call},
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7"},
        {"role": "tool", "tool_call_id": "call_2", "content": "3"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_3", **chat_call}]},
    ]
    assert request_tools(api_agents.RESPONSES_TOOLS) == lookup_agent.TOOLS
    assert request_tools([]) is None and request_tools(None) is None


def test_string_input_is_the_chat_conversation_it_stands_for(served, client):
    endpoint, _, tokenizer = served
    question = lookup_agent.first_messages(0)[1]["content"]
    reply = client.responses.create(**ASK, input=question, temperature=0, store=True, max_output_tokens=48,
                                    extra_body={"return_token_ids": True})
    # instructions + a string input render as the system and user messages of the chat route.
    assert reply.model_extra["prompt_token_ids"] == chat_prompt(tokenizer, lookup_agent.first_messages(0))
    (call,) = reply.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "lookup", {"key": "a"})
    assert call.call_id.startswith("call_") and reply.status == "completed" and reply.output_text == ""
    ids = reply.model_extra["token_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("<tool_call>")
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.total_tokens) == (
        len(reply.model_extra["prompt_token_ids"]), len(ids), len(reply.model_extra["prompt_token_ids"]) + len(ids))
    # Without tools or instructions the reply is a message; the raw JSON is a valid `Response`, not merely one the
    # client's lenient construction accepts.
    raw = client.responses.with_raw_response.create(model="policy", input=question, max_output_tokens=5)
    strict = Response.model_validate(raw.http_response.json())
    (message,) = strict.output
    assert message.type == "message" and message.content[0].type == "output_text"
    assert strict.output_text == message.content[0].text and strict.usage.output_tokens <= 5
    if strict.usage.output_tokens == 5:  # cut at the cap, as OpenAI marks it
        assert strict.status == "incomplete" and strict.incomplete_details.reason == "max_output_tokens"


def test_a_function_call_round_in_items(served, client):
    """The first reply's output items and a function_call_output go back as input; each call's prompt is the one
    the chat route renders for the same conversation."""
    endpoint, _, tokenizer = served
    system = {"type": "message", "role": "developer",
              "content": [{"type": "input_text", "text": api_agents.INSTRUCTIONS}]}
    items = [system, *api_agents.first_input(0)]
    first = client.responses.create(model="policy", input=items, tools=api_agents.RESPONSES_TOOLS, temperature=0)
    (call,) = first.output
    items += first.output
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "7"})
    second = client.responses.create(model="policy", input=items, tools=api_agents.RESPONSES_TOOLS, temperature=0,
                                     extra_body={"return_token_ids": True})
    chat = lookup_agent.first_messages(0) + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "7"}]
    assert second.model_extra["prompt_token_ids"] == chat_prompt(tokenizer, chat)
    assert "<tool_response>\n7\n</tool_response>" in tokenizer.decode(second.model_extra["prompt_token_ids"])
    (message,) = second.output
    assert message.type == "message" and "The value is" in second.output_text
    # The answer (an output_text part) goes back too, with a follow-up question.
    items += second.output
    items.append({"role": "user", "content": [{"type": "input_text", "text": "And b?"}]})
    third = client.responses.create(model="policy", input=items, tools=api_agents.RESPONSES_TOOLS, temperature=0,
                                    extra_body={"return_token_ids": True})
    chat += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And b?"}]
    assert third.model_extra["prompt_token_ids"] == chat_prompt(tokenizer, chat)


def expected_events(response: Response, deltas: int) -> list[str]:
    """The event types of `response` streamed, with `deltas` text deltas for its message."""
    types = ["response.created", "response.in_progress"]
    for item in response.output:
        types.append("response.output_item.added")
        if item.type == "message":
            types += ["response.content_part.added", *["response.output_text.delta"] * deltas,
                      "response.output_text.done", "response.content_part.done"]
        else:
            types += ["response.function_call_arguments.delta", "response.function_call_arguments.done"]
        types.append("response.output_item.done")
    return types + ["response.completed"]


def test_a_streamed_response_is_the_response(served, client):
    """At the same seed, the streamed events (in the order the client's stream state needs them) build the
    response the plain call gives: for a function call, and for a text answer in several deltas."""
    first = client.responses.create(**ASK, input=api_agents.first_input(0), temperature=0)
    answer_input = api_agents.first_input(0) + first.output + [
        {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "7"}]
    events_valid = TypeAdapter(ResponseStreamEvent)
    for items in (api_agents.first_input(0), answer_input):
        ask = {**ASK, "input": items, "max_output_tokens": 48, "extra_body": {"seed": 11}}
        plain = client.responses.create(**ask)
        events = list(client.responses.create(**ask, stream=True))
        for event in events:
            events_valid.validate_python(event.to_dict())
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert [e.type for e in events] == expected_events(plain, len(deltas))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(deltas) == plain.output_text
        assert items_of(events[-1].response) == items_of(plain)
        with client.responses.stream(**ask) as stream:
            final = stream.get_final_response()
        assert items_of(final) == items_of(plain) and final.output_text == plain.output_text
    assert len(deltas) > 1 and "The value is" in "".join(deltas)  # the answer came in pieces


REFUSED = [
    ({"previous_response_id": "resp_1"}, "previous_response_id='resp_1' is not allowed: this endpoint stores no "
     "responses or conversations: send the whole conversation as `input`"),
    ({"conversation": "conv_1"}, "conversation='conv_1' is not allowed: this endpoint stores no responses"),
    ({"input": []}, "`input` must be a string or a non-empty list of input items"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, r"input\[0\].type='item_reference' is not served"),
    ({"input": [{"role": "critic", "content": "hi"}]}, r"input\[0\].role='critic' is not a message role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     r"input\[0\].content must be a string, null or a list of input_text or output_text parts"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "lookup", "arguments": "{"}]},
     r"input\[0\].arguments of lookup are not JSON"),
    ({"input": [{"type": "function_call", "name": "lookup", "arguments": "{}"}]},
     r"input\[0\] must be a function_call with string `call_id`, `name` and `arguments`"),
    ({"input": [{"type": "function_call_output", "output": "7"}]}, r"input\[0\].call_id must be a string"),
    ({"tools": [{"type": "web_search"}]}, r'tools\[0\] must be \{"type": "function", "name": NAME'),
    ({"tools": [{"type": "function", "name": "lookup", "parameters": "key"}]}, r"tools\[0\] must be"),
    ({"max_output_tokens": 0}, "max_output_tokens=0 is not allowed: use an integer >= 1"),
    ({"instructions": 5}, "instructions=5 is not allowed: use a string"),
    ({"stream": "yes"}, "stream='yes' is not allowed: use true or false"),
    ({"store": "yes"}, "store='yes' is not allowed: use true or false"),
]


def test_what_the_responses_route_refuses(served):
    """State the endpoint does not keep, items and tools it cannot serve, fields of the wrong type and a prompt
    over the context: each a 400 naming the field (or both lengths), none reaching the model."""
    endpoint, service, tokenizer = served
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=30)
    for fields, says in REFUSED:
        with pytest.raises(openai.BadRequestError, match=says):
            client.responses.create(**{"model": "policy", "input": "hi", **fields})
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):  # refused before any event is sent
        client.responses.create(model="policy", input="hi", previous_response_id="resp_1", stream=True)
    (message,) = user_messages(tokenizer, 4200)
    with pytest.raises(openai.BadRequestError, match=EXACT.format(prompt_length(tokenizer, [message]))):
        client.responses.create(model="policy", input=message["content"])
    assert service.batcher.batch_sizes == []
