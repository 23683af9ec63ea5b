"""`tandem profile import-dynamo | export-dynamo | compare`: a profile converted from and to Dynamo's profiler
layout, or set beside another; no engine is built (tandem.profile_dynamo, tandem.profile_compare)."""

from __future__ import annotations

import argparse
import sys

from tandem.profile import profile_named, save_profile
from tandem.worker.devtools.profile_args import PROG, int_list


def import_dynamo(argv: list[str]) -> int:
    """`tandem profile import-dynamo DIR -o OUT`: a tandem profile from Dynamo's profiler output."""
    from tandem.profile_dynamo import from_dynamo

    p = argparse.ArgumentParser(prog=f"{PROG} import-dynamo", description=import_dynamo.__doc__)
    p.add_argument(
        "directory", help="a Dynamo profiler result: selected_{prefill,decode}_interpolation/raw_data.npz"
    )
    p.add_argument("-o", "--output", required=True, help="where to write the profile JSON")
    p.add_argument("--model", required=True, help="the model the profile measured (kept in the profile)")
    p.add_argument("--device", required=True, help="the accelerator it ran on, e.g. H200")
    p.add_argument("--dtype", default="fp8")
    p.add_argument(
        "--cold-start-s", type=float, default=60.0, help="pod created to Ready (not in Dynamo's data)"
    )
    p.add_argument("--max-running-sequences", type=int, default=256, help="the engine's max_num_seqs")
    p.add_argument("--note", default="", help="where the data came from and under which licence")
    args = p.parse_args(argv)
    try:
        profile = from_dynamo(
            args.directory,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            cold_start_ms=args.cold_start_s * 1000,
            max_running_sequences=args.max_running_sequences,
            note=args.note,
        )
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"{PROG} import-dynamo: error: {e}", file=sys.stderr)
        return 2
    save_profile(profile, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def export_dynamo(argv: list[str]) -> int:
    """`tandem profile export-dynamo PROFILE -o DIR`: the profile in Dynamo's profiler layout, for its planner
    and its mocker's replay (`--profile-dir DIR`)."""
    from tandem.profile_dynamo import to_dynamo

    p = argparse.ArgumentParser(prog=f"{PROG} export-dynamo", description=export_dynamo.__doc__)
    p.add_argument("profile", help="a profile JSON, or a shipped profile's name")
    p.add_argument("-o", "--output", required=True, help="the folder to write (created)")
    args = p.parse_args(argv)
    try:
        profile = profile_named(args.profile)
    except (OSError, ValueError) as e:
        print(f"{PROG} export-dynamo: error: {args.profile}: {e}", file=sys.stderr)
        return 2
    for path in to_dynamo(profile, args.output):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def compare(argv: list[str]) -> int:
    """`tandem profile compare A B`: two profiles side by side (TTFT by prompt length, ITL by batch and
    context), each cell as its profile predicts it, and B / A."""
    from tandem.profile_compare import render

    p = argparse.ArgumentParser(prog=f"{PROG} compare", description=compare.__doc__)
    p.add_argument("a", help="a profile JSON, or a shipped profile's name")
    p.add_argument("b", help="a profile JSON, or a shipped profile's name")
    p.add_argument(
        "--prompt-lengths", type=int_list, default=None, help="default: 128,512,1024,2048,4096,8192"
    )
    p.add_argument("--batches", type=int_list, default=[1, 8, 32, 64, 128])
    p.add_argument("--contexts", type=int_list, default=[512, 2048, 8192])
    args = p.parse_args(argv)
    try:
        a, b = profile_named(args.a), profile_named(args.b)
    except (OSError, ValueError) as e:
        print(f"{PROG} compare: error: {e}", file=sys.stderr)
        return 2
    print(render(a, b, args.a, args.b, args.prompt_lengths, args.batches, args.contexts))
    return 0


SUBCOMMANDS = {"import-dynamo": import_dynamo, "export-dynamo": export_dynamo, "compare": compare}
