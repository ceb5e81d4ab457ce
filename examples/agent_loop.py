"""A tiny tool-using agent loop: the model picks an action with ``select``, the program runs
the tool in Python and feeds the observation back, until the model chooses to answer.

    python examples/agent_loop.py
"""
from __future__ import annotations

import sgdsl as sgl

TOOLS = {
    "calculator": lambda arg: str(eval(arg, {"__builtins__": {}}, {})),  # digits and + - * / only
    "lookup": lambda arg: {"france": "Paris", "japan": "Tokyo"}.get(arg.strip().lower(), "unknown"),
}


@sgl.function
def agent(s, question: str, max_steps: int = 3):
    s += sgl.system("You solve tasks with tools: calculator (arithmetic) and lookup (capital "
                    "of a country). Then you answer.")
    s += sgl.user(question)
    for step in range(max_steps):
        s += sgl.assistant_begin()
        s += "Action: " + sgl.select(f"action_{step}", choices=["calculator", "lookup", "answer"])
        action = s[f"action_{step}"]
        if action == "answer":
            s += "\nAnswer:" + sgl.gen("answer", max_tokens=16, stop="\n")
            s += sgl.assistant_end()
            return
        s += "\nInput: " + sgl.gen(f"input_{step}", max_tokens=12, stop="\n",
                                   regex=r"[0-9+*/ -]+" if action == "calculator" else r"[A-Za-z ]+")
        s += sgl.assistant_end()
        try:
            observation = TOOLS[action](s[f"input_{step}"])
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation too
            observation = f"error: {exc}"
        s += sgl.user(f"Observation: {observation}")
    s += sgl.assistant("Answer:" + sgl.gen("answer", max_tokens=16, stop="\n"))


def main() -> None:
    state = agent.run(question="What is 12 * 7?", temperature=0.0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")


if __name__ == "__main__":
    main()
