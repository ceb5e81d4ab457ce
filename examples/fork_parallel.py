"""Fork and join: expand several points in parallel branches that share the prompt's prefix
(the runtime computes that prefix once and reuses it from its radix cache).

    python examples/fork_parallel.py
"""
from __future__ import annotations

import sgdsl as sgl


@sgl.function
def tips(s, topic: str):
    s += f"Here are two tips for {topic}: 1. Sleep well. 2. Eat healthy.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Explain tip {i + 1} in one sentence:" + sgl.gen("detail", max_tokens=12, stop="\n")
    forks.join()
    s += "Tip 1: " + forks[0]["detail"] + "\n"
    s += "Tip 2: " + forks[1]["detail"] + "\n"
    s += "In summary," + sgl.gen("summary", max_tokens=12, stop="\n")


def main() -> None:
    state = tips.run(topic="staying healthy", temperature=0.0)
    print(state.text())


if __name__ == "__main__":
    main()
