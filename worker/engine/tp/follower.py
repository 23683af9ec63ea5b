"""A tensor-parallel rank other than 0: joins rank 0's group, loads its share of the model and runs each
command rank 0 sends, in order, until told to stop.

Commands: ("load", model_dir, dtype, quantization), ("kv", num_blocks, block_size, dtype, kv_cache_dtype),
("forward", input_ids, positions, batch, hooked, num_layers) (when hooked, after each layer: commands until
("next",)), ("logits", hidden), ("read", layer, block_ids), ("write", layer, block_ids), ("stop",).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from tandem.worker.engine.layers.kv_cache import KvCache
from tandem.worker.engine.models.llama import Transformer
from tandem.worker.engine.tp.group import Command, TpGroup, join_ranks
from tandem.worker.engine.tp.model import load_shard, read_shard, rebuilt, write_shard

log = logging.getLogger("tandem.worker.tp")


class Follower:
    def __init__(self, group: TpGroup):
        self.group = group
        self.model: Transformer | None = None
        self.kv: KvCache | None = None

    def serve(self) -> None:
        while self.run(self.group.receive()):
            pass

    def run(self, command: Command) -> bool:
        """Run one command; False on stop."""
        kind, *args = command
        if kind == "stop":
            return False
        if kind == "load":
            self.kv = None
            model_dir, dtype, quantization = args
            self.model = load_shard(model_dir, dtype, self.group.device, quantization, self.group)
            return True
        assert self.model is not None, f"{kind!r} before a model was loaded"
        if kind == "kv":
            num_blocks, block_size, dtype, kv_cache_dtype = args
            self.kv = self.model.kv_cache(num_blocks, block_size, dtype, self.group.device, kv_cache_dtype)
            return True
        with torch.inference_mode():
            if kind == "logits":
                self.model.logits(args[0].to(self.group.device))
                return True
            assert self.kv is not None, f"{kind!r} before the KV cache was made"
            if kind == "forward":
                self._forward(*args)
            elif kind == "read":
                read_shard(self.kv, self.group, *args)
            elif kind == "write":
                write_shard(self.kv, self.group, *args)
            else:
                raise ValueError(f"unknown tensor-parallel command {kind!r}")
        return True

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, batch: tuple, hooked: bool, num_layers: int | None
    ) -> None:
        assert self.model is not None and self.kv is not None
        device = self.group.device

        def until_next(layer: int) -> None:
            while (command := self.group.receive())[0] != "next":
                self.run(command)

        self.model(
            ids.to(device),
            positions.to(device),
            self.kv.k,
            self.kv.v,
            rebuilt(batch, device),
            until_next if hooked else None,
            num_layers,
        )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tandem tensor-parallel rank")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args.rank} %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    group = join_ranks(args.rank, args.ranks, args.port, args.device)
    try:
        Follower(group).serve()
    except Exception:  # rank 0 gone mid-collective, or a failing command: this rank cannot go on alone
        log.exception("tensor-parallel rank %d stopped", args.rank)
        return 1
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
