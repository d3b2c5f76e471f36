"""An agent that manages its own context: it works on a question for two calls, asks itself for a note of what
it learned (the call sent as role `memory`), then drops its history and goes on from the note alone. Its next
call's prompt therefore no longer extends the previous one, as with any harness that summarises or truncates.
"""

from lookup_agent import TOOLS, TABLE, _after, first_messages


def play(client, seed: int) -> float:
    messages = first_messages(seed)
    for _ in range(2):
        reply = client.chat.completions.create(model="solver", messages=messages, tools=TOOLS, max_tokens=48)
        if _after(messages, reply.choices[0].message) is not None:
            break
    messages.append({"role": "user", "content": "Write a note of what you know: <memory>note</memory>."})
    note = client.chat.completions.create(model="memory", messages=messages, max_tokens=32).choices[0].message
    fresh = [messages[0], {"role": "user", "content": f"Your note: {note.content or ''}\n{messages[1]['content']}"}]
    reward = None
    for _ in range(2):
        reply = client.chat.completions.create(model="solver", messages=fresh, tools=TOOLS, max_tokens=48)
        reward = _after(fresh, reply.choices[0].message)
        if reward is not None:
            break
    return reward if reward is not None else float(TABLE["a"] in (note.content or ""))
