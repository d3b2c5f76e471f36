"""The lookup task (`lookup_agent.py`: what is the value of key a? one tool, `lookup(key)`) written with agent
frameworks nobody here wrote, as their users write agents: the OpenAI Agents SDK (Responses and chat models,
streamed or not), smolagents, and LangGraph over langchain-openai. Each function is an `agent.entrypoint`: it
points the framework at the client's base URL and returns 1.0 when the final answer holds the value.

Nothing may reach the network: the Agents SDK's tracing is off, LangSmith's too, and every client here talks
only to the endpoint the run gives.
"""

import os

from agents import (Agent, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool,
                    set_tracing_disabled)
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from smolagents import OpenAIServerModel, ToolCallingAgent
from smolagents import tool as smolagents_tool

import lookup_agent

set_tracing_disabled(True)
os.environ["LANGSMITH_TRACING"] = "false"

INSTRUCTIONS = lookup_agent.first_messages(0)[0]["content"]
MAX_TOKENS = 48


def question(seed: int) -> str:
    return lookup_agent.first_messages(seed)[1]["content"]


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: The key to look up.
    """
    return lookup_agent.TABLE.get(key, "unknown")


def reward(answer: object) -> float:
    return 1.0 if lookup_agent.TABLE["a"] in str(answer) else 0.0


# The OpenAI Agents SDK. Its provider makes the Responses model by default, the chat completions one with
# use_responses=False; the endpoint's client is the one every call goes through.
agent = Agent(name="lookup", instructions=INSTRUCTIONS, tools=[function_tool(lookup)],
              model_settings=ModelSettings(max_tokens=MAX_TOKENS))


def _run_config(client, use_responses: bool) -> RunConfig:
    return RunConfig(model="policy", model_provider=OpenAIProvider(openai_client=client, use_responses=use_responses))


async def _agents_sdk(client, seed: int, use_responses: bool, streamed: bool) -> float:
    """One run; an agent that keeps calling tools, or whose reply was cut at the token cap (the SDK raises on an
    `incomplete` response, as it would with OpenAI's), failed the task. An HTTP error is not caught."""
    config = _run_config(client, use_responses)
    try:
        if not streamed:
            return reward((await Runner.run(agent, question(seed), max_turns=3, run_config=config)).final_output)
        result = Runner.run_streamed(agent, question(seed), max_turns=3, run_config=config)
        async for _ in result.stream_events():
            pass
        return reward(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError):
        return 0.0


async def agents_sdk_responses(client, seed: int) -> float:
    return await _agents_sdk(client, seed, use_responses=True, streamed=False)


async def agents_sdk_responses_streamed(client, seed: int) -> float:
    return await _agents_sdk(client, seed, use_responses=True, streamed=True)


async def agents_sdk_chat(client, seed: int) -> float:
    return await _agents_sdk(client, seed, use_responses=False, streamed=False)


async def agents_sdk_chat_streamed(client, seed: int) -> float:
    return await _agents_sdk(client, seed, use_responses=False, streamed=True)


def smolagents_tool_calling(client, seed: int) -> float:
    """A ToolCallingAgent: it acts through tool calls only, so an answer in text is a parsing error it shows the
    model; after `max_steps` it asks the model for the final answer (one more call). Its own system prompt, a
    worked example of tool use (2,800 tokens with the tiny policy's tokenizer), is replaced by the task's: the
    tools reach the model through `tools=` anyway."""
    model = OpenAIServerModel(model_id="policy", api_base=str(client.base_url), api_key=client.api_key,
                              client_kwargs={"max_retries": 0}, max_tokens=MAX_TOKENS)
    agent = ToolCallingAgent(tools=[smolagents_tool(lookup)], model=model, max_steps=2, verbosity_level=-1)
    agent.prompt_templates["system_prompt"] = f"{INSTRUCTIONS} Look it up, then call final_answer."
    return reward(agent.run(question(seed)))


def langgraph_react(client, seed: int) -> float:
    """A ReAct graph in LangGraph (the model, then its tool calls, until it answers) over langchain-openai's
    ChatOpenAI, which talks chat completions."""
    tools = [langchain_tool(lookup)]
    model = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0,
                       max_tokens=MAX_TOKENS).bind_tools(tools)
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke([("system", INSTRUCTIONS), *state["messages"]])]})
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    try:
        state = graph.compile().invoke({"messages": [("user", question(seed))]}, {"recursion_limit": 6})
    except GraphRecursionError:  # the model kept calling tools: the task failed
        return 0.0
    return reward(state["messages"][-1].content)
