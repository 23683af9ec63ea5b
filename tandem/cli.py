"""The `tandem` command: a thin dispatcher that imports each subcommand's module only when it runs."""

from __future__ import annotations

import importlib
import sys

from tandem.lifecycle import honour_parent_death

# subcommand -> (module, one-line help). Each module exposes `main(argv: list[str]) -> int | None`.
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("tandem.worker.devtools.model_cli", "model tools (create-tiny)"),
    "generate": ("tandem.worker.devtools.generate", "one-shot completion through the engine"),
    "fetch-model": ("tandem.worker.hf.fetch", "download a Hugging Face model once into a folder pods share"),
    "worker": ("tandem.worker.serve.main", "run a prefill, decode or colocated gRPC worker"),
    "drain": ("tandem.worker.serve.drain_cli", "tell a worker to drain and wait until it holds nothing"),
    "flip": ("tandem.flip_cli", "move warm workers between the prefill and decode pools (SetRole)"),
    "router": ("tandem.worker.router.main", "run the OpenAI-compatible router"),
    "up": ("tandem.operator.local.cli", "run an InferenceService spec as local processes"),
    "bench": ("tandem.loadgen.cli", "load generator for any OpenAI-compatible endpoint"),
    "operator": ("tandem.operator.__main__", "run the Kubernetes operator"),
    "top": (
        "tandem.operator.top.cli",
        "live view of InferenceServices: replicas, TTFT/TPOT vs SLO, attainment",
    ),
    "profile": ("tandem.worker.devtools.profile", "measure a worker's capacity profile for the autoscaler"),
    "simulate": ("tandem.operator.autoscale.sim.cli", "replay a trace against autoscaling policies"),
}


def usage() -> str:
    lines = ["usage: tandem COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    honour_parent_death()
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"tandem: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
