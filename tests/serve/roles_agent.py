"""Two agents sharing the policy in one episode: a solver that answers with the `lookup` tool, then a critic that
reviews its answer. The solver names its role in the `model` field, the critic in the X-Ragen2-Role header
(its `model` is the served model's id), so both ways of giving a role are used; `agent.train_roles=[solver]`
trains the solver's calls only. The reward is the solver's: 1 when its answer holds the looked-up value.
"""

from lookup_agent import TOOLS, _after, first_messages


def play(client, seed: int) -> float:
    messages = first_messages(seed)
    reward = None
    for _ in range(3):
        reply = client.chat.completions.create(model="solver", messages=messages, tools=TOOLS, max_tokens=48)
        reward = _after(messages, reply.choices[0].message)
        if reward is not None:
            break
    review = [{"role": "system", "content": "Answer with the value of key a."},
              {"role": "user", "content": f"Question {seed % 3}: is {messages[-1].get('content')} the value of a?"}]
    client.chat.completions.create(model="policy", messages=review, tools=TOOLS, max_tokens=48,
                                   extra_headers={"X-Ragen2-Role": "critic"})
    return reward or 0.0
