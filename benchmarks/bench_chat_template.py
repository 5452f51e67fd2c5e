"""Chat-template rendering: the bounded sandbox against Jinja's plain sandbox, same run.

The bounds of :mod:`llama_cffi.template_sandbox` (size checks before size-multiplying
operations, counted output, memory, ``range`` items, macro depth, and a watchdog for
time) cost something per render. This times one render of a ChatML-style template (a
loop, string concatenation, a filter) over a chat of ``--messages`` messages, with
``apply_jinja`` (bounded; compiled templates cached) and with a template compiled once
in Jinja's ``ImmutableSandboxedEnvironment`` (no bounds), interleaved, and prints the
medians and the difference (the issue's budget: below 1 ms for a 10-message chat).

    python benchmarks/bench_chat_template.py [--rounds 2000] [--messages 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=10)
    args = ap.parse_args(argv)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from llama_cffi.chat import apply_jinja

    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 20}
        for i in range(args.messages)
    ]
    plain_tpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(TEMPLATE)

    def plain() -> str:
        return str(plain_tpl.render(messages=msgs, add_generation_prompt=True))

    def bounded() -> str:
        return apply_jinja(TEMPLATE, msgs)

    if plain() != bounded():
        print("the two renders differ", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {"plain": [], "bounded": []}
    for _ in range(args.rounds):
        for name, f in (("plain", plain), ("bounded", bounded)):
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    p = statistics.median(times["plain"]) * 1e6
    b = statistics.median(times["bounded"]) * 1e6
    print(f"{args.messages} messages, {args.rounds} interleaved rounds, medians:")
    print(f"  plain sandbox (compiled once)  {p:8.1f} us")
    print(f"  bounded (apply_jinja)          {b:8.1f} us")
    print(f"  overhead                       {b - p:8.1f} us (budget 1000 us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
