"""`tandem router`'s command line, and the one the operator renders for it."""

from __future__ import annotations

from tandem import names

# ---- the command line ----


def test_router_command_line(capsys):
    from tandem.worker.router.main import build_parser, check_args, main

    args = build_parser().parse_args(
        [
            "--model-dir",
            "m",
            "--served-name",
            "tiny",
            "--prefill",
            "a:1,b:2",
            "--decode",
            "c:3",
            "--max-queued",
            "8",
        ]
    )
    assert (args.mode, args.prefill, args.decode, args.colocated) == (
        "disaggregated",
        ["a:1", "b:2"],
        ["c:3"],
        [],
    )
    assert (args.host, args.port, args.max_queued, args.workers_file) == ("127.0.0.1", 8000, 8, None)
    assert check_args(args) is None
    colocated = build_parser().parse_args(["--model-dir", "m", "--served-name", "t", "--mode", "colocated"])
    assert "--colocated" in check_args(colocated)
    dynamic = build_parser().parse_args(
        ["--model-dir", "m", "--served-name", "t", "--workers-file", "w.json"]
    )
    assert check_args(dynamic) is None and dynamic.workers_file == "w.json"
    assert main(["--model-dir", "m", "--served-name", "t", "--decode", "c:3"]) == 2
    assert "needs --prefill and --decode" in capsys.readouterr().err


def test_the_rendered_router_keeps_metrics_on_its_metrics_port():
    from tandem.operator.manifests import render
    from tandem.spec import InferenceServiceSpec
    from tandem.worker.router.main import build_parser

    spec = InferenceServiceSpec.model_validate({"model": {"source": {"path": "/m"}, "servedName": "m"}})
    args = build_parser().parse_args(render.router_args(spec, "s", "ns")[1:])
    assert args.metrics_port == names.METRICS_PORT and not args.public_metrics and not args.docs
